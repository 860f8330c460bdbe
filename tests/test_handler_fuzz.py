"""Any event at all, of any shape: both functions' parsers answer with a trigger, an action or
an ignore, and never raise (a raise would make Lambda retry the asynchronous invoke)."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from tidefleet import triggers
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
