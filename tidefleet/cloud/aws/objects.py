"""Objects in S3: what `tidefleet.agent.checkpoint` saves for a workload on AWS."""

from __future__ import annotations

import boto3

from tidefleet.cloud.aws import CLIENT_CONFIG


class S3Objects:
    def __init__(self):
        # The agent's and the CLI's bounds (connect 5 s, 8 s without an answer, 3 attempts), not
        # botocore's 60 s per try and legacy retries: a silent endpoint held a save for minutes.
        # The read timeout is per socket operation, so a long upload that keeps sending is not cut.
        # Passed here, not installed (`_fail_fast`): the workload's own boto3 clients keep theirs.
        self.s3 = boto3.client("s3", config=CLIENT_CONFIG)

    def put(self, bucket: str, key: str, body: bytes) -> None:
        self.s3.put_object(Bucket=bucket, Key=key, Body=body)

    def get(self, bucket: str, key: str) -> bytes | None:
        try:
            return self.s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        except self.s3.exceptions.NoSuchKey:
            return None
