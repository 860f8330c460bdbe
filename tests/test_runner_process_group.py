"""An attempt's workload is its whole process group, as a systemd unit is its control group: the
attempt ends when the group has exited, not when its first process has, and what the workload
leaves in its group, or in a session of its own with the attempt's environment (torchrun's workers),
does not outlive it. And its output is cut into lines at a carriage return
too, a progress bar's. Real processes, real signals, the agent's own runner (`runner.Workload`)."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
from agent_harness import Harness, Imds, wait_until

from tidefleet.agent import runner
from tidefleet.agent.attempt import Attempt, Exited, Outcome, Signal, Started, Stop, StopAsked
from tidefleet.agent.runner import OutputLines, Workload
from tidefleet.config import Pool, Queue
from tidefleet.jobs import sdk
from tidefleet.jobs.sdk import ItemMessage
from tidefleet.jobs.spec import JobSpec, resolve

SHELL = Pool(instance_types=[{"type": "c6i.large"}], max=1, command="sh -c")

# A Python child under a shell that goes on after it (so the shell does not exec it): on SIGTERM
# the shell dies at once, the child saves its checkpoint (a second) and leaves, as
# `checkpoint.exit_interrupted()` does. argv: its pid file, its checkpoint file.
SAVES_ON_SIGTERM = """
import os, signal, sys, time
pid_file, saved = sys.argv[1:]
def save(*_):
    time.sleep(1)
    open(saved, "w").write("step 7")
    print("checkpoint saved", flush=True)
    sys.exit(75)
signal.signal(signal.SIGTERM, save)
open(pid_file, "w").write(str(os.getpid()))
print("training", flush=True)
time.sleep(600)
"""


class Lines:
    def __init__(self):
        self.lines: list[str] = []
        self.cut_before: list[bool] = []

    def write(self, line: str, *, cut_before: bool = False) -> None:
        self.lines.append(line)
        self.cut_before.append(cut_before)


def start(tmp_path: Path, script: str, *args: str) -> Workload:
    workload = Workload(tmp_path / "work" / "job-1" / "000000" / "1")
    workload.start(resolve(JobSpec(), Queue(pool="p"), SHELL), ItemMessage("job-1", "000000", [script, *args]), 1,
                   "file:///checkpoints/", checkpoint_root=None, user_name=None)  # fmt: skip
    return workload


def alive(pid: int) -> bool:
    try:  # a zombie is gone: nobody may be there to reap a process whose parent died
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0] not in "ZX"
    except (OSError, IndexError):
        return False


def pid_in(path: Path) -> int:
    return int(wait_until(lambda: path.exists() and path.read_text().strip(), 10, path.name))


@pytest.fixture
def pids():
    """Pid files of the processes a test starts; whatever is left of them is killed after it."""
    files: list[Path] = []
    yield files
    for path in files:
        if path.exists() and path.read_text():
            try:
                os.kill(int(path.read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass


def wrapper(tmp_path: Path, pids: list[Path]) -> tuple[Workload, Path, Path]:
    child, pid_file, saved = tmp_path / "train.py", tmp_path / "train.pid", tmp_path / "saved"
    child.write_text(SAVES_ON_SIGTERM)
    pids.append(pid_file)
    workload = start(
        tmp_path, f'{sys.executable} "$0" "$1" "$2"; echo "wrapper after $?"', child, pid_file, saved
    )
    return workload, pid_file, saved


def test_a_wrapper_scripts_child_saves_its_checkpoint_before_the_attempt_ends(tmp_path, pids, monkeypatch):
    """The spot notice's SIGTERM ends the shell at once; the item goes back when the attempt
    ends, and its next attempt resumes from what was saved by then."""
    monkeypatch.setattr(runner, "DRAIN_S", 0.1)  # the output read after the end: not the child's grace
    workload, pid_file, saved = wrapper(tmp_path, pids)
    pid_in(pid_file)
    workload.signal(Signal.STOP)
    lines = Lines()
    code, _, last_line = workload.wait(lines)
    assert saved.exists(), "the attempt ended before its checkpoint was saved"
    assert (code, last_line) == (-signal.SIGTERM, "checkpoint saved")
    assert lines.lines == ["training", "checkpoint saved"]
    assert workload.has_exited()


def test_what_a_stopped_workload_leaves_in_its_group_ends_with_the_agents_sigkill(tmp_path, pids):
    """Its grace is the agent's to bound: the SIGKILL at its end reaches the whole group, also
    once the shell that led it has exited."""
    workload, pid_file, _ = wrapper(tmp_path, pids)
    child = pid_in(pid_file)
    ended = stopped_then_killed(workload, child)
    assert not alive(child) and ended and ended[0][0] == -signal.SIGTERM


def stopped_then_killed(workload: Workload, child: int) -> list[tuple]:
    """Stop the workload while `child` cannot save (stopped: it takes longer than any grace); once
    its first process has died of the SIGTERM and the attempt still waits for `child`, the
    grace's end (SIGKILL). What `wait` returned, once it did."""
    os.kill(child, signal.SIGSTOP)
    workload.signal(Signal.STOP)
    ended: list[tuple] = []
    waiting = threading.Thread(target=lambda: ended.append(workload.wait(Lines())))
    waiting.start()
    wait_until(lambda: not alive(workload.proc.pid), 10, "the first process to die of the SIGTERM")
    assert alive(child) and not workload.has_exited()
    workload.signal(Signal.KILL)  # the drain's grace is over
    waiting.join(30)
    return ended


LEAVES_A_CHILD = """
sh -c 'echo $$ > "$1"; {trap} exec sleep 600 >&- 2>&-' child "$0" &
while [ ! -s "$0" ]; do sleep 0.05; done
echo done
"""


@pytest.mark.parametrize("trap", ["", "trap '' TERM;"], ids=["dies of SIGTERM", "ignores SIGTERM"])
def test_a_child_left_in_its_group_by_a_workload_that_ended_on_its_own_is_stopped_as_it_ends(
    tmp_path, pids, monkeypatch, trap
):
    """It would hold the slot's GPUs and memory under the next item, its folder deleted: SIGTERM,
    then SIGKILL, as systemd stops what a unit's main process left."""
    monkeypatch.setattr(runner, "LEFTOVER_KILL_S", 0.5)
    pid_file = tmp_path / "child.pid"
    pids.append(pid_file)
    workload = start(tmp_path, LEAVES_A_CHILD.format(trap=trap), pid_file)
    code, _, last_line = workload.wait(Lines())
    assert (code, last_line) == (0, "done")
    assert not alive(int(pid_file.read_text()))


def test_a_stop_asked_after_a_workload_ended_on_its_own_does_not_decide_its_outcome(tmp_path, pids):
    """A drain or a notice that comes while what it left is being stopped: it had succeeded, and
    handing it back would run it again."""
    pid_file = tmp_path / "child.pid"
    pids.append(pid_file)
    workload = start(tmp_path, LEAVES_A_CHILD.format(trap="trap '' TERM;"), pid_file)
    attempt = Attempt(timeout_s=60, cancel_grace_s=5)
    attempt.on(Started())
    threading.Timer(0.8, lambda: (attempt.on(StopAsked(Stop.INTERRUPT, time.monotonic())), workload.signal(Signal.STOP))).start()
    code, _, last_line = workload.wait(Lines())
    assert attempt.stop is Stop.INTERRUPT and workload.exited_at < attempt.stop_at
    (decided,) = attempt.on(Exited(code, workload.completed(), last_line, workload.exited_at))
    assert decided.outcome is Outcome.SUCCEEDED


def test_an_attempt_ends_even_if_its_group_outlives_sigkill(tmp_path, pids, monkeypatch):
    """A process stuck in the kernel (a hung driver or mount) that SIGKILL cannot end must not hold
    the slot and the item for ever: stood in for by a group that never reads as gone."""
    monkeypatch.setattr(runner, "LEFTOVER_KILL_S", 0.2)
    monkeypatch.setattr(runner, "KILLED_WAIT_S", 0.5)
    monkeypatch.setattr(runner, "group_alive", lambda pgid, tag=None: True)
    pid_file = tmp_path / "child.pid"
    pids.append(pid_file)
    workload = start(tmp_path, LEAVES_A_CHILD.format(trap=""), pid_file)
    ended = threading.Event()
    threading.Thread(target=lambda: (workload.wait(Lines()), ended.set()), daemon=True).start()
    assert ended.wait(30), "the attempt never ended"


def test_a_daemon_in_a_session_of_its_own_is_stopped_as_the_attempt_ends(tmp_path, pids, monkeypatch):
    """Out of the group (`setsid cmd &`) it still carries the attempt's environment: it would hold
    the slot's GPUs and memory under the next item, as one left in the group would."""
    monkeypatch.setattr(runner, "LEFTOVER_KILL_S", 0.5)
    pid_file = tmp_path / "daemon.pid"
    pids.append(pid_file)
    workload = start(tmp_path, """setsid sh -c 'echo $$ > "$0"; exec sleep 600' "$0" >/dev/null &
                                  while [ ! -s "$0" ]; do sleep 0.05; done""", pid_file)  # fmt: skip
    assert workload.wait(Lines())[0] == 0
    assert not alive(int(pid_in(pid_file)))


def test_a_daemon_that_dropped_the_attempts_environment_is_out_of_reach_and_holds_nothing(tmp_path, pids):
    """`env -i setsid cmd &`: nothing tells it from any other process of the node; its output is
    read for DRAIN_S more, not until it closes it."""
    pid_file = tmp_path / "daemon.pid"
    pids.append(pid_file)
    workload = start(tmp_path, """env -i setsid sh -c 'echo $$ > "$0"; exec sleep 600' "$0" &
                                  while [ ! -s "$0" ]; do sleep 0.05; done""", pid_file)  # fmt: skip
    assert workload.wait(Lines())[0] == 0
    assert alive(int(pid_in(pid_file)))


# torchrun's way: each worker in a session of its own (start_new_session), the launcher waiting on
# it; on SIGTERM the launcher passes it on, waits, and exits. argv: pid file, checkpoint file.
LAUNCHER = """
import subprocess, sys, signal
worker = subprocess.Popen([sys.executable, sys.argv[1], *sys.argv[2:]], start_new_session=True)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a launcher that leaves at once
sys.exit(worker.wait())
"""


def launched(tmp_path: Path, pids: list[Path]) -> tuple[Workload, Path, Path]:
    worker, launcher = tmp_path / "train.py", tmp_path / "launcher.py"
    worker.write_text(SAVES_ON_SIGTERM)
    launcher.write_text(LAUNCHER)
    pid_file, saved = tmp_path / "train.pid", tmp_path / "saved"
    pids.append(pid_file)
    return start(tmp_path, f'exec {sys.executable} "$0" "$1" "$2" "$3"', launcher, worker, pid_file, saved), pid_file, saved


def test_a_worker_in_a_session_of_its_own_gets_the_stop_and_saves_before_the_attempt_ends(tmp_path, pids, monkeypatch):
    """The audit's torchrun case: the stop reached the launcher only, and the attempt ended (the
    item handed back) while the worker had not been told, or still saved."""
    monkeypatch.setattr(runner, "DRAIN_S", 0.1)
    workload, pid_file, saved = launched(tmp_path, pids)
    pid_in(pid_file)
    workload.signal(Signal.STOP)
    workload.wait(Lines())
    assert saved.read_text() == "step 7", "the worker was not told to stop, or the attempt did not wait for its save"


def test_the_kill_reaches_a_worker_in_a_session_of_its_own_after_its_launcher_died(tmp_path, pids):
    """It kept the GPUs and wrote the item's checkpoint under the next attempt."""
    workload, pid_file, _ = launched(tmp_path, pids)
    worker = pid_in(pid_file)
    assert stopped_then_killed(workload, worker) and not alive(worker)


def test_torchrun_is_told_the_agents_grace_unless_the_job_says_otherwise(tmp_path):
    """torchrun SIGKILLs its workers 30 s after a SIGTERM by default: under AWS's 90-s grace the
    save was cut at 30."""
    script = 'echo "$TORCH_ELASTIC_SHUTDOWN_TIMEOUT"'
    for env, grace, said in (({}, 90.0, "90"), ({}, 14.5, "15"), ({"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "5"}, 90.0, "5")):
        workload = Workload(tmp_path / "work" / said / str(grace))
        pool = SHELL.model_copy(update={"env": env})
        workload.start(resolve(JobSpec(), Queue(pool="p"), pool), ItemMessage("job-1", "000000", [script]), 1,
                       "file:///checkpoints/", checkpoint_root=None, user_name=None, grace_s=grace)  # fmt: skip
        assert workload.wait(Lines())[2] == said


PROGRESS = r"""
import sys
for percent in range(0, 101, 10):  # tqdm's way: \r, the bar, no newline until it closes
    sys.stdout.write(f"\r{percent:3d}%|{'#' * (percent // 10):10s}|")
    sys.stdout.flush()
sys.stdout.write("\ndone\r\nlast words")
"""


def test_a_progress_bar_redrawn_with_carriage_returns_is_logged_update_by_update(tmp_path):
    """Not as one line holding every update (and growing for as long as the bar runs): the log
    shows the latest."""
    script = tmp_path / "progress.py"
    script.write_text(PROGRESS)
    workload = start(tmp_path, f'{sys.executable} "$0"', script)
    lines = Lines()
    code, _, last_line = workload.wait(lines)
    bars = [f"{p:3d}%|{'#' * (p // 10):10s}|" for p in range(0, 101, 10)]
    assert (code, last_line, lines.lines) == (0, "last words", [*bars, "done", "last words"])


def test_a_line_of_output_that_never_ends_is_kept_to_its_first_bytes(tmp_path):
    """Whatever a workload writes, the agent holds a bounded part of it, as an item log keeps the
    first characters of a long line."""
    huge = runner.MAX_LINE_BYTES * 40
    workload = start(tmp_path, f"head -c {huge} /dev/zero | tr '\\0' x; echo; echo after")
    lines = Lines()
    assert workload.wait(lines)[0] == 0
    assert lines.lines == ["x" * runner.MAX_LINE_BYTES, "after"]
    # Said to the item log as cut already: its marker then says "at least", not 49,577 of ~2.6 million.
    assert lines.cut_before == [True, False]
    from tidefleet.logstream import cut_line

    kept = cut_line(lines.lines[0], 16_000, cut_before=True)
    assert len(kept) <= 16_000 and "… [tidefleet: at least " in kept and kept.endswith(" more characters cut]")
    assert cut_line("short", 16_000, cut_before=True) == "short… [tidefleet: at least 0 more characters cut]"


@pytest.mark.parametrize("cut", range(1, 12))
def test_lines_are_the_same_wherever_the_pipe_cuts_the_output(cut):
    """A \r\n cut between two reads is one line end, not two."""
    output = b"a\r\nb\rc\n\rd\r\re"
    lines = OutputLines()
    got = lines.feed(output[:cut]) + lines.feed(output[cut:])
    assert (got, bytes(lines.pending)) == ([b"a", b"b", b"c", b"d"], b"e")


# -- through the agent ----------------------------------------------------------------------
ENV_TOML = """
region = "us-east-1"

[pools.cpu]
max = 1
command = "sh -c '{python} {workload} \\"$@\\"; echo wrapper after $?' wrapper"
env = {{ LEDGER = "{ledger}" }}
instance_types = [{{ type = "c6i.large", weight = 1 }}]

[queues.work]
pool = "cpu"
max_retries = {max_retries}
item_timeout_s = 120
"""

# Saves its checkpoint in 3 s, longer than the agent reads the output of an ended workload.
SLOW_SAVE = r"""
import json, os, time
from tidefleet.agent import checkpoint

def record(event):
    with open(os.environ["LEDGER"], "a") as f:
        f.write(json.dumps({"event": event, "attempt": checkpoint.attempt(), "at": time.time()}) + "\n")

record("start")
while not checkpoint.should_stop():
    time.sleep(0.05)
time.sleep(3)
checkpoint.save("progress", "saved")
record("checkpoint")
checkpoint.exit_interrupted()
"""


@pytest.mark.moto
def test_on_a_spot_notice_the_item_goes_back_only_once_the_wrapped_workload_has_saved_its_checkpoint(
    tmp_path, aws
):
    h = Harness(tmp_path, aws, env_toml=ENV_TOML, workload=SLOW_SAVE, max_retries=0)
    imds = Imds()
    try:
        job = sdk.submit(h.env, "wrapped", "work", sdk.read_items([["x"]]), kick=False).job_id
        agent = h.start_agent("node-spot", imds.url, TIDEFLEET_AGENT_GRACE_S="60")
        wait_until(lambda: h.events("start"), 30, "the workload to start")
        imds.spot_action = {"action": "terminate", "time": "2030-01-01T00:00:00Z"}
        assert agent.wait(timeout=60) == 0
        item = h.items(job)["000000"]
        assert (item.status, item.interruptions) == ("queued", 1)
        saved = h.events("checkpoint")
        assert saved, "the item went back before its checkpoint was saved"
        assert saved[0]["at"] <= item.history[-1]["ended_at"], json.dumps(item.history[-1])
    finally:
        imds.close()
        h.stop_agents()


def test_a_command_workload_finds_the_python_that_has_the_checkpoint_module(tmp_path):
    """A node's python3 is the image's (3.9 on Amazon Linux 2023, no tidefleet): $TIDEFLEET_PYTHON is the agent's."""
    script = '"$TIDEFLEET_PYTHON" -c "from tidefleet.agent import checkpoint; print(checkpoint.EXIT_INTERRUPTED)"'
    assert start(tmp_path, script).wait(Lines())[::2] == (0, "75")


def test_real_torchruns_workers_are_killed_with_their_attempt(tmp_path, pids):
    """torch 2.13's torchrun starts each worker with start_new_session: the agent's SIGKILL of the
    group ended torchrun alone, and its worker went on saving under the next attempt."""
    pytest.importorskip("torch", reason="PyTorch is not installed: .ci/run installs its CPU wheel for this test")
    worker, pid_file, saved = tmp_path / "train.py", tmp_path / "train.pid", tmp_path / "saved"
    worker.write_text(SAVES_ON_SIGTERM.replace("time.sleep(1)", "time.sleep(4)"))
    pids.append(pid_file)
    torchrun = f"{sys.executable} -m torch.distributed.run --standalone --nproc-per-node=1"
    workload = start(tmp_path, f'exec {torchrun} "$0" "$1" "$2"', worker, pid_file, saved)
    rank0 = pid_in(pid_file)
    ended: list[tuple] = []
    waiting = threading.Thread(target=lambda: ended.append(workload.wait(Lines())))
    waiting.start()
    workload.signal(Signal.STOP)
    time.sleep(1)  # a grace shorter than the save
    workload.signal(Signal.KILL)
    waiting.join(30)
    assert ended and not alive(rank0)
    time.sleep(4)
    assert not saved.exists(), "the worker outlived its attempt's SIGKILL"
