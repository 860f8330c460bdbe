"""The shipped defaults against every baseline on workloads named, not drawn.

    python benchmarks/bench_scenarios.py [--seed 0] [--scenarios render,merge,...] [--workers 2]

`bench_unseen.py` draws shapes from one generator (steady, bursty, diurnal or batch arrivals,
log-normal run times); these are the workloads the README opens with (a render of thousands of
items at once, a model merge every ten hours, GPU training bursts on weekdays) and shapes that
generator never draws: sparse items, office hours, two run-time modes, a heavy tail, items far
shorter than a boot, gangs among small items, batches days apart. Each is generated from
`--seed`, replayed on its pool of `environments/bench.toml` under the defaults and the baselines,
and judged as `invoke bench` judges a workload (`tidefleet.sim.bench.goal_line`). Nothing was
tuned on them.
"""

from __future__ import annotations

import argparse
import math
import random
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor

import shape_args

from tidefleet.config import DAY_S, load_environment
from tidefleet.sim.bench import goal_line
from tidefleet.sim.run import simulate
from tidefleet.sim.trace import TraceItem

H = 3600.0
POLICIES = ["tidefleet", "keda", "clearml", "target-tracking", "oracle"]


def _runs(rng: random.Random, median_s: float, sigma: float) -> float:
    return round(max(1.0, median_s * math.exp(rng.gauss(0, sigma))), 1)


def _stream(rng: random.Random, every_s: float, days: float, item: Callable[[float], TraceItem | None]) -> list[TraceItem]:
    """Poisson arrivals every `every_s` on average over `days`; `item(t)` makes one (None: none then)."""
    out, t = [], 0.0
    while (t := t + rng.expovariate(1 / every_s)) < days * DAY_S:
        if (made := item(t)) is not None:
            out.append(made)
    return out


def render(rng):
    return [TraceItem(round(rng.uniform(0, 30), 1), _runs(rng, 20, 0.3), 1) for _ in range(20_000)]


def merge(rng):
    return [TraceItem(round(k * 10 * H + rng.uniform(0, 600), 1), _runs(rng, 3 * H, 0.2), 8) for k in range(24)]


def training_bursts(rng):
    starts = [d * DAY_S + h * H for d in range(7) if d % 7 < 5 for h in (9, 14)]
    return [TraceItem(round(s + rng.uniform(0, 300), 1), _runs(rng, 2 * H, 0.3), 4) for s in starts for _ in range(10)]


def sparse(rng):
    return _stream(rng, 2 * H, 7, lambda t: TraceItem(round(t, 1), _runs(rng, 300, 0.3), 1))


def office_hours(rng):
    def item(t):
        weekday, hour = (t // DAY_S) % 7 < 5, (t % DAY_S) / H
        return TraceItem(round(t, 1), _runs(rng, 900, 0.4), 1) if weekday and 9 <= hour < 17 else None

    return _stream(rng, 60, 7, item)


def bimodal(rng):
    return _stream(rng, 30, 2, lambda t: TraceItem(round(t, 1), _runs(rng, 30 if rng.random() < 0.9 else 2 * H, 0.3), 1))


def heavy_tail(rng):
    return _stream(rng, 60, 2, lambda t: TraceItem(round(t, 1), round(min(60 * rng.paretovariate(1.2), 2 * DAY_S), 1), 1))


def trickle(rng):
    return _stream(rng, 20, 2, lambda t: TraceItem(round(t, 1), _runs(rng, 2, 0.3), 1))


def gangs(rng):
    big = _stream(rng, 2 * H, 5, lambda t: TraceItem(round(t, 1), _runs(rng, H, 0.3), 16))
    small = _stream(rng, 120, 5, lambda t: TraceItem(round(t, 1), _runs(rng, 600, 0.5), 1))
    return sorted(big + small, key=lambda i: i.submit_s)


def batches(rng):
    return [TraceItem(round(b * 2 * DAY_S + rng.uniform(0, 5), 1), _runs(rng, 600, 0.5), 1) for b in range(3) for _ in range(2000)]


# name: (pool, what it is, its items)
SCENARIOS: dict[str, tuple[str, str, Callable[[random.Random], list[TraceItem]]]] = {
    "render": ("gpu", "20,000 20-s items at once", render),
    "merge": ("gpu8", "an 8-GPU ~3-h merge every 10 h", merge),
    "training-bursts": ("gpu8", "10 4-GPU ~2-h items at 9:00 and 14:00 on weekdays", training_bursts),
    "sparse": ("gpu", "a 5-min item every ~2 h", sparse),
    "office-hours": ("gpu", "15-min items, one a minute, 9:00-17:00 on weekdays", office_hours),
    "bimodal": ("gpu8", "9 in 10 items 30 s, 1 in 10 2 h, one every 30 s", bimodal),
    "heavy-tail": ("gpu", "Pareto(1.2) run times from 60 s, one a minute", heavy_tail),
    "trickle": ("gpu", "2-s items every ~20 s", trickle),
    "gangs": ("gpu8", "2-node ~1-h gangs every ~2 h among 1-GPU 10-min items", gangs),
    "batches": ("gpu", "3 batches of 2,000 10-min items, 2 days apart", batches),
}


def replay(name: str, seed: int) -> str:
    pool, what, make = SCENARIOS[name]
    items = make(random.Random(f"scenario/{name}/{seed}"))
    report = simulate(load_environment("bench"), pool, items, POLICIES)
    ours = next(r for r in report.results if r.policy == "tidefleet")
    others = sorted((r for r in report.results if r.policy not in ("tidefleet", "oracle")), key=lambda r: r.cost_usd)
    cheapest = others[0]
    return (f"| {name} | {what} ({pool}, {len(items):,} items) | {ours.cost_usd:,.2f} | {ours.cost_vs_lower_bound:.2f} | "
            f"{ours.cost_vs_zero_wait:.2f} | {ours.wait_s['p95']:,.0f} | {cheapest.policy} {cheapest.cost_usd:,.2f} "
            f"(p95 {cheapest.wait_s['p95']:,.0f}{f', {cheapest.items_unfinished:,} unfinished' if cheapest.items_unfinished else ''}) "
            f"| {goal_line(report)} |")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0, help="draws each scenario's items (default 0)")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS),
                        help=f"comma-separated, of: {', '.join(SCENARIOS)} (default: all)")  # fmt: skip
    parser.add_argument("--workers", type=shape_args.at_least(1), default=2, help="processes (default 2)")
    args = parser.parse_args()
    names = [n for n in args.scenarios.split(",") if n]
    unknown = [n for n in names if n not in SCENARIOS] or ([] if names else ["(none given)"])
    if unknown:
        parser.error(f"--scenarios: unknown scenario {', '.join(unknown)}; choose from {', '.join(SCENARIOS)}")
    print("| scenario | workload | tidefleet $ | ÷ lower bound | ÷ zero-wait bound | p95 wait s | cheapest baseline $ | verdict |")
    print("|---|---|---|---|---|---|---|---|")
    with ProcessPoolExecutor(args.workers) as pool:
        lines = list(pool.map(replay, names, [args.seed] * len(names)))
    for line in lines:
        print(line)
    met = sum("| goal met" in line for line in lines)
    print(f"\ngoal met on {met} of {len(lines)} scenarios")


if __name__ == "__main__":
    main()
