"""Publish what nodes install at boot: the agent wheel and the environment file, under
`agent/` in the environment's artifacts bucket (see templates/user-data.sh.j2)."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import boto3

from tidefleet import naming
from tidefleet.config import Environment, environments_dir

ROOT = Path(__file__).resolve().parents[1]


def build_agent_wheel(out: Path) -> Path:
    """The tidefleet wheel (its dependencies come from PyPI when the node installs it)."""
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir", str(out), str(ROOT)],
        check=True,
    )
    wheels = sorted(out.glob("tidefleet-*.whl"), key=lambda p: p.stat().st_mtime)
    return wheels[-1]


def publish_agent(env: Environment, wheel: Path | None = None) -> list[str]:
    """Upload the agent wheel and `environments/<env>.toml`; returns the S3 URIs written."""
    if env.cloud != "aws":
        raise ValueError(f"publishing to {env.cloud} is not automated yet; copy the wheel to gs://…/agent/ by hand")
    with tempfile.TemporaryDirectory() as tmp:
        wheel = wheel or build_agent_wheel(Path(tmp))
        account = boto3.client("sts", region_name=env.region).get_caller_identity()["Account"]
        bucket = naming.artifacts_bucket(env.name, account)
        s3 = boto3.client("s3", region_name=env.region)
        uploads = {
            f"agent/{wheel.name}": wheel,
            f"agent/environments/{env.name}.toml": environments_dir() / f"{env.name}.toml",
        }
        for key, path in uploads.items():
            s3.upload_file(str(path), bucket, key)
        return [f"s3://{bucket}/{key}" for key in uploads]
