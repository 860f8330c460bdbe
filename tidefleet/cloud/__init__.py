"""The adapters, one package per cloud, chosen once by `for_env`: nothing else branches on
the cloud. `tidefleet.ports` says what an adapter must do; each package imports its SDK only
when it is chosen, so an AWS node never needs the Google libraries, nor a GCP function boto3.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tidefleet.config import Environment
    from tidefleet.ports import Cloud, Objects


def for_env(env: Environment) -> Cloud:
    """The environment's cloud: its queues, job store and item logs, and the rest it offers."""
    if env.cloud == "gcp":
        from tidefleet.cloud.gcp import GcpCloud

        return GcpCloud(env)
    from tidefleet.cloud.aws import AwsCloud

    return AwsCloud(env)


def aws_instance_types() -> tuple[str, frozenset[str]]:
    """('botocore X.Y.Z', the EC2 instance types it knows), for validate; no credentials, no network."""
    from tidefleet.cloud.aws.offerings import known_types

    return known_types()


def object_store(scheme: str) -> Objects:
    """The object store of a URI scheme (s3 or gs), for checkpoints."""
    if scheme == "gs":
        from tidefleet.cloud.gcp.objects import GcsObjects

        return GcsObjects()
    from tidefleet.cloud.aws.objects import S3Objects

    return S3Objects()
