"""Any event at all, of any shape: both functions' parsers answer with a trigger, an action or
an ignore, and never raise (a raise would make Lambda retry the asynchronous invoke)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

from hypothesis import example, given, settings
from hypothesis import strategies as st

from tidefleet import schedules, triggers
from tidefleet.config import load_environment
from tidefleet.policy.interruption import action_for

ENV = load_environment("sandbox")
KEYS = st.sampled_from(["source", "detail-type", "detail", "resources", "alarmData", "state", "value", "tidefleet",
                        "env", "reason", "instance-id", "instance-action", "EC2InstanceId", "AutoScalingGroupName",
                        "LifecycleTransition", "LifecycleHookName", "LifecycleActionToken", "time", "alarmName"])
VALUES = st.sampled_from(["aws.events", "Scheduled Event", "aws.cloudwatch", "aws.ec2", "aws.autoscaling", "kick",
                          "EC2 Spot Instance Interruption Warning", "EC2 Instance Rebalance Recommendation",
                          "EC2 Instance-terminate Lifecycle Action", "autoscaling:EC2_INSTANCE_TERMINATING",
                          "i-0123456789abcdef0", "tidefleet-sandbox-cpu", "sandbox", "2030-01-01T00:00:00Z", "schedule"])
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20) | VALUES,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS | st.text(max_size=8), inner, max_size=6),
    max_leaves=20,
)


@settings(max_examples=150, deadline=None)
@given(JSON)
def test_the_scaler_parser_never_raises(event):
    result = triggers.parse(event)
    assert isinstance(result, (triggers.Trigger, triggers.Ignored))
    json.dumps(result.__getattribute__("detail" if isinstance(result, triggers.Trigger) else "reason"))


@settings(max_examples=150, deadline=None)
@given(JSON)
def test_the_interruption_decision_never_raises(event):
    action_for(event, ENV)


def test_malformed_resources_and_alarm_states_are_read_safely():
    assert triggers.parse({"source": "aws.events", "detail-type": "Scheduled Event", "resources": [1, {"a": 2}]}).detail \
        == "schedule"
    alarm = {"source": "aws.cloudwatch", "alarmData": {"alarmName": "depth", "state": "ALARM"}}
    assert triggers.parse(alarm).detail == "depth -> ?"


OFFSETS = st.builds(timezone, st.timedeltas(min_value=timedelta(hours=-23, minutes=-59),
                                            max_value=timedelta(hours=23, minutes=59)))  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(st.datetimes(timezones=OFFSETS), st.sampled_from(["0 3 * * *", None]))
@example(datetime(9999, 12, 31, 23, 59, 59, tzinfo=timezone(timedelta(hours=-14))), None)  # the audit's
@example(datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=14))), "0 3 * * *")
def test_a_fire_time_the_parser_keeps_is_one_the_schedule_can_use(moment, cron):
    at = triggers.parse({"tidefleet": "fire", "schedule": "s", "at": moment.isoformat()}).at
    if at is not None:  # None: the fire's time is when it runs, as for a time that does not parse
        schedules.run_id("s", schedules.fire_time(cron, "1 hour", at))


@settings(max_examples=150, deadline=None)
@given(JSON | st.text(min_size=90, max_size=5000))
def test_a_kicks_reason_is_short_in_the_log_whatever_was_sent(reason):
    kick = triggers.parse({"tidefleet": "kick", "env": "sandbox", "reason": reason})
    assert len(kick.detail) <= triggers.DETAIL_CHARS + len("... (5000 characters)")
    if isinstance(reason, str) and reason:
        assert kick.detail.startswith(reason[: triggers.DETAIL_CHARS])
