"""Nodes that cannot run items: launches held (scaling rule 14). Pure.

An agent that finds at start that its node cannot run items (GPUs the driver does not give, a
container pool's docker daemon that does not answer, the item user missing) takes nothing, says
why in its heartbeat (`Heartbeat.fault`) and is replaced like any idle draining node. Where the
cause is the node image or its setup, every replacement fails the same way, and the pool pays a
boot for each, for as long as work waits. So once `FAULTS_IN_A_ROW` nodes reported a fault with
no node booted after them running healthy, the pool launches nothing (not even for its min)
until the newest fault is `RETRY_AFTER_S` old; then one node tries at a time (none while a node
boots). A healthy node booted after the faults ends the hold (nodes in boot order: `in_a_row`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tidefleet.policy.model import NodeFault, NodeView

FAULTS_IN_A_ROW = 3
RETRY_AFTER_S = 600


@dataclass(frozen=True)
class FaultHold:
    launch: int  # nodes the pool may launch now: 0 or 1
    reason: str


def in_a_row(faults: Sequence[NodeFault], nodes: Sequence[NodeView]) -> list[NodeFault]:
    """The faults no healthy node came after: of nodes that booted after the newest node that
    reports and has none, oldest first. By boot, not by report: a faulted agent's restarts report
    again and again, and a broken node launched beside a healthy one came with it, not after.
    (An agent that does not say its boot: its launch for a healthy node, its report for a fault.)"""
    faulted = {f.node_id for f in faults}
    healthy_since = max((n.launched_at if n.booted_at is None else n.booted_at for n in nodes
                         if n.last_heartbeat is not None and n.id not in faulted), default=float("-inf"))  # fmt: skip
    return sorted((f for f in faults if (f.at if f.booted_at is None else f.booted_at) > healthy_since),
                  key=lambda f: (f.at, f.node_id))


def hold(pool: str, faults: Sequence[NodeFault], nodes: Sequence[NodeView], now: float) -> FaultHold | None:
    """None when the pool launches as usual; else how many nodes it may launch now, and why."""
    row = in_a_row(faults, nodes)
    if len(row) < FAULTS_IN_A_ROW:
        return None
    newest = row[-1]
    said = (f"pool {pool}: launches held: the last {len(row)} nodes could not run items (newest {newest.node_id}, "
            f"{max(0.0, now - newest.at):.0f}s ago: {newest.why}); fix the node image or setup, then redeploy")  # fmt: skip
    booting = sorted(n.id for n in nodes if n.state == "pending")
    if booting:
        return FaultHold(0, f"{said}; {', '.join(booting)} boots and tells whether it runs items")
    if now - newest.at < RETRY_AFTER_S:
        return FaultHold(0, f"{said}; one node tries again in {RETRY_AFTER_S - (now - newest.at):.0f}s")
    return FaultHold(1, f"{said}; one node tries again now")
