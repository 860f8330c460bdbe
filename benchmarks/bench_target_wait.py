"""`target_wait_s` against cost: the curve the `[queues.<name>]` docs show, on the tuning halves.

    python benchmarks/bench_target_wait.py [--waits 60,120,300] [--workloads genai,philly,...]

Replays the first half (the half `invoke bench` never scores) of every bench workload, the three
shipped traces and the three synthetic shapes, on its `environments/bench.toml` pool with the
`[scaler]` defaults, once per `target_wait_s`, and the baselines once. Prints a Markdown table:
cost, cost over the lower bound, p95 wait. All six take about 5 minutes on a 2-core machine.
"""

from __future__ import annotations

import argparse
import time

from tidefleet.config import load_environment
from tidefleet.sim.bench import ENV, TRACES_DIR, WORKLOADS, halves
from tidefleet.sim.run import simulate

BASELINES = ["keda", "clearml", "target-tracking"]
BY_KEY = {w.label.split(" (")[0].split()[0].lower(): w for w in WORKLOADS}  # genai, openb, philly, bursty-short, ...


def with_any_target_wait(env, seconds: int):
    """Every queue at `seconds`, unchecked: the benchmarks try targets past a queue's `max_wait_s`
    (bench_unseen's --keda-wait: up to keda's p95), which a deployable config refuses
    (`tidefleet.sim.run.with_target_wait`, behind `simulate --target-wait-s`, checks)."""
    queues = {name: q.model_copy(update={"target_wait_s": seconds}) for name, q in env.queues.items()}
    return env.model_copy(update={"queues": queues})


def waits_arg(text: str) -> list[int]:
    try:
        waits = [int(w) for w in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, comma-separated, e.g. 60,120,300 (got {text!r})") from None
    if any(w < 0 for w in waits):
        raise argparse.ArgumentTypeError(f"a wait target is 0 or more seconds (got {text!r})")
    return waits


def workloads_arg(text: str) -> list[str]:
    keys = text.split(",")
    if unknown := [k for k in keys if k not in BY_KEY]:
        raise argparse.ArgumentTypeError(f"unknown workload {', '.join(unknown)}; choose from {', '.join(BY_KEY)}")
    return keys


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--waits", type=waits_arg, default="60,120,300", help="target_wait_s values, comma-separated")
    parser.add_argument("--workloads", type=workloads_arg, default=",".join(BY_KEY),
                        help=f"which, comma-separated (default: all of {', '.join(BY_KEY)})")  # fmt: skip
    args = parser.parse_args()
    env = load_environment(ENV)
    print("| workload (pool) | policy | `target_wait_s` | cost $ | ÷ lower bound | p95 wait s |")
    print("|---|---|---|---|---|---|")
    started = time.perf_counter()
    for key in args.workloads:
        workload = BY_KEY[key]
        items = halves(workload.items(TRACES_DIR))[0]
        label = f"{workload.label}, first half ({workload.pool})"
        default = next(q.target_wait_s for q in env.queues.values() if q.pool == workload.pool)
        for wait in args.waits:
            (r,) = simulate(with_any_target_wait(env, wait), workload.pool, items, ["tidefleet"]).results
            mark = " (default)" if wait == default else ""
            print(f"| {label} | tidefleet | {wait}{mark} | {r.cost_usd:,.2f} | {r.cost_vs_lower_bound:.2f} | "
                  f"{r.wait_s['p95']:.0f} |", flush=True)  # fmt: skip
        for r in simulate(env, workload.pool, items, BASELINES).results:
            unfinished = f" ({r.items_unfinished} unfinished)" if r.items_unfinished else ""
            print(f"| {label} | {r.policy} | - | {r.cost_usd:,.2f}{unfinished} | {r.cost_vs_lower_bound:.2f} | "
                  f"{r.wait_s['p95']:.0f} |", flush=True)  # fmt: skip
    print(f"\n{time.perf_counter() - started:.0f}s")


if __name__ == "__main__":
    main()
