"""In-memory adapters of the control ports: groups and their instances, heartbeats, backlogs
and queue statistics held in plain objects. Tests drive `tidefleet.control` against them; no
SDK import, no clock.

The fleet keeps the promises of `FleetPort` the way an Auto Scaling group does, and nothing
more: it launches nothing by itself (the cloud's, or the simulator's, job) and never picks a
victim. Terminate is with decrement: the instance leaves the group at once and desired drops
by its weight, never below min (there the group keeps min and would launch a replacement,
as the simulator's group does).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from tidefleet.ports import Backlog, GroupInstance, GroupState
from tidefleet.records import Heartbeat, LeaveGrant, QueueStats, WaitingMark, take_from_grant

TERMINABLE = frozenset({"InService"})  # as AWS: Pending or already leaving instances are skipped


class MemoryGroup:
    """One pool's group. `instances` keep their order (launch order, as the cloud lists them)."""

    def __init__(
        self,
        name: str,
        *,
        desired: int,
        min: int = 0,
        max: int,
        on_demand_base: int = 0,
        instances: Iterable[GroupInstance] = (),
        spot_failures: Iterable[float] = (),
    ):
        self.name, self.desired, self.min, self.max = name, desired, min, max
        self.on_demand_base = on_demand_base
        self.instances = {i.id: i for i in instances}
        self.spot_failures = list(spot_failures)

    def state(self, since: float) -> GroupState:
        return GroupState(
            name=self.name,
            desired=self.desired,
            min=self.min,
            max=self.max,
            on_demand_base=self.on_demand_base,
            instances=tuple(self.instances.values()),
            spot_failures=tuple(t for t in self.spot_failures if t >= since),
        )


class MemoryFleet:
    """FleetPort over `MemoryGroup`s, by pool. `released` lists the lifecycle actions completed."""

    def __init__(self, groups: dict[str, MemoryGroup] | None = None):
        self.groups_ = dict(groups or {})
        self.released: list[tuple[str, str, str, str | None]] = []

    def _group(self, pool: str) -> MemoryGroup:
        try:
            return self.groups_[pool]
        except KeyError:
            raise LookupError(f"pool {pool!r}: no group; known: {', '.join(sorted(self.groups_))}") from None

    def groups(self, pools: list[str], since: float) -> dict[str, GroupState]:
        return {p: self.groups_[p].state(since) for p in pools if p in self.groups_}

    def set_desired(self, pool: str, desired: int) -> None:
        group = self._group(pool)
        if not group.min <= desired <= group.max:
            # As AWS's SetDesiredCapacity: a value outside the bounds is refused, not clamped.
            raise ValueError(f"{group.name}: desired {desired} is outside [min {group.min}, max {group.max}]")
        group.desired = desired

    def terminate(self, pool: str, instance_ids: tuple[str, ...]) -> tuple[str, ...]:
        group, done = self._group(pool), []
        for instance_id in instance_ids:
            instance = group.instances.get(instance_id)
            if instance is None or instance.lifecycle_state not in TERMINABLE:
                continue  # gone, another group's, or not (or no longer) in service: skipped
            del group.instances[instance_id]
            group.desired = max(group.min, group.desired - (instance.weight or 1))
            done.append(instance_id)
        return tuple(done)

    def set_on_demand_base(self, pool: str, units: int) -> None:
        if units < 0:
            raise ValueError(f"{self._group(pool).name}: on-demand base must be >= 0 (got {units})")
        self._group(pool).on_demand_base = units

    def group_of(self, instance_id: str) -> str | None:
        return next((g.name for g in self.groups_.values() if instance_id in g.instances), None)

    def complete_lifecycle_action(self, pool: str, instance_id: str, hook: str, token: str | None) -> bool:
        """The instance held by the terminate hook leaves the group (True); its decrement happened
        when it entered Terminating:Wait. False: no instance of the group waits there."""
        group = self._group(pool)
        instance = group.instances.get(instance_id)
        self.released.append((pool, instance_id, hook, token))
        if instance is None or instance.lifecycle_state != "Terminating:Wait":
            return False
        del group.instances[instance_id]
        return True

    def launch(self, pool: str, instance: GroupInstance) -> None:
        """What the cloud does for desired: add an instance (tests and simulations call it)."""
        self._group(pool).instances[instance.id] = instance


class MemoryNodes:
    """NodeStatePort: heartbeats by pool and node, as the job store keeps them. A draining or
    cordon mark set before a node's first heartbeat waits for it, as a mark-only row."""

    def __init__(self, heartbeats: Iterable[Heartbeat] = ()):
        self.beats: dict[str, dict[str, Heartbeat]] = {}
        self.cordons: dict[tuple[str, str], bool] = {}  # marks set before a node's first heartbeat
        self.drains: set[tuple[str, str]] = set()  # likewise
        self.claims: dict[tuple[str, str], float] = {}  # when each node last took work while idle (`claim_work`)
        self.leave: dict[str, LeaveGrant] = {}  # pool -> the leave grant
        for heartbeat in heartbeats:  # the store's state as given, cordon marks included
            self.beats.setdefault(heartbeat.pool, {})[heartbeat.node_id] = heartbeat

    def record(self, heartbeat: Heartbeat) -> None:
        """The agent's write: every field but the scaler's marks, which survive it (draining is sticky)."""
        key, beats = (heartbeat.pool, heartbeat.node_id), self.beats.setdefault(heartbeat.pool, {})
        old = beats.get(heartbeat.node_id)
        cordoned = old.cordoned if old is not None else self.cordons.get(key, False)
        draining = heartbeat.draining or (old.draining if old is not None else key in self.drains)
        beats[heartbeat.node_id] = replace(heartbeat, cordoned=cordoned, draining=draining)

    def heartbeats(self, pool: str) -> dict[str, Heartbeat]:
        return self.node_rows(pool)[0]

    def node_rows(self, pool: str) -> tuple[dict[str, Heartbeat], frozenset[str]]:
        beats = dict(self.beats.get(pool, {}))
        marked = {node for p, node in (*self.cordons, *self.drains) if p == pool and node not in beats}
        return beats, frozenset(marked)

    def mark_draining(self, pool: str, node_id: str) -> None:
        heartbeat = self.beats.get(pool, {}).get(node_id)
        if heartbeat is None:
            self.drains.add((pool, node_id))
        else:
            self.beats[pool][node_id] = replace(heartbeat, draining=True)

    def let_idle_go(self, pool: str, node_id: str, idle_since: float) -> bool:
        heartbeat = self.beats.get(pool, {}).get(node_id)
        if heartbeat is None or heartbeat.idle_since != idle_since or self.claims.get((pool, node_id), -1.0) > idle_since:
            return False
        self.mark_draining(pool, node_id)
        return True

    def claim_work(self, pool: str, node_id: str, at: float) -> bool:
        heartbeat = self.beats.get(pool, {}).get(node_id)
        if (heartbeat.draining if heartbeat is not None else (pool, node_id) in self.drains):
            return False
        self.claims[pool, node_id] = at
        return True

    def set_cordon(self, pool: str, node_id: str, cordoned: bool) -> None:
        heartbeat = self.beats.get(pool, {}).get(node_id)
        if heartbeat is None:
            self.cordons[pool, node_id] = cordoned
        else:
            self.beats[pool][node_id] = replace(heartbeat, cordoned=cordoned)

    def set_preempt(self, pool: str, node_id: str, keys: list[str]) -> None:
        heartbeat = self.beats.get(pool, {}).get(node_id)
        if heartbeat is not None:  # no heartbeat, no attempts to preempt
            self.beats[pool][node_id] = replace(heartbeat, preempt=list(keys))

    def forget_node(self, pool: str, node_id: str) -> None:
        self.beats.get(pool, {}).pop(node_id, None)
        self.cordons.pop((pool, node_id), None)
        self.drains.discard((pool, node_id))
        self.claims.pop((pool, node_id), None)

    def grant_leave(self, pool: str, units: int, at: float, until: float, stay: int = 0) -> None:
        self.leave[pool] = (units, at, until, stay)

    def take_leave(self, pool: str, units: int, idle_since: float, now: float, cordoned: bool = False) -> bool:
        self.leave[pool], leaves = take_from_grant(self.leave.get(pool, (0, 0.0, 0.0, 0)), units, idle_since, now, cordoned)
        return leaves


class MemoryQueues:
    """QueuePort and QueueStatsPort: backlog and recorded mean item time per configured queue."""

    def __init__(self, backlogs: dict[str, Backlog] | None = None, stats: dict[str, QueueStats] | None = None):
        self.backlogs = dict(backlogs or {})
        self.stats = dict(stats or {})
        self.waiting: dict[str, WaitingMark] = {}
        self.held: dict[str, float] = {}

    def backlog(self, queue: str) -> Backlog:
        return self.backlogs.get(queue, Backlog(0, 0))

    def queue_stats(self, queues: list[str]) -> dict[str, QueueStats]:
        return {q: self.stats[q] for q in queues if q in self.stats}

    def waiting_marks(self, queues: list[str]) -> dict[str, WaitingMark]:
        return {q: self.waiting[q] for q in queues if q in self.waiting}

    def mark_waiting(self, queue: str, mark: WaitingMark | None) -> None:
        _mark(self.waiting, queue, mark)

    def held_since(self, queues: list[str]) -> dict[str, float]:
        return {q: self.held[q] for q in queues if q in self.held}

    def mark_held(self, queue: str, since: float | None) -> None:
        _mark(self.held, queue, since)


def _mark(marks: dict, queue: str, since) -> None:
    if since is None:
        marks.pop(queue, None)
    else:
        marks[queue] = since
