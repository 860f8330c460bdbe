"""The verdict line `invoke bench` and bench_seeds print per workload (`tidefleet.sim.bench.goal_line`)."""

from __future__ import annotations

from types import SimpleNamespace

from tidefleet.sim.bench import goal_line
from tidefleet.sim.run import PolicyResult

BOUND = 24.06


def result(policy: str, cost: float, p95: float, unfinished: int = 0) -> PolicyResult:
    return PolicyResult(policy, cost, 0.0, 0.0, {"p50": 0.0, "p95": p95, "p99": p95, "max": p95}, 0.0, 100,
                        unfinished, 0, 0, 0.0, 0, 0, 0, BOUND, cost / BOUND)  # fmt: skip


def verdict(*results: PolicyResult) -> str:
    return goal_line(SimpleNamespace(results=list(results)))


def test_a_cost_just_over_the_goal_never_reads_as_the_goal_itself():
    """GenAI LoRA's held-out half at $30.16 against a $24.06 bound is 1.2535x: two decimals said
    'cost is 1.25x the lower bound (> 1.25x)'."""
    assert verdict(result("tidefleet", 30.16, 94), result("keda", 38.31, 138)) == (
        "goal NOT met: cost is 1.254x the lower bound (> 1.25x)")


def test_a_cheaper_baseline_counts_unless_it_leaves_more_work_unfinished():
    assert verdict(result("tidefleet", 27.0, 60), result("keda", 26.0, 900)) == (
        "goal NOT met: keda is cheaper ($26.00 vs $27.00)")
    assert verdict(result("tidefleet", 27.0, 60), result("keda", 26.0, 900, unfinished=3)) == (
        "goal met (not like for like: keda is cheaper ($26.00 vs $27.00) but leaves 3 items unfinished)")
    assert verdict(result("tidefleet", 27.0, 60), result("clearml", 90.0, 12)) == (
        "goal NOT met: clearml has a lower p95 wait (12s vs 60s)")


def test_a_lower_p95_wait_within_a_second_says_by_how_much():
    """An 8-GPU bench_scenarios shape: clearml's p95 0.0 s against tidefleet's 0.4 s read
    'lower p95 wait (0s vs 0s)'."""
    assert verdict(result("tidefleet", 24.06, 0.39999999999417923), result("clearml", 33.0, 0.0)) == (
        "goal NOT met: clearml has a lower p95 wait (0.0s vs 0.4s)")
    assert verdict(result("tidefleet", 24.06, 47.4), result("clearml", 33.0, 44.6)) == (
        "goal NOT met: clearml has a lower p95 wait (45s vs 47s)")
