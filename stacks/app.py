"""Synthesize one environment's stack into Terraform JSON.

The app is the only place that touches files: it renders user-data from the template and
computes the paths Terraform will use (function archive, local state) relative to the
synthesized stack directory, then hands plain values to the constructs.
"""

from __future__ import annotations

import os
from pathlib import Path

from cdktn import App

import stacks  # noqa: F401  (points jsii at the bundled Node before cdktn loads)
from stacks.aws.stack import AwsFleetStack
from stacks.package import archive_name
from tidefleet.config import Environment
from tidefleet.userdata import render_user_data

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "build"  # where `invoke build` writes the function archives
STATE_DIR = ROOT / "state"


def stack_id(env: Environment) -> str:
    return f"tidefleet-{env.name}"


def synth(env: Environment, outdir: Path) -> Path:
    """Write `outdir/stacks/<stack id>/cdk.tf.json`; return that directory (terraform runs there)."""
    outdir = Path(outdir).resolve()
    stack_dir = outdir / "stacks" / stack_id(env)
    state = Path(env.state.path) if env.state.path else STATE_DIR / f"{env.name}.tfstate"
    outdir.mkdir(parents=True, exist_ok=True)
    app = App(outdir=str(outdir))
    stack_class = AwsFleetStack
    if env.cloud == "gcp":
        from stacks.gcp.stack import GcpFleetStack  # the google provider bindings: the gcp extra only

        stack_class = GcpFleetStack
    stack_class(
        app,
        stack_id(env),
        env=env,
        archive_path=os.path.relpath(BUILD / archive_name(env), stack_dir),  # env's own: `invoke build --env`
        local_state_path=os.path.relpath(ROOT / state, stack_dir),
        user_data=lambda pool, bucket: render_user_data(env, pool, artifacts_bucket=bucket),
    )
    app.synth()
    return stack_dir
