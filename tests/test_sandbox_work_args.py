"""The sandbox's workload scripts, run by hand as the README and the sandbox's messages name them:
--help explains their arguments (exit 0), and bad arguments are one line with the usage (exit 2),
never a traceback; run as the agent runs them (a real process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

WORK = {
    "sleep_work": "usage: python -m tidefleet.sandbox.sleep_work SECONDS EVENTS_FILE",
    "train_work": "usage: python -m tidefleet.sandbox.train_work {infer SECONDS | train STEPS} EVENTS_FILE",
    "demo_work": "usage: python -m tidefleet.sandbox.demo_work INPUT_FILE",
}


def work(module: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", f"tidefleet.sandbox.{module}", *args], capture_output=True, text=True,
                          timeout=60, check=False, env={**os.environ, **env})  # fmt: skip


@pytest.mark.parametrize("flag", ["--help", "-h"])
@pytest.mark.parametrize(("module", "words"), [
    ("sleep_work", ["SECONDS", "EVENTS_FILE", "a number of seconds, 0 or more", "checkpoint"]),
    ("train_work", ["infer SECONDS EVENTS_FILE", "train STEPS EVENTS_FILE", "MASTER_ADDR", "CUDA_VISIBLE_DEVICES"]),
    ("demo_work", ["INPUT_FILE", "absolute path", "events.jsonl"]),
])  # fmt: skip
def test_help_explains_the_arguments_and_exits_0(module, words, flag):
    done = work(module, flag)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout.startswith(WORK[module] + "\n\n") and all(w in done.stdout for w in words), done.stdout


@pytest.mark.parametrize(("module", "args", "problem"), [
    ("sleep_work", [], "sleep_work: takes 2 arguments, SECONDS and EVENTS_FILE (got 0)"),
    ("sleep_work", ["3"], "sleep_work: takes 2 arguments, SECONDS and EVENTS_FILE (got 1)"),
    ("sleep_work", ["soon", "events.jsonl"], "sleep_work: SECONDS must be a number of seconds, 0 or more (got 'soon')"),
    ("sleep_work", ["-1", "events.jsonl"], "sleep_work: SECONDS must be a number of seconds, 0 or more (got '-1')"),
    ("sleep_work", ["nan", "events.jsonl"], "sleep_work: SECONDS must be a number of seconds, 0 or more (got 'nan')"),
    ("train_work", ["infer", "3"], "train_work: takes 3 arguments, infer SECONDS or train STEPS, then EVENTS_FILE (got 2)"),
    ("train_work", ["walk", "3", "e"], "train_work: the first argument is infer or train (got 'walk')"),
    ("train_work", ["infer", "x", "e"], "train_work: SECONDS must be a number of seconds, 0 or more (got 'x')"),
    ("train_work", ["train", "1.5", "e"], "train_work: STEPS must be a whole number, 0 or more (got '1.5')"),
    ("demo_work", [], "demo_work: takes 1 argument, INPUT_FILE (got 0)"),
    ("demo_work", ["/a", "/b"], "demo_work: takes 1 argument, INPUT_FILE (got 2)"),
])  # fmt: skip
def test_bad_arguments_are_one_line_with_the_usage_and_exit_2(module, args, problem, tmp_path):
    done = work(module, *args)
    assert (done.returncode, done.stdout) == (2, ""), done.stdout + done.stderr
    assert done.stderr == f"{problem}; {WORK[module]}\n"
    assert not any(tmp_path.iterdir())


def test_train_outside_a_gang_says_which_variables_the_agent_sets(tmp_path):
    unset = {k: "" for k in ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "TIDEFLEET_GANG_NODES")}
    done = work("train_work", "train", "5", str(tmp_path / "events.jsonl"), **unset)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == ("train_work: train runs as one node of a gang, and MASTER_ADDR, MASTER_PORT, NODE_RANK, "
                           "TIDEFLEET_GANG_NODES are not set; run it as an item of a queue with nodes_per_item > 1, "
                           "whose agent sets them\n")  # fmt: skip
    assert not (tmp_path / "events.jsonl").exists()


def test_an_inference_item_still_prints_its_devices_and_records_them(tmp_path):
    events = tmp_path / "events.jsonl"
    done = work("train_work", "infer", "0.1", str(events), CUDA_VISIBLE_DEVICES="2,3", TIDEFLEET_ITEM_ID="gpu-0")
    assert (done.returncode, done.stdout, done.stderr) == (0, "sees GPUs 2,3\n", "")
    (line,) = map(json.loads, events.read_text().splitlines())
    assert (line["event"], line["item"], line["devices"]) == ("gpu", "gpu-0", "2,3") and line["end"] - line["start"] >= 0.1
