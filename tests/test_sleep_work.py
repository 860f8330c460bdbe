"""The calibration workload keeps the agent's checkpoint contract: asked to stop, it saves how long
it slept and exits interrupted (75); the next attempt sleeps only the rest and records the first
attempt's start, so the sandbox's waits and node time count a moved item once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from tidefleet.sandbox.sleep_work import EXIT_INTERRUPTED


def test_a_stopped_item_resumes_with_what_it_had_left_and_keeps_its_first_start(tmp_path):
    events, stop = tmp_path / "events.jsonl", tmp_path / "stop"
    env = {**os.environ, "TIDEFLEET_CHECKPOINT_URI": (tmp_path / "checkpoint").as_uri() + "/",
           "TIDEFLEET_STOP_FILE": str(stop), "TIDEFLEET_ITEM_ID": "000007", "TIDEFLEET_NODE_ID": "i-a"}  # fmt: skip
    first = subprocess.Popen([sys.executable, "-m", "tidefleet.sandbox.sleep_work", "3", str(events)], env=env)
    time.sleep(1.0)
    stop.touch()
    assert first.wait(10) == EXIT_INTERRUPTED and not events.exists()
    slept = json.loads((tmp_path / "checkpoint" / "sleep_work.json").read_text())["slept_s"]
    assert 0 < slept < 3
    stop.unlink()
    began = time.time()
    second = subprocess.run([sys.executable, "-m", "tidefleet.sandbox.sleep_work", "3", str(events)], env=env,
                            timeout=10, check=False)  # fmt: skip
    assert second.returncode == 0
    (line,) = map(json.loads, events.read_text().splitlines())
    assert line["item"] == "000007" and line["start"] < began <= line["began"]
    assert abs(line["end"] - line["began"] - (3 - slept)) < 0.5  # what the first attempt left, not 3 s again
