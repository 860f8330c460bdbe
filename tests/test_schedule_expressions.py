"""What the stacks hand each cloud's scheduler fires when tidefleet's own cron says it should
(`tidefleet.schedules.Cron`, which the fires and the sandbox use)."""

from __future__ import annotations

import re

import pytest

from stacks.aws.schedules import expression
from tidefleet.schedules import Cron

pytestmark = pytest.mark.synth


def aws_weekdays(field: str) -> set[int]:
    """The days EventBridge fires on for a day-of-week field (1 = SUN .. 7 = SAT), as cron's 0-6."""
    days: set[int] = set()
    for part in field.split(","):
        body, _, step = part.partition("/")
        first, _, last = body.partition("-")
        low = int(first)
        high = int(last) if last else (7 if step else low)
        days |= {(d - 1) for d in range(low, high + 1, int(step or 1))}
    return days


@pytest.mark.parametrize("dow", ["*/2", "1-5/2", "1/2", "0,6", "1-5", "0", "7", "7/3", "2,4-6", "0-6/3"])
def test_aws_fires_on_the_days_of_the_week_tidefleets_cron_computes(dow):
    cron = f"0 3 * * {dow}"
    translated = re.fullmatch(r"cron\(0 3 \? \* (\S+) \*\)", expression(cron, None))
    assert translated, expression(cron, None)
    assert aws_weekdays(translated.group(1)) == set(Cron.parse(cron).weekdays), translated.group(1)
