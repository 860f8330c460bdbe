"""`tidefleet sandbox` end to end, as a user runs it: the real CLI in a subprocess, a moto
server, the scaler, nodes booted from their rendered user-data running the real agent.

Every item must be accounted for: succeeded (with the workload's own record of it), or
failed by design with its reason; none lost, none run to success twice unless its node was
SIGKILLed after the work but before the report; and the fleet back at zero nodes.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tidefleet.sandbox.run import FAIL_EVERY

pytestmark = pytest.mark.sandbox
ITEMS = 40
DOOMED = {f"item-{i:04d}" for i in range(ITEMS) if i % FAIL_EVERY == FAIL_EVERY - 1}


def run_sandbox(tmp_path, *flags: str) -> dict:
    run = subprocess.run(
        [sys.executable, "-m", "tidefleet.cli", "sandbox", "--items", str(ITEMS), "--time-limit", "150",
         "--workdir", str(tmp_path / "sandbox"), "--json", *flags],
        capture_output=True, text=True, timeout=200, check=False,
    )  # fmt: skip
    assert run.stdout, f"no summary; exit {run.returncode}\n{run.stderr[-3000:]}"
    summary = json.loads(run.stdout)
    scaler_log = (tmp_path / "sandbox" / "scaler.log").read_text().splitlines()
    summary["why"] = {"notes": summary["notes"], "last scaler decisions": scaler_log[-4:]}  # shown on failure
    assert run.returncode == (0 if summary["ok"] else 1 if not summary["time_limit_hit"] else 2)
    return summary


def assert_every_item_accounted_for(summary: dict) -> None:
    assert summary["fleet_at_zero"] and not summary["time_limit_hit"], summary["why"]
    assert summary["unaccounted"] == {}
    assert summary["failed_unexpectedly"] == {} and summary["succeeded_unexpectedly"] == []
    assert set(summary["failed"]) == DOOMED
    assert all("not UTF-8 text" in reason for reason in summary["failed"].values())
    assert summary["succeeded"] == ITEMS - len(DOOMED)
    assert summary["duplicates_explained"], summary["duplicate_successes"]
    assert summary["ok"]


def test_a_short_job_runs_on_nodes_that_appear_and_go_back_to_zero(tmp_path):
    summary = run_sandbox(tmp_path)
    assert_every_item_accounted_for(summary)
    assert summary["duplicate_successes"] == {}  # nothing was killed, so nothing may run twice
    assert summary["peak_nodes"] >= 2
    assert summary["submit_to_first_start_s"] is not None and summary["last_finish_to_zero_s"] is not None


def test_chaos_kills_and_spot_notices_lose_no_item(tmp_path):
    summary = run_sandbox(tmp_path, "--chaos")
    assert summary["nodes_killed"] >= 1 and summary["spot_notices"] >= 1
    assert_every_item_accounted_for(summary)
