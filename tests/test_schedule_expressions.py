"""What the stacks hand each cloud's scheduler fires when tidefleet's own cron says it should
(`tidefleet.schedules.Cron`, which the fires and the sandbox use)."""

from __future__ import annotations

import re

import pytest

from stacks.aws.schedules import expression
from stacks.gcp.schedules import unix_crons
from tidefleet.schedules import Cron, rate_seconds

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


WEEK = [1_750_000_000 - 1_750_000_000 % 86400 + 60 * m for m in range(8 * 24 * 60)]  # eight days, by the minute


def fires(crons: list[str]) -> set[float]:
    """The minutes of WEEK that any of these 5-field crons matches."""
    parsed = [Cron.parse(c) for c in crons]
    return {t for t in WEEK if any(c.latest(t) == t for c in parsed)}


@pytest.mark.parametrize("cron", ["0 3 * * 1-5", "*/15 * * * *", "5/20 1-3 * * *", "0 3 * * */2", "0 3 * * 7",
                                  "0 0 1,15 * 1", "30 6 */1 * 0-6/3", "0 12 * 1-12/2 *"])  # fmt: skip
def test_gcp_fires_a_cron_when_tidefleets_cron_does(cron):
    (translated,) = unix_crons(cron, None)
    assert fires([translated]) == fires([cron]), translated


@pytest.mark.parametrize("rate", ["10 minutes", "45 minutes", "96 minutes", "1 hour", "8 hours", "1 day",
                                  "288 minutes", "1440 minutes"])  # fmt: skip
def test_gcp_fires_a_rate_at_each_multiple_of_its_period_from_midnight(rate):
    period = rate_seconds(rate)
    assert fires(unix_crons(None, rate)) == {t for t in WEEK if t % period == 0}


@pytest.mark.parametrize("tick_s", [30, 60, 120, 300, 600, 900, 1200, 1800, 3600])
def test_gcp_ticks_the_scaler_every_tick_s_the_config_accepts(tick_s):
    """Every GCP tick_s the config accepts (a whole number of minutes dividing an hour) is a valid
    unix-cron that fires every tick; an hour was '*/60', past the minute field's 0-59."""
    from stacks.gcp.control import schedule

    period, minute = max(60, tick_s), schedule(tick_s).split()[0]
    assert fires([schedule(tick_s)]) == {t for t in WEEK if t % period == 0}, schedule(tick_s)
    assert minute in ("*", "0") or 2 <= int(minute.removeprefix("*/")) <= 59, f"minute field {minute!r}: unix-cron's is 0-59"
