"""`tidefleet ... | head -1`: a reader that leaves before the output ends (head, grep -q, a pager
quit early) ends every command quietly with exit 141, 128 + SIGPIPE, what a shell reports for a
Unix tool that the closed pipe killed. Never 1, which `status` gives a job done with failed items,
nor a traceback. Run as a user runs it: a real process whose stdout is a pipe the reader closes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from agent_harness import Harness
from click.testing import CliRunner
from test_cli_json import job_with

from tidefleet.cli import main
from tidefleet.cloud import for_env

ROOT = Path(__file__).resolve().parents[1]
READER_LEFT = 141  # 128 + SIGPIPE (13)
# More than a pipe holds (64 KiB on Linux) and Python's buffer: the command is still writing
# when the reader leaves, so the closed pipe reaches it.
MANY_BYTES = 300_000


def tidefleet(*args: str) -> subprocess.Popen:
    env = {**os.environ, "TIDEFLEET_KICK_URL": "http://127.0.0.1:9/"}
    return subprocess.Popen([sys.executable, "-m", "tidefleet.cli", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip


def head_1(*args: str) -> tuple[bytes, int, str]:
    """`tidefleet ARGS | head -1`: (the line read, exit status, stderr)."""
    process = tidefleet(*args)
    line = process.stdout.readline()
    process.stdout.close()
    stderr = process.stderr.read().decode()
    return line, process.wait(timeout=120), stderr


@pytest.fixture
def h(tmp_path, aws):
    return Harness(tmp_path, aws)


def test_status_of_a_job_done_with_failures_read_by_head_exits_141_not_1(h):
    job_id = job_with(h, "many-failed", *[f"failed:{'x' * 5000} {n}" for n in range(60)])
    process = tidefleet("status", "--env", str(h.env_path), job_id, "--failed")
    out, err = process.communicate(timeout=120)
    assert len(out) > MANY_BYTES and process.returncode == 1, err  # read whole: the job's verdict
    line, code, stderr = head_1("status", "--env", str(h.env_path), job_id, "--failed")
    assert job_id.encode() in line
    assert code == READER_LEFT and stderr == "", stderr


def test_logs_read_by_head_exits_141_quietly(h):
    job_id = job_with(h, "chatty", "queued")
    stream = for_env(h.env).logs.stream("work", job_id, "000000", 1)
    for n in range(3000):
        stream.write(f"epoch {n} " + "." * 120)
    stream.close()
    line, code, stderr = head_1("logs", "--env", str(h.env_path), job_id)
    assert line.startswith(b"==> ")
    assert code == READER_LEFT and stderr == "", stderr


@pytest.mark.parametrize("args", [["--help"], ["status", "--help"], ["validate", "dev"],
                                  ["simulate", "TRACE", "--env", "bench", "--pool", "gpu"]], ids=" ".join)  # fmt: skip
def test_a_reader_gone_before_the_first_word_ends_every_command_with_141(args, tmp_path):
    """`tidefleet --help | true`: the pipe is closed before the command writes (it takes longer
    than that to start), so even a few lines meet it."""
    trace = tmp_path / "trace.csv"
    trace.write_text("submit_s,duration_s\n0,60\n10,30\n")
    process = tidefleet(*[str(trace) if a == "TRACE" else a for a in args])
    process.stdout.close()
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=120) == READER_LEFT and "Traceback" not in stderr, stderr


def test_status_help_lists_141_with_its_other_exit_statuses():
    text = " ".join(CliRunner().invoke(main, ["status", "--help"]).output.split())
    assert "141 when its reader leaves before the output ends (| head -1), as every tidefleet command" in text


def test_the_sandbox_read_by_head_exits_141_and_takes_its_moto_server_with_it(tmp_path):
    """Its lines go through its own rich console, whose closed pipe would exit 1: after `| head -1`
    it stops as on Ctrl-C (its emulator and nodes go) and ends with 141 like every command."""
    line, code, stderr = head_1("sandbox", "--items", "4", "--workdir", str(tmp_path / "run"))
    assert line.startswith(b"tidefleet sandbox: moto on http://127.0.0.1:")
    port = line.split(b"127.0.0.1:")[1].split()[0].decode()
    assert code == READER_LEFT and "Traceback" not in stderr, stderr
    left = subprocess.run(["pgrep", "-f", f"emulator.*-p {port}"], check=False, capture_output=True, text=True)
    assert left.stdout == "", left.stdout
