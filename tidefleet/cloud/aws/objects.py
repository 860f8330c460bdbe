"""Objects in S3: what `tidefleet.agent.checkpoint` saves for a workload on AWS."""

from __future__ import annotations

import os

import boto3
from botocore.exceptions import ClientError

from tidefleet.cloud.aws import CLIENT_CONFIG
from tidefleet.cloud.per_process import PerProcess

# What a client is built from besides the session: the AWS_ variables (endpoint, region, profile,
# files, keys) and the proxies botocore reads once, when it builds the client.
PROXY_VARIABLES = {"http_proxy", "https_proxy", "no_proxy"}
_CLIENTS: PerProcess = PerProcess()


def _client():
    """This process's S3 client for the checkpoints: one, built at the first save or load and kept
    while the default boto3 session and the variables it reads stay the same (`PerProcess`)."""
    if boto3.DEFAULT_SESSION is None:
        boto3.setup_default_session()
    session = boto3.DEFAULT_SESSION
    read = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("AWS_") or k.lower() in PROXY_VARIABLES))
    # The agent's and the CLI's bounds (connect 5 s, 8 s without an answer, 3 attempts), not
    # botocore's 60 s per try and legacy retries: a silent endpoint held a save for minutes.
    # The read timeout is per socket operation, so a long upload that keeps sending is not cut.
    # Passed here, not installed (`_fail_fast`): the workload's own boto3 clients keep theirs.
    return _CLIENTS.get((session, read), lambda: session.client("s3", config=CLIENT_CONFIG))


class S3Objects:
    def __init__(self):
        self.s3 = _client()

    def put(self, bucket: str, key: str, body: bytes) -> None:
        self.s3.put_object(Bucket=bucket, Key=key, Body=body)

    def get(self, bucket: str, key: str) -> bytes | None:
        """The object, or None where there is none. S3 answers a missing key with 404 only to a
        caller that may list the whole bucket; a node role may list its own prefixes only, so it
        gets 403 (AccessDenied): a listing of the key's own prefix then tells missing from denied."""
        try:
            return self.s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        except self.s3.exceptions.NoSuchKey:
            return None
        except ClientError as err:
            if err.response.get("Error", {}).get("Code") != "AccessDenied":
                raise
            try:
                listed = self.s3.list_objects_v2(Bucket=bucket, Prefix=key, MaxKeys=1).get("Contents", [])
            except ClientError:  # denied too: the read's refusal is the one to tell
                raise err from None
            if any(o.get("Key") == key for o in listed):
                raise  # there, and not ours to read
            return None
