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
    ("bench_status.py", ["--total", "1000", "--items", "20", "--repeat", "1"], "ratio read/stamp"),
    ("bench_submit.py", ["--items", "20"], "resubmit 20 items"),
    ("bench_policy.py", ["--repeat", "1"], "ms"),
    ("bench_cold_import.py", ["--runs", "1"], "ms"),
    ("bench_sim.py", ["clearml"], "clearml"),  # the whole Philly trace, shipped in traces/
    ("bench_tick.py", ["--queues", "3", "--pools", "2", "--nodes", "2", "--rounds", "1"], "ratio tick/bare"),
    ("bench_target_wait.py", ["--waits", "120", "--workloads", "genai"], "| tidefleet | 120 (default) |"),
    ("bench_teams.py", ["--window", "2592000:2599200"], "| all | 544 GPUs (pool max) |"),
    ("bench_moves.py", ["--shapes", "1", "--max-items", "200", "--workers", "1"], "checkpoint-and-move against the defaults"),
    ("bench_unseen.py", ["--shapes", "2", "--max-items", "200", "--workers", "1"], "of 2 shapes"),
    ("bench_seeds.py", ["--seeds", "2", "--workloads", "bursty-short", "--workers", "1"], "of 2 seeds"),
    ("bench_unseen.py", ["--first", "1002", "--shapes", "1", "--max-items", "200", "--workers", "1", "--keda-wait"],
     "with keda's p95 as target_wait_s, on the 1 shapes keda is cheaper"),
    ("bench_unseen.py", ["--first", "1039", "--shapes", "1", "--max-items", "200", "--workers", "1", "--clearml-idle"],
     "on the 1 shapes where only a costlier baseline waits less: cheaper than every quicker one on 1"),
    ("bench_scenarios.py", ["--scenarios", "sparse,merge", "--workers", "1"], "of 2 scenarios"),
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


DEGENERATE = [
    ("bench_agent.py", ["--rounds", "0"], "argument --rounds: must be at least 1 (got 0)"),
    ("bench_agent.py", ["--items", "0"], "argument --items: must be at least 1 (got 0)"),
    ("bench_status.py", ["--items", "0", "--total", "10", "--repeat", "1"], "argument --items: must be at least 1 (got 0)"),
    ("bench_status.py", ["--repeat", "0"], "argument --repeat: must be at least 1 (got 0)"),
    ("bench_status.py", ["--total", "-1"], "argument --total: must be at least 1 (got -1)"),
    ("bench_cold_import.py", ["--runs", "0"], "argument --runs: must be at least 1 (got 0)"),
    ("bench_policy.py", ["--repeat", "0"], "argument --repeat: must be at least 1 (got 0)"),
    ("bench_policy.py", ["--repeat", "many"], "argument --repeat: expected a whole number, at least 1 (got 'many')"),
    ("bench_submit.py", ["--rounds", "0"], "argument --rounds: must be at least 1 (got 0)"),
    ("bench_submit.py", ["--threads", "0"], "argument --threads: must be at least 1 (got 0)"),
    ("bench_tick.py", ["--pools", "0"], "argument --pools: must be at least 1 (got 0)"),
    ("bench_tick.py", ["--rounds", "0"], "argument --rounds: must be at least 1 (got 0)"),
    ("bench_tick.py", ["--nodes", "-1"], "argument --nodes: must be at least 0 (got -1)"),
    ("bench_teams.py", ["--window", "abc"], "bench_teams.py: error: --window: expected START:END in seconds, e.g. 0:86400 (got 'abc')"),
    ("bench_teams.py", ["--window", "5:1"], "bench_teams.py: error: --window: END must be after START (got '5:1')"),
    ("bench_moves.py", ["--workers", "0"], "argument --workers: must be at least 1 (got 0)"),
    ("bench_seeds.py", ["--seeds", "0"], "argument --seeds: must be at least 1 (got 0)"),
    ("bench_scenarios.py", ["--workers", "0"], "argument --workers: must be at least 1 (got 0)"),
    ("bench_scenarios.py", ["--scenarios", "nope"], ("--scenarios: unknown scenario nope; choose from render, merge, "
                                                     "training-bursts, sparse, office-hours, bimodal, heavy-tail, "
                                                     "trickle, gangs, batches")),
    ("bench_seeds.py", ["--workloads", "nope"], ("argument --workloads: unknown workload nope; choose from genai, openb, "
                                                 "philly, bursty-short, rare-large, diurnal-steady")),
]


@pytest.mark.parametrize(("script", "args", "message"), DEGENERATE, ids=[f"{s} {' '.join(a)}" for s, a, _ in DEGENERATE])
def test_a_degenerate_count_or_window_is_refused_in_one_line_before_anything_runs(script, args, message):
    """Zero rounds, runs or repeats divided by zero or took the median of nothing, after starting
    moto; a bad --window ended in a traceback whose last line was the right message."""
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 2 and done.stdout == "", done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stderr.splitlines()[-1].endswith(message) and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("usage: ") and "moto" not in done.stderr, done.stderr


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
