"""`tidefleet sandbox --train` end to end, as a user runs it (the real CLI in a subprocess): GPU
items on nodes of an emulated 4-GPU driver, two at a time per node on disjoint devices, and a
2-node training gang whose non-lead node gets a spot notice: the item goes back whole once (not a
failure), resumes from its saved step on a new pair of nodes, succeeds once, and the fleet goes
back to zero."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.sandbox


def test_gpu_items_share_nodes_on_their_own_devices_and_a_gang_survives_a_notice_on_a_member(tmp_path):
    run = subprocess.run(
        [sys.executable, "-m", "tidefleet.cli", "sandbox", "--train", "--time-limit", "200",
         "--workdir", str(tmp_path / "sandbox"), "--json"],
        capture_output=True, text=True, timeout=260, check=False,
    )  # fmt: skip
    assert run.stdout, f"no summary; exit {run.returncode}\n{run.stderr[-3000:]}"
    summary = json.loads(run.stdout)
    assert run.returncode == (0 if summary["ok"] else 2 if summary["time_limit_hit"] else 1), summary
    assert summary["gpu_items_succeeded"] == summary["gpu_items"] == 4
    assert summary["overlapping_pairs"] >= 1 and summary["devices_disjoint"]
    assert summary["gang_nodes"] == 2 and summary["ranks_on_distinct_nodes"] and summary["rendezvous_ok"]
    assert summary["billed_nodes"] == [2, 2], "each attempt billed on both its nodes: the lead's entry and the member's part"
    assert summary["noticed_node"] and (summary["interruptions"], summary["failures"]) == (1, 0)
    assert summary["resumed_from"] > 0 and summary["succeeded_once"] and summary["fleet_at_zero"]
    assert summary["ok"]


def test_train_refuses_an_environment_without_a_gang_queue_in_one_line():
    run = subprocess.run([sys.executable, "-m", "tidefleet.cli", "sandbox", "--train", "--env", "sandbox"],
                         capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert "--train needs a queue with nodes_per_item > 1" in run.stderr and "use --env sandbox-train" in run.stderr


@pytest.mark.parametrize("env_name", ["sandbox", "sandbox-train"])
def test_the_keep_lines_submit_items_the_first_queues_workload_takes(env_name, tmp_path):
    """The audit: `sandbox --train --keep` printed a submit of the demo's text files to the infer
    queue, whose workload takes `infer SECONDS EVENTS_FILE`: every item failed."""
    from tidefleet.config import load_environment
    from tidefleet.jobs import sdk
    from tidefleet.sandbox import run, train_work

    box = run.Sandbox.__new__(run.Sandbox)
    box.env = load_environment(env_name)
    lines = box.try_lines(tmp_path / "my-items.txt")
    assert f"--items {tmp_path / 'my-items.txt'}" in lines[0]
    items = list(sdk.read_items(tmp_path / "my-items.txt"))
    assert len(items) == 5
    for item in items:
        args = list(item.args)
        if env_name == "sandbox-train":
            assert not isinstance(train_work._arguments(args), str), args
        else:
            assert Path(args[0]).is_file(), args
