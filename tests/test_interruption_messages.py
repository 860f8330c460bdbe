"""An interruption event's ignore reasons name a field's type with the right article: "an int", "a dict"."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidefleet.config import load_environment
from tidefleet.policy.interruption import SPOT_WARNING, TERMINATE_HOOK, action_for

ENV = load_environment("dev", Path(__file__).resolve().parents[1] / "environments")


@pytest.mark.parametrize("value, shown", [(5, "an int"), ({"a": 1}, "a dict"), ([1], "a list"), (1.5, "a float"),
                                          (object(), "an object")])  # fmt: skip
def test_a_field_of_the_wrong_type_is_named_with_a_or_an(value, shown):
    action = action_for({"detail-type": value, "source": "aws.ec2", "detail": {}}, ENV)
    assert action.reason == f"event {shown} from 'aws.ec2' is not an interruption this function handles"


def test_a_lifecycle_token_of_the_wrong_type_is_an_int_not_a_int():
    detail = {"EC2InstanceId": "i-0123456789abcdef0", "AutoScalingGroupName": "tidefleet-dev-cpu",
              "LifecycleTransition": "autoscaling:EC2_INSTANCE_TERMINATING", "LifecycleActionToken": 5}  # fmt: skip
    action = action_for({"detail-type": TERMINATE_HOOK, "detail": detail}, ENV)
    assert action.reason.endswith("detail.LifecycleActionToken is not a lifecycle action token (got an int)")


def test_a_spot_warnings_instance_action_of_the_wrong_type_is_an_int_not_a_int():
    event = {"detail-type": SPOT_WARNING, "detail": {"instance-id": "i-0123456789abcdef0", "instance-action": 7}}
    assert action_for(event, ENV).reason.endswith("(its instance-action is an int, not a string)")
