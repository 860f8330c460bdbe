"""S3 answers a GET of a missing key with 403 (AccessDenied), not 404, to a caller that may not
list the whole bucket: a node role lists only its own prefixes (stacks/aws/pool.py), so a first
attempt's checkpoint.load() was AccessDenied instead of "no checkpoint". moto enforces no IAM, so
S3's answers are stubbed here (botocore's Stubber): the behaviour under test is ours."""

from __future__ import annotations

import boto3
import pytest
from botocore.exceptions import ClientError
from botocore.stub import Stubber

from tidefleet.cloud.aws.objects import S3Objects


@pytest.fixture
def objects():
    store = S3Objects()
    store.s3 = boto3.client("s3", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    with Stubber(store.s3) as stub:
        yield store, stub
        stub.assert_no_pending_responses()


KEY = "checkpoints/train/job-1/item-1/state.pt"


def test_a_key_denied_and_not_listed_is_missing(objects):
    store, stub = objects
    stub.add_client_error("get_object", "AccessDenied", http_status_code=403)
    stub.add_response("list_objects_v2", {"Contents": [{"Key": f"{KEY}.bak"}]},
                      {"Bucket": "b", "Prefix": KEY, "MaxKeys": 1})  # fmt: skip
    assert store.get("b", KEY) is None


def test_a_key_denied_and_listed_is_denied(objects):
    store, stub = objects
    stub.add_client_error("get_object", "AccessDenied", http_status_code=403)
    stub.add_response("list_objects_v2", {"Contents": [{"Key": KEY}]}, {"Bucket": "b", "Prefix": KEY, "MaxKeys": 1})
    with pytest.raises(ClientError, match="AccessDenied"):
        store.get("b", KEY)


def test_other_errors_are_raised_as_they_are(objects):
    store, stub = objects
    stub.add_client_error("get_object", "SlowDown", http_status_code=503)
    with pytest.raises(ClientError, match="SlowDown"):
        store.get("b", KEY)
