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

from tidefleet import naming, registries
from tidefleet.config import INIT_SCRIPT_DELIMITER, Environment, boot_script_problems

TEMPLATE = Path(__file__).resolve().parents[1] / "templates" / "user-data.sh.j2"
# The most each cloud takes as a boot script: EC2 user data is 16 KB before its base64 (EC2 docs,
# "Run commands when you launch an EC2 instance with user data input"); on GCE the startup-script is one
# metadata value, at most 262144 bytes (256 KiB; all of an instance's metadata at most 512 KB, and the
# template's other values are a few bytes).
BOOT_SCRIPT_LIMITS = {"aws": (16 * 1024, "EC2's user-data limit"),
                      "gcp": (256 * 1024, "GCE's metadata value limit (startup-script)")}  # fmt: skip
EC2_USER_DATA_LIMIT = BOOT_SCRIPT_LIMITS["aws"][0]
# Where the file system's address goes (known only at apply): the stack splices it in.
SHARED_FS_PLACEHOLDER = "TIDEFLEET-SHARED-FS-PLACEHOLDER"
# The longest address it can be: an FSx for Lustre mount source, fs-<17 hex>.fsx.<region>.amazonaws.com@tcp:/<name>,
# is about 70 bytes; an EFS one (...efs.<region>.amazonaws.com:/) or a Filestore IP:/share is shorter.
SHARED_FS_SOURCE_MAX = 100
AWS_ACCOUNT_ID = "0" * 12  # the artifacts bucket's name ends in the account id, known at apply: 12 digits
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
    if local is None and not problems:  # the sandbox runs a local script itself: no cloud's limit
        problems = [problem] if (problem := boot_script_size_problem(env, pool_name)) else []
    if problems:
        raise ValueError("; ".join(problems))
    return _render(env, pool_name, artifacts_bucket=artifacts_bucket, local=local)


def _render(env: Environment, pool_name: str, *, artifacts_bucket: str, local: dict | None) -> str:
    return _template().render(
        env=env,
        pool_name=pool_name,
        pool=env.pools[pool_name],
        artifacts_bucket=artifacts_bucket,
        local=local,
        python=(local or {}).get(LOCAL_PYTHON, "python3"),
        init_delimiter=INIT_SCRIPT_DELIMITER,
        shared_fs_source=SHARED_FS_PLACEHOLDER,
        registry_hosts=registries.credential_helpers(env, pool_name),
    )


def boot_script_size_problem(env: Environment, pool_name: str) -> str | None:
    """The line saying the pool's cloud boot script is over its cloud's limit (BOOT_SCRIPT_LIMITS), or
    None. Measured as the node gets it: rendered with the artifacts bucket's real name (its 12-digit
    account id on AWS) and the longest file-system address the stack splices in at apply. Validation
    runs it (tidefleet.config), so a file that validates renders; render_user_data runs it for an
    Environment built in code. The pool's other boot values must already be valid (boot_script_problems)."""
    if not TEMPLATE.is_file():  # a function's archive, or a node's wheel: nothing there renders a boot script
        return None
    account = env.project or "" if env.cloud == "gcp" else AWS_ACCOUNT_ID
    script = _render(env, pool_name, artifacts_bucket=naming.artifacts_bucket(env.name, account), local=None)
    size = len(script.encode()) + script.count(SHARED_FS_PLACEHOLDER) * (SHARED_FS_SOURCE_MAX - len(SHARED_FS_PLACEHOLDER))
    limit, what = BOOT_SCRIPT_LIMITS[env.cloud]
    if size <= limit:
        return None
    pool = env.pools[pool_name]
    init_bytes = len(pool.init_script.encode())
    env_bytes = sum(len(f"{k}={v}".encode()) for k, v in pool.env.items())
    field, got = ("env", f"an env of {len(pool.env)} variables, {env_bytes} bytes") if env_bytes > init_bytes else (
        "init_script", f"an init_script of {init_bytes} bytes")  # fmt: skip
    fix = ("put the bulk in a file the init_script fetches (from the artifacts or a data bucket) or bake it into "
           "the pool's image")  # fmt: skip
    return (f"pools.{pool_name}.{field}: the node's boot script would be {size} bytes, over {what} of {limit} bytes "
            f"(got {got}); shorten it: {fix}")
