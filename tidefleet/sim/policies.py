"""The policies the simulator replays: tidefleet's own and the baselines users would pick.

`tidefleet` runs the real `tidefleet.control.tick` (observe, decide, act) against the
simulation's ports (`tidefleet.sim.ports`); nothing here decides or applies for it. The baselines follow their documented defaults (see the module docstring of
`tidefleet.sim` for every number and modelling choice).
"""

from __future__ import annotations

import math
from collections import deque

from tidefleet.config import Environment
from tidefleet.control import retick_in
from tidefleet.policy.demand import gang_counts
from tidefleet.policy.model import FleetView, PoolDecision
from tidefleet.ports import Ports
from tidefleet.sim.engine import Simulation, is_gang
from tidefleet.sim.ports import SimulationPorts
from tidefleet.triggers import MAX_LOOP_S


def queued(sim: Simulation, per_node: int) -> int:
    """Waiting messages as these baselines count them, a gang item as `per_node` for each member of
    its gang's max (`gang_counts`), plus the members a forming gang still waits for: it holds its
    message in flight, where they do not look, and would otherwise never start."""
    total = sim.forming_short() * per_node
    for q, (_, queue) in enumerate(sim.queues):
        nodes, _ = gang_counts(queue, sim.visible[q], 0)
        total += nodes * per_node if is_gang(queue) else nodes
    return total


class TidefleetPolicy:
    """The real control tick at the environment's tick, on every submit kick and on spot notices.

    A tick that would change nothing is skipped: when the last tick acted on nothing, nothing
    has happened since (`Simulation.changes`), and the policy shows that deciding again gives
    the same decision until now (`tidefleet.policy.quiet`), the skipped tick still does what
    such a tick does: the agents' heartbeats are read and the leave grant renewed. The outcome
    is the one ticking every time gives (a test compares them); `skip_unchanged` turns it off."""

    name = "tidefleet"
    kick_on_notice = True  # the interruption function ticks at once when the pool has backlog
    protects_busy = True  # the agent sets scale-in protection while it runs an item
    skip_unchanged = True

    def __init__(self, env: Environment, kick_s: float):
        if env.scaler.dry_run:  # the simulation asks what the policy would do: let it act
            env = env.model_copy(update={"scaler": env.scaler.model_copy(update={"dry_run": False})})
        self.env = env
        self.poll_s = float(env.scaler.tick_s)
        self.kick_s = kick_s
        self._ports: Ports | None = None
        self._view: SimulationPorts | None = None
        # The last tick computed: (sim.changes after it, or -1 if it acted; its fleet view; its
        # decisions; its time; until when deciding again gives the same: None until asked, its
        # own time when not to be asked).
        self._last: tuple[int, FleetView | None, tuple[PoolDecision, ...], float, float | None] = (-1, None, (), 0.0, None)

    def poll(self, sim: Simulation) -> None:
        self._tick(sim, sim.now)

    def poll_again(self, sim: Simulation, first: float) -> None:
        self._tick(sim, first)

    def _tick(self, sim: Simulation, first: float) -> None:
        """One tick of a run that started at `first`, and the run's next one while items wait
        (`tidefleet.triggers.run`: within MAX_LOOP_S of the first and `tick_s`, less the wait)."""
        self._tick_once(sim)
        wait = retick_in(self.env, self._last[1])
        if wait is not None and sim.now + wait <= first + min(MAX_LOOP_S, self.poll_s) - wait:
            sim.tick_again(sim.now + wait, first)

    def _tick_once(self, sim: Simulation) -> None:
        from tidefleet.control import grant_leave, tick
        from tidefleet.policy.quiet import actions, unchanged_until

        if self._view is None or self._view.sim is not sim:
            self._view = view = SimulationPorts(sim)
            self._ports = Ports(queues=view, fleet=view, nodes=view, stats=view)
            self._last = (-1, None, (), 0.0, None)
        changes, fleet, decisions, then, until = self._last
        quiet = sim.changes == changes and fleet is not None and self.skip_unchanged
        if quiet:
            if until is None:  # asked only now: most ticks are followed by an event before the next
                until = unchanged_until(self.env, fleet, decisions, then)
                self._last = (changes, fleet, decisions, then, until)
            if sim.now < until:
                self._view.agents_beat()  # their reports' times (and so the intake they carry) as ticking gives
                grant_leave(self.env, self._ports, decisions, sim.now)
                return
        before, seen = sim.changes, []
        decided = tick(self.env, self._ports, sim.now, pools=[sim.pool_name], report=lambda fleet, _: seen.append(fleet))
        acted = sim.changes != before
        # No promise was possible for a quiet fleet and deciding again gives the same: most likely
        # none is again (a decision at zero intake does not move with intake), so it is not asked
        # until something happens or the decision moves. Only ever a tick more computed, never one less.
        refused = quiet and until == then and list(map(actions, decided)) == list(map(actions, decisions))
        self._last = (-1 if acted else sim.changes, seen[0], decided, sim.now, sim.now if refused else None)


class TargetTracking:
    """AWS target tracking on backlog per instance (visible messages / in-service instances).

    Scale out after 3 one-minute datapoints above target, scale in after 15 below, to
    ceil(instances * metric / target), with a 300 s cooldown. The metric is undefined with
    no instance in service, so (as AWS's guide does) a separate alarm on visible > 0 sets
    one node. Target: one queued item per slot of an instance, a gang item counting a whole node
    per member. No scale-in protection, so the group's victims may be busy.
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
        target = sim.pool.slots(sim.launch_types[0])
        backlog = queued(sim, target)
        if in_service == 0:
            self.points.clear()
            if backlog and sim.desired < weight:
                sim.set_desired(weight)
            return
        metric = backlog / in_service
        self.points.append(metric)
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
    """ClearML AWS autoscaler: every 5 min, one instance per queued task (a gang task: one per
    member) minus idle and booting instances; instances idle 15 min are terminated by the
    autoscaler itself."""

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
                sim.terminate(node, decrement=True)
        idle = sum(1 for n in sim.nodes.values() if n.state == "running" and n.busy == 0)
        booting = sum(1 for n in sim.nodes.values() if n.state == "pending")
        missing = queued(sim, 1) - idle - booting
        if missing > 0:
            sim.set_desired(sim.desired + missing * sim.launch_weight())


class Keda:
    """KEDA ScaledObject with the aws-sqs-queue scaler's defaults: replicas =
    ceil((visible + in flight) / 5) per queue, polled every 30 s; the HPA keeps the highest
    recommendation of the last 300 s before scaling down; cooldownPeriod 300 s before 1 -> 0.
    A replica is one worker slot; nodes follow the replicas. A gang queue needs every member at
    once, so its replicas are its messages times the gang's max (`gang_counts`), a whole node's
    slots each, not one per 5 messages. The HPA's victims are any pods, so scale-in may kill
    running items."""

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
            if is_gang(queue):
                slots += sum(gang_counts(queue, sim.visible[q], sim.in_flight[q])) * queue.slots_per_item
                continue
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
