"""The metrics tidefleet emits: their names, dimensions and units, in one place, and the pure
functions that turn what a tick observed and decided (and an agent's finished attempt) into points.

Adapters only write points: as CloudWatch Embedded Metric Format on AWS (a JSON line on the
scaler function's stdout; an event in the item log group from an agent), as Cloud Monitoring
custom metrics on GCP (`tidefleet.cloud.gcp.monitoring`). The stacks' alarms and dashboards name
metrics from here, and a test checks that every metric they show is one of `METRICS` (or one the
cloud itself publishes, `CLOUD_METRICS`). Every gauge is written on every tick, zeros included,
so a dashboard line never has gaps and an alarm never waits on missing data. No SDK import.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from tidefleet import naming
from tidefleet.config import Environment
from tidefleet.policy import faults
from tidefleet.policy.cost import PoolPrices
from tidefleet.policy.model import FleetView, NodeView, PoolDecision, PoolView, on_demand_units

NAMESPACE = "tidefleet"
LIFECYCLES = ("spot", "on-demand")
ACTIVITIES = ("booting", "busy", "idle", "draining")
# A running node whose agent has not written a heartbeat for this long is silent: agents beat
# every 5 s and the item claims they renew last 30 s, so two minutes is never a slow beat.
SILENT_AFTER_S = 120


@dataclass(frozen=True, slots=True)
class Metric:
    name: str
    unit: str  # a CloudWatch unit; Cloud Monitoring gets UNITS[unit]
    dimensions: tuple[str, ...]
    help: str
    source: str = "scaler"  # scaler | agent: who writes it


POOL = ("Environment", "Pool")
POOL_LIFECYCLE = ("Environment", "Pool", "Lifecycle")
QUEUE = ("Environment", "Queue")
METRICS = {m.name: m for m in (
    Metric("DesiredUnits", "Count", POOL_LIFECYCLE, "capacity units the scaler asks for, split as the group buys them"),
    Metric("InServiceUnits", "Count", POOL_LIFECYCLE, "capacity units of nodes whose agent reports (running or draining)"),
    Metric("Nodes", "Count", (*POOL_LIFECYCLE, "Activity"), "nodes by activity: booting, busy, idle, draining"),
    Metric("DemandSlots", "Count", POOL, "slots the pool's queues want: waiting and running items times their slots"),
    Metric("StarvedQueues", "Count", POOL, "queues of the pool left waiting because a cap holds capacity back"),
    Metric("TerminatedNodes", "Count", POOL, "idle nodes the tick removed"),
    Metric("LeaveGrantUnits", "Count", POOL, "units of nodes that may leave on their own once idle, until the next tick"),
    Metric("SpotLaunchFailures", "Count", POOL, "failed spot launches within scaler.spot_failure_window_s"),
    Metric("OnDemandFallbackUnits", "Count", POOL, "units moved to on-demand above the configured base: spot is short"),
    Metric("NodesStuckBooting", "Count", POOL, "nodes launched longer ago than boot_timeout_s with no heartbeat yet"),
    Metric("NodesSilent", "Count", POOL, f"running nodes whose agent has not reported for {SILENT_AFTER_S} s"),
    Metric("NodesFaulted", "Count", POOL, "nodes in a row that said at start they cannot run items, no healthy node "
           f"booted since; at {faults.FAULTS_IN_A_ROW} the pool's launches are held (scaling rule 14)"),
    Metric("PoolCostPerHour", "None", POOL, "USD per hour of the pool's nodes, at the configured prices"),
    Metric("CostPerHour", "None", ("Environment",), "USD per hour of every node, at the configured prices"),
    Metric("QueueVisible", "Count", QUEUE, "items waiting in the queue"),
    Metric("QueueInFlight", "Count", QUEUE, "items received by an agent and not yet finished"),
    Metric("AttemptsSucceeded", "Count", QUEUE, "attempts that succeeded", "agent"),
    Metric("AttemptsFailed", "Count", QUEUE, "attempts that failed (retried, or dead-lettered)", "agent"),
    Metric("AttemptsInterrupted", "Count", QUEUE, "attempts handed back on a spot notice or a drain", "agent"),
    Metric("AttemptsCancelled", "Count", QUEUE, "attempts stopped by a cancel", "agent"),
)}  # fmt: skip
# The agent's outcome (tidefleet.agent.attempt.Outcome values) -> the metric that counts it.
OUTCOME_METRICS = {"succeeded": "AttemptsSucceeded", "failed": "AttemptsFailed",
                   "handed back": "AttemptsInterrupted", "cancelled": "AttemptsCancelled"}  # fmt: skip
# What the clouds publish themselves and the alarms and dashboards use: (namespace, name).
CLOUD_METRICS = {
    "aws": frozenset({
        ("AWS/SQS", "ApproximateNumberOfMessagesVisible"), ("AWS/SQS", "ApproximateAgeOfOldestMessage"),
        ("AWS/Lambda", "Errors"), ("AWS/Lambda", "Throttles"), ("AWS/Lambda", "Duration"),
        ("AWS/Lambda", "Invocations"),
    }),
    "gcp": frozenset({
        "pubsub.googleapis.com/subscription/num_undelivered_messages",
        "pubsub.googleapis.com/subscription/oldest_unacked_message_age",
        "run.googleapis.com/request_latencies",
    }),
}  # fmt: skip
# Cloud Monitoring's units (UCUM) for ours.
UNITS = {"Count": "1", "None": "USD/h", "Seconds": "s"}
GCP_CUSTOM = "custom.googleapis.com/tidefleet"
# On GCP the agents log each outcome (Cloud Logging) and the stack's log-based metric counts them.
GCP_OUTCOMES = {"AttemptsSucceeded": "succeeded", "AttemptsFailed": "failed",
                "AttemptsInterrupted": "handed back", "AttemptsCancelled": "cancelled"}  # fmt: skip


def gcp_metric_type(name: str, env_name: str) -> str:
    """The Cloud Monitoring metric type of one of ours."""
    if METRICS[name].source == "agent":
        return f"logging.googleapis.com/user/{naming.stack_resource(env_name, 'item-outcomes')}"
    return f"{GCP_CUSTOM}/{''.join('_' + c.lower() if c.isupper() else c for c in name).lstrip('_')}"


def gcp_labels(name: str, dimensions: dict[str, str]) -> dict[str, str]:
    """Our dimensions as the metric's labels on GCP (the outcome metric has outcome and queue only)."""
    if METRICS[name].source == "agent":
        return {"outcome": GCP_OUTCOMES[name], **({"queue": dimensions["Queue"]} if "Queue" in dimensions else {})}
    return {k.lower(): v for k, v in dimensions.items()}


def gcp_filter(name: str, env_name: str, **dimensions: str) -> str:
    """A Cloud Monitoring filter for one of ours, with the given dimensions (Environment implied)."""
    labels = gcp_labels(name, {"Environment": env_name, **dimensions})
    parts = [f'metric.type = "{gcp_metric_type(name, env_name)}"']
    parts += [f'metric.labels.{k} = "{v}"' for k, v in sorted(labels.items())]
    return " AND ".join(parts)


@dataclass(frozen=True, slots=True)
class Point:
    name: str
    value: float
    dimensions: tuple[tuple[str, str], ...]  # in the metric's dimension order

    @property
    def metric(self) -> Metric:
        return METRICS[self.name]


def point(name: str, value: float, **dimensions: str) -> Point:
    """A point of a known metric; its dimensions must be exactly the metric's."""
    metric = METRICS[name]
    if set(dimensions) != set(metric.dimensions):
        raise ValueError(f"{name}: dimensions {sorted(dimensions)} are not {list(metric.dimensions)}")
    return Point(name, float(value), tuple((d, dimensions[d]) for d in metric.dimensions))


def _lifecycle(node: NodeView) -> str:
    return "spot" if node.spot else "on-demand"


def _activity(node: NodeView) -> str:
    if node.state == "pending":
        return "booting"
    if node.state in ("draining", "terminating"):
        return "draining"
    return "busy" if node.busy_slots else "idle"


def tick_points(
    env: Environment,
    fleet: FleetView,
    decisions: Iterable[PoolDecision],
    now: float,
    acted: Mapping[str, dict] | None = None,
) -> list[Point]:
    """Everything one tick saw and did, as points: per pool and lifecycle, per queue, and the total cost.

    `acted`: per pool, what acting on its decision did (`control.tick`'s `acted(pool, done)`).
    Where a pool has it, DesiredUnits and TerminatedNodes say what was set and terminated, not
    the decision, which the group may not take (a MaxSize below the config's max, a refused
    call, a node already gone); without it (a dry run) they say what was decided."""
    e = env.name
    decided = {d.pool: d for d in decisions}
    acted = acted or {}
    out: list[Point] = []
    total_cost = 0.0
    for pool in fleet.pools:
        config, p = env.pools[pool.name], pool.name
        decision, done = decided.get(p), acted.get(p)
        desired, base, terminated = _outcome(pool, decision, done)
        on_demand = on_demand_units(desired, base, config.on_demand_percent)
        for lifecycle, units in (("spot", desired - on_demand), ("on-demand", on_demand)):
            out.append(point("DesiredUnits", units, Environment=e, Pool=p, Lifecycle=lifecycle))
        live = [n for n in pool.nodes if n.state != "terminating"]
        for lifecycle in LIFECYCLES:
            mine = [n for n in live if _lifecycle(n) == lifecycle]
            serving = sum(n.weight for n in mine if n.state in ("running", "draining"))
            out.append(point("InServiceUnits", serving, Environment=e, Pool=p, Lifecycle=lifecycle))
            for activity in ACTIVITIES:
                count = sum(1 for n in mine if _activity(n) == activity)
                out.append(point("Nodes", count, Environment=e, Pool=p, Lifecycle=lifecycle, Activity=activity))
        demand = sum((q.visible + q.in_flight) * q.slots_per_item for q in fleet.queues if q.pool == p)
        prices = PoolPrices.of(config)
        cost = sum(prices.node(n) for n in live)
        total_cost += cost
        silent = sum(1 for n in live if n.state == "running" and n.last_heartbeat is not None
                     and now - n.last_heartbeat > SILENT_AFTER_S)  # fmt: skip
        stuck = sum(1 for n in live if n.state == "pending" and now - n.launched_at > config.boot_timeout_s)
        faulted = len(faults.in_a_row(pool.faults, pool.nodes)) if pool.faults else 0  # what rule 14 counts
        out += [
            point("DemandSlots", demand, Environment=e, Pool=p),
            point("StarvedQueues", len(decision.starved_queues) if decision else 0, Environment=e, Pool=p),
            point("TerminatedNodes", terminated, Environment=e, Pool=p),
            point("LeaveGrantUnits", decision.leave if decision else 0, Environment=e, Pool=p),
            point("SpotLaunchFailures", len(pool.spot_failures), Environment=e, Pool=p),
            point("OnDemandFallbackUnits", max(0, base - config.on_demand_base), Environment=e, Pool=p),
            point("NodesStuckBooting", stuck, Environment=e, Pool=p),
            point("NodesSilent", silent, Environment=e, Pool=p),
            point("NodesFaulted", faulted, Environment=e, Pool=p),
            point("PoolCostPerHour", round(cost, 4), Environment=e, Pool=p),
        ]
    for queue in fleet.queues:
        out.append(point("QueueVisible", queue.visible, Environment=e, Queue=queue.name))
        out.append(point("QueueInFlight", queue.in_flight, Environment=e, Queue=queue.name))
    out.append(point("CostPerHour", round(total_cost, 4), Environment=e))
    return out


def _outcome(pool: PoolView, decision: PoolDecision | None, done: dict | None) -> tuple[int, int, int]:
    """(desired units, on-demand base, nodes terminated) of a pool after its tick: as acted on
    where `done` says (a refused set keeps the group's own), else as decided, else as observed."""
    desired = decision.desired if decision else pool.desired
    base = decision.on_demand_base if decision and decision.on_demand_base is not None else pool.on_demand_base
    terminated = len(decision.terminate) if decision else 0
    if done is None:
        return desired, base, terminated
    if "desired_after" not in done:  # act itself failed (`error`): the group as observed
        return pool.desired, pool.on_demand_base, 0
    return done["desired_after"], done["base_after"], len(done["terminated"])


def attempt_points(env_name: str, queue: str, outcome: str) -> list[Point]:
    """One finished attempt: 1 for its outcome and 0 for the others, so a failure rate always has
    its denominator and every outcome's line exists. An unknown outcome counts nothing."""
    counted = OUTCOME_METRICS.get(outcome)
    return [point(name, 1 if name == counted else 0, Environment=env_name, Queue=queue)
            for name in OUTCOME_METRICS.values()]  # fmt: skip


# -- CloudWatch Embedded Metric Format ----------------------------------------------------
def emf(points: Iterable[Point], timestamp_ms: int) -> list[str]:
    """Points as EMF documents, one JSON line per dimension set (CloudWatch extracts them from a
    Lambda's stdout or any log event). At most 100 metrics per document, as EMF allows."""
    groups: dict[tuple[tuple[str, str], ...], list[Point]] = {}
    for p in points:
        groups.setdefault(p.dimensions, []).append(p)
    lines = []
    for dims, members in groups.items():
        for at in range(0, len(members), 100):
            chunk = members[at : at + 100]
            lines.append(json.dumps({
                "_aws": {"Timestamp": timestamp_ms, "CloudWatchMetrics": [{
                    "Namespace": NAMESPACE, "Dimensions": [[d for d, _ in dims]],
                    "Metrics": [{"Name": p.name, "Unit": p.metric.unit} for p in chunk],
                }]},
                **dict(dims), **{p.name: p.value for p in chunk},
            }, separators=(",", ":")))  # fmt: skip
    return lines


def emf_at(line: str, timestamp_ms: int) -> str:
    """An `emf` document whose metrics are at `timestamp_ms` instead: its event put again at the
    log service's time (a node's clock far off) moves its metrics with it, which CloudWatch would
    otherwise drop as it drops the event (over 14 days back or 2 h ahead)."""
    doc = json.loads(line)
    doc["_aws"]["Timestamp"] = timestamp_ms
    return json.dumps(doc, separators=(",", ":"))


def from_emf(line: str) -> tuple[int, list[Point]]:
    """(timestamp ms, points) of one EMF document: what CloudWatch extracts from it. For the
    sandbox, whose emulator does not extract EMF; raises ValueError on anything else."""
    doc = json.loads(line)
    meta = doc.get("_aws") if isinstance(doc, dict) else None
    if not isinstance(meta, dict):
        raise ValueError("not an EMF document (no _aws)")  # noqa: TRY004 - bad input text, as json's errors
    out = []
    for directive in meta["CloudWatchMetrics"]:
        for dims in directive["Dimensions"]:
            for m in directive["Metrics"]:
                out.append(point(m["Name"], doc[m["Name"]], **{d: doc[d] for d in dims}))
    return int(meta["Timestamp"]), out
