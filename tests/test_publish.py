"""`invoke deploy` publishes what a node installs at boot to the artifacts bucket."""

import boto3

from stacks.publish import ROOT, publish_agent
from tests.gcp_fake import FakeGcp
from tests.test_gcp_jobs import calls, gcp  # noqa: F401 - gcp is a fixture
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


def test_publish_on_gcp_uploads_both_to_the_artifacts_bucket_through_the_gcs_json_api(gcp: FakeGcp, tmp_path):  # noqa: F811
    env = load_environment("gcp-dev")
    wheel = tmp_path / "tidefleet-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"wheel")

    written = publish_agent(env, wheel)

    bucket = naming.artifacts_bucket("gcp-dev", env.project)
    assert [(c["query"], c["content_type"]) for c in calls(gcp, "POST", f"/upload/storage/v1/b/{bucket}/o")] == [
        ({"uploadType": "media", "name": f"agent/{wheel.name}"}, "application/octet-stream"),
        ({"uploadType": "media", "name": "agent/environments/gcp-dev.toml"}, "application/octet-stream"),
    ]
    assert gcp.objects == {f"{bucket}/agent/{wheel.name}": b"wheel",
                           f"{bucket}/agent/environments/gcp-dev.toml": (ROOT / "environments/gcp-dev.toml").read_bytes()}
    assert written == [f"gs://{bucket}/agent/{wheel.name}", f"gs://{bucket}/agent/environments/gcp-dev.toml"]
