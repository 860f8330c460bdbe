"""When a waiting item preempts at a pool's max (README "Preemption"): the scaler marks attempts
once it counts the pool short (scaling rule 1a, the count that decides launches), which credits
running items with the turnover their queue's mean item time promises (two boots while none of
its items finished) within their queue's target_wait_s; an item that waited its own target less a
boot (at least a boot) gets slots whatever turnover promises."""

from __future__ import annotations

import pytest

from tidefleet.config import parse_environment
from tidefleet.policy import decide
from tidefleet.policy.model import FleetView, NodeView, PoolView, QueueView, RunView

NOW = 100_000.0
BOOT_S = 60  # the default boot_estimate_s
TARGET_S = 120  # the default target_wait_s


def preempts(waited_s: float, batch_mean_s: float | None, waiting: int, targets: tuple[int, int]) -> bool:
    """One node of 4 slots at the pool's max, each running an hour-old attempt of preemptible queue
    batch; one item of queue urgent (priority 50) waits. `targets`: urgent's and batch's target_wait_s."""
    env = parse_environment({
        "region": "us-east-1",
        "pools": {"cpu": {"max": 1, "slots_per_unit": 4, "command": "work", "instance_types": [{"type": "c6i.large"}]}},
        "queues": {"urgent": {"pool": "cpu", "priority": 50, "target_wait_s": targets[0]},
                   "batch": {"pool": "cpu", "priority": 1, "preemptible": True, "target_wait_s": targets[1]}},
    }, name="t")  # fmt: skip
    node = NodeView("n1", "c6i.large", 1, 4, True, "running", NOW - 7200, busy_slots=4, last_heartbeat=NOW - 2,
                    runs=tuple(RunView(f"b/{i}/1", "batch", NOW - 3600, 1) for i in range(4)))  # fmt: skip
    queues = (
        QueueView("urgent", "cpu", 50, 1, 1, 0, oldest_age_s=waited_s, target_wait_s=targets[0]),
        QueueView("batch", "cpu", 1, 1, waiting, 4, mean_item_s=batch_mean_s, target_wait_s=targets[1],
                  oldest_age_s=5.0 if waiting else None),
    )  # fmt: skip
    (decision,) = decide(env, FleetView((PoolView("cpu", (node,), 1, 0),), queues), NOW)
    return any(keys for _, keys in decision.preempt)


DEFAULTS, PREEMPTIBLE_AT_0, URGENT_AT_0 = (TARGET_S, TARGET_S), (TARGET_S, 0), (0, TARGET_S)
# (case, batch's mean item s, batch items waiting, targets, preempts at the first tick)
CASES = [
    ("behind items known to run long, a waiting item preempts at the first tick", 3000, 0, DEFAULTS, True),
    ("...also when the preemptible queue has a backlog of its own", 3000, 2, DEFAULTS, True),
    ("items whose finished ones ran 90 s, with a backlog of their own, are expected to turn over: it waits",
     90, 2, DEFAULTS, False),
    ("target_wait_s = 0 on the preemptible queue counts its turnover within a boot only: at the first tick",
     90, 2, PREEMPTIBLE_AT_0, True),
    ("...unless its items are expected to end within a boot", BOOT_S, 2, PREEMPTIBLE_AT_0, False),
    ("target_wait_s = 0 on the waiting item's queue only bounds its wait to a boot", 90, 2, URGENT_AT_0, False),
]  # fmt: skip


@pytest.mark.parametrize(("case", "mean", "waiting", "targets", "at_once"), CASES, ids=[c[0] for c in CASES])
def test_a_waiting_item_preempts_once_the_scaler_counts_the_pool_short(case, mean, waiting, targets, at_once):
    assert preempts(0.0, mean, waiting, targets) is at_once
    if not at_once:  # it waits its target less a boot (at least a boot), and then preempts
        bound = max(BOOT_S, targets[0] - BOOT_S)
        assert [preempts(bound + d, mean, waiting, targets) for d in (-1, 0)] == [False, True]
