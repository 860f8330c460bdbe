"""`target_wait_s` against cost: the curve the `[queues.<name>]` docs show, on the tuning halves.

    python benchmarks/bench_target_wait.py [--waits 60,120,300]

Replays the first half of the GenAI LoRA trace and of the bursty-short synthetic shape (the
halves `invoke bench` never scores) on `environments/bench.toml`'s `gpu` pool with the
`[scaler]` defaults, once per `target_wait_s`, and the baselines once. Prints a Markdown
table: cost, cost over the lower bound, p95 wait.
"""

from __future__ import annotations

import argparse
import time

from tidefleet.config import load_environment
from tidefleet.sim.bench import SHAPE_SEED, TRACES_DIR, halves
from tidefleet.sim.run import simulate
from tidefleet.sim.shapes import SHAPES
from tidefleet.sim.trace import load_trace

BASELINES = ["keda", "clearml", "target-tracking"]


def with_target_wait(env, seconds: int):
    queues = {name: q.model_copy(update={"target_wait_s": seconds}) for name, q in env.queues.items()}
    return env.model_copy(update={"queues": queues})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--waits", default="60,120,300", help="target_wait_s values, comma-separated")
    waits = [int(w) for w in parser.parse_args().waits.split(",")]
    env = load_environment("bench")
    workloads = {
        "GenAI LoRA (first half)": halves(load_trace(TRACES_DIR / "alibaba_genai_lora_2024_requests.csv"))[0],
        f"bursty-short, seed {SHAPE_SEED} (first half)": halves(SHAPES["bursty-short"].items(SHAPE_SEED))[0],
    }
    print("| workload | policy | `target_wait_s` | cost $ | ÷ lower bound | p95 wait s |")
    print("|---|---|---|---|---|---|")
    started = time.perf_counter()
    for label, items in workloads.items():
        for wait in waits:
            (r,) = simulate(with_target_wait(env, wait), "gpu", items, ["tidefleet"]).results
            default = " (default)" if wait == env.queues["gpu"].target_wait_s else ""
            print(f"| {label} | tidefleet | {wait}{default} | {r.cost_usd:,.2f} | {r.cost_vs_lower_bound:.2f} | "
                  f"{r.wait_s['p95']:.0f} |", flush=True)  # fmt: skip
        for r in simulate(env, "gpu", items, BASELINES).results:
            print(f"| {label} | {r.policy} | - | {r.cost_usd:,.2f} | {r.cost_vs_lower_bound:.2f} | "
                  f"{r.wait_s['p95']:.0f} |", flush=True)  # fmt: skip
    print(f"\n{time.perf_counter() - started:.0f}s")


if __name__ == "__main__":
    main()
