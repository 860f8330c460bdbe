"""Dollars per hour for the cost caps, from the configured prices (`InstanceType.price`).

Existing nodes cost what their own type and lifecycle cost. Units not launched yet are priced
conservatively, because the group (not the policy) picks the type: each unit at the most
expensive $/unit among the pool's types, on-demand for the share the group will buy on demand
(the on-demand base, then `on_demand_percent` of the rest rounded UP), spot for the remainder.
During a spot shortage every new unit is priced on-demand (the base is raised to cover them).
So the estimate may overshoot the real bill, never undershoot it.
"""

from __future__ import annotations

from dataclasses import dataclass

from tidefleet.config import Pool
from tidefleet.policy.model import NodeView, on_demand_units


@dataclass(frozen=True, slots=True)
class PoolPrices:
    """$/hour per node type and lifecycle, and the most expensive $/unit per lifecycle."""

    by_type: dict[tuple[str, bool], float]
    on_demand_unit: float
    spot_unit: float

    @classmethod
    def of(cls, pool: Pool) -> PoolPrices:
        # Config objects are frozen; the simulator asks ~160k times for the same pool. The
        # identity check makes a reused id() of a dead config harmless.
        cached = _PRICES.get(id(pool))
        if cached is not None and cached[0] is pool:
            return cached[1]
        if len(_PRICES) > 1024:
            _PRICES.clear()
        prices = cls._compute(pool)
        _PRICES[id(pool)] = (pool, prices)
        return prices

    @classmethod
    def _compute(cls, pool: Pool) -> PoolPrices:
        by_type = {
            (t.type, spot): t.price(spot) or 0.0 for t in pool.instance_types for spot in (False, True)
        }
        return cls(
            by_type=by_type,
            on_demand_unit=max(by_type[t.type, False] / t.weight for t in pool.instance_types),
            spot_unit=max(by_type[t.type, True] / t.weight for t in pool.instance_types),
        )

    def node(self, node: NodeView) -> float:
        own = self.by_type.get((node.instance_type, node.spot))
        if own is not None:
            return own
        # A type no longer in the config: assume the dearest unit price, never zero.
        return node.weight * (self.spot_unit if node.spot else self.on_demand_unit)


_PRICES: dict[int, tuple[Pool, PoolPrices]] = {}


@dataclass(frozen=True, slots=True)
class LaunchCost:
    """$/hour of launching `k` more units into a group that already holds `group_units`."""

    prices: PoolPrices
    group_units: int
    on_demand_units: int  # of group_units, bought on demand
    on_demand_base: int  # units the group buys on demand before the percentage applies
    on_demand_percent: int

    def __call__(self, k: int) -> float:
        on_demand_target = on_demand_units(self.group_units + k, self.on_demand_base, self.on_demand_percent)
        on_demand_new = min(k, max(0, on_demand_target - self.on_demand_units))
        return on_demand_new * self.prices.on_demand_unit + (k - on_demand_new) * self.prices.spot_unit

    def affordable(self, budget: float, upto: int) -> int:
        """The most units in [0, upto] whose launch costs at most `budget` (cost grows with k)."""
        if upto <= 0 or budget < 0:
            return 0
        if self(upto) <= budget:
            return upto
        low, high = 0, upto  # self(low) <= budget < self(high)
        while high - low > 1:
            mid = (low + high) // 2
            if self(mid) <= budget:
                low = mid
            else:
                high = mid
        return low
