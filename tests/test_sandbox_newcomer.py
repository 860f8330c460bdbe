"""The sandbox as a newcomer meets it: with an environment file of their own and their own
workload, `--keep` printing commands that work when pasted into another shell, plain progress
lines when the output is not a terminal, the live view under `invoke` on a terminal, and no
temp directory left behind."""

from __future__ import annotations

import os
import pty
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from terminal import read_until_closed

pytestmark = pytest.mark.sandbox
ROOT = Path(__file__).resolve().parents[1]
MY_ENV = """
cloud = "aws"
region = "eu-west-1"

[scaler]
tick_s = 2
scale_in_delay_s = 3
scale_out_cooldown_s = 3

[pools.work]
max = 2
command = "wc -w"
slots_per_unit = 2
instance_types = [{ type = "c6i.large" }]

[queues.mine]
pool = "work"
item_timeout_s = 10
"""


def process_env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "TIDEFLEET_"))}
    return {**env, "TMPDIR": str(tmp), "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"}


def read_until(stream, marker: str, proc: subprocess.Popen, timeout_s: float) -> str:
    out, deadline = "", time.monotonic() + timeout_s
    while marker not in out:
        assert time.monotonic() < deadline and proc.poll() is None, f"no {marker!r} (exit {proc.poll()}):\n{out[-3000:]}"
        line = stream.readline()
        out += line
    return out


def test_my_own_environment_file_and_workload_run_and_keep_prints_commands_that_work(tmp_path):
    """Outside the project (its own folder, another cwd), through a pipe: plain lines, then the
    pasted commands submit to the kept sandbox and watch the job to the end."""
    mine, temp = tmp_path / "elsewhere", tmp_path / "tmp"
    mine.mkdir(), temp.mkdir()
    (mine / "my-env.toml").write_text(MY_ENV)
    # Started with SIGINT ignored, as a background job of a shell without job control (a CI script)
    # starts it: Ctrl-C must stop it all the same.
    sandbox = subprocess.Popen(
        ["bash", "-c", 'trap "" INT; exec "$0" "$@"', sys.executable, "-m", "tidefleet.cli", "sandbox",
         "--env", str(mine / "my-env.toml"), "--items", "6", "--time-limit", "150", "--keep"],
        cwd=mine, env=process_env(temp), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        shown = read_until(sandbox.stdout, "Ctrl-C stops everything", sandbox, 200)
        assert "\x1b[" not in shown  # no cursor codes off a terminal
        assert re.search(r"\d+s  6/6 final \(0 failed\)", shown), shown  # plain progress lines
        assert re.search(r"succeeded\s+6", shown) and "failed (the workload's reasons below)" in shown, shown
        pasted = shown.split("paste:")[1].split("Ctrl-C")[0].strip().splitlines()
        assert [line.split()[:2] for line in pasted[-2:]] == [["tidefleet", "submit"], ["tidefleet", "status"]]
        assert "--items" in pasted[-2] and all(line.startswith("export ") for line in pasted[:-2])
        run = subprocess.run(["bash", "-ec", "\n".join(pasted)], cwd=tmp_path, env=process_env(temp),
                             capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
        assert run.returncode == 0, run.stdout + run.stderr
        assert "5 item(s)" in run.stdout and "succeeded 5" in run.stdout, run.stdout
    finally:
        sandbox.send_signal(signal.SIGINT)
        sandbox.wait(timeout=60)
    assert sandbox.returncode == 0
    assert list(temp.iterdir()) == []  # its workdir, the nodes' and workloads' temp files: gone


def test_the_live_view_redraws_under_invoke_on_a_terminal(tmp_path):
    main, child = pty.openpty()
    run = subprocess.Popen([sys.executable, "-m", "invoke", "sandbox", "--items", "4", "--time-limit", "120"],
                           cwd=ROOT, env={**process_env(tmp_path), "COLUMNS": "120", "LINES": "40"},
                           stdin=child, stdout=child, stderr=child)  # fmt: skip
    os.close(child)
    out = read_until_closed(main, 200)
    assert run.wait(timeout=30) == 0, out[-3000:].decode(errors="replace")
    text = out.decode(errors="replace")
    assert "\x1b[2K" in text or "\x1b[1A" in text  # redrawn in place
    assert "tidefleet sandbox · env sandbox" in text and re.search(r"succeeded\s+\S*4", text)


def command(process) -> list[str]:
    """Its command line; [] once it is gone (a workload ends between the listing and the look)."""
    import psutil

    try:
        return process.cmdline()
    except psutil.Error:
        return []


def _status(process) -> str:
    import psutil

    try:
        return process.status()
    except psutil.Error:
        return "gone"


def emulator_of(pid: int, wait_s: float = 10.0):
    """The moto server the sandbox in process `pid` started (a psutil.Process); what its children
    are if none is found within `wait_s`."""
    import psutil

    deadline, seen = time.monotonic() + wait_s, []
    while True:
        children = psutil.Process(pid).children()
        found = [p for p in children if "tidefleet.emulator" in " ".join(command(p))]
        if len(found) == 1 or time.monotonic() > deadline:
            break
        seen = [(p.pid, _status(p), command(p)[:4]) for p in children]
        time.sleep(0.2)
    assert len(found) == 1, f"the sandbox {pid} has no emulator child; its children: {seen}"
    return found[0]


@pytest.mark.parametrize("own_workdir", [True, False], ids=["--workdir", "a temp folder"])
def test_the_sandbox_ends_in_one_line_when_its_emulator_dies(tmp_path, own_workdir):
    """The moto server killed under a kept sandbox (the kernel's OOM killer did it): the sandbox
    ends with exit 1 and one line that says so and where moto's log is, instead of staying "up"
    with no backend; no thread dies with a traceback meanwhile. The log is there to read, in a
    temp work folder too: a run that failed keeps it."""
    work, temp = tmp_path / "work", tmp_path / "tmp"
    temp.mkdir()
    sandbox = subprocess.Popen(
        [sys.executable, "-m", "tidefleet.cli", "sandbox", "--items", "0", "--keep",
         *(["--workdir", str(work)] if own_workdir else [])],
        cwd=ROOT, env=process_env(temp), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        read_until(sandbox.stdout, "Ctrl-C stops everything", sandbox, 120)
        moto = emulator_of(sandbox.pid)
        time.sleep(2)  # the launcher and the control loop are running rounds against it
        moto.kill()
        out, err = sandbox.communicate(timeout=30)
    finally:
        if sandbox.poll() is None:
            sandbox.kill()
            sandbox.wait()
    assert sandbox.returncode == 1, out + err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in out + err and "Exception in thread" not in out + err, out + err
    if not own_workdir:
        (work,) = temp.glob("tidefleet-sandbox-*")
    assert "emulator (moto server) was killed by SIGKILL" in lines[0] and f"{work / 'moto.log'}" in lines[0], lines
    assert (work / "moto.log").exists()


@contextmanager
def busy_sandbox(temp: Path) -> Iterator[tuple[subprocess.Popen, str]]:
    """The demo job's sandbox once its nodes run items, and what it printed so far; killed on the
    way out if still running."""
    sandbox = subprocess.Popen(
        [sys.executable, "-m", "tidefleet.cli", "sandbox", "--items", "60", "--time-limit", "150"],
        cwd=ROOT, env=process_env(temp), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        yield sandbox, read_until(sandbox.stdout, " busy", sandbox, 120)
    finally:
        if sandbox.poll() is None:
            sandbox.kill()
            sandbox.wait()


def test_ctrl_c_mid_run_stops_every_node_and_the_emulator_and_says_so(tmp_path):
    """Ctrl-C while the demo job runs: every node process and the emulator stop, the temp work
    folder goes, and the output says so as it starts stopping and once it is done, exit 130 as
    submit's Ctrl-C (click's bare 'Aborted!', exit 1, said none of it)."""
    import psutil

    temp = tmp_path / "tmp"
    temp.mkdir()
    with busy_sandbox(temp) as (sandbox, shown):
        (work,) = temp.glob("tidefleet-sandbox-*")
        processes = psutil.Process(sandbox.pid).children(recursive=True)  # the emulator, the nodes, their items
        emulator = emulator_of(sandbox.pid)
        sandbox.send_signal(signal.SIGINT)
        out, _ = sandbox.communicate(timeout=60)
    out = shown + out
    assert sandbox.returncode == 130, out
    assert "Ctrl-C: stopping every node and the emulator" in out, out
    assert f"interrupted: every node and the emulator stopped; {work} removed" in out, out
    assert "Aborted!" not in out and "Traceback" not in out, out
    assert emulator in processes, processes
    left = [p for p in processes if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not left, left
    assert list(temp.iterdir()) == []  # its work folder, the nodes' and workloads' temp files: gone


def test_a_sigkilled_sandbox_leaves_no_node_workload_or_emulator_running(tmp_path):
    """kill -9 of the sandbox (or of its terminal's session): nothing outlives it. Its nodes' agents
    and their items, and its moto server, end with it (`tidefleet.lifeline`); before, five agents of
    one killed sandbox were still polling a dead emulator 75 minutes later."""
    import psutil

    temp = tmp_path / "tmp"
    temp.mkdir()
    with busy_sandbox(temp) as (sandbox, _):
        processes = psutil.Process(sandbox.pid).children(recursive=True)  # the emulator, the nodes, their items
        emulator = emulator_of(sandbox.pid)
        agents = [p for p in processes if "tidefleet.cli agent" in " ".join(command(p))]
        sandbox.kill()
        sandbox.wait()
    assert emulator in processes and agents, processes

    def left() -> list:
        out = []
        for p in processes:
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    out.append(p)
            except psutil.NoSuchProcess:
                pass
        return out

    deadline = time.monotonic() + 20
    while left() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left(), [(p.pid, " ".join(command(p))[:120]) for p in left()]


# The sandbox with a moto start as slow as the test wants: start_moto's first look at whether its
# server answers waits for a line on stdin, as on a machine where moto takes seconds to come up.
SLOW_START = """
import sys
import urllib.request
from tidefleet.cli import main
look = urllib.request.urlopen
def first_look(*args, **kwargs):
    urllib.request.urlopen = look
    print("emulator starting", flush=True)
    sys.stdin.readline()
    return look(*args, **kwargs)
urllib.request.urlopen = first_look
main()
"""


def slow_start(temp: Path) -> subprocess.Popen:
    """`tidefleet sandbox --items 0` with the slow moto start (`SLOW_START`: a line on its stdin ends
    the wait), in its own process group: a terminal's Ctrl-C reaches it and the emulator only."""
    return subprocess.Popen(
        [sys.executable, "-c", SLOW_START, "sandbox", "--items", "0"], cwd=ROOT, env=process_env(temp),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip


def end_both(sandbox: subprocess.Popen, emulator) -> bool:
    """After the test: the sandbox killed if it is still running, and whether its emulator (a
    psutil process, or None) was left running, killed then so no test leaves it behind."""
    import psutil

    if sandbox.poll() is None:
        sandbox.kill()
        sandbox.wait()
    left = emulator is not None and emulator.is_running() and emulator.status() != psutil.STATUS_ZOMBIE
    if left:
        emulator.kill()
    return left


@pytest.mark.parametrize(
    "whole_group", [False, True], ids=["to the sandbox", "to its process group (a terminal)"]
)
def test_ctrl_c_while_the_sandbox_starts_says_so_at_once_and_leaves_no_emulator_behind(tmp_path, whole_group):
    """Ctrl-C while the emulator starts: the stopping line comes at once, a second Ctrl-C is
    ignored, and once start-up is over everything stops, the same interrupted line, exit 130.
    It said nothing until the end, and the emulator ran on after the sandbox had exited: the
    Ctrl-C came before start_moto returned it to the sandbox. A terminal's Ctrl-C also reaches the
    emulator, whose start then fails: that reads as the Ctrl-C too, not as moto's error."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    sandbox = slow_start(temp)
    ctrl_c = (lambda: os.killpg(sandbox.pid, signal.SIGINT)) if whole_group else (
        lambda: sandbox.send_signal(signal.SIGINT))  # fmt: skip
    emulator = None
    try:
        shown = read_until(sandbox.stdout, "emulator starting", sandbox, 120)
        (work,) = temp.glob("tidefleet-sandbox-*")
        emulator = emulator_of(sandbox.pid)
        ctrl_c()
        shown += read_until(sandbox.stdout, "Ctrl-C: stopping every node and the emulator", sandbox, 60)
        ctrl_c()  # ignored: the stopping goes on
        out, _ = sandbox.communicate("\n", timeout=120)  # start_moto goes on
    finally:
        left = end_both(sandbox, emulator)
    out = shown + out
    assert sandbox.returncode == 130, out
    assert f"interrupted: every node and the emulator stopped; {work} removed" in out, out
    assert out.count("Ctrl-C: stopping") == 1 and "Traceback" not in out, out
    assert not left, emulator
    assert list(temp.iterdir()) == []


def test_sigterm_while_the_emulator_starts_leaves_no_emulator_behind(tmp_path):
    """SIGTERM ends the run as Ctrl-C does (exit 143), but start_moto had no handle to give back
    yet: its SystemExit left the emulator running after the sandbox had exited."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    sandbox = slow_start(temp)
    emulator = None
    try:
        read_until(sandbox.stdout, "emulator starting", sandbox, 120)
        emulator = emulator_of(sandbox.pid)
        sandbox.send_signal(signal.SIGTERM)
        out, _ = sandbox.communicate("\n", timeout=120)
    finally:
        left = end_both(sandbox, emulator)
    assert sandbox.returncode == 143 and "Traceback" not in out, out
    assert not left, emulator


def test_an_emulator_error_the_sandbox_meets_is_one_line_naming_moto_s_log_and_the_work_is_kept(tmp_path, monkeypatch):
    """Under load moto answered a status read with its own HTTP 500 page; the sandbox ended in a
    botocore traceback. Now one line: what failed, the emulator's log, and the work folder kept."""
    from click.testing import CliRunner

    from tidefleet.cli import main
    from tidefleet.cloud.aws.endpoint import NotAws
    from tidefleet.sandbox import cli as sandbox_cli

    def fails(box, *_, **__):
        raise NotAws(endpoint=os.environ["AWS_ENDPOINT_URL"], status=500)

    monkeypatch.setattr(sandbox_cli, "_up", fails)
    work = tmp_path / "work"
    result = CliRunner().invoke(main, ["sandbox", "--items", "4", "--workdir", str(work)])
    assert result.exit_code == 1 and result.exception is not None and isinstance(result.exception, SystemExit)
    (line,) = [x for x in result.output.splitlines() if x.startswith("Error:")]
    assert line.startswith("Error: the emulator failed a call the sandbox made: the endpoint http://127.0.0.1:")
    assert line.endswith(f"did not answer like the AWS API (HTTP 500); check AWS_ENDPOINT_URL; its log is "
                         f"{work / 'moto.log'}; start the sandbox again")  # fmt: skip
    assert (work / "moto.log").exists()
