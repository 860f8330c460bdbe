"""The discrete-event engine: one pool, its autoscaling group, its nodes and its items.

Events live in one heap ordered by (time, sequence number), so two runs with the same
inputs and seed take the same steps. Arrivals are merged from the sorted trace instead of
being pushed up front, which keeps the heap small for long traces.

The engine models what every policy shares: the group (desired capacity in units, the
on-demand base, which type and purchase option it launches, which victims it picks on
scale-in), node boot, the worker agent (pull: see `Simulation._pull`; stop intake on a spot
notice), spot interruptions and billing. A policy only observes the engine and
sets desired capacity, terminates exact nodes, or changes the on-demand base.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from tidefleet.config import Environment, InstanceType, Queue
from tidefleet.policy.model import item_seconds_mean, on_demand_units, rate_after, rate_at
from tidefleet.sim.trace import SpotTrace, TraceItem

# Event kinds, in the order they are handled when they fall on the same time and sequence.
BOOTED, DONE, NOTICE, RECLAIM, SPOT_DROP, POLL, KICK, RETRY, SAMPLE = range(9)

RETRY_LAUNCH_S = 60.0  # the group retries a failed launch on its own about once a minute
DRAIN_HORIZON_S = 6 * 3600.0  # after the last item: how long a policy may take to reach min
STALL_S = 7 * 86400.0  # waiting work but nothing started or finished this long: give up


@dataclass(frozen=True, slots=True)
class Timing:
    boot_s: float  # launch to a usable OS with the agent's first heartbeat
    notice_s: float  # spot interruption notice to reclaim
    kick_s: float = 2.0  # submit to the scaler's kicked run (asynchronous invoke)
    # The agent's own time per attempt, holding the item's slots: receive and claim to the
    # workload's start (counted as waiting), and its exit to the slots being free. 0 for traces,
    # whose durations are whole runs; the sandbox's loaded machine measures seconds
    # (tidefleet.sim.calibration).
    start_s: float = 0.0
    finish_s: float = 0.0
    # The scaler's decision to terminate a node to the node stopping (billed until then): the
    # tick's own observe-and-act time and the shutdown. 0 for traces; the sandbox measures it.
    stop_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Interruptions:
    rate_per_hour: float = 0.0  # Poisson notices per spot node-hour
    spot: SpotTrace | None = None  # market levels: drops interrupt, zero refuses launches


NO_INTERRUPTIONS = Interruptions()  # spot is never interrupted


class Policy(Protocol):
    name: str
    poll_s: float  # how often poll() runs
    kick_s: float | None  # also run this soon after a submit (None: never)
    kick_on_notice: bool  # also run at once on a spot notice
    protects_busy: bool  # busy nodes carry scale-in protection

    def poll(self, sim: Simulation) -> None: ...


class Node:
    __slots__ = (
        "busy",
        "busy_s",
        "busy_since",
        "cordoned",
        "free_at",
        "id",
        "idle_since",
        "intake",
        "intake_at",
        "itype",
        "launched_at",
        "name",
        "price",
        "ready_at",
        "record",
        "reported_at",
        "running",
        "slots",
        "spot",
        "state",
        "weight",
    )  # fmt: skip
    free_at: tuple[int, int] | None

    def __init__(self, id: int, itype: InstanceType, weight: int, slots: int, spot: bool, now: float):
        self.id = id
        self.name = f"i-{id:08d}"
        self.itype = itype
        self.weight = weight
        self.slots = slots
        self.spot = spot
        self.price = itype.price(spot) or 0.0
        self.launched_at = now
        self.ready_at: float | None = None
        self.state = "pending"
        self.cordoned = False  # the policy's cordon mark: its agent takes no new items
        self.free_at = None  # (free slots, position) in Simulation.takers while it takes items
        self.busy = 0
        self.idle_since: float | None = None
        self.running: dict[int, float] = {}  # item index -> start of this attempt
        self.busy_since = 0.0
        self.busy_s = 0.0
        self.reported_at: float | None = None  # the agent's last heartbeat: at boot, every change, see beat()
        self.record = None  # the ports' cached group instance and heartbeat, dropped on every change
        self.intake: dict[int, float] = {}  # queue index -> items taken per second (policy.model.rate_after)
        self.intake_at = now

    def changed(self, now: float) -> None:
        self.record = None
        if self.ready_at is not None:
            self.reported_at = now

    def beat(self, now: float, every_s: float) -> None:
        """The agent's periodic heartbeat, at a coarse grain: the real agent beats every few
        seconds, but the policy only asks whether the last beat is older than the boot timeout,
        so refreshing the record once it is `every_s` old (a fraction of that timeout) gives the
        same decisions and keeps cached records between refreshes."""
        if self.reported_at is not None and now - self.reported_at >= every_s:
            self.reported_at = now
            self.record = None


class Takers:
    """The nodes whose agents take items, filed by free slots, so that a uniform random pick
    among those with at least n free slots costs one pass over the slot counts."""

    def __init__(self, most_slots: int):
        self.by_free: list[list[Node]] = [[] for _ in range(most_slots + 1)]

    def add(self, node: Node) -> None:
        line = self.by_free[node.slots - node.busy]
        node.free_at = (node.slots - node.busy, len(line))
        line.append(node)

    def discard(self, node: Node) -> None:
        if node.free_at is None:
            return
        free, pos = node.free_at
        line = self.by_free[free]
        last = line.pop()
        if last is not node:
            line[pos] = last
            last.free_at = (free, pos)
        node.free_at = None

    def pick(self, need: int, rng: random.Random) -> Node | None:
        """Any one node with at least `need` free slots, each equally likely; None if there is none.
        (SQS hands a message to whichever waiting receiver it picks: no best fit, no packing.)"""
        lines = self.by_free[need:]
        total = sum(len(line) for line in lines)
        if not total:
            return None
        k = rng.randrange(total)
        for line in lines:
            if k < len(line):
                return line[k]
            k -= len(line)
        raise AssertionError("unreachable")


@dataclass
class Sample:
    t: float
    queued: int
    running_items: int
    nodes: int
    capacity_slots: int


@dataclass
class Outcome:
    """Raw counts from one run; metrics.summarise turns it into the reported numbers."""

    policy: str
    first_start: list[float | None]
    finished: list[float | None]
    cost_usd: float = 0.0
    node_hours: float = 0.0
    idle_node_hours: float = 0.0
    interruptions: int = 0
    redone_s: float = 0.0
    busy_killed: int = 0  # interruptions caused by a scale-in, not by the spot market
    dead_lettered: int = 0  # items interrupted max_receive_count times: in the dead-letter queue
    peak_nodes: int = 0
    spot_launch_failures: int = 0
    item_cost_usd: dict[int, float] = field(default_factory=dict)  # item index -> its slots' share of node bills
    end_s: float = 0.0
    samples: list[Sample] = field(default_factory=list)


class Simulation:
    def __init__(
        self,
        env: Environment,
        pool: str,
        items: list[TraceItem],
        policy: Policy,
        timing: Timing,
        interruptions: Interruptions = NO_INTERRUPTIONS,
        seed: int = 0,
        sample_s: float | None = None,
    ):
        self.env = env
        self.pool_name = pool
        self.pool = env.pools[pool]
        self.policy = policy
        self.timing = timing
        self.interruptions = interruptions
        self.rng = random.Random(seed)
        self.placement_rng = random.Random(f"placement/{seed}")  # apart: placement draws move no interruption
        self.queues = pool_queues(env, pool)
        self.intake_order = intake_order(env, pool, self.queues)
        self.launch_types = launchable_types(env, pool, max((i.slots for i in items), default=1))
        self.max_slots = max(self.pool.slots(t) for t in self.pool.instance_types)

        self.items = items
        self.queue_of, self.need = placement(self.queues, items)
        self.attempt = [0] * len(items)
        self.outcome = Outcome(policy.name, [None] * len(items), [None] * len(items))

        self.now = items[0].submit_s if items else 0.0
        self.start_s = self.now
        self.heap: list[tuple[float, int, int, object]] = []
        self.seq = itertools.count()
        self.next_arrival = 0
        self.nodes: dict[int, Node] = {}
        self.node_ids = itertools.count(1)
        self.takers = Takers(self.max_slots)
        self.waiting: list[deque[int]] = [deque() for _ in self.queues]  # per queue, in arrival order
        self.held_at: dict[int, float] = {}  # queues the policy holds (team at its share): not pulled
        self.visible = [0] * len(self.queues)
        self.in_flight = [0] * len(self.queues)
        # Per queue, the run time of items finished so far, as the job store keeps it (never the
        # trace's durations of items not finished yet): what the policy may know.
        self.mean_item_s: list[float | None] = [None] * len(self.queues)
        self.finished_items = [0] * len(self.queues)  # the count the job store keeps with the mean
        self.units = 0  # capacity units of pending + running + draining nodes
        self.desired = self.pool.min
        self.on_demand_base = self.pool.on_demand_base
        self.spot_failures: deque[float] = deque()
        self.kick_pending = False
        self.retry_pending = False
        self.done = 0  # items finished or dead-lettered
        self.last_progress = self.now
        self.sample_s = sample_s
        longest = max((i.duration_s for i in items), default=0.0)
        self.horizon = (items[-1].submit_s if items else 0.0) + 2 * longest + STALL_S

    # ----------------------------------------------------------------- observation
    def queued(self, q: int | None = None) -> int:
        return sum(self.visible) if q is None else self.visible[q]

    def running_items(self, q: int | None = None) -> int:
        return sum(self.in_flight) if q is None else self.in_flight[q]

    def alive(self) -> list[Node]:
        return list(self.nodes.values())

    def spot_failures_since(self, since: float) -> tuple[float, ...]:
        while self.spot_failures and self.spot_failures[0] < since:
            self.spot_failures.popleft()
        return tuple(self.spot_failures)

    def node_named(self, name: str) -> Node | None:
        """The live node with this instance id (`i-%08d`), or None (gone, or not this group's)."""
        prefix, _, number = name.partition("-")
        node = self.nodes.get(int(number)) if prefix == "i" and number.isdigit() else None
        return node if node is not None and node.name == name else None

    def launch_weight(self) -> int:
        """Units one more node adds (the type the group would launch next)."""
        return self.launch_types[0].weight

    # ----------------------------------------------------------------- actions
    def set_desired(self, units: int) -> None:
        self.desired = max(self.pool.min, min(self.pool.max, units))
        self._reconcile()

    def set_on_demand_base(self, units: int) -> None:
        self.on_demand_base = units
        self._reconcile()

    def terminate(self, node: Node, decrement: bool = True) -> None:
        """Terminate one exact node, like terminate-instance-in-auto-scaling-group; at min the
        decrement stops there and the group launches a replacement."""
        if node.busy:
            self.outcome.busy_killed += len(node.running)
        self._remove(node, billed_until=self.now + self.timing.stop_s)
        if decrement:
            self.desired = max(self.pool.min, self.desired - node.weight)
        self._reconcile()  # dispatches what the node ran

    # ----------------------------------------------------------------- the run
    def run(self) -> Outcome:
        self._push(self.now, POLL, None)
        if self.sample_s:
            self._push(self.now, SAMPLE, None)
        spot = self.interruptions.spot
        if spot is not None:
            self._drops = spot.drops(self.now, math.inf)
            self._next_drop()
        items, n = self.items, len(self.items)
        done_at = None
        while True:
            arrival_t = items[self.next_arrival].submit_s if self.next_arrival < n else math.inf
            event_t = self.heap[0][0] if self.heap else math.inf
            if arrival_t <= event_t:
                if arrival_t == math.inf:
                    break
                self.now = arrival_t
                self._arrive(self.next_arrival)
                self.next_arrival += 1
            else:
                t, _, kind, payload = heapq.heappop(self.heap)
                self.now = t
                self._handle(kind, payload)
            if self.done == n:
                if done_at is None:
                    done_at = self.now
                settled = self.units <= self.pool.min and all(
                    nd.state != "pending" for nd in self.nodes.values()
                )
                if settled or self.now >= done_at + DRAIN_HORIZON_S:
                    break
            elif (
                self.next_arrival == n and not any(self.in_flight) and self.now - self.last_progress > STALL_S
            ):
                break  # work waits and nothing runs: the policy will never serve it
            elif self.now > self.horizon:
                break  # work keeps being lost (e.g. scale-in killing long items): report it unfinished
        return self._close()

    def _close(self) -> Outcome:
        for node in list(self.nodes.values()):
            self._remove(node)
        self.outcome.end_s = self.now
        return self.outcome

    def _push(self, t: float, kind: int, payload: object) -> None:
        heapq.heappush(self.heap, (t, next(self.seq), kind, payload))

    def _handle(self, kind: int, payload) -> None:
        if kind == DONE:
            node_id, index, attempt = payload
            if self.attempt[index] == attempt and node_id in self.nodes:
                self._finish(self.nodes[node_id], index)
        elif kind == POLL:
            self.policy.poll(self)
            self._push(self.now + self.policy.poll_s, POLL, None)
        elif kind == KICK:
            self.kick_pending = False
            self.policy.poll(self)
        elif kind == BOOTED:
            node = self.nodes.get(payload)
            if node is not None and node.state == "pending":
                node.state = "running"
                node.ready_at = node.idle_since = self.now
                node.changed(self.now)
                self._refile(node)
                self._pull(node)
        elif kind == NOTICE:
            node = self.nodes.get(payload)
            if node is not None and node.state != "draining":
                self._notice(node)
        elif kind == RECLAIM:
            node = self.nodes.get(payload)
            if node is not None:
                self._remove(node)
                self._reconcile()  # the group replaces reclaimed capacity up to desired; dispatches
        elif kind == SPOT_DROP:
            self._spot_drop(payload)
        elif kind == RETRY:
            self.retry_pending = False
            self._reconcile()
        elif kind == SAMPLE:
            self._sample()
            self._push(self.now + self.sample_s, SAMPLE, None)

    # ----------------------------------------------------------------- items
    def _arrive(self, index: int) -> None:
        q = self.queue_of[index]
        self.waiting[q].append(index)
        self.visible[q] += 1
        # Behind others, it waits for them (no node had room for them); a held queue, for its release.
        if len(self.waiting[q]) == 1 and q not in self.held_at:
            node = self.takers.pick(self.need[index], self.placement_rng)
            if node is not None:
                self._start(node, self.waiting[q].popleft())
        if self.policy.kick_s is not None and not self.kick_pending:
            self.kick_pending = True
            self._push(self.now + self.policy.kick_s, KICK, None)

    def takes_items(self, node: Node) -> bool:
        """Its agent receives: booted, not stopping intake, not cordoned."""
        return node.state == "running" and not node.cordoned

    def _refile(self, node: Node) -> None:
        """File the node under its free slots again (after any change to them or to takes_items)."""
        self.takers.discard(node)
        if self.takes_items(node):
            self.takers.add(node)

    def _pull(self, node: Node) -> None:
        """The agent's intake (`agent.worker.Agent._intake`): its queues by priority (config order
        among equals), from each the oldest items while they fit its free slots. So a node that
        frees a slot takes small items before a big one waits for a whole node: fragmentation."""
        if not self.takes_items(node):
            return
        for q in self.intake_order:
            if q in self.held_at:
                continue
            line = self.waiting[q]
            while line and self.need[line[0]] <= node.slots - node.busy:
                self._start(node, line.popleft())

    def _dispatch(self) -> None:
        """Items waiting while agents have room (after requeues, launches): queue by queue in
        intake order, each head to any node it fits, until none fits."""
        for q in self.intake_order:
            if q in self.held_at:
                continue
            line = self.waiting[q]
            while line:
                node = self.takers.pick(self.need[line[0]], self.placement_rng)
                if node is None:
                    break
                self._start(node, line.popleft())

    def _start(self, node: Node, index: int) -> None:
        need = self.need[index]
        assert need <= node.slots - node.busy and self.takes_items(node), "placed on a node without room"
        if node.busy == 0:
            node.busy_since = self.now
            node.idle_since = None
        node.busy += need
        node.changed(self.now)
        self._refile(node)
        node.running[index] = self.now
        q = self.queue_of[index]
        node.intake[q] = rate_after(node.intake.get(q, 0.0), node.intake_at, self.now)
        for other in node.intake:
            if other != q:
                node.intake[other] = rate_at(node.intake[other], node.intake_at, self.now)
        node.intake_at = self.now
        self.visible[q] -= 1
        self.in_flight[q] += 1
        if self.outcome.first_start[index] is None:
            self.outcome.first_start[index] = self.now + self.timing.start_s
        self.last_progress = self.now
        held_s = self.timing.start_s + self.items[index].duration_s + self.timing.finish_s
        self._push(self.now + held_s, DONE, (node.id, index, self.attempt[index]))

    def _release_slots(self, node: Node, index: int) -> None:
        share = self.need[index] / node.slots * node.price * (self.now - node.running[index]) / 3600.0
        self.outcome.item_cost_usd[index] = self.outcome.item_cost_usd.get(index, 0.0) + share
        del node.running[index]
        node.busy -= self.need[index]
        node.changed(self.now)
        self._refile(node)
        if node.busy == 0:
            node.busy_s += self.now - node.busy_since
            node.idle_since = self.now
        self.in_flight[self.queue_of[index]] -= 1

    def _finish(self, node: Node, index: int) -> None:
        q = self.queue_of[index]
        self.mean_item_s[q] = item_seconds_mean(self.mean_item_s[q], self.now - node.running[index])
        self.finished_items[q] += 1
        self._release_slots(node, index)
        self.outcome.finished[index] = self.now
        self.done += 1
        self.last_progress = self.now
        self._pull(node)

    def _requeue(self, node: Node, index: int) -> None:
        """The node went away under the item: its work is lost and it waits again, first in line,
        unless SQS's redrive policy moves it to the dead-letter queue: every attempt was a
        receive, and after `Queue.max_receive_count` of them the message is dead-lettered."""
        self.outcome.interruptions += 1
        self.outcome.redone_s += self.now - node.running[index]
        self._release_slots(node, index)
        self.attempt[index] += 1
        q = self.queue_of[index]
        if self.attempt[index] >= self.queues[q][1].max_receive_count:
            self.outcome.dead_lettered += 1
            self.done += 1  # settled, not finished: reported as unfinished and dead-lettered
            return
        self.waiting[q].appendleft(index)
        self.visible[q] += 1

    # ----------------------------------------------------------------- nodes and the group
    def _launch(self) -> bool:
        od_units = sum(n.weight for n in self.nodes.values() if not n.spot)
        spot = od_units >= on_demand_units(self.desired, self.on_demand_base, self.pool.on_demand_percent)
        if spot and self._spot_unavailable():
            self.spot_failures.append(self.now)
            self.outcome.spot_launch_failures += 1
            if not self.retry_pending:
                self.retry_pending = True
                self._push(self.now + RETRY_LAUNCH_S, RETRY, None)
            return False
        itype = self.launch_types[0]
        node = Node(next(self.node_ids), itype, itype.weight, self.pool.slots(itype), spot, self.now)
        self.nodes[node.id] = node
        self.units += node.weight
        self.outcome.peak_nodes = max(self.outcome.peak_nodes, len(self.nodes))
        self._push(self.now + self.timing.boot_s, BOOTED, node.id)
        if spot and self.interruptions.rate_per_hour > 0:
            life = self.rng.expovariate(self.interruptions.rate_per_hour / 3600.0)
            self._push(self.now + life, NOTICE, node.id)
        return True

    def _spot_unavailable(self) -> bool:
        spot = self.interruptions.spot
        return spot is not None and spot.level_at(self.now) <= 0

    def _reconcile(self) -> None:
        """The group's own loop: launch up to desired, or remove unprotected victims down to it."""
        while self.units < self.desired:
            if not self._launch():
                break
        if self.units <= self.desired:
            self._dispatch()
            return
        # Default termination policy with one template and per-second billing: effectively
        # arbitrary, so a seeded random pick among nodes without scale-in protection.
        protect = self.policy.protects_busy
        victims = [n for n in self.nodes.values() if not (protect and n.busy)]
        self.rng.shuffle(victims)
        for node in victims:
            if self.units - node.weight < self.desired:
                continue
            if node.busy:
                self.outcome.busy_killed += len(node.running)
            self._remove(node)
        self._dispatch()

    def _remove(self, node: Node, billed_until: float | None = None) -> None:
        """The node is gone (terminated or reclaimed): bill it and requeue whatever it ran."""
        node.state = "gone"
        for index in list(node.running):
            self._requeue(node, index)
        self.takers.discard(node)
        del self.nodes[node.id]
        self.units -= node.weight
        hours = ((self.now if billed_until is None else billed_until) - node.launched_at) / 3600.0
        self.outcome.node_hours += hours
        self.outcome.idle_node_hours += hours - node.busy_s / 3600.0
        self.outcome.cost_usd += hours * node.price

    def set_cordon(self, node: Node, cordoned: bool) -> None:
        """The scaler's cordon mark, as the agent reads it: no new items while it is set."""
        node.cordoned = cordoned
        node.changed(self.now)
        self._refile(node)
        if not cordoned:
            self._dispatch()

    def set_held(self, q: int, since: float | None) -> None:
        """The scaler's hold mark on queue q, as the agents read it: no new items from it while set."""
        if since is None:
            self.held_at.pop(q, None)
            self._dispatch()
        else:
            self.held_at[q] = since

    def oldest_waiting(self, q: int) -> float | None:
        """Submit time of queue q's oldest waiting item (its line's head)."""
        line = self.waiting[q]
        return self.items[line[0]].submit_s if line else None

    def stop_intake(self, node: Node) -> None:
        """The node is draining: its agent takes no more items; those it runs may finish."""
        node.state = "draining"
        node.changed(self.now)
        self._refile(node)

    def _notice(self, node: Node) -> None:
        """Spot notice: the agent stops intake; items that end before the reclaim still finish."""
        self.stop_intake(node)
        self._push(self.now + self.timing.notice_s, RECLAIM, node.id)
        if self.policy.kick_on_notice and (any(self.visible) or any(self.in_flight)):
            self.policy.poll(self)

    def _spot_drop(self, share: float) -> None:
        spot_nodes = [n for n in self.nodes.values() if n.spot and n.state != "draining"]
        hit = round(share * len(spot_nodes))
        for node in self.rng.sample(spot_nodes, hit):
            if node.id in self.nodes and node.state != "draining":
                self._notice(node)
        self._next_drop()

    def _next_drop(self) -> None:
        nxt = next(self._drops, None)
        if nxt is not None:
            self._push(nxt[0], SPOT_DROP, nxt[1])

    def _sample(self) -> None:
        self.outcome.samples.append(
            Sample(self.now, self.queued(), self.running_items(), len(self.nodes),
                   sum(n.slots for n in self.nodes.values() if n.state == "running"))
        )  # fmt: skip


def pool_queues(env: Environment, pool: str) -> list[tuple[str, Queue]]:
    """The queues feeding a pool, smallest items first."""
    queues = sorted(env.queues_of(pool).items(), key=lambda kv: kv[1].slots_per_item)
    if not queues:
        raise ValueError(f"pools.{pool}: no queue feeds this pool; add a [queues.NAME] with pool = {pool!r}")
    return queues


def intake_order(env: Environment, pool: str, queues: list[tuple[str, Queue]]) -> list[int]:
    """Indices into `queues` in the order an agent of the pool receives from them: priority,
    highest first, then the order of the environment file (the agent's stable sort)."""
    in_file = list(env.queues_of(pool))
    return sorted(range(len(queues)), key=lambda q: (-queues[q][1].priority, in_file.index(queues[q][0])))


def placement(queues: list[tuple[str, Queue]], items: list[TraceItem]) -> tuple[list[int], list[int]]:
    """(queue index, slots taken) per item.

    An item goes to the pool's queue with the smallest slots_per_item that holds it (else the
    largest) and takes that many slots, as the agent reserves a queue's slots per item. An item
    whose trace group is the `team` of some of the queues goes to one of those (a team's work).
    """
    teams: dict[str, list[int]] = {}
    for i, (_, queue) in enumerate(queues):
        if queue.team is not None:
            teams.setdefault(queue.team, []).append(i)
    every = list(range(len(queues)))
    queue_of, need = [], []
    for item in items:
        own = teams.get(item.group, every)
        q = next((i for i in own if queues[i][1].slots_per_item >= item.slots), own[-1])
        queue_of.append(q)
        need.append(max(item.slots, queues[q][1].slots_per_item))
    return queue_of, need


def launchable_types(env: Environment, pool: str, largest_item: int) -> list[InstanceType]:
    """Types the group may launch, cheapest spot $/unit first.

    Like the config rule that every type must fit its queues' items, types too small for the
    trace's largest fitting item are left out: the group does not know item sizes.
    """
    p = env.pools[pool]
    biggest = max(p.slots(t) for t in p.instance_types)
    fits = [t for t in p.instance_types if p.slots(t) >= min(largest_item, biggest)]
    return sorted(fits, key=lambda t: (t.price(True) or math.inf) / t.weight)
