"""The policies the simulator replays: tidefleet's own and the baselines users would pick.

`tidefleet` builds the same views the AWS scaler builds (FleetView of NodeView/QueueView)
from simulated state and calls the real `tidefleet.policy.decide`; nothing here decides
for it. The baselines follow their documented defaults (see the module docstring of
`tidefleet.sim` for every number and modelling choice).
"""

from __future__ import annotations

import math
from collections import deque

from tidefleet.config import Environment
from tidefleet.policy.model import FleetView, NodeView, PoolDecision, PoolView, QueueView
from tidefleet.sim.engine import Node, Simulation


class TidefleetPolicy:
    """The real policy at the environment's tick, on every submit kick and on spot notices."""

    name = "tidefleet"
    kick_on_notice = True  # the interruption function ticks at once when the pool has backlog
    protects_busy = True  # the agent sets scale-in protection while it runs an item

    def __init__(self, env: Environment, kick_s: float):
        from tidefleet.policy import decide

        self._decide = decide
        self.env = env
        self.poll_s = float(env.scaler.tick_s)
        self.kick_s = kick_s

    def poll(self, sim: Simulation) -> None:
        for decision in self._decide(self.env, fleet_view(sim), sim.now):
            if decision.pool == sim.pool_name:
                apply_decision(sim, decision)


def node_view(node: Node) -> NodeView:
    """The node as its heartbeat record shows it; cached until the node changes."""
    if node.view is None:
        node.view = NodeView(
            id=node.name,
            instance_type=node.itype.type,
            weight=node.weight,
            slots=node.slots,
            spot=node.spot,
            state=node.state,
            launched_at=node.launched_at,
            busy_slots=node.busy,
            last_heartbeat=node.reported_at,
            idle_since=node.idle_since,
            protected=node.busy > 0,
        )
    return node.view


HEARTBEAT_GRAIN = 0.25  # of the boot timeout: a live node's last beat is never older than this


def fleet_view(sim: Simulation) -> FleetView:
    """What the AWS adapter observes for one pool: its group's nodes and its queues."""
    window = sim.env.scaler.spot_failure_window_s
    every_s = sim.pool.boot_timeout_s * HEARTBEAT_GRAIN
    for node in sim.nodes.values():
        node.beat(sim.now, every_s)
    nodes = tuple(map(node_view, sim.nodes.values()))
    pool = PoolView(sim.pool_name, nodes, sim.desired, sim.on_demand_base, sim.recent_spot_failures(window))
    queues = tuple(
        QueueView(
            name, q.pool, q.priority, q.slots_per_item, sim.visible[i], sim.in_flight[i], sim.mean_item_s[i]
        )
        for i, (name, q) in enumerate(sim.queues)
    )
    return FleetView((pool,), queues)


def apply_decision(sim: Simulation, decision: PoolDecision) -> None:
    """As `tidefleet.control.act` does: terminate with decrement, the on-demand base, then
    desired, never below the units of the nodes that stay (the group would pick a victim)."""
    for node_id in decision.terminate:
        sim.terminate(node_id, decrement=True)
    if decision.on_demand_base is not None:
        sim.on_demand_base = decision.on_demand_base
    sim.set_desired(max(decision.desired, sim.units))


class TargetTracking:
    """AWS target tracking on backlog per instance (visible messages / in-service instances).

    Scale out after 3 one-minute datapoints above target, scale in after 15 below, to
    ceil(instances * metric / target), with a 300 s cooldown. The metric is undefined with
    no instance in service, so (as AWS's guide does) a separate alarm on visible > 0 sets
    one node. Target: one queued item per slot of an instance. No scale-in protection, so
    the group's victims may be busy.
    """

    name = "target-tracking"
    poll_s = 60.0
    kick_s = None
    kick_on_notice = False
    protects_busy = False
    OUT_POINTS, IN_POINTS, COOLDOWN_S = 3, 15, 300.0

    def __init__(self, env: Environment, pool: str):
        self.points: deque[float] = deque(maxlen=self.IN_POINTS)
        self.last_scaled = -math.inf

    def poll(self, sim: Simulation) -> None:
        in_service = sum(1 for n in sim.nodes.values() if n.state == "running")
        weight = sim.launch_weight()
        if in_service == 0:
            self.points.clear()
            if sim.queued() and sim.desired < weight:
                sim.set_desired(weight)
            return
        metric = sim.queued() / in_service
        self.points.append(metric)
        target = sim.pool.slots(sim.launch_types[0])
        if sim.now - self.last_scaled < self.COOLDOWN_S:
            return
        wanted = math.ceil(in_service * metric / target) * weight
        recent = list(self.points)
        if len(recent) >= self.OUT_POINTS and all(p > target for p in recent[-self.OUT_POINTS :]):
            if wanted > sim.desired:
                self._scale(sim, wanted)
        elif len(recent) == self.IN_POINTS and all(p < target for p in recent) and wanted < sim.desired:
            self._scale(sim, wanted)

    def _scale(self, sim: Simulation, units: int) -> None:
        sim.set_desired(units)
        self.last_scaled = sim.now
        self.points.clear()


class ClearML:
    """ClearML AWS autoscaler: every 5 min, one instance per queued task minus idle and
    booting instances; instances idle 15 min are terminated by the autoscaler itself."""

    name = "clearml"
    poll_s = 300.0
    kick_s = None
    kick_on_notice = False
    protects_busy = False  # irrelevant: it only ever removes the idle instances it picks
    IDLE_S = 900.0

    def __init__(self, env: Environment, pool: str):
        pass

    def poll(self, sim: Simulation) -> None:
        for node in list(sim.nodes.values()):
            if node.state == "running" and node.busy == 0 and sim.now - node.idle_since >= self.IDLE_S:
                sim.terminate(node.id, decrement=True)
        idle = sum(1 for n in sim.nodes.values() if n.state == "running" and n.busy == 0)
        booting = sum(1 for n in sim.nodes.values() if n.state == "pending")
        missing = sim.queued() - idle - booting
        if missing > 0:
            sim.set_desired(sim.desired + missing * sim.launch_weight())


class Keda:
    """KEDA ScaledObject with the aws-sqs-queue scaler's defaults: replicas =
    ceil((visible + in flight) / 5) per queue, polled every 30 s; the HPA keeps the highest
    recommendation of the last 300 s before scaling down; cooldownPeriod 300 s before 1 -> 0.
    A replica is one worker slot; nodes follow the replicas. The HPA's victims are any
    pods, so scale-in may kill running items."""

    name = "keda"
    poll_s = 30.0
    kick_s = None
    kick_on_notice = False
    protects_busy = False
    QUEUE_LENGTH, STABILIZATION_S, COOLDOWN_S = 5, 300.0, 300.0

    def __init__(self, env: Environment, pool: str):
        self.history: deque[tuple[float, int]] = deque()
        self.last_active = -math.inf

    def poll(self, sim: Simulation) -> None:
        slots = 0
        for q, (_, queue) in enumerate(sim.queues):
            messages = sim.visible[q] + sim.in_flight[q]
            slots += math.ceil(messages / self.QUEUE_LENGTH) * queue.slots_per_item
        if slots:
            self.last_active = sim.now
        node_slots = sim.pool.slots(sim.launch_types[0])
        units = math.ceil(slots / node_slots) * sim.launch_weight()
        self.history.append((sim.now, units))
        while self.history[0][0] < sim.now - self.STABILIZATION_S:
            self.history.popleft()
        units = max(u for _, u in self.history)
        if units == 0 and sim.now - self.last_active < self.COOLDOWN_S:
            return
        if units != sim.desired:
            sim.set_desired(units)


BASELINES = {"target-tracking": TargetTracking, "clearml": ClearML, "keda": Keda}
POLICY_NAMES = ("tidefleet", *BASELINES, "oracle")
