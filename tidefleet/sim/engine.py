"""The discrete-event engine: one pool, its autoscaling group, its nodes and its items.

Events live in one heap ordered by (time, sequence number), so two runs with the same
inputs and seed take the same steps. Arrivals are merged from the sorted trace instead of
being pushed up front, which keeps the heap small for long traces.

The engine models what every policy shares: the group (desired capacity in units, the
on-demand base, which type and purchase option it launches, which victims it picks on
scale-in), node boot, the worker agent (pull: see `Simulation._pull`; stop intake on a spot
notice), gangs (see `Gang`), spot interruptions and billing. A policy only observes the engine
and sets desired capacity, terminates exact nodes, or changes the on-demand base.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from tidefleet.config import Environment, InstanceType, Queue
from tidefleet.policy.model import item_seconds_mean, on_demand_units, rate_after, rate_at
from tidefleet.records import take_from_grant
from tidefleet.sim.trace import SpotTrace, TraceItem

if TYPE_CHECKING:
    from collections.abc import Callable

# Event kinds, in the order they are handled when they fall on the same time and sequence.
BOOTED, DONE, NOTICE, RECLAIM, SPOT_DROP, POLL, KICK, RETRY, SAMPLE, GANG_DONE, RENDEZVOUS, LEAVE, ACKED, TIMED = range(14)
READS_ONLY = (POLL, KICK, SAMPLE)  # events that change nothing themselves (a tick's actions count apart)

RETRY_LAUNCH_S = 60.0  # the group retries a failed launch on its own about once a minute
DRAIN_HORIZON_S = 6 * 3600.0  # after the last item: how long a policy may take to reach min
PROGRESS_EVENTS = 4096  # `run` tells its progress callback every this many events (~10^6 a long trace)
STALL_S = 7 * 86400.0  # waiting work but nothing arrived, started or finished this long: give up
# Why a run gave up with items unfinished (`Outcome.stopped`; None: it ran to the end).
STALLED = "stalled"  # items waited STALL_S while nothing arrived, started or finished
HORIZON = "horizon"  # past the last submit + twice the longest item + STALL_S, items still unfinished


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
    # A finished item's exit to its message being deleted, when later than its slots are free: it
    # stays in flight to the scaler until then (the agent records successes and deletes their
    # messages in batches, `agent.worker.ACK_FLUSH_S`). 0 for traces; the sandbox measures it.
    ack_s: float = 0.0
    # A finished item's run time to the scaler's view of its queue's mean (QueueStats): the agent
    # records the times of its items with its next heartbeat (`Agent._record_item_seconds`). Until
    # the first one lands the boot horizon counts no turnover, and a tick then may launch for items
    # a known mean would see finish in time. 0 for traces; the calibration's sandbox beats every 1 s.
    stats_s: float = 0.0
    # The scaler's decision to terminate a node to the node stopping (billed until then): the
    # tick's own observe-and-act time and the shutdown. 0 for traces; the sandbox measures it.
    stop_s: float = 0.0
    # A node that went idle finds nothing to receive this long after, and then may leave on the
    # scaler's grant: its agent's first long poll when idle (`agent.worker.LEAVE_POLL_S`).
    idle_poll_s: float = 2.0
    # Work a preempted attempt repeats when it resumes: the checkpoint written at the stop and read
    # back at the restart, and whatever the workload does again (a model load). An assumption: the
    # sandbox's workloads checkpoint in well under a second, real training in tens of seconds.
    resume_s: float = 60.0
    # Boots measured node by node (the calibration's sandbox), given to the nodes in launch order,
    # in turn: nodes launched together are then ready at different times, as real ones are, rather
    # than all at `boot_s`. () for traces: every node boots in `boot_s`.
    boots_s: tuple[float, ...] = ()


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

    def poll_again(self, sim: Simulation, first: float) -> None:
        """A run that first polled at `first` polls again: only a policy that calls
        `Simulation.tick_again` is asked (the baselines never are)."""


class Node:
    __slots__ = (
        "busy",
        "busy_s",
        "busy_since",
        "cordoned",
        "free_at",
        "gang",
        "id",
        "idle_since",
        "intake",
        "intake_at",
        "itype",
        "launched_at",
        "listed",
        "name",
        "preempting",
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
        self.gang: Gang | None = None  # the gang it is a member of (it then holds all its slots)
        self.idle_since: float | None = None
        self.running: dict[int, float] = {}  # item index -> start of this attempt
        self.preempting: tuple[str, ...] = ()  # the scaler's preempt mark: attempt keys to stop
        self.busy_since = 0.0
        self.busy_s = 0.0
        self.reported_at: float | None = None  # the agent's last heartbeat: at boot, every change, see ports.agents_beat
        self.listed = None  # the ports' cached group instance (see sim.ports._listed)
        self.record = None  # the ports' cached heartbeat, dropped on every change
        self.intake: dict[int, float] = {}  # queue index -> items taken per second (policy.model.rate_after)
        self.intake_at = now

    def changed(self, now: float) -> None:
        self.record = None
        if self.ready_at is not None:
            self.reported_at = now


class Gang:
    """One gang item on its member nodes, one member per node holding all its slots.

    A free node that receives a gang item leads a forming gang (the pool's only one); other nodes,
    once wholly free, join it before they receive anything. At `lo` members it starts, all at once;
    an elastic gang (`lo < hi`) takes joiners up to `hi` while it runs (the rendezvous restart is
    not modelled: no pause) and runs on while `lo` members remain. Its duration does not depend on
    how many members it has. A forming gang short of `lo` after the pool's boot_timeout_s lets its item go back (as the agent's lead does)
    to the queue (not an attempt). A stopped gang (a member lost from a fixed gang, or an elastic one
    below `lo`) goes back whole as one interruption and resumes from its checkpoint: the work it did
    is kept (`Simulation.left_s`).
    """

    __slots__ = ("hi", "index", "lo", "members", "started_at")

    def __init__(self, index: int, lo: int, hi: int):
        self.index = index
        self.lo = lo
        self.hi = hi
        self.members: list[Node] = []
        self.started_at: float | None = None

    def stops_without(self, node: Node) -> bool:
        """Losing this member stops the running gang whole (a fixed gang has exactly `lo` members)."""
        return self.started_at is not None and len(self.members) - 1 < self.lo


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
    stopped: str | None = None  # STALLED or HORIZON: the run gave up with items unfinished
    held: tuple[str, ...] = ()  # queues with items waiting that the quotas held when the run gave up


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
        self.gang_size = [queue.gang if is_gang(queue) else None for _, queue in self.queues]
        self.forming: Gang | None = None  # the pool's one gang waiting for members
        self.running_gangs: dict[int, Gang] = {}  # item index -> its gang, in start order
        # Work an item stopped with a checkpoint has left: a gang gone back whole, a preempted attempt.
        self.left_s: dict[int, float] = {}
        # Queues whose agents list their attempts for the scaler to preempt (`Queue.preemptible`).
        self.preemptible = {q for q, (_, queue) in enumerate(self.queues) if queue.preemptible and not is_gang(queue)}
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
        self.retick_first: float | None = None  # the pending kick is a retick of the run that started then
        self.leave_grant = (0, 0.0, 0.0, 0)  # the scaler's (units, granted at, until, stay): see grant_leave
        self.retry_pending = False
        # Events and actions so far: while it holds, nothing happened that a tick could see
        # change (TidefleetPolicy skips the ticks the policy shows would change nothing).
        self.changes = 0
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

    def forming_short(self) -> int:
        """Members the forming gang still waits for (it holds its item in flight meanwhile)."""
        return self.forming.lo - len(self.forming.members) if self.forming is not None else 0

    def launch_weight(self) -> int:
        """Units one more node adds (the type the group would launch next)."""
        return self.launch_types[0].weight

    # ----------------------------------------------------------------- actions
    def set_desired(self, units: int) -> None:
        self.changes += 1
        self.desired = max(self.pool.min, min(self.pool.max, units))
        self._reconcile()

    def set_on_demand_base(self, units: int) -> None:
        self.changes += 1
        self.on_demand_base = units
        self._reconcile()

    def grant_leave(self, units: int, at: float, until: float, stay: int = 0) -> None:
        """The scaler's leave grant (`JobStore.grant_leave`), as the agents take it: see LEAVE."""
        self.leave_grant = (units, at, until, stay)

    def tick_again(self, at: float, first: float) -> None:
        """The scaler's run that started at `first` ticks again at `at` (`tidefleet.triggers.run`
        while items wait). Submits meanwhile send no kick of their own: the function runs one
        invocation at a time, so theirs would be throttled while this one sleeps."""
        if not self.kick_pending:
            self.kick_pending = True
            self.retick_first = first
            self._push(at, KICK, None)
        elif self.retick_first is not None:
            # A run that started while an earlier run's retick was pending (a scheduled tick): the
            # function would have been throttled until that run's last tick, and then looped on
            # its own. Without this, its reticks were dropped and items waited a whole schedule.
            self.retick_first = max(self.retick_first, first)

    def _idle_poll(self, node: Node) -> None:
        """A wholly free node's agent finds nothing to receive one long poll later: then it asks
        for the leave grant (`agent.worker.Agent._leave_if_granted`)."""
        if node.busy == 0 and node.gang is None and node.state == "running":
            self._push(self.now + self.timing.idle_poll_s, LEAVE, (node.id, node.idle_since))

    def terminate(self, node: Node, decrement: bool = True) -> None:
        """Terminate one exact node, like terminate-instance-in-auto-scaling-group; at min the
        decrement stops there and the group launches a replacement."""
        self.outcome.busy_killed += self._items_killed(node)
        self._remove(node, billed_until=self.now + self.timing.stop_s)
        if decrement:
            self.desired = max(self.pool.min, self.desired - node.weight)
        self._reconcile()  # dispatches what the node ran

    # ----------------------------------------------------------------- the run
    def run(self, progress: Callable[[int, int, float], object] | None = None) -> Outcome:
        """Replay every item to its end. `progress(items done, items, now)` is called every
        `PROGRESS_EVENTS` events: the caller decides what to say and when (the replay keeps no clock)."""
        self._push(self.now, POLL, None)
        if self.sample_s:
            self._push(self.now, SAMPLE, None)
        spot = self.interruptions.spot
        if spot is not None:
            self._drops = spot.drops(self.now, math.inf)
            self._next_drop()
        items, n = self.items, len(self.items)
        done_at = None
        for events in itertools.count(1):
            if progress is not None and events % PROGRESS_EVENTS == 0:
                progress(self.done, n, self.now)
            arrival_t = items[self.next_arrival].submit_s if self.next_arrival < n else math.inf
            event_t = self.heap[0][0] if self.heap else math.inf
            if arrival_t <= event_t:
                if arrival_t == math.inf:
                    break
                self.now = arrival_t
                self.changes += 1
                self.last_progress = arrival_t  # a stall counts from here: a quiet week before it is no stall
                self._arrive(self.next_arrival)
                self.next_arrival += 1
            else:
                t, _, kind, payload = heapq.heappop(self.heap)
                self.now = t
                if kind not in READS_ONLY:
                    self.changes += 1
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
                self.outcome.stopped = STALLED  # work waits and nothing runs: the policy will never serve it
                self.outcome.held = tuple(name for q, (name, _) in enumerate(self.queues)
                                          if q in self.held_at and self.waiting[q])  # fmt: skip
                break
            elif self.now > self.horizon:
                self.outcome.stopped = HORIZON  # work keeps being lost (scale-in killing long items) or queued behind
                break
        return self._close()

    def _close(self) -> Outcome:
        """The run ends: the nodes still up are billed to now. Items they were running are cut off
        by the end, not interrupted: reported unfinished, no work redone, none dead-lettered."""
        o = self.outcome
        counts = o.interruptions, o.redone_s, o.dead_lettered
        for node in list(self.nodes.values()):
            self._remove(node)
        o.interruptions, o.redone_s, o.dead_lettered = counts
        self.outcome.end_s = self.now
        return self.outcome

    def _push(self, t: float, kind: int, payload: object) -> None:
        heapq.heappush(self.heap, (t, next(self.seq), kind, payload))

    def _handle(self, kind: int, payload) -> None:
        if kind == DONE:
            node_id, index, attempt = payload
            if self.attempt[index] == attempt and node_id in self.nodes:
                self._finish(self.nodes[node_id], index)
        elif kind == GANG_DONE:
            index, attempt = payload
            if self.attempt[index] == attempt and index in self.running_gangs:
                self._finish_gang(self.running_gangs[index])
        elif kind == ACKED:  # counted as a change by run(), as every event that is not READS_ONLY
            self.in_flight[payload] -= 1
        elif kind == TIMED:
            self._timed(*payload, recorded=True)
        elif kind == RENDEZVOUS:
            if self.forming is payload:
                self._release_forming(payload)
                self._dispatch()
        elif kind == POLL:
            self.policy.poll(self)
            self._push(self.now + self.policy.poll_s, POLL, None)
        elif kind == LEAVE:
            node_id, since = payload
            node = self.nodes.get(node_id)
            # Still idle since then (nothing came in the poll), gone idle after the tick that
            # granted: it stays if it is one of the first to (for the next tick to judge), or
            # leaves, with a decrement, while the grant holds its units.
            if node is not None and node.idle_since == since and node.busy == 0 and node.gang is None and node.state == "running":
                self.leave_grant, leaves = take_from_grant(self.leave_grant, node.weight, since, self.now, node.cordoned)
                if leaves:
                    self.terminate(node)
        elif kind == KICK:
            self.kick_pending = False
            first, self.retick_first = self.retick_first, None
            if first is None:
                self.policy.poll(self)
            else:
                self.policy.poll_again(self, first)
        elif kind == BOOTED:
            node = self.nodes.get(payload)
            if node is not None and node.state == "pending":
                node.state = "running"
                node.ready_at = node.idle_since = self.now
                node.changed(self.now)
                self._refile(node)
                self._pull(node)
                self._idle_poll(node)
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
        # Behind others, it waits for them (no node had room for them); a held queue, for its
        # release; a gang item, for the pool's forming gang to fill.
        if len(self.waiting[q]) == 1 and q not in self.held_at:
            gang = self.gang_size[q] is not None
            if not (gang and self.forming):
                node = self.takers.pick(self.need[index], self.placement_rng)
                if node is not None:
                    (self._lead if gang else self._start)(node, self.waiting[q].popleft())
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
        if node.busy == 0 and (gang := self._open_gang()) is not None:
            self._join(gang, node)  # a wholly free node joins an open gang before receiving
            return
        for q in self.intake_order:
            if q in self.held_at:
                continue
            line = self.waiting[q]
            if self.gang_size[q] is not None:
                if line and node.busy == 0 and self.forming is None:
                    self._lead(node, line.popleft())
                continue
            while line and self.need[line[0]] <= node.slots - node.busy:
                self._start(node, line.popleft())

    def _dispatch(self) -> None:
        """Items waiting while agents have room (after requeues, launches): queue by queue in
        intake order, each head to any node it fits, until none fits; wholly free nodes first join
        the open gangs, and a gang item is led only while no other gang forms."""
        self._recruit()
        for q in self.intake_order:
            if q in self.held_at:
                continue
            line = self.waiting[q]
            gang = self.gang_size[q] is not None
            while line and not (gang and self.forming):
                node = self.takers.pick(self.need[line[0]], self.placement_rng)
                if node is None:
                    break
                (self._lead if gang else self._start)(node, line.popleft())

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
        self._received(node, index)
        if self.outcome.first_start[index] is None:
            self.outcome.first_start[index] = self.now + self.timing.start_s
        self.last_progress = self.now
        held_s = self.timing.start_s + self._work_left(index) + self.timing.finish_s
        self._push(self.now + held_s, DONE, (node.id, index, self.attempt[index]))

    def _received(self, node: Node, index: int) -> None:
        """The node's agent took the item's message: in flight, and the node's intake rate."""
        q = self.queue_of[index]
        node.intake[q] = rate_after(node.intake.get(q, 0.0), node.intake_at, self.now)
        for other in node.intake:
            if other != q:
                node.intake[other] = rate_at(node.intake[other], node.intake_at, self.now)
        node.intake_at = self.now
        self.visible[q] -= 1
        self.in_flight[q] += 1

    # ----------------------------------------------------------------- gangs
    def _open_gang(self) -> Gang | None:
        """The gang a wholly free node joins: the forming one, else a running elastic one below its max."""
        if self.forming is not None:
            return self.forming
        return next((g for g in self.running_gangs.values() if len(g.members) < g.hi), None)

    def _recruit(self) -> None:
        """Wholly free nodes join the open gangs (any one of them each time, as they poll)."""
        while self.running_gangs or self.forming:
            gang = self._open_gang()
            node = self.takers.pick(self.need[gang.index], self.placement_rng) if gang is not None else None
            if node is None:
                return
            self._join(gang, node)

    def _lead(self, node: Node, index: int) -> None:
        """The node received a gang item: it opens the pool's forming gang, which free nodes join."""
        q = self.queue_of[index]
        gang = self.forming = Gang(index, *self.gang_size[q])
        self._received(node, index)
        self._join(gang, node)
        if gang.started_at is None:
            self._push(self.now + self.env.pools[self.pool_name].boot_timeout_s, RENDEZVOUS, gang)
        self._recruit()

    def _join(self, gang: Gang, node: Node) -> None:
        """A member holds all its node's slots (so the node is protected and takes nothing else);
        a forming member is billed and counts as idle until the gang starts."""
        gang.members.append(node)
        node.gang = gang
        node.busy = node.slots
        node.idle_since = None
        node.changed(self.now)
        self._refile(node)
        if gang.started_at is not None:
            node.busy_since = self.now
        elif len(gang.members) >= gang.lo:
            self._start_gang(gang)
        else:
            gang.members[0].changed(self.now)  # the lead's beacon says how many it still waits for

    def _start_gang(self, gang: Gang) -> None:
        index = gang.index
        gang.started_at = self.now
        self.forming = None
        self.running_gangs[index] = gang
        for node in gang.members:
            node.busy_since = self.now
        gang.members[0].changed(self.now)  # the lead's beacon comes down
        if self.outcome.first_start[index] is None:
            self.outcome.first_start[index] = self.now + self.timing.start_s
        self.last_progress = self.now
        held_s = self.timing.start_s + self._work_left(index) + self.timing.finish_s
        self._push(self.now + held_s, GANG_DONE, (index, self.attempt[index]))

    def _leave(self, gang: Gang, node: Node) -> None:
        gang.members.remove(node)
        node.gang = None
        node.busy = 0
        if gang.started_at is not None:
            node.busy_s += self.now - node.busy_since
        node.idle_since = self.now
        node.changed(self.now)
        self._refile(node)

    def _disband(self, gang: Gang) -> list[Node]:
        members = list(gang.members)
        for node in members:
            self._leave(gang, node)
        return members

    def _finish_gang(self, gang: Gang) -> None:
        index, q = gang.index, self.queue_of[gang.index]
        self._timed(q, self.now - gang.started_at)
        del self.running_gangs[index]
        self._ack(q)
        self.outcome.finished[index] = self.now
        self.done += 1
        self.last_progress = self.now
        for node in self._disband(gang):
            self._pull(node)
            self._idle_poll(node)

    def _release_forming(self, gang: Gang) -> None:
        """Short of members (rendezvous timeout, or every member gone): the item goes back to the
        head of its queue, not as a failed attempt; the members are free again."""
        self.forming = None
        self._disband(gang)
        q = self.queue_of[gang.index]
        self.in_flight[q] -= 1
        self.waiting[q].appendleft(gang.index)
        self.visible[q] += 1

    def _lose_member(self, node: Node) -> None:
        """The member stops (spot notice, or its node is gone): a forming gang waits on without it,
        an elastic one runs on while `lo` remain, else the gang stops and goes back whole."""
        gang = node.gang
        if gang.stops_without(node):
            index, q = gang.index, self.queue_of[gang.index]
            self._checkpoint(index, self.now - gang.started_at)
            self.outcome.interruptions += 1
            del self.running_gangs[index]
            self._disband(gang)
            self.in_flight[q] -= 1
            self._receive_again(index)
            return
        self._leave(gang, node)
        if gang.started_at is None and not gang.members:
            self._release_forming(gang)

    def _items_killed(self, node: Node) -> int:
        """Items that terminating this node kills: those it runs, and a gang that stops without it."""
        return len(node.running) + (node.gang is not None and node.gang.stops_without(node))

    def _release_slots(self, node: Node, index: int, *, finished: bool = False) -> None:
        """The item's slots are free; its message leaves flight now, or (`finished`) once deleted."""
        share = self.need[index] / node.slots * node.price * (self.now - node.running[index]) / 3600.0
        self.outcome.item_cost_usd[index] = self.outcome.item_cost_usd.get(index, 0.0) + share
        del node.running[index]
        node.busy -= self.need[index]
        node.changed(self.now)
        self._refile(node)
        if node.busy == 0:
            node.busy_s += self.now - node.busy_since
            node.idle_since = self.now
        if finished:
            self._ack(self.queue_of[index])
        else:
            self.in_flight[self.queue_of[index]] -= 1

    def _ack(self, q: int) -> None:
        """A finished item's message is deleted `Timing.ack_s` after its exit: now, if its slots
        were held that long."""
        lag = self.timing.ack_s - self.timing.finish_s
        if lag > 0:
            self._push(self.now + lag, ACKED, q)
        else:
            self.in_flight[q] -= 1

    def _timed(self, q: int, seconds: float, *, recorded: bool = False) -> None:
        """A finished item's run time, into its queue's mean once recorded (`Timing.stats_s`)."""
        if not recorded and self.timing.stats_s > 0:
            self._push(self.now + self.timing.stats_s, TIMED, (q, seconds))
            return
        self.mean_item_s[q] = item_seconds_mean(self.mean_item_s[q], seconds)
        self.finished_items[q] += 1

    def _finish(self, node: Node, index: int) -> None:
        q = self.queue_of[index]
        self._timed(q, self.now - node.running[index])
        self._release_slots(node, index, finished=True)
        self.outcome.finished[index] = self.now
        self.done += 1
        self.last_progress = self.now
        self._pull(node)
        self._idle_poll(node)

    def _requeue(self, node: Node, index: int) -> None:
        """The node went away under the item: its work is lost and it waits again, first in line,
        unless SQS's redrive policy moves it to the dead-letter queue: every attempt was a
        receive, and after `Queue.max_receive_count` of them the message is dead-lettered."""
        self.outcome.interruptions += 1
        self.outcome.redone_s += self.now - node.running[index]
        self._release_slots(node, index)
        self._receive_again(index)

    def _work_left(self, index: int) -> float:
        """The item's work still to do: all of it, or what its last checkpoint left."""
        return self.left_s.get(index, self.items[index].duration_s)

    def _checkpoint(self, index: int, held_s: float, redo_s: float = 0.0) -> None:
        """The item stopped after holding its slots `held_s` (the agent's start time first) and
        keeps its work: what is left, and `redo_s` to do again when it resumes."""
        self.left_s[index] = max(0.0, self._work_left(index) - max(0.0, held_s - self.timing.start_s)) + redo_s

    def preempt(self, node: Node, keys: tuple[str, ...]) -> None:
        """The scaler's preempt mark, as the agent reads it (`agent.worker.Agent._preempt`): each
        marked attempt still running checkpoints and goes back to its queue, an interruption, and
        resumes with the work it had left and `Timing.resume_s` more. Its slots are free at once
        and its agent re-sends its message, so it waits behind the items already waiting, as a new
        message does."""
        self.changes += 1
        node.preempting = keys
        node.changed(self.now)
        for key in keys:
            _, index, attempt = key.split("/")
            index = int(index)
            if index in node.running and self.attempt[index] == int(attempt):
                self._checkpoint(index, self.now - node.running[index], redo_s=self.timing.resume_s)
                self.outcome.interruptions += 1
                self.outcome.redone_s += self.timing.resume_s
                self._release_slots(node, index)
                self.attempt[index] += 1
                q = self.queue_of[index]
                self.waiting[q].append(index)
                self.visible[q] += 1
        self._idle_poll(node)
        self._dispatch()

    def _receive_again(self, index: int) -> None:
        """The attempt was a receive: the item waits again, first in line, or is dead-lettered."""
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
        boots = self.timing.boots_s
        self._push(self.now + (boots[(node.id - 1) % len(boots)] if boots else self.timing.boot_s), BOOTED, node.id)
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
            self.outcome.busy_killed += self._items_killed(node)
            self._remove(node)
        self._dispatch()

    def _remove(self, node: Node, billed_until: float | None = None) -> None:
        """The node is gone (terminated or reclaimed): bill it and requeue whatever it ran."""
        node.state = "gone"
        if node.gang is not None:
            self._lose_member(node)
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
        self.changes += 1
        node.cordoned = cordoned
        node.changed(self.now)
        self._refile(node)
        if not cordoned:
            self._dispatch()

    def set_held(self, q: int, since: float | None) -> None:
        """The scaler's hold mark on queue q, as the agents read it: no new items from it while set."""
        self.changes += 1
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
        self.changes += 1
        node.state = "draining"
        node.changed(self.now)
        self._refile(node)

    def _notice(self, node: Node) -> None:
        """Spot notice: the agent stops intake; items that end before the reclaim still finish."""
        self.stop_intake(node)
        if node.gang is not None:  # the agent stops its member at once: the gang cannot wait 2 min
            self._lose_member(node)
            self._dispatch()
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


def is_gang(queue: Queue) -> bool:
    return queue.gang[1] > 1


def gang_nodes(slots: int, node_slots: int) -> int:
    """Whole nodes an item of this many slots spans."""
    return -(-slots // node_slots)


def placement(queues: list[tuple[str, Queue]], items: list[TraceItem]) -> tuple[list[int], list[int]]:
    """(queue index, slots taken on each of its nodes) per item.

    An item goes to the pool's queue with the smallest slots_per_item that holds it (else the
    largest) and takes that many slots, as the agent reserves a queue's slots per item. An item
    whose trace group is the `team` of some of the queues goes to one of those (a team's work).
    Gang queues take the items larger than a node (all items, where no other queue feeds the
    pool): the one with the smallest max that holds the item's nodes (else the largest max), a
    whole node per member (a gang queue's slots_per_item is its nodes' slots: a config rule).
    """
    teams: dict[str, list[int]] = {}
    for i, (_, queue) in enumerate(queues):
        if queue.team is not None:
            teams.setdefault(queue.team, []).append(i)
    every = list(range(len(queues)))
    all_gangs = [q for q in every if is_gang(queues[q][1])]
    node_slots = queues[all_gangs[0]][1].slots_per_item if all_gangs else 0
    queue_of, need = [], []
    split: dict[str | None, tuple[list[int], list[int]]] = {}  # per team (None: every queue): (ordinary, gangs)
    for item in items:
        team = item.group if item.group in teams else None
        if team not in split:
            own = teams.get(team, every)
            split[team] = ([q for q in own if not is_gang(queues[q][1])],
                           sorted((q for q in own if is_gang(queues[q][1])), key=lambda q: queues[q][1].gang[1]))
        ordinary, gangs = split[team]
        if ordinary and (not gangs or item.slots <= node_slots):
            q = next((q for q in ordinary if queues[q][1].slots_per_item >= item.slots), ordinary[-1])
            need.append(max(item.slots, queues[q][1].slots_per_item))
        else:
            nodes = gang_nodes(item.slots, node_slots)
            q = next((q for q in gangs if queues[q][1].gang[1] >= nodes), gangs[-1])
            need.append(node_slots)
        queue_of.append(q)
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
