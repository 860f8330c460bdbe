"""Time one `decide()` at cloud-function scale, then with each dimension doubled.

    python benchmarks/bench_policy.py [--repeat 9]

Baseline: 1,000 queues / 100 pools / 10,000 nodes, with an environment cost cap and a pool
cost cap on every fourth pool, so every rule runs: idle scale-in with per-node reasons, growth,
boot timeouts, spot shortage, the priority budget. Prints the median of `--repeat` runs
per shape and its ratio to the baseline measured in the same process.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import shape_args

from tidefleet.config import Environment, parse_environment
from tidefleet.policy import decide
from tidefleet.policy.model import FleetView, NodeView, PoolView, QueueView

NOW = 1_000_000.0


def environment(pools: int, queues: int) -> Environment:
    pool_specs = {
        f"p{p}": {
            "command": "work",
            "max": 2000,
            "slots_per_unit": 2,
            "cost_cap_usd_per_hour": 40.0 if p % 4 == 0 else None,
            "instance_types": [
                {"type": "c6i.large"},
                {"type": "m6i.large"},
                {"type": "c6i.xlarge", "weight": 2},
            ],
        }
        for p in range(pools)
    }
    # Every fourth queue's items take two slots, so the packing rule places items on nodes.
    queue_specs = {
        f"q{q}": {"pool": f"p{q % pools}", "priority": q % 7, "slots_per_item": 2 if q % 4 == 0 else 1}
        for q in range(queues)
    }
    data = {
        "region": "us-east-1",
        # Up to 400,000 nodes, more than a VPC the stack creates holds: subnets of its own, as such a fleet would have.
        "network": {"subnet_ids": ["subnet-0123456789abcdef0"]},
        "scaler": {"cost_cap_usd_per_hour": 2000.0},
        "pools": pool_specs,
        "queues": queue_specs,
    }
    return parse_environment(data, name="bench")


def node(rng: random.Random, pool: str, i: int) -> NodeView:
    kind = rng.random()
    weight = 2 if rng.random() < 0.2 else 1
    itype = "c6i.xlarge" if weight == 2 else rng.choice(["c6i.large", "m6i.large"])
    common = {"id": f"{pool}-i{i}", "instance_type": itype, "weight": weight, "slots": 2 * weight}
    common["spot"] = rng.random() < 0.8
    if kind < 0.55:  # busy
        return NodeView(
            **common,
            state="running",
            launched_at=NOW - 4000,
            busy_slots=1,
            last_heartbeat=NOW - 3,
            protected=True,
        )
    if kind < 0.85:  # idle, some past the delay
        return NodeView(
            **common,
            state="running",
            launched_at=NOW - 4000,
            last_heartbeat=NOW - 3,
            idle_since=NOW - rng.uniform(0, 900),
        )
    if kind < 0.95:  # booting, some past the boot timeout
        return NodeView(**common, state="pending", launched_at=NOW - rng.uniform(0, 800))
    return NodeView(
        **common,
        state="draining",
        launched_at=NOW - 4000,
        busy_slots=rng.choice([0, 1]),
        last_heartbeat=NOW - 3,
        idle_since=NOW - 10,
    )


def fleet(env: Environment, nodes: int, seed: int = 7) -> FleetView:
    rng = random.Random(seed)
    names = list(env.pools)
    per_pool = nodes // len(names)
    pools = []
    for p, name in enumerate(names):
        members = tuple(node(rng, name, i) for i in range(per_pool))
        failures = (NOW - 30,) if p % 10 == 0 else ()
        pools.append(
            PoolView(
                name,
                members,
                desired=sum(n.weight for n in members if n.state != "terminating"),
                on_demand_base=0,
                spot_failures=failures,
            )
        )
    queues = tuple(
        QueueView(
            name,
            q.pool,
            q.priority,
            q.slots_per_item,
            rng.choice([0, 0, 3, 40, 400]),
            rng.randint(0, 20),
            mean_item_s=rng.choice([None, 20.0, 300.0]),  # unknown, turning over within the boot, not
        )
        for name, q in env.queues.items()
    )
    return FleetView(tuple(pools), queues)


def seconds(env: Environment, view: FleetView) -> float:
    start = time.perf_counter()
    decide(env, view, NOW)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=shape_args.positive, default=9, help="runs per shape; the median is reported")
    args = parser.parse_args()
    shapes = [
        ("baseline", 1000, 100, 10_000),
        ("queues x2", 2000, 100, 10_000),
        ("pools x2", 1000, 200, 10_000),
        ("nodes x2", 1000, 100, 20_000),
        ("all x2", 2000, 200, 20_000),
    ]
    built = []
    for label, queues, pools, nodes in shapes:
        env = environment(pools, queues)
        view = fleet(env, nodes)
        decisions = decide(env, view, NOW)  # warm-up, and a check the shape is real
        assert len(decisions) == pools
        built.append((env, view))
    # Rounds interleave the shapes so a noisy neighbour slows them all alike.
    times = [[] for _ in shapes]
    for _ in range(args.repeat):
        for i, (env, view) in enumerate(built):
            times[i].append(seconds(env, view))
    base = statistics.median(times[0])
    print(f"{'shape':<10} {'queues':>7} {'pools':>6} {'nodes':>7} {'median ms':>10} {'vs baseline':>12}")
    for (label, queues, pools, nodes), runs in zip(shapes, times, strict=True):
        median = statistics.median(runs)
        print(f"{label:<10} {queues:>7} {pools:>6} {nodes:>7} {median * 1000:>10.1f} {median / base:>11.2f}x")
    reasons = sum(len(d.reasons) for d in decisions)
    terminated = sum(len(d.terminate) for d in decisions)
    print(
        f"(last shape: {reasons} reason lines, {terminated} nodes terminated, {sum(bool(d.starved_queues) for d in decisions)} pools capped)"
    )


if __name__ == "__main__":
    main()
