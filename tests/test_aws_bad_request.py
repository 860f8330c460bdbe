"""A call botocore refuses to send (its parameter validation) is a bad request, not an AWS that
cannot be reached: its line says so, at the CLI and in a function alike."""

from __future__ import annotations

import boto3
import pytest
from botocore.exceptions import ParamValidationError

from tidefleet.cloud import for_env
from tidefleet.config import load_environment


@pytest.mark.parametrize("function", [None, "tidefleet-sandbox-interruption"])
def test_a_request_botocore_refuses_to_send_is_said_as_a_bad_request(aws, monkeypatch, function):
    if function:
        monkeypatch.setenv("AWS_LAMBDA_FUNCTION_NAME", function)
    client = boto3.client("autoscaling", region_name="us-east-1")
    with pytest.raises(ParamValidationError) as refused:
        client.complete_lifecycle_action(AutoScalingGroupName="g", LifecycleHookName={"a": 1},
                                         LifecycleActionResult="CONTINUE", InstanceId="i-0123456789abcdef0")  # fmt: skip
    line = for_env(load_environment("sandbox")).explain(refused.value)
    assert line.startswith("bad request to AWS for 'sandbox', not sent (Parameter validation failed: Invalid type "
                           "for parameter LifecycleHookName, value: {'a': 1}")  # fmt: skip
    assert "reach" not in line and "AWS_ENDPOINT_URL" not in line and "\n" not in line
