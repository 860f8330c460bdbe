"""Node boot script: one jinja2 template for a cloud node and for a sandbox node.

Cloud mode (EC2 user-data): install Python 3.11, fetch the agent wheel from the artifacts
bucket's ``agent/`` prefix, run the pool's init_script with the pool's env, start the agent as
the systemd unit ``tidefleet-agent`` (the pool's env in its ``Environment=`` lines). Local mode
(``local`` given): export the given variables and the pool's env, run the init_script and
``exec`` the agent in the caller's Python, so the sandbox boots a node exactly the way EC2
would, minus installation and systemd. In both modes the init_script sees the pool's env and
runs as ``bash -euo pipefail -c`` with its stdin /dev/null.
"""

from __future__ import annotations

import shlex
from functools import cache
from pathlib import Path

import jinja2

from tidefleet.config import INIT_SCRIPT_DELIMITER, Environment, boot_script_problems

TEMPLATE = Path(__file__).resolve().parents[1] / "templates" / "user-data.sh.j2"
EC2_USER_DATA_LIMIT = 16 * 1024
# Where the file system's address goes (known only at apply): the stack splices it in.
SHARED_FS_PLACEHOLDER = "TIDEFLEET-SHARED-FS-PLACEHOLDER"
# In local mode, the interpreter that runs the agent (also exported, harmlessly).
LOCAL_PYTHON = "TIDEFLEET_PYTHON"


def _systemd_quote(assignment: str) -> str:
    """One systemd `Environment=` value: double-quoted, with \\, " and % escaped."""
    if any(c in assignment for c in "\n\r\0"):
        raise ValueError(f"pool env: a value may not contain a newline or NUL (got {assignment!r})")
    escaped = assignment.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")
    return f'"{escaped}"'


def _shell_quote(value: str) -> str:
    """One literal shell word: shlex.quote's single quotes, but a value with a backslash goes in
    ANSI-C quotes ($'...', each backslash and single quote escaped). A backslash before a quote
    in plain single quotes ('C:\\data\\') is correct bash but draws shellcheck's SC1003."""
    if "\\" not in value:
        return shlex.quote(value)
    return "$'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


@cache
def _template() -> jinja2.Template:
    environment = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False)
    environment.filters["q"] = _shell_quote
    environment.filters["systemd_quote"] = _systemd_quote
    return environment.from_string(TEMPLATE.read_text())


def render_user_data(env: Environment, pool_name: str, *, artifacts_bucket: str, local: dict | None = None) -> str:
    """The boot script of a node of `pool_name`. `local`: variables to export instead of
    installing (AWS_ENDPOINT_URL, TIDEFLEET_NODE_ID, ...; TIDEFLEET_PYTHON = the interpreter)."""
    if pool_name not in env.pools:
        raise ValueError(f"pool: unknown pool (got {pool_name!r}); known pools: {', '.join(sorted(env.pools))}")
    # Validation already refused these for a loaded file; an Environment built in code is checked here.
    problems = boot_script_problems(env, pool_name)
    if problems:
        raise ValueError("; ".join(problems))
    pool = env.pools[pool_name]
    script = _template().render(
        env=env,
        pool_name=pool_name,
        pool=pool,
        artifacts_bucket=artifacts_bucket,
        local=local,
        python=(local or {}).get(LOCAL_PYTHON, "python3"),
        init_delimiter=INIT_SCRIPT_DELIMITER,
        shared_fs_source=SHARED_FS_PLACEHOLDER,
    )
    if len(script.encode()) > EC2_USER_DATA_LIMIT:
        raise ValueError(
            f"pools.{pool_name}: user-data is {len(script.encode())} bytes, over EC2's {EC2_USER_DATA_LIMIT}; "
            "shorten init_script or env"
        )
    return script
