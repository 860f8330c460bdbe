"""How fast the simulator replays the whole Philly trace (82k jobs, 110 days) per policy.

    python benchmarks/bench_sim.py [POLICY ...]      (default: tidefleet, clearml)

Prints wall seconds, CPU seconds (the machine is shared: CPU time is the steadier number),
jobs/s and decide() calls, plus the ratio to the clearml baseline run in the same process
(the engine alone, with a 5-minute poll and no policy cost to speak of).
"""

from __future__ import annotations

import argparse
import time

from tidefleet.config import load_environment
from tidefleet.sim.bench import TRACES_DIR
from tidefleet.sim.policies import POLICY_NAMES
from tidefleet.sim.run import simulate
from tidefleet.sim.trace import load_trace


def main(policies: list[str]) -> None:
    env = load_environment("bench")
    started = time.perf_counter()
    items = load_trace(TRACES_DIR / "philly_2017_jobs.csv")
    print(f"load: {time.perf_counter() - started:.2f}s for {len(items)} jobs")
    cpu_by_policy = {}
    for name in policies:
        wall, cpu = time.perf_counter(), time.process_time()
        report = simulate(env, "gpu8", items, [name])
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        cpu_by_policy[name] = cpu
        r = report.results[0]
        print(
            f"{name:16s} wall {wall:6.1f}s  cpu {cpu:6.1f}s  {len(items) / cpu:8,.0f} jobs/cpu-s  "
            f"cost ${r.cost_usd:,.0f}  p95 wait {r.wait_s['p95']:.0f}s"
        )
    if "clearml" in cpu_by_policy:
        for name, cpu in cpu_by_policy.items():
            print(f"{name}: {cpu / cpu_by_policy['clearml']:.1f}x the clearml run's CPU time")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("policies", nargs="*", metavar="POLICY",
                        help=f"policies to replay ({', '.join(POLICY_NAMES)}; default: tidefleet clearml)")  # fmt: skip
    policies = parser.parse_args().policies or ["tidefleet", "clearml"]
    if unknown := [p for p in policies if p not in POLICY_NAMES]:  # not choices=: Python 3.11 refuses none given
        parser.error(f"unknown policy {', '.join(unknown)}; choose from {', '.join(POLICY_NAMES)}")
    main(policies)
