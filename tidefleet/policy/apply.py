"""Apply decisions to a fleet view the way the cloud would at once: a pure helper for the
simulator and the tests.

Terminated nodes leave the group (terminate with decrement), desired and the on-demand base
take their new values. Launching nodes for the new desired is the cloud's (or simulator's)
job, not this function's. Applying the same decisions twice gives the same fleet.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from tidefleet.policy.model import FleetView, PoolDecision, PoolView


def apply(fleet: FleetView, decisions: Iterable[PoolDecision]) -> FleetView:
    by_pool = {d.pool: d for d in decisions}
    return replace(fleet, pools=tuple(_apply_pool(p, by_pool.get(p.name)) for p in fleet.pools))


def _apply_pool(pool: PoolView, decision: PoolDecision | None) -> PoolView:
    if decision is None:
        return pool
    gone = set(decision.terminate)
    return replace(
        pool,
        nodes=tuple(n for n in pool.nodes if n.id not in gone),
        desired=decision.desired,
        on_demand_base=pool.on_demand_base if decision.on_demand_base is None else decision.on_demand_base,
    )
