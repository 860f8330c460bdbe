"""Every benchmark runs, at a tiny size, as a user would start it: a benchmark that no longer
runs is found here, not the next time someone wants its numbers. Sizes are for smoke only;
the numbers they print mean nothing at these sizes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SMOKE = [
    ("bench_agent.py", ["--items", "10"], "ratio agent/bare:"),
    ("bench_status.py", ["--total", "1000", "--items", "20", "--repeat", "1"], "from the counters"),
    ("bench_submit.py", ["--items", "20"], "resubmit 20 items"),
    ("bench_policy.py", ["--repeat", "1"], "ms"),
    ("bench_cold_import.py", ["--runs", "1"], "ms"),
    ("bench_sim.py", ["clearml"], "clearml"),  # the whole Philly trace, shipped in traces/
    ("bench_tick.py", ["--queues", "3", "--pools", "2", "--nodes", "2", "--rounds", "1"], "ratio tick/bare"),
    ("bench_target_wait.py", ["--waits", "120", "--workloads", "genai"], "| tidefleet | 120 (default) |"),
    ("bench_teams.py", ["--window", "2592000:2599200"], "| all | 544 GPUs (pool max) |"),
    ("bench_moves.py", ["--shapes", "1", "--max-items", "200", "--workers", "1"], "checkpoint-and-move against the defaults"),
    ("bench_unseen.py", ["--shapes", "2", "--max-items", "200", "--workers", "1"], "of 2 shapes"),
    ("bench_unseen.py", ["--first", "1002", "--shapes", "1", "--max-items", "200", "--workers", "1", "--keda-wait"],
     "with keda's p95 as target_wait_s, on the 1 shapes keda is cheaper"),
]


@pytest.mark.parametrize(("script", "args", "expect"), SMOKE, ids=[s[0] for s in SMOKE])
def test_the_benchmark_runs_at_a_tiny_size(script, args, expect):
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert expect in done.stdout and "Traceback" not in done.stderr


def test_bench_moves_refuses_zero_shapes_with_one_line():
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_moves.py"), "--shapes", "0"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 2 and "--shapes: must be at least 1 (got 0)" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("script", sorted(p.name for p in (ROOT / "benchmarks").glob("bench_*.py")))
def test_every_benchmark_explains_itself_on_help_rather_than_running(script):
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), "--help"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0 and done.stdout.startswith("usage:"), done.stdout[-2000:] + done.stderr[-2000:]


@pytest.mark.parametrize(("args", "message"), [
    (["--waits", "abc"], "argument --waits: expected seconds, comma-separated, e.g. 60,120,300 (got 'abc')"),
    (["--waits", "-5"], "argument --waits: a wait target is 0 or more seconds (got '-5')"),
    (["--workloads", "nope"], "argument --workloads: unknown workload nope; choose from genai, openb, philly"),
])  # fmt: skip
def test_bench_target_wait_refuses_bad_arguments_with_one_line(args, message):
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_target_wait.py"), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr
