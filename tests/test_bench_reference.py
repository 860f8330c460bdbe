"""bench_unseen's wait-free reference schedule (`duration_blind`), on workloads small enough to
bill by hand: every item starts at its submit, on the fullest node with room, else on the node
idle the shortest time (billed the gap, at most a boot), else on a new node (billed a boot)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tidefleet.config import load_environment
from tidefleet.sim.run import cheapest_slot_hour, default_timing
from tidefleet.sim.trace import TraceItem

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from bench_unseen import duration_blind  # the benchmarks are scripts, not a package


@pytest.fixture(scope="module")
def env():
    return load_environment("bench")


def node_seconds(env, pool: str, usd: float) -> float:
    price, slots = cheapest_slot_hour(env, pool)
    return usd / (price * slots) * 3600.0


def test_items_that_fit_one_node_together_share_it_and_bill_one_boot(env):
    boot = default_timing(env).boot_s
    items = [TraceItem(0, 100, 1), TraceItem(10, 200, 2), TraceItem(20, 50, 4)]
    assert node_seconds(env, "gpu8", duration_blind(env, "gpu8", items)) == pytest.approx(boot + 210)


def test_a_node_idle_shorter_than_a_boot_is_kept_for_the_next_item_and_billed_the_gap(env):
    boot = default_timing(env).boot_s
    soon = [TraceItem(0, 10, 1), TraceItem(10 + boot / 2, 10, 1)]
    assert node_seconds(env, "gpu", duration_blind(env, "gpu", soon)) == pytest.approx(boot + 10 + boot / 2 + 10)
    late = [TraceItem(0, 10, 1), TraceItem(10 + 3 * boot, 10, 1)]
    assert node_seconds(env, "gpu", duration_blind(env, "gpu", late)) == pytest.approx(2 * (boot + 10))


def test_an_item_goes_to_the_fullest_busy_node_with_room_before_an_idle_one(env):
    boot = default_timing(env).boot_s  # 45 s: the gaps below are shorter
    items = [
        TraceItem(0, 50, 8),  # node 1, full until 50, then idle
        TraceItem(1, 1000, 2),  # node 2 (6 free)
        TraceItem(2, 1000, 4),  # node 2 (2 free)
        TraceItem(60, 500, 4),  # no busy node has 4 free: node 1 again, idle 10 s (billed), 4 free
        TraceItem(70, 500, 2),  # nodes 1 (4 free) and 2 (2 free) fit: the fullest, node 2
    ]
    first = boot + 50 + 10 + (560 - 60)
    second = boot + (1002 - 1)
    assert node_seconds(env, "gpu8", duration_blind(env, "gpu8", items)) == pytest.approx(first + second)


def test_an_item_of_no_time_holds_no_node(env):
    assert duration_blind(env, "gpu", [TraceItem(0, 0, 1)]) == 0.0


def test_a_baseline_that_leaves_work_unfinished_counts_neither_as_cheaper_nor_as_quicker():
    """The goal: cheaper than every baseline at an equal or better p95 wait, a baseline that leaves
    work unfinished not counting; a tie in cost counts against tidefleet."""
    from bench_unseen import BASELINES, misses

    from tidefleet.sim.run import PolicyResult

    def result(policy, cost, p95, unfinished=0):
        return PolicyResult(policy, cost, 1.0, 0.0, {"p50": 0.0, "p95": p95, "p99": p95, "max": p95}, 1.0, 10, unfinished,
                            0, 0, 0.0, 0, 0, 1, 1.0, 1.0)  # fmt: skip

    ours = {"tidefleet": result("tidefleet", 10.0, 60.0)}
    quick_but_unfinished = {b: result(b, 20.0, 60.0) for b in BASELINES} | {"clearml": result("clearml", 20.0, 5.0, 3)}
    assert misses(ours | quick_but_unfinished) == ([], [])
    tie = {b: result(b, 20.0, 60.0) for b in BASELINES} | {"keda": result("keda", 10.0, 900.0)}
    assert [b.policy for b in misses(ours | tie)[0]] == ["keda"]
