"""Synthetic workload shapes, generated from a seed: workloads no tuning has seen.

The shipped traces are what the policy was developed on; these shapes are the questions a
user's workload asks that those traces may not: short items in bursts (boot time dominates),
rare large multi-GPU items among small ones (packing and fragmentation), and a steady stream
whose rate swings over the day (idle capacity at night). Each is a plain list of
`TraceItem`s, the same seed giving the same list on every machine (`random.Random(seed)`).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from tidefleet.sim.trace import TraceItem

DAY_S = 86400.0


def _lognormal(rng: random.Random, median_s: float, sigma: float) -> float:
    return round(median_s * math.exp(rng.gauss(0.0, sigma)), 1)


def bursty_short(rng: random.Random, days: float = 4.0) -> list[TraceItem]:
    """Bursts of short 1-GPU items: a burst every ~40 min (Poisson), 5-80 items each submitted
    within a minute, items ~30 s (lognormal, p99 ~2 min): shorter than a boot."""
    items, t = [], 0.0
    while True:
        t += rng.expovariate(1 / 2400.0)
        if t >= days * DAY_S:
            return items
        for _ in range(rng.randint(5, 80)):
            items.append(TraceItem(round(t + rng.uniform(0, 60), 1), _lognormal(rng, 30.0, 0.6), 1))


def rare_large(rng: random.Random, days: float = 7.0) -> list[TraceItem]:
    """1-GPU items of ~20 min at 6 an hour, and rarely large ones: 4 GPUs every ~3 h and
    8 GPUs every ~6 h, ~3 h each (lognormal): big items wait for a whole free node."""
    items = []
    for rate_per_h, gpus, median_s, sigma in ((6.0, 1, 1200.0, 1.0), (1 / 3, 4, 10800.0, 0.7), (1 / 6, 8, 10800.0, 0.7)):
        t = 0.0
        while (t := t + rng.expovariate(rate_per_h / 3600.0)) < days * DAY_S:
            items.append(TraceItem(round(t, 1), _lognormal(rng, median_s, sigma), gpus))
    return items


def diurnal_steady(rng: random.Random, days: float = 7.0) -> list[TraceItem]:
    """A steady Poisson stream of 1-GPU items (~8 min, lognormal), 40 an hour on average,
    swinging from 8 at night to 72 at midday (rate x (1 + 0.8 sin)), drawn by thinning."""
    peak_per_s = 40.0 * 1.8 / 3600.0
    items, t = [], 0.0
    while (t := t + rng.expovariate(peak_per_s)) < days * DAY_S:
        if rng.random() < (1 + 0.8 * math.sin(2 * math.pi * t / DAY_S)) / 1.8:
            items.append(TraceItem(round(t, 1), _lognormal(rng, 480.0, 0.8), 1))
    return items


KINDS = ("steady", "bursty", "diurnal", "batch")
GPU8_SLOT_SETS = ([1], [1, 2], [1, 2, 4], [1, 1, 1, 8], [2, 4])  # item sizes an 8-GPU pool's shapes draw from


def random_shape(rng: random.Random, *, slot_sets, kinds=KINDS[:3], max_items: int = 6000) -> tuple[list[TraceItem], str]:
    """One random workload (items in submit order, at most `max_items`) and its description, for
    the benchmarks that judge the defaults on shapes nothing was tuned on: log-normal run times
    (median 10 s to 2 h, sigma 0.2-1.2), item sizes drawn from one of `slot_sets`, 300-4,000 items
    over 1-5 days, arriving as one of `kinds`: a steady Poisson stream, bursts of up to 120 items
    within a minute, a stream swinging over the day, or 1-6 batches of 20-600 items submitted at
    once. The same rng state gives the same workload; `benchmarks/bench_moves.py`'s shapes are the
    first three kinds."""
    median = math.exp(rng.uniform(math.log(10), math.log(7200)))
    sigma = rng.uniform(0.2, 1.2)
    slots = rng.choice(list(slot_sets))
    kind = rng.choice(list(kinds))
    target, span = rng.randint(300, 4000), rng.uniform(1, 5) * DAY_S

    def item(t: float) -> TraceItem:
        return TraceItem(round(t, 1), max(1.0, round(median * math.exp(rng.gauss(0, sigma)), 1)), rng.choice(slots))

    items, t = [], 0.0
    if kind == "steady":
        while (t := t + rng.expovariate(target / span)) < span:
            items.append(item(t))
    elif kind == "bursty":
        per = rng.randint(3, 60)
        while (t := t + rng.expovariate(max(1, target / per) / span)) < span:
            items += [item(t + rng.uniform(0, 60)) for _ in range(rng.randint(1, 2 * per))]
    elif kind == "diurnal":
        peak = 1.8 * target / span
        while (t := t + rng.expovariate(peak)) < span:
            if rng.random() < (1 + 0.8 * math.sin(2 * math.pi * t / DAY_S)) / 1.8:
                items.append(item(t))
    else:
        for _ in range(rng.randint(1, 6)):
            at = rng.uniform(0, span)
            items += [item(at + rng.uniform(0, 5)) for _ in range(rng.randint(20, 600))]
    items = sorted(items, key=lambda i: i.submit_s)[:max_items]
    return items, f"{kind}, median {median:.0f} s, slots {slots}, {len(items)} items"


@dataclass(frozen=True)
class Shape:
    name: str
    pool: str  # the pool of environments/bench.toml it is replayed on
    make: Callable[[random.Random], list[TraceItem]]

    def items(self, seed: int) -> list[TraceItem]:
        """The shape's items for `seed`, sorted by submit time (stable)."""
        return sorted(self.make(random.Random(f"{self.name}/{seed}")), key=lambda i: i.submit_s)


SHAPES = {
    s.name: s
    for s in (
        Shape("bursty-short", "gpu", bursty_short),
        Shape("rare-large", "gpu8", rare_large),
        Shape("diurnal-steady", "gpu", diurnal_steady),
    )
}
