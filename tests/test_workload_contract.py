"""The workload contract as the README states it: its table of endings is `attempt.outcome`,
and its example workload, run by a real agent through a spot notice, resumes from its
checkpoint on another node and succeeds once. Both are read from README.md itself."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from agent_harness import Harness, Imds, wait_until

from tidefleet.agent.attempt import Outcome, Stop, outcome
from tidefleet.config import load_environment
from tidefleet.jobs import sdk

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()
SECTION = README[README.index("### Writing a workload"):]
SECTION = SECTION[: SECTION.index("\n## ")]

STOPS = {"no": None, "spot notice or drain": Stop.INTERRUPT, "job cancelled": Stop.CANCEL,
         "item timeout (SIGKILL)": Stop.TIMEOUT}  # fmt: skip
EXITS = {"0": [0], "not 0, or killed by a signal": [1, 3, 75, -9, -15], "any": [0, 1, -9],
         "not 0, or SIGKILL after the grace": [1, 75, -9, -15], "killed": [-9]}  # fmt: skip
DONE = {"written": [True], "not written": [False], "either": [False, True]}
RECORDED = {"succeeded": Outcome.SUCCEEDED, "failed": Outcome.FAILED, "handed back": Outcome.HANDED_BACK,
            "cancelled": Outcome.CANCELLED}  # fmt: skip


def contract_rows() -> list[list[str]]:
    table = SECTION[SECTION.index("| asked to stop |"):].split("\n\n")[0].splitlines()[2:]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in table]


def test_the_readme_table_is_the_rule_the_agent_applies():
    rows = contract_rows()
    assert len(rows) == 7
    for stop, exit_code, done, recorded in rows:
        expected = RECORDED[re.split(r"[:(]", recorded)[0].strip()]
        for code in EXITS[exit_code]:
            for completed in DONE[done]:
                assert outcome(STOPS[stop], code, completed) is expected, (stop, code, completed)


def test_stopping_midway_and_exiting_0_is_never_success():
    assert outcome(Stop.INTERRUPT, 0, completed=False) is Outcome.HANDED_BACK
    assert outcome(Stop.SUPERSEDED, 0, completed=True) is Outcome.DROPPED


ENV_TOML = """
region = "us-east-1"

[pools.cpu]
max = 2
command = "{python} {workload}"
instance_types = [{{ type = "c6i.large", weight = 1 }}]

[queues.work]
pool = "cpu"
max_retries = 0
item_timeout_s = 120
"""


@pytest.mark.moto
def test_the_readme_workload_resumes_from_its_checkpoint_after_a_spot_notice_and_succeeds_once(tmp_path, aws):
    example = re.search(r"```python\n(.*?)```", SECTION, re.DOTALL).group(1)
    assert "checkpoint.complete()" in example and "SystemExit(0)" not in example
    workload = tmp_path / "readme_workload.py"
    workload.write_text(example)
    h = Harness(tmp_path, aws)  # queues, table and log group for environment "t"
    h.env_path = tmp_path / "readme" / "t.toml"
    h.env_path.parent.mkdir()
    h.env_path.write_text(ENV_TOML.format(python=sys.executable, workload=workload))
    h.env = load_environment(str(h.env_path))
    imds = Imds()
    try:
        job = sdk.submit(h.env, "readme", "work", sdk.read_items([["x"]]), kick=False).job_id
        first = h.start_agent("node-spot", imds.url)
        wait_until(lambda: h.items(job)["000000"].status == "running", 30, "the item to start")
        wait_until(lambda: "starting at step 0" in "".join(line for _, line in sdk.log_lines(h.env, job)), 30,
                   "the workload's first output")
        imds.spot_action = {"action": "terminate", "time": "2030-01-01T00:00:00Z"}
        assert first.wait(timeout=30) == 0
        item = h.items(job)["000000"]
        assert (item.status, item.interruptions, item.failures) == ("queued", 1, 0), "handed back, not succeeded"
        saved = list((tmp_path / "checkpoints").rglob("progress.json"))
        assert len(saved) == 1 and '"step"' in saved[0].read_text()

        h.start_agent("node-b")
        item = wait_until(lambda: h.items(job)["000000"].status == "succeeded" and h.items(job)["000000"], 60,
                          "the other node to finish it")
        assert item.attempts == 2 and [e["outcome"] for e in item.history] == ["interrupted", "succeeded"]
        lines = [line for stream, line in sdk.log_lines(h.env, job) if stream.endswith("/2")]
        resumed_at = int(re.match(r"starting at step (\d+)", lines[0]).group(1))
        assert resumed_at > 0, "the second attempt resumed from the checkpoint"
    finally:
        imds.close()
        h.stop_agents()
