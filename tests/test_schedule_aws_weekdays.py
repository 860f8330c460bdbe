"""EventBridge Scheduler's day-of-week field takes , - * ? L # but no '/' step (EventBridge docs,
"Cron expressions reference"): a cron step over the days of the week is written as the days it means."""

from __future__ import annotations

import pytest

from stacks.aws.schedules import expression
from tidefleet.schedules import Cron

pytestmark = pytest.mark.synth


def test_every_other_day_from_sunday_is_the_explicit_days_in_eventbridges_numbering():
    assert expression("0 3 * * */2", None) == "cron(0 3 ? * 1,3,5,7 *)"  # SUN, TUE, THU, SAT


@pytest.mark.parametrize("dow", ["*/2", "1-5/2", "1/2", "7/3", "0-6/3", "*/3", "2,4-6", "1-5", "0,6", "7", "0-6"])
def test_no_step_reaches_eventbridges_day_of_week_and_the_days_are_tidefleets(dow):
    field = expression(f"0 3 * * {dow}", None).split()[4]
    assert "/" not in field, field
    days = set()
    for part in field.split(","):
        first, _, last = part.partition("-")
        days |= {d - 1 for d in range(int(first), int(last or first) + 1)}
    assert days == set(Cron.parse(f"0 3 * * {dow}").weekdays), field


def test_weekdays_keep_their_range():
    assert expression("0 3 * * 1-5", None) == "cron(0 3 ? * 2-6 *)"
