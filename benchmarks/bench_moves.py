"""Checkpoint-and-move on random 8-GPU workloads: what it saves, and against the baselines.

    python benchmarks/bench_moves.py [--shapes 20] [--first 0] [--max-items N] [--workers 2]

Draws workload shapes from a seed (`shape`: steady, bursty or diurnal arrivals, log-normal run
times with a median of 10 s to 2 h, 1-8 GPU items on `environments/bench.toml`'s `gpu8` pool;
drawn after checkpoint-and-move was built, and nothing was tuned on them) and replays each under
the shipped defaults, once as they are and once with the pool's single-node queues preemptible
and `checkpoint_and_move = true` (`tidefleet.sim.bench.with_moves`), and under the baselines.
Prints a Markdown row per shape and a summary: the mean and extreme change in cost, and on how
many shapes each variant is cheaper than every baseline.
"""

from __future__ import annotations

import random
from concurrent.futures import ProcessPoolExecutor

import shape_args

from tidefleet.config import load_environment
from tidefleet.sim.bench import with_moves
from tidefleet.sim.run import simulate
from tidefleet.sim.shapes import GPU8_SLOT_SETS, random_shape
from tidefleet.sim.trace import TraceItem

POOL = "gpu8"
BASELINES = ["keda", "clearml", "target-tracking"]


def shape(seed: int, max_items: int) -> tuple[list[TraceItem], str]:
    """One random workload (items in submit order) and its description."""
    return random_shape(random.Random(f"fuzz15/{seed}"), slot_sets=GPU8_SLOT_SETS, max_items=max_items)


def replay(seed: int, max_items: int) -> tuple[str, dict]:
    items, described = shape(seed, max_items)
    env = load_environment("bench")
    as_is = simulate(env, POOL, items, ["tidefleet", *BASELINES]).results
    moved = simulate(with_moves(env, POOL), POOL, items, ["tidefleet"]).results[0]
    return described, {"defaults": as_is[0], "moves": moved, **{r.policy: r for r in as_is[1:]}}


def main() -> None:
    args = shape_args.parse(__doc__.splitlines()[0], shapes=20, max_items=6000)
    seeds = range(args.first, args.first + args.shapes)
    print("| seed | shape | defaults ÷ bound (p95 s) | checkpoint-and-move ÷ bound (p95 s, moves) | change "
          "| cheapest baseline ÷ bound (p95 s) |")
    print("|---|---|---|---|---|---|")
    changes, wins = [], {"defaults": 0, "moves": 0}
    with ProcessPoolExecutor(args.workers) as pool:
        for seed, (described, r) in zip(seeds, pool.map(replay, seeds, [args.max_items] * len(seeds)), strict=True):
            best = min((r[b] for b in BASELINES), key=lambda b: b.cost_usd)
            d, m = r["defaults"], r["moves"]
            changes.append(m.cost_usd / d.cost_usd - 1)
            for name in wins:  # a baseline that leaves more unfinished did less of the work (bench.goal_line)
                wins[name] += all(r[name].cost_usd < r[b].cost_usd or r[b].items_unfinished > r[name].items_unfinished
                                  for b in BASELINES)  # fmt: skip
            print(f"| {seed} | {described} | {d.cost_vs_lower_bound:.2f} ({d.wait_s['p95']:.0f}) | "
                  f"{m.cost_vs_lower_bound:.2f} ({m.wait_s['p95']:.0f}, {m.items_interrupted}) | {changes[-1]:+.1%} | "
                  f"{best.policy} {best.cost_vs_lower_bound:.2f} ({best.wait_s['p95']:.0f}"
                  f"{f', {best.items_unfinished} unfinished' if best.items_unfinished else ''}) |", flush=True)
    print(f"\ncheckpoint-and-move against the defaults over {len(changes)} shapes: cost mean {sum(changes) / len(changes):+.1%}, "
          f"from {min(changes):+.1%} to {max(changes):+.1%}; cheaper than every baseline on {wins['moves']} "
          f"(the defaults alone: {wins['defaults']})")


if __name__ == "__main__":
    main()
