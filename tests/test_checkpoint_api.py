"""What a workload imports (`tidefleet.agent.checkpoint`) beyond the README's example: a PyTorch
DataLoader with worker processes checkpoints on a spot notice through a real agent, a workload run
outside the agent checkpoints to a local folder it names, and `exit_interrupted()` without a stop
request says that it is a failure."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from agent_harness import Harness, Imds, wait_until

from tidefleet.agent import checkpoint
from tidefleet.agent.attempt import Outcome, Stop, outcome
from tidefleet.jobs import sdk

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()
SECTION = README[README.index("### Writing a workload") :]
SECTION = SECTION[: SECTION.index("\n## ")]
EXAMPLE = re.search(r"```python\n(.*?)```", SECTION, re.DOTALL).group(1)

# The item's one argument is the DataLoader's start method. Asked to stop, the loop draws 10 more
# batches before it saves (as one finishing a gradient accumulation would): the workers must still
# serve after the notice reached the whole process group.
DATALOADER = r"""
import sys, time
from torch.utils.data import DataLoader, Dataset
from tidefleet.agent import checkpoint

class Numbers(Dataset):
    def __len__(self):
        return 1_000_000

    def __getitem__(self, i):
        time.sleep(0.005)
        return i

if __name__ == "__main__":
    saved = checkpoint.load("step")
    step = int(saved) if saved else 0
    last = step + 40 if saved else None  # the resumed attempt finishes soon after
    print(f"starting at step {step}", flush=True)
    loader = DataLoader(Numbers(), batch_size=4, num_workers=2, multiprocessing_context=sys.argv[1],
                        worker_init_fn=checkpoint.ignore_stop)
    after_stop = 0
    for batch in loader:
        if checkpoint.should_stop():
            after_stop += 1
            if after_stop > 10:
                checkpoint.save("step", str(step))
                print(f"saved step {step}", flush=True)
                checkpoint.exit_interrupted()
        step += 1
        if step % 20 == 0:
            print(f"step {step}", flush=True)
        if step == last:
            break
    checkpoint.complete()
"""

ENV_TOML = """
region = "us-east-1"

[pools.cpu]
max = 2
command = "{python} {workload}"
env = {{ LEDGER = "{ledger}" }}
run_as_root = true
instance_types = [{{ type = "c6i.large", weight = 1 }}]

[queues.work]
pool = "cpu"
max_retries = {max_retries}
item_timeout_s = 300
"""


def logged(h: Harness, job: str) -> str:
    return "\n".join(line for _, line in sdk.log_lines(h.env, job))


@pytest.mark.moto
@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_a_dataloader_with_worker_processes_saves_on_a_notice_and_resumes(tmp_path, aws, start_method):
    pytest.importorskip("torch", reason="PyTorch is not installed: .ci/run installs its CPU wheel for it")
    assert all("worker_init_fn=checkpoint.ignore_stop" in text for text in (SECTION, DATALOADER))
    h = Harness(tmp_path, aws, env_toml=ENV_TOML, workload=DATALOADER, max_retries=0)
    imds = Imds()
    try:
        job = sdk.submit(h.env, "loader", "work", sdk.read_items([[start_method]]), kick=False).job_id
        first = h.start_agent("node-spot", imds.url)
        wait_until(lambda: "step 20" in logged(h, job), 120, "the loop to run")
        imds.spot_action = {"action": "terminate", "time": "2030-01-01T00:00:00Z"}
        assert first.wait(timeout=60) == 0
        item = h.items(job)["000000"]
        assert (item.status, item.interruptions, item.failures) == ("queued", 1, 0), logged(h, job)
        said = re.search(r"saved step (\d+)", logged(h, job))
        assert said, f"no checkpoint: {logged(h, job)[-600:]}"
        saved = int(said.group(1))
        assert saved > 20, "it saved the step the loop had reached"
        assert [p.read_text() for p in (tmp_path / "checkpoints").rglob("step")] == [str(saved)]

        h.start_agent("node-b")
        item = wait_until(lambda: (it := h.items(job)["000000"]).status == "succeeded" and it, 120, "the end")
        assert [e["outcome"] for e in item.history] == ["interrupted", "succeeded"]
        assert f"starting at step {saved}" in logged(h, job)
    finally:
        imds.close()
        h.stop_agents()


def python(*args: str, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess:
    """Python run as on a laptop: this environment without any variable the agent sets, plus `env`."""
    plain = {k: v for k, v in os.environ.items() if not k.startswith("TIDEFLEET_")}
    return subprocess.run([sys.executable, *args], cwd=cwd, env={**plain, **env}, capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip


def test_the_readme_workload_runs_outside_the_agent_and_names_its_local_checkpoint_folder(tmp_path):
    script = tmp_path / "readme_workload.py"
    script.write_text(EXAMPLE)
    stop = tmp_path / "stop"
    stop.touch()  # the stop file asked for, as the agent's notice would: it saves at once
    run = python(str(script), cwd=tmp_path, TIDEFLEET_STOP_FILE=str(stop))
    assert run.returncode == checkpoint.EXIT_INTERRUPTED and "starting at step 0" in run.stdout
    (line,) = run.stderr.splitlines()
    assert "TIDEFLEET_CHECKPOINT_URI is not set" in line and "TIDEFLEET_CHECKPOINT_URI=file://" in line
    folder = Path(re.search(r"checkpoints go to (\S+);", line).group(1))
    assert (folder / "progress.json").read_text() == '{"step": 0}'

    # The way the line gives to choose the folder, and resume from what a run saved there.
    (folder / "progress.json").write_text('{"step": 99}')
    run = python(str(script), cwd=tmp_path, TIDEFLEET_CHECKPOINT_URI=folder.as_uri() + "/")
    assert (run.returncode, run.stderr) == (0, "") and "starting at step 99" in run.stdout


SPAWNS = """
import multiprocessing, sys
from tidefleet.agent import checkpoint

def rank(n):
    checkpoint.save(f"rank-{n}", str(n))
    return sorted(p.name for p in __import__("pathlib").Path(checkpoint.checkpoint_uri()[7:]).iterdir())

if __name__ == "__main__":
    assert checkpoint.load("model.pt") is None  # nothing saved yet: no folder made for it
    checkpoint.save("rank-0", "0")
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        print(pool.map(rank, [1, 2])[-1])
"""


def test_a_local_run_makes_its_folder_at_its_first_save_and_the_processes_it_starts_share_it(tmp_path):
    script = tmp_path / "spawns.py"
    script.write_text(SPAWNS)
    (tmp_path / "tmp").mkdir()
    run = python(str(script), cwd=tmp_path, TMPDIR=str(tmp_path / "tmp"))
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "['rank-0', 'rank-1', 'rank-2']"  # one folder for all three processes
    assert len(run.stderr.splitlines()) == 1 and "checkpoints go to" in run.stderr  # named once
    (made,) = (tmp_path / "tmp").iterdir()
    only_loads = python("-c", "from tidefleet.agent import checkpoint; print(checkpoint.load('x'))",
                        TMPDIR=str(tmp_path / "tmp"))  # fmt: skip
    assert (only_loads.returncode, only_loads.stdout, only_loads.stderr) == (0, "None\n", "")
    assert list((tmp_path / "tmp").iterdir()) == [made]  # left no empty folder behind


IGNORES = """
import os, signal, sys, time
from tidefleet.agent import checkpoint
checkpoint.ignore_stop()
print("ready", flush=True)
for _ in range(2):
    time.sleep(1)
    print("alive", flush=True)
"""


@pytest.mark.parametrize("asked", [True, False], ids=["the agent's notice", "another SIGTERM"])
def test_ignore_stop_lives_through_the_agents_notice_only(tmp_path, asked):
    stop = tmp_path / "stop"
    if asked:
        stop.touch()  # the agent makes its stop file before it signals the group
    plain = {k: v for k, v in os.environ.items() if not k.startswith("TIDEFLEET_")}
    proc = subprocess.Popen([sys.executable, "-c", IGNORES], env={**plain, "TIDEFLEET_STOP_FILE": str(stop)},
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert proc.stdout.readline() == "ready\n"
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert (proc.returncode, out) == ((0, "alive\nalive\n") if asked else (-signal.SIGTERM, ""))


def test_a_workload_given_an_item_but_no_checkpoint_location_is_refused_not_sent_to_a_local_folder():
    run = python("-c", "from tidefleet.agent import checkpoint; checkpoint.load('x')", TIDEFLEET_ITEM_ID="a")
    assert run.returncode == 1
    assert "TIDEFLEET_CHECKPOINT_URI is not set though TIDEFLEET_ITEM_ID is" in run.stderr


def test_exit_interrupted_without_a_stop_request_says_it_is_a_failure_that_uses_a_retry(tmp_path):
    assert outcome(None, checkpoint.EXIT_INTERRUPTED, completed=False) is Outcome.FAILED
    assert outcome(Stop.INTERRUPT, checkpoint.EXIT_INTERRUPTED, completed=False) is Outcome.HANDED_BACK
    code = "from tidefleet.agent import checkpoint; checkpoint.exit_interrupted()"
    stop = tmp_path / "stop"
    unasked = python("-c", code, TIDEFLEET_STOP_FILE=str(stop))
    assert unasked.returncode == checkpoint.EXIT_INTERRUPTED
    assert unasked.stderr.splitlines() == [
        "tidefleet: exit_interrupted() but this process was not asked to stop: exit 75 counts as a failure that "
        + "uses a retry unless the agent asks the workload to stop before it ends"
    ]
    stop.touch()
    asked = python("-c", code, TIDEFLEET_STOP_FILE=str(stop))
    assert (asked.returncode, asked.stderr) == (checkpoint.EXIT_INTERRUPTED, "")
    doc = " ".join(checkpoint.exit_interrupted.__doc__.split())
    assert "without a stop request this is a failure that uses a retry" in doc
