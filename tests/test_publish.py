"""`invoke deploy` publishes what a node installs at boot to the artifacts bucket."""

import boto3

from stacks.publish import publish_agent
from tidefleet import naming
from tidefleet.config import load_environment


def test_publish_puts_the_agent_wheel_and_environment_where_user_data_fetches_them(aws, tmp_path):
    env = load_environment("dev")
    bucket = naming.artifacts_bucket("dev", boto3.client("sts").get_caller_identity()["Account"])
    boto3.client("s3").create_bucket(Bucket=bucket)
    wheel = tmp_path / "tidefleet-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"wheel")

    written = publish_agent(env, wheel)

    keys = sorted(o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket=bucket)["Contents"])
    assert keys == ["agent/environments/dev.toml", "agent/tidefleet-0.1.0-py3-none-any.whl"]
    assert written == [f"s3://{bucket}/{k}" for k in reversed(keys)]
