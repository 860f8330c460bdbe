"""Every cloud error a user can reach through the CLIs becomes one line that says what is wrong
and what to do (`Cloud.explain`), on both clouds; and each is one of the cloud's `errors`, so
the CLIs catch it instead of showing a traceback."""

from __future__ import annotations

import pytest
import requests
from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError
from google.api_core import exceptions as gexc
from google.auth.exceptions import DefaultCredentialsError

from tidefleet.cloud import for_env
from tidefleet.cloud.aws.sqs import QueueMissing
from tidefleet.config import load_environment

AWS, GCP = load_environment("dev"), load_environment("gcp-dev")


def client_error(code: str) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": f"{code} happened"}}, "Call")


@pytest.mark.parametrize(
    ("env", "err", "says"),
    [
        (AWS, NoCredentialsError(), "no AWS credentials: set AWS_PROFILE"),
        (AWS, client_error("ResourceNotFoundException"), "is not deployed in us-east-1; deploy it with `invoke deploy"),
        (AWS, client_error("AccessDenied"), "AccessDenied: AccessDenied happened (region us-east-1)"),
        (AWS, EndpointConnectionError(endpoint_url="http://127.0.0.1:9"), "cannot reach AWS for 'dev'"),
        (AWS, QueueMissing("queues.default: SQS queue 'x' does not exist"), "queues.default: SQS queue 'x' does not exist"),
        (GCP, DefaultCredentialsError("none found"), "no Google credentials: run `gcloud auth application-default login`"),
        (GCP, gexc.NotFound("subscription gone"), "is not deployed in project acme-ml-dev; deploy it with"),
        (GCP, gexc.PermissionDenied("no role"), "permission denied in project acme-ml-dev (no role)"),
        (GCP, gexc.TooManyRequests("slow down"), "TooManyRequests: slow down (project acme-ml-dev)"),
        (GCP, requests.ConnectionError("refused"), "cannot reach Google Cloud for 'gcp-dev' (refused)"),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else None,
)
def test_a_cloud_error_is_caught_and_explained_in_one_line(env, err, says):
    cloud = for_env(env)
    assert isinstance(err, cloud.errors)
    line = cloud.explain(err)
    assert says in line and "\n" not in line
