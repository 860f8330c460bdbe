"""The control ports over a Simulation: what the cloud adapters read and do, for its one pool.

`tidefleet.control.tick` runs against these exactly as it runs against AWS: the group lists
the simulated nodes, the job store their heartbeats and the queues' mean item times, the
queues their backlog; terminate, desired and the on-demand base go to the simulated group.
The group's promises are those of `tidefleet.cloud.memory.MemoryFleet`; a test applies the
same decisions to both and compares the fleets.
"""

from __future__ import annotations

from tidefleet.agent.gang import Beacon
from tidefleet.policy.model import rate_decay
from tidefleet.ports import Backlog, GroupInstance, GroupState
from tidefleet.records import Heartbeat, QueueStats, WaitingMark
from tidefleet.sim.engine import Node, Simulation

HEARTBEAT_GRAIN = 0.9  # of the boot timeout: at every tick a live node's last beat is younger than this


class SimulationPorts:
    """QueuePort, FleetPort, NodeStatePort and QueueStatsPort at once (see `Ports`)."""

    def __init__(self, sim: Simulation):
        self.sim = sim
        self.group_name = f"sim-{sim.pool_name}"
        self._queue = {name: q for q, (name, _) in enumerate(sim.queues)}
        self._names = [name for name, _ in sim.queues]
        self._waiting: dict[str, WaitingMark] = {}

    # -- QueuePort, QueueStatsPort -------------------------------------------------------------
    def backlog(self, queue: str) -> Backlog:
        """As SQS and Pub/Sub answer it: counts, not the oldest item's age; the tick learns that
        from its own waiting marks (`waiting_marks`), as it does in the cloud."""
        q = self._queue[queue]
        return Backlog(self.sim.visible[q], self.sim.in_flight[q])  # messages: the tick counts a gang's nodes

    def waiting_marks(self, queues: list[str]) -> dict[str, WaitingMark]:
        return {q: self._waiting[q] for q in queues if q in self._waiting}

    def mark_waiting(self, queue: str, mark: WaitingMark | None) -> None:
        self.sim.changes += 1  # the next tick reads it
        if mark is None:
            self._waiting.pop(queue, None)
        else:
            self._waiting[queue] = mark

    def held_since(self, queues: list[str]) -> dict[str, float]:
        return {q: self.sim.held_at[i] for q in queues if (i := self._queue.get(q)) is not None and i in self.sim.held_at}

    def mark_held(self, queue: str, since: float | None) -> None:
        """The agents read the mark with their heartbeats: here, at once."""
        self.sim.set_held(self._queue[queue], since)

    def queue_stats(self, queues: list[str]) -> dict[str, QueueStats]:
        sim = self.sim
        return {
            name: QueueStats(sim.mean_item_s[q], sim.finished_items[q])
            for name in queues
            if (q := self._queue.get(name)) is not None and sim.mean_item_s[q] is not None
        }

    # -- FleetPort -----------------------------------------------------------------------------
    def groups(self, pools: list[str], since: float) -> dict[str, GroupState]:
        sim = self.sim
        if sim.pool_name not in pools:
            return {}
        group = GroupState(
            name=self.group_name,
            desired=sim.desired,
            min=sim.pool.min,
            max=sim.pool.max,
            on_demand_base=sim.on_demand_base,
            # `_listed`, its common case inline (~10^7 nodes a replay)
            instances=tuple([n.listed if n.listed is not None and n.listed.protected == (n.busy > 0) else _listed(n)
                             for n in sim.nodes.values()]),
            spot_failures=sim.spot_failures_since(since),
        )
        return {sim.pool_name: group}

    def set_desired(self, pool: str, desired: int) -> None:
        self._check(pool)
        self.sim.set_desired(desired)

    def terminate(self, pool: str, instance_ids: tuple[str, ...]) -> tuple[str, ...]:
        self._check(pool)
        done = []
        for instance_id in instance_ids:
            node = self.sim.node_named(instance_id)
            if node is not None:  # every simulated node is in service
                self.sim.terminate(node, decrement=True)
                done.append(instance_id)
        return tuple(done)

    def set_on_demand_base(self, pool: str, units: int) -> None:
        self._check(pool)
        self.sim.set_on_demand_base(units)

    def group_of(self, instance_id: str) -> str | None:
        return self.group_name if self.sim.node_named(instance_id) is not None else None

    def complete_lifecycle_action(self, pool: str, instance_id: str, hook: str, token: str | None) -> None:
        """The simulated group has no terminate hook: no node is ever held."""

    # -- NodeStatePort -------------------------------------------------------------------------
    def heartbeats(self, pool: str) -> dict[str, Heartbeat]:
        sim = self.sim
        if pool != sim.pool_name:
            return {}
        self.agents_beat()
        beats = {}
        for node in sim.nodes.values():
            heartbeat = node.record or _heartbeat(node, pool, self._names, sim)
            if heartbeat is not None:
                beats[node.name] = heartbeat
        return beats

    def node_rows(self, pool: str) -> tuple[dict[str, Heartbeat], frozenset[str]]:
        """A mark is set on the live node itself, so no node has a mark-only row."""
        return self.heartbeats(pool), frozenset()

    def agents_beat(self) -> None:
        """Every agent's periodic heartbeat, at a coarse grain; its record is made when read. The
        real agent beats every few seconds, but the policy only asks whether the last beat is older
        than the boot timeout, so refreshing a node's record once it is a fraction of that timeout
        old gives the same decisions and keeps cached records between refreshes."""
        now, every_s = self.sim.now, self.sim.pool.boot_timeout_s * HEARTBEAT_GRAIN
        for node in self.sim.nodes.values():  # ~10^7 nodes a replay: no call per node
            if node.reported_at is not None and now - node.reported_at >= every_s:
                node.reported_at = now
                node.record = None

    def mark_draining(self, pool: str, node_id: str) -> None:
        node = self.sim.node_named(node_id) if pool == self.sim.pool_name else None
        if node is not None:
            self.sim.stop_intake(node)

    def let_idle_go(self, pool: str, node_id: str, idle_since: float) -> bool:
        """Always: the engine stands still during a tick, so no node takes work between what the
        tick saw and what it does (the race the real store's conditional mark settles)."""
        self._check(pool)
        return True

    def set_cordon(self, pool: str, node_id: str, cordoned: bool) -> None:
        node = self.sim.node_named(node_id) if pool == self.sim.pool_name else None
        if node is not None:
            self.sim.set_cordon(node, cordoned)

    def set_preempt(self, pool: str, node_id: str, keys: list[str]) -> None:
        node = self.sim.node_named(node_id) if pool == self.sim.pool_name else None
        if node is not None:
            self.sim.preempt(node, tuple(keys))

    def forget_node(self, pool: str, node_id: str) -> None:
        """Heartbeats are read off the live nodes: a node that left has none to forget."""

    def grant_leave(self, pool: str, units: int, at: float, until: float, stay: int = 0) -> None:
        if pool == self.sim.pool_name:
            self.sim.grant_leave(units, at, until, stay)

    def _check(self, pool: str) -> None:
        if pool != self.sim.pool_name:
            raise LookupError(f"pool {pool!r}: the simulation runs pool {self.sim.pool_name!r} only")


def _listed(node: Node) -> GroupInstance:
    """The node as its group lists it: a node boots in service. The same object while its scale-in
    protection stays (nothing else listed changes), so the tick can reuse what it made of it."""
    protected = node.busy > 0  # the agent protects its node while it runs an item
    if node.listed is None or node.listed.protected != protected:
        node.listed = GroupInstance(
            id=node.name,
            instance_type=node.itype.type,
            lifecycle_state="InService",
            spot=node.spot,
            launched_at=node.launched_at,
            protected=protected,
            weight=node.weight,
        )
    return node.listed


def _heartbeat(node: Node, pool: str, queues: list[str], sim: Simulation) -> Heartbeat | None:
    """The node's last heartbeat, cached until it changes (`Node.changed`, `SimulationPorts.agents_beat`); None
    until its agent's first one, when it is ready. A forming gang's lead beacons the members it
    still waits for, as the agent's does; its attempts of preemptible queues are listed (keyed
    sim/item/attempt) with the scaler's preempt mark, as the agent's are."""
    if node.record is None and node.reported_at is not None:
        queue_of = sim.queue_of
        gang = node.gang
        beacon = {}
        if gang is not None and gang.started_at is None and gang.members[0] is node:
            beacon = Beacon(queues[queue_of[gang.index]], "sim", str(gang.index), 1, node.reported_at, forming=True,
                            short=gang.lo - len(gang.members)).record()  # fmt: skip
        decay = rate_decay(node.intake_at, node.reported_at)  # each rate `rate_at` its report, one exp()
        node.record = Heartbeat(
            node_id=node.name,
            pool=pool,
            at=node.reported_at,
            slots=node.slots,
            busy_slots=node.busy,
            idle_since=node.idle_since,
            draining=node.state == "draining",
            instance_type=node.itype.type,
            spot=node.spot,
            # A rate long decayed to exactly 0 adds nothing to the queue's sum: left out, as if never taken.
            intake={queues[q]: r * decay for q, r in node.intake.items() if r},
            cordoned=node.cordoned,
            gang=beacon,
            runs=[{"key": f"sim/{i}/{sim.attempt[i]}", "queue": queues[queue_of[i]], "since": since, "slots": sim.need[i]}
                  for i, since in node.running.items() if queue_of[i] in sim.preemptible] if sim.preemptible else [],
            preempt=list(node.preempting),
        )
    return node.record
