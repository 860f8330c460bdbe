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
GCS_UPLOAD = "https://storage.googleapis.com/upload/storage/v1"


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
    """Upload the agent wheel and `environments/<env>.toml`; returns the URIs written."""
    with tempfile.TemporaryDirectory() as tmp:
        wheel = wheel or build_agent_wheel(Path(tmp))
        uploads = {
            f"agent/{wheel.name}": wheel,
            f"agent/environments/{env.name}.toml": environments_dir() / f"{env.name}.toml",
        }
        upload = _to_gcs(env) if env.cloud == "gcp" else _to_s3(env)
        return [upload(key, path) for key, path in uploads.items()]


def _to_s3(env: Environment):
    account = boto3.client("sts", region_name=env.region).get_caller_identity()["Account"]
    bucket = naming.artifacts_bucket(env.name, account)
    s3 = boto3.client("s3", region_name=env.region)

    def upload(key: str, path: Path) -> str:
        s3.upload_file(str(path), bucket, key)
        return f"s3://{bucket}/{key}"

    return upload


def _to_gcs(env: Environment):
    """The GCS JSON API's single-request upload through google-auth (a wheel is small; no
    google-cloud-storage dependency for two objects)."""
    import google.auth
    from google.auth.transport.requests import AuthorizedSession

    from tidefleet.cloud.gcp_work import SCOPES

    bucket = naming.artifacts_bucket(env.name, env.project)
    session = AuthorizedSession(google.auth.default(scopes=SCOPES)[0])

    def upload(key: str, path: Path) -> str:
        session.post(f"{GCS_UPLOAD}/b/{bucket}/o", params={"uploadType": "media", "name": key}, data=path.read_bytes(),
                     headers={"Content-Type": "application/octet-stream"}, timeout=120).raise_for_status()  # fmt: skip
        return f"gs://{bucket}/{key}"

    return upload
