"""Objects in S3: what `tidefleet.agent.checkpoint` saves for a workload on AWS."""

from __future__ import annotations

import boto3


class S3Objects:
    def __init__(self):
        self.s3 = boto3.client("s3")

    def put(self, bucket: str, key: str, body: bytes) -> None:
        self.s3.put_object(Bucket=bucket, Key=key, Body=body)

    def get(self, bucket: str, key: str) -> bytes | None:
        try:
            return self.s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        except self.s3.exceptions.NoSuchKey:
            return None
