"""One control tick: observe the queues and the fleet, ask the pure policy, act.

Safe when two ticks run at once (the stack also reserves a concurrency of one):
- every action sets an absolute target computed from fresh observations, never a delta:
  two ticks that saw the same world set the same desired capacity;
- scale-in is only `terminate` with a decrement of desired capacity; the fleet port
  re-reads each instance just before terminating it and skips those already gone or on
  their way out, and if another tick wins the race in between, AWS refuses the second
  terminate without decrementing ("not in InService", "No managed instance found"), which
  the port takes as done: a node is removed, and desired decremented, once;
- desired capacity is never lowered below the capacity of the instances still in the
  group, so the group itself never picks a node to stop (it could pick a busy one).
The interruption function does not tick itself: it kicks the scaler function, so there is
one writer. With `dry_run` (the flag or `scaler.dry_run` in the environment) the tick
decides and logs exactly the same lines but changes nothing.
"""

from __future__ import annotations

import json
import logging
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import partial

from tidefleet import policy
from tidefleet.agent.gang import Beacon
from tidefleet.config import Environment, InstanceType, Pool, Queue
from tidefleet.fanout import each
from tidefleet.policy.demand import drop_oldest, gang_counts
from tidefleet.policy.faults import in_a_row
from tidefleet.policy.interruption import DrainNode, pool_of_group
from tidefleet.policy.model import (
    FleetView,
    NodeFault,
    NodeView,
    PoolDecision,
    PoolView,
    QueueView,
    RunView,
    rate_decay,
)
from tidefleet.ports import Backlog, GroupInstance, GroupState, Ports
from tidefleet.records import Heartbeat, QueueStats, WaitingMark

log = logging.getLogger("tidefleet.control")

# Auto Scaling lifecycle states, as the policy sees them.
LAUNCHING = frozenset({"Pending", "Pending:Wait", "Pending:Proceed"})
IN_SERVICE = frozenset({"InService"})
HELD_FOR_DRAIN = frozenset({"Terminating:Wait"})  # the terminate hook holds it while it hands work back
GOING = frozenset({"Terminating", "Terminating:Proceed", "Terminated", "Detaching", "Detached"})
CAPACITY = LAUNCHING | IN_SERVICE  # what holds desired capacity up
# Anything else (Standby, warm pool states) is neither capacity nor ours to touch.
# A leave grant outlives its tick by half a tick: the next tick replaces it, and one that never
# comes (a failed or stopped scaler) lets it lapse.
LEAVE_GRANT_TICKS = 1.5
# Idle this long, receiving nothing, a node has polled each of its queues several times (a GCE
# agent's receive waits 2 s at most): nothing of them waited meanwhile (`_seen_empty`).
IDLE_PROOF_S = 15.0
MAX_COHORTS = 16  # waiting cohorts a queue's mark keeps (`waiting_ages`); past it the oldest two merge
# A heartbeat further ahead of the scaler's clock than this is from a node whose clock is wrong: it
# is read as written now (`node_view`). Within it, clocks that differ by an NTP step read as written.
CLOCK_SLACK_S = 60.0
# A gone node's heartbeat that said it could not run items stays this long (rule 14 counts it; `tidefleet
# nodes` shows it), where other gone nodes' are forgotten once silent longer than a boot.
FAULT_MEMORY_S = 3600.0


class TickError(RuntimeError):
    """Some actions failed, or job-store reads the tick went on without (`WITHOUT`); every other
    action, in every pool, was still applied. One line per failed action, `<pool>: <action>:
    <error>`, and per read, `job store: <what> not read, ...: <error>`. `failures` keeps each
    `(<pool>: <action>, the exception)`: a function says the error in its cloud's words (`Cloud.explain`), which the
    core cannot import. `unread`: how many of `failures` (the first) are job-store reads, and
    `unobserved` how many (next) are pools left out, their nodes or a queue unread. `cut`: what a
    tick out of time left to the next (`Deadline.cut`), or None."""

    def __init__(self, failures: list[tuple[str, Exception]], decisions: tuple[PoolDecision, ...],
                 cut: dict | None = None, unread: int = 0, unobserved: int = 0):  # fmt: skip
        super().__init__("\n".join(f"{where}: {type(err).__name__}: {err}" for where, err in failures))
        self.failures = tuple(failures)
        self.decisions = decisions
        self.cut = cut
        self.unread, self.unobserved = unread, unobserved

    @property
    def summary(self) -> str:
        """What failed, as the CLI and the function head its lines: a tick that only went without
        reads changed every pool it acted on, so it does not say that actions failed."""
        others = len(self.failures) - self.unobserved
        said = ["some pools could not be read"] if self.unobserved else []
        if others and not self.unread:
            said.append("some actions failed")
        elif others:
            said.append("some job-store reads failed" if self.unread == others else "some actions and job-store reads failed")
        return "; ".join(said)


# One call's worst case on either cloud, retries included (AWS: 3 tries of 5 s and backoff; GCP:
# its 20-s retry window and an 8-s try): the most a run's observe counts for as one step.
STEP_AT_MOST_S = 30.0


@dataclass
class Deadline:
    """A cloud function's run, which must end in its own lines before the platform's timeout ends
    it with none of ours (`time_left()`: seconds until then). A tick begins each step that calls
    the cloud only while the time left holds what such a step took at most in this run, plus
    `margin_s`, and leaves the rest to the next tick: each pool's act (whole, never in part),
    then each round of writes after the pools. The observe, which calls every service the steps
    do, counts as one of each. `cut`: what the last tick left undone and why (its log line), or
    None. The default has no end: a tick without a function (the CLI, sandbox, simulator)."""

    time_left: Callable[[], float] = lambda: math.inf
    margin_s: float = 0.0  # kept past every step: the run's own lines
    act_s: float = 0.0  # the slowest pool's act of this run so far
    write_s: float = 0.0  # the slowest round of writes after the pools so far
    cut: dict | None = None

    def observed(self, began: float) -> None:
        # The observe is several rounds of calls (one at a time on GCP): as a step's estimate, at
        # most one call's worst case, or a slow observe would leave every pool unacted, every tick.
        took = min(began - self.time_left(), STEP_AT_MOST_S)
        self.act_s = self.write_s = max(self.act_s, self.write_s, took)

    def act(self, pools: list[str], call: Callable[[], object]) -> bool:
        """call(), the first of these pools' act, if its time fits; else all of them are skipped."""
        if self._short(self.act_s, "a pool's act"):
            self.cut["skipped"] += pools
            return False
        began = self.time_left()
        call()
        self.act_s = max(self.act_s, began - self.time_left())
        return True

    def write(self, what: str, call: Callable[[], object]) -> object | None:
        """call(), a round of writes after the pools, if its time fits; else None, noted as not written."""
        if self._short(self.write_s, "a round of writes"):
            self.cut.setdefault("not_written", []).append(what)
            return None
        began = self.time_left()
        done = call()
        self.write_s = max(self.write_s, began - self.time_left())
        return done

    def _short(self, took_s: float, step: str) -> bool:
        left = self.time_left()
        if left >= took_s + self.margin_s:
            return False
        self.cut = self.cut or {"skipped": [], "out_of_time": f"{left:.0f} s left of the function's timeout: {step} "
                                f"took up to {took_s:.0f} s in this run, and {self.margin_s:.0f} s are kept for its "
                                "own lines; the next tick handles them"}  # fmt: skip
        return True


# Per environment, the pools the last tick out of time left to the next (`Deadline`): a function's
# next tick in the same warm process acts on them first, or pools that are slow every tick would
# keep the ones after them from ever being acted on.
_LEFT_OVER: dict[str, frozenset[str]] = {}


def _instance_type(pool: Pool, instance: GroupInstance) -> InstanceType | None:
    for itype in pool.instance_types:  # a loop, not next(genexpr): the simulator calls it ~10^7 times
        if itype.type == instance.instance_type:
            return itype
    return None


def _weight(itype: InstanceType | None, instance: GroupInstance) -> int:
    """Capacity units: the configured weight; the group's own if the type is not configured."""
    return itype.weight if itype else (instance.weight or 1)


def _types(pool: Pool) -> dict[str, InstanceType]:
    """The pool's types by name, the first of a repeated name (as `_instance_type` finds it)."""
    types: dict[str, InstanceType] = {}
    for itype in pool.instance_types:
        types.setdefault(itype.type, itype)
    return types


def node_view(
    pool: Pool, instance: GroupInstance, heartbeat: Heartbeat | None, now: float
) -> NodeView | None:
    if heartbeat is not None and _previous_machines(heartbeat, instance):
        heartbeat = None  # this machine has not reported yet; its agent forgets the record at start
    state = instance.lifecycle_state
    if state in GOING:
        node_state = "terminating"
    elif state in HELD_FOR_DRAIN or (heartbeat is not None and heartbeat.draining):
        node_state = "draining"
    elif state in CAPACITY:
        node_state = "pending" if heartbeat is None else "running"
    else:
        return None
    itype = _instance_type(pool, instance)
    weight = _weight(itype, instance)
    # A clock ahead: the heartbeat is read as written now, and its other times (the node's own
    # clock) moved back by as much, so idle and run times are the node's, never negative.
    ahead = heartbeat.at - now if heartbeat is not None and heartbeat.at - now > CLOCK_SLACK_S else 0.0
    return NodeView(
        id=instance.id,
        instance_type=instance.instance_type,
        weight=weight,
        slots=pool.slots(itype) if itype else weight * pool.slots_per_unit,
        spot=instance.spot,
        state=node_state,
        # Unknown launch time: take it as just launched, so it is never replaced as "no
        # heartbeat past the boot timeout" because EC2 had not listed it yet.
        launched_at=now if instance.launched_at is None else instance.launched_at,
        busy_slots=heartbeat.busy_slots if heartbeat else 0,
        last_heartbeat=heartbeat.at - ahead if heartbeat else None,
        idle_since=heartbeat.idle_since - ahead if heartbeat and heartbeat.idle_since is not None else None,
        protected=instance.protected,
        cordoned=heartbeat.cordoned if heartbeat else False,
        runs=_runs(heartbeat, ahead),
        preempting=tuple(heartbeat.preempt) if heartbeat else (),
        booted_at=heartbeat.booted_at if heartbeat else None,
    )


def _previous_machines(heartbeat: Heartbeat, instance: GroupInstance) -> bool:
    """A record written before this instance was launched, under its name: a managed instance group
    recreates a preempted Spot VM under the same name, and the old machine's sticky draining mark
    (or its silence) would have the new one terminated before its agent reported. Written over a
    clock's slack before the launch, or draining and before it at all: a node whose clock lags
    less than that (NTP keeps it within a second) is read as ever."""
    launched = instance.launched_at
    return launched is not None and (heartbeat.at < launched - CLOCK_SLACK_S or heartbeat.draining and heartbeat.at < launched)


def _runs(heartbeat: Heartbeat | None, ahead: float = 0.0) -> tuple[RunView, ...]:
    """The preemptible attempts a heartbeat lists, their start times moved back by how far the
    node's clock is `ahead`; a malformed entry is skipped (never preempted)."""
    out = []
    for run in heartbeat.runs if heartbeat else ():
        try:
            out.append(RunView(str(run["key"]), str(run["queue"]), float(run["since"]) - ahead, int(run["slots"])))
        except (KeyError, TypeError, ValueError):
            continue
    return tuple(out)


# Per pool name: (the pool's config, instance id -> (instance, heartbeat, view)) as the last observe saw them.
_LAST_VIEWS: dict[str, tuple[Pool, dict[str, tuple[GroupInstance, Heartbeat | None, NodeView | None]]]] = {}


def _node_views(
    name: str, pool: Pool, instances: tuple[GroupInstance, ...], beats: dict[str, Heartbeat], now: float
) -> tuple[tuple[NodeView, ...], dict]:
    """(the pool's node views, its members by instance id). Records are frozen values: a node whose
    group record and heartbeat are the very objects of the last observe, under the same pool
    config, has the same view (its launch time known: `now` is not used), so it is reused. An
    adapter that keeps records between ticks (the simulator, ~10^7 views a replay) skips the
    rebuild; one that reads fresh records every tick only misses."""
    cached = _LAST_VIEWS.get(name)
    last = cached[1] if cached is not None and cached[0] is pool else {}
    seen: dict[str, tuple[GroupInstance, Heartbeat | None, NodeView | None]] = {}
    views = []
    beat_of, last_of = beats.get, last.get
    for instance in instances:
        heartbeat = beat_of(instance.id)
        hit = last_of(instance.id)
        stale = hit is None or hit[0] is not instance or hit[1] is not heartbeat or instance.launched_at is None
        if stale or (heartbeat is not None and heartbeat.at - now > CLOCK_SLACK_S):  # read as written now: `now` used
            hit = (instance, heartbeat, node_view(pool, instance, heartbeat, now))
        seen[instance.id] = hit
        if hit[2] is not None:
            views.append(hit[2])
    _LAST_VIEWS[name] = (pool, seen)  # only live nodes: the cache never outgrows the fleet
    return tuple(views), seen


@dataclass(frozen=True)
class Observation:
    fleet: FleetView  # what the policy sees
    groups: dict[str, GroupState]  # the raw groups, which the act step checks against
    # Per pool: the rows of nodes gone from the group: heartbeats silent longer than a boot, and
    # the marks of nodes that never reported.
    gone: dict[str, tuple[str, ...]]
    waiting_marks: dict[str, WaitingMark | None] = field(default_factory=dict)  # per queue: mark (None: clear)
    unread: dict[str, Exception] = field(default_factory=dict)  # job-store reads gone without (`WITHOUT`)
    # Per pool: the heartbeats of its nodes whose clock is ahead (`CLOCK_SLACK_S`), by node id, as written.
    clock_ahead: dict[str, dict[str, Heartbeat]] = field(default_factory=dict)
    # Per pool left out: the read of its nodes or of one of its queues that failed (it is not acted on).
    unobserved: dict[str, Exception] = field(default_factory=dict)


# The job-store reads a tick goes without when they fail (a throttled table, a store out of
# retries), as the queues and groups it scales on were read: what it decides then. Each errs
# towards more capacity or towards leaving the store's marks as they are, never a guess written back.
WITHOUT = {
    "mean item times": "slots counted without them, as for a queue with no item done yet",
    # Marks written now would replace the first-seen times with this tick's: items would look younger.
    "waiting marks": "waiting items aged only by the queue's own oldest age (SQS gives none); marks left as they are",
    # Sizing reads no hold; a hold or release decided on a guess would flip what the agents obey,
    # and a preemption would stop (or move) attempts for a queue that may be held.
    "hold marks": "decided as if no queue were held; no hold or release written and preemption marks left as "
                  "they are this tick",
}


def _silent(pool: Pool, heartbeat: Heartbeat, now: float) -> bool:
    """Rule 5's test (`policy.scaling`): no heartbeat for longer than the pool's boot timeout, so
    its agent is dead or hung (the tick replaces such a node)."""
    return now - heartbeat.at > pool.boot_timeout_s


def _remembered(heartbeat: Heartbeat, now: float) -> bool:
    """A fault (rule 14) counts for `FAULT_MEMORY_S` after its node last said it, its node gone or
    not; `faults.in_a_row` then leaves out those a healthy node booted after."""
    return bool(heartbeat.fault) and now - heartbeat.at < FAULT_MEMORY_S


def observe(env: Environment, ports: Ports, now: float, pools: Iterable[str]) -> Observation:
    """The policy's view of these pools. A pool whose group does not exist (not deployed yet)
    is left out and logged."""
    names = list(pools)
    groups = ports.fleet.groups(names, since=now - env.scaler.spot_failure_window_s)
    for missing in sorted(set(names) - set(groups)):
        log.warning(json.dumps({"pool": missing, "skipped": "no auto scaling group; deploy the environment"}))
    pool_views, gone, clock_ahead = [], {}, {}
    in_group: dict[str, tuple[dict[str, Heartbeat], dict]] = {}  # per pool: (heartbeats, the group's members)
    intake: defaultdict[str, float] = defaultdict(float)  # per queue: 0.0 until an agent took from it
    # Items spot agents left to on-demand nodes, by queue: distinct, as several spot nodes see the same item.
    on_demand: dict[str, set[str]] = {}
    forming: defaultdict[str, int] = defaultdict(int)  # per queue: gang members its forming gangs wait for
    # One call per pool and per queue, `calls_in_flight` at once (1k queues: 1k calls). A pool whose
    # nodes or one of whose queues could not be read is left out, as a missing group is: the others
    # are decided and acted on (a throttled partition or a deleted queue stopped them all).
    rows, unobserved = _per_key(ports.nodes.node_rows, list(groups), ports.calls_in_flight)
    observed = [qname for qname, queue in env.queues.items() if queue.pool in rows]
    store, unread = ports.stats if observed else None, {}
    # Mean item times feed the policy's boot-horizon rule; without a stats port they are unknown.
    # Read before the backlogs: a success between the two reads is then counted by neither, and a
    # waiting item's age errs long (`waiting_ages`), not short.
    stats = _read(unread, "mean item times", store.queue_stats, observed) if store is not None else None
    backlogs, failed_queues = _per_key(ports.queues.backlog, observed, ports.calls_in_flight)
    unobserved |= {env.queues[q].pool: err for q, err in failed_queues.items()}
    for name, err in sorted(unobserved.items()):
        what = "its nodes" if name not in rows else "a queue's backlog"
        log.warning(json.dumps({"pool": name, "skipped": f"{what} not read: {type(err).__name__}: {err}"}))
    groups = {name: group for name, group in groups.items() if name not in unobserved}
    observed = [qname for qname in observed if env.queues[qname].pool in groups]
    for name, group in groups.items():
        beats, marked = rows[name]
        decays: dict[float, float] = {}  # many agents beat at the same time: one exp() for them
        leads, ahead, faults = [], {}, []
        for node_id, hb in beats.items():  # each agent's smoothed rate, decayed to now: the queues' arrivals
            if hb.fault and _remembered(hb, now):
                faults.append(NodeFault(node_id, hb.at, hb.fault, hb.booted_at))
            if hb.at - now > CLOCK_SLACK_S:
                ahead[hb.node_id] = hb
            if hb.gang and (beacon := Beacon.parse(hb.gang)) is not None and beacon.forming:
                leads.append((hb.node_id, beacon))
            if rates := hb.intake:
                decay = decays.get(hb.at)
                if decay is None:
                    decay = decays[hb.at] = rate_decay(hb.at, now)
                for qname in rates:  # ~10^7 rates a simulator replay
                    intake[qname] += rates[qname] * decay
            if hb.on_demand_wanted:
                for qname, keys in hb.on_demand_wanted.items():
                    on_demand.setdefault(qname, set()).update(keys)
        nodes, members = _node_views(name, env.pools[name], group.instances, beats, now)
        in_group[name] = (beats, members)
        if ahead := {node_id: hb for node_id, hb in ahead.items() if node_id in members}:
            clock_ahead[name] = ahead
        for node_id, beacon in leads:  # a forming gang's lead still in the group: the members it waits for
            if node_id in members:
                forming[beacon.queue] += beacon.short
        if faults:  # a healthy node booted after a fault ends it for good, even once that node is gone
            faults = in_a_row(faults, nodes)
        pool_views.append(
            PoolView(
                name=name,
                nodes=nodes,
                desired=group.desired,
                on_demand_base=group.on_demand_base,
                spot_failures=group.spot_failures,
                faults=tuple(faults),
            )
        )
        # A node the group no longer lists and that has been silent longer than a boot: its
        # record would otherwise stay forever (a reclaimed spot node never says goodbye). A node
        # that never reported has only a mark (a spot notice's draining) and no heartbeat to age.
        strays = beats.keys() - members.keys()  # usually none: a set difference, not a scan
        pool = env.pools[name]
        # A gone node's fault is kept while rule 14 counts it, and forgotten at once once a healthy
        # node came after it: that node may leave before the fault is silent a boot.
        counted = {f.node_id for f in faults}
        gone[name] = tuple(n for n, hb in beats.items() if n in strays and n not in counted
                           and (hb.fault or _silent(pool, hb, now))) if strays else ()  # fmt: skip
        if marked:
            gone[name] += tuple(sorted(marked - members.keys()))
    backlogs = {q: backlogs[q] for q in observed}
    if any(b.counts_leased for b in backlogs.values()):  # never in the simulator: its backlog says in-flight
        backlogs = _leased_in_flight(env, backlogs, in_group, now)
    waiting = _read(unread, "waiting marks", store.waiting_marks, observed) if store is not None else None
    # Hold marks are the scaler's own (quota.py), read every tick: a removed [teams] table releases them.
    held = _read(unread, "hold marks", store.held_since, observed) if store is not None else None
    # Unread stats count no success: the starts since the marks are not known this tick.
    counted, stats, held = stats is not None, stats or {}, held or {}
    queue_views, marks, next_tick = [], {}, next_tick_s(env)
    for qname in observed:
        queue, backlog = env.queues[qname], backlogs[qname]
        if backlog.visible and backlog.as_of is not None and qname not in held and not on_demand.get(qname) \
                and _seen_empty(queue, backlog.as_of, *in_group[queue.pool]):  # fmt: skip
            backlog = replace(backlog, visible=0)
        ages: tuple[tuple[float, int], ...] = ()
        if waiting is not None:  # no marks without a store, or unread: the age stays what the cloud said
            ages, mark = waiting_ages(backlog, waiting.get(qname), now,
                                     items_started(backlog, stats.get(qname)) if counted else None)  # fmt: skip
            if mark != waiting.get(qname):
                marks[qname] = mark
        # A gang item is demand for every node of it, each node one item of the queue's slots.
        visible, in_flight = gang_counts(queue, backlog.visible, backlog.in_flight)
        nodes_per_item = queue.gang[1]
        queue_views.append(
            QueueView(
                name=qname,
                pool=queue.pool,
                priority=queue.priority,
                slots_per_item=queue.slots_per_item,
                visible=visible,
                in_flight=in_flight,
                mean_item_s=stats[qname].mean_item_s if qname in stats else None,
                oldest_age_s=ages[0][0] if ages else backlog.oldest_age_s,
                waiting_ages=tuple((age, n * nodes_per_item) for age, n in ages),
                target_wait_s=queue.target_wait_s,
                next_tick_s=next_tick,
                gang=nodes_per_item > 1,
                intake_per_s=intake.get(qname, 0.0),
                team=env.team_of(qname),
                held=qname in held,
                max_wait_s=queue.max_wait_s,
                on_demand_wanted=len(on_demand.get(qname, ())) if queue.on_demand_after_interruptions else 0,
                forming_short=min(forming.get(qname, 0), in_flight),
            )
        )
    fleet = FleetView(pools=tuple(pool_views), queues=tuple(queue_views))
    return Observation(fleet, groups, gone, marks, unread, clock_ahead, unobserved)


def _per_key(fetch: Callable[[str], object], keys: list[str], at_once: int) -> tuple[dict, dict[str, Exception]]:
    """({key: fetch(key)} of the calls that answered, {key: what the others raised})."""

    def tried(key: str) -> tuple[bool, object]:
        try:
            return True, fetch(key)
        except Exception as err:  # noqa: BLE001 - any cloud's error (the core imports none); the caller reports it
            return False, err

    answers = dict(zip(keys, each(tried, keys, at_once), strict=True))
    return ({k: v for k, (ok, v) in answers.items() if ok},
            {k: v for k, (ok, v) in answers.items() if not ok})  # fmt: skip


def _leased_in_flight(env: Environment, backlogs: dict[str, Backlog], in_group: dict, now: float) -> dict[str, Backlog]:
    """Backlogs that count the messages agents hold as waiting (`Backlog.counts_leased`: Pub/Sub's
    undelivered messages include those leased to running items) with what the agents of the
    queue's pool say they hold (`Heartbeat.leased`) moved to in flight, before the waiting items
    are aged: running items are no waiting demand. Only nodes the group still lists count, and
    only while their heartbeat is younger than the queue's visibility timeout (past it, a silent
    node's leases lapsed and its messages wait again)."""
    out = dict(backlogs)
    for qname, backlog in backlogs.items():
        if not backlog.counts_leased:
            continue
        queue = env.queues[qname]
        beats, members = in_group.get(queue.pool, ({}, {}))
        held = sum(hb.leased.get(qname, 0) for node_id, hb in beats.items()
                   if hb.leased and node_id in members and now - hb.at <= queue.visibility_timeout_s)  # fmt: skip
        held = min(held, backlog.visible)  # the count trails the agents by a minute or two: never below 0 waiting
        out[qname] = replace(backlog, visible=backlog.visible - held, in_flight=backlog.in_flight + held)
    return out


def _seen_empty(queue: Queue, as_of: float, beats: dict[str, Heartbeat], members: dict) -> bool:
    """A node of the queue's pool said, after the backlog was counted (`Backlog.as_of`), that it
    had been idle for IDLE_PROOF_S, its receives finding nothing: its word is the newer, and
    nothing waits. Cloud Monitoring's count trails by one to three minutes, so after a job's last
    items are acked it still shows them, and the tick kept or launched nodes for finished work.
    Only a node that would take the queue's items says so: in the group, with the slots for one,
    not cordoned, draining or faulted (a held queue's and a queue whose items wait for on-demand
    nodes are not asked: their items wait whatever idle nodes there are)."""
    return any(node_id in members and hb.idle_since is not None and hb.at > as_of
               and hb.at - hb.idle_since >= IDLE_PROOF_S and hb.slots >= queue.slots_per_item
               and not (hb.cordoned or hb.draining or hb.fault) for node_id, hb in beats.items())  # fmt: skip


class NotTried(Exception):
    """A job-store read the tick did not make: the store refused an earlier one (`_read`)."""


# Errors of a record the store gave back, not of the store: the other reads still go on.
BAD_RECORD = (ValueError, TypeError, LookupError, AttributeError)


def _read(unread: dict[str, Exception], what: str, call: Callable[[list[str]], dict], queues: list[str]):
    """call(queues), one of the job-store reads in `WITHOUT`; None when it failed, logged in one
    line and kept in `unread` (the tick then goes on without it, and ends in a TickError). Once
    the store refused one read (a cloud's error: throttled past its retries, unavailable), the
    others are not tried: each would spend its whole retry budget (GCP: 20 s and more), which
    would leave the tick no time to act. A bad record fails only its own read."""
    refused = next((w for w, e in unread.items() if not isinstance(e, (NotTried, *BAD_RECORD))), None)
    if refused is not None:
        unread[what] = NotTried(f"not tried: the store refused the {refused} read first this tick")
        log.warning(json.dumps({"job_store": f"{what} not read: {unread[what]}", "went_on": WITHOUT[what]}))
        return None
    try:
        return call(queues)
    except Exception as err:  # noqa: BLE001 - any cloud's error (the core imports none); reported
        unread[what] = err
        line = {"job_store": f"{what} not read: {type(err).__name__}: {err}", "went_on": WITHOUT[what]}
        log.warning(json.dumps(line))
        return None


def waiting_ages(backlog: Backlog, kept: WaitingMark | None, now: float,
                 started: int | None) -> tuple[tuple[tuple[float, int], ...], WaitingMark | None]:  # fmt: skip
    """(the waiting items' ages as (age s, items) oldest first, the queue's waiting mark to keep).
    SQS and Pub/Sub give counts only, so the tick keeps when it first saw each part of the
    backlog (a cohort), and how many items had started by then (`started`, the queue's count
    now). Items left from the oldest (the queue is about first in, first out): as many as
    started since, and at least as many as the count fell by; the rest of the count arrived
    since, seen now. (Without the starts, a count that held while items came and went, an item
    each tick that runs as the next comes, kept the older time, and that age ran on for as long
    as it lasted.) A start missed errs long (nodes launch sooner): a failed or handed-back item
    leaves in flight without a success. A success counted a heartbeat after its delete errs
    short for a tick, by the items that succeeded within that heartbeat at most. `started` None
    (the successes unread this tick): no start is known, and the mark keeps none, as an older
    scaler's. Ages start from the submit's kick, seconds after the items went out. A cloud that
    gives the oldest item's age caps them all."""
    if not backlog.visible:
        return (), None
    held = sum(n for _, n in kept.cohorts) if kept else 0
    left = held - backlog.visible
    counting = kept is not None and kept.started is not None and started is not None
    if counting:
        left = max(left, started - kept.started)
    cohorts = drop_oldest(kept.cohorts if kept else (), max(0, left))
    if (arrived := backlog.visible - sum(n for _, n in cohorts)) > 0:
        cohorts.append((now, arrived))
    while len(cohorts) > MAX_COHORTS:  # the two oldest as one, as old as the older: ages err long
        cohorts[:2] = [(cohorts[0][0], cohorts[0][1] + cohorts[1][1])]
    cap = backlog.oldest_age_s
    ages = tuple((now - since if cap is None else min(cap, now - since), n) for since, n in cohorts)
    if cap is not None:
        ages = ((cap, ages[0][1]), *ages[1:])
    # The count moves with the cohorts only: a mark written as often as before, and a start counted
    # once whichever tick saw it (the count dips between a success's delete and its record).
    if counting and kept.cohorts == tuple(cohorts):
        return ages, kept
    return ages, WaitingMark(tuple(cohorts), started)


def items_started(backlog: Backlog, stats: QueueStats | None) -> int:
    """A queue's items started so far, as far as the tick can count them: in flight now, plus
    those that succeeded (`QueueStats.items`, the agents' count)."""
    return backlog.in_flight + (stats.items if stats is not None else 0)


def _units(env: Environment, pool: str, instances: Iterable[GroupInstance]) -> int:
    """Capacity units of these instances, as `_weight` gives them."""
    weights = {name: itype.weight for name, itype in _types(env.pools[pool]).items()}
    return sum([weights.get(i.instance_type) or i.weight or 1 for i in instances])


def _live_capacity(env: Environment, pool: str, group: GroupState, leaving: Iterable[str]) -> int:
    """Units of the group's instances that stay: desired below this makes the group pick a victim."""
    leaving = set(leaving)
    # A Terminating:Wait instance already left the group's capacity: not counted. (A list, not a
    # generator: every tick of every pool asks it.)
    return _units(env, pool, [i for i in group.instances if i.lifecycle_state in CAPACITY and i.id not in leaving])


def act(
    ports: Ports,
    env: Environment,
    decision: PoolDecision,
    group: GroupState,
    raised: list[tuple[str, Exception]] | None = None,
    idle: Mapping[str, float] | None = None,
) -> dict:
    """Apply one pool's decision: terminate (with decrement), the on-demand base, then desired.
    `idle`: since when the tick saw each idle node idle (its heartbeat): such a node is
    terminated only once marked draining on that condition (`NodeStatePort.let_idle_go`); one
    that took work since, or whose mark failed, is kept ("kept" in the result).
    Returns what was done, for the log line; actions that failed are listed under "failed", and
    appended to `raised` as `(action, exception)` (the result stays JSON; the cloud explains these).

    Every action runs even when an earlier one failed, each failure logged on its own line: a
    base change is an UpdateAutoScalingGroup that AWS re-authorizes as a launch from the
    template, and a refusal there must not hold scaling back. The base still goes first, so the
    nodes a raised desired launches are already bought as the base says (spot being short is
    why the policy raises it)."""
    failed: list[str] = []

    def attempt(action: str, call: Callable, *args):
        try:
            return call(*args)
        except Exception as err:  # noqa: BLE001 - one refused action must not stop the others; reported
            failed.append(f"{action}: {type(err).__name__}: {err}")
            if raised is not None:
                raised.append((action, err))
            log.warning(json.dumps({"pool": decision.pool, "action": action, "error": failed[-1]}))
            return None

    ours = {i.id for i in group.instances}
    # The policy is pure and trusted, but a stray id must never reach another group's node.
    leaving = tuple(i for i in decision.terminate if i in ours)
    # An idle node may have taken an item since the tick saw it idle, and Auto Scaling and GCE
    # terminate busy nodes all the same: its agent's claim and this mark race on one record, and
    # one of the two wins (the agent then starts nothing).
    kept = {}
    for node_id in (i for i in leaving if idle and i in idle):
        let_go = attempt(f"let idle node {node_id} go", ports.nodes.let_idle_go, decision.pool, node_id, idle[node_id])
        if not let_go:
            kept[node_id] = "took work after this tick saw it idle" if let_go is False else "could not be marked draining"
    leaving = tuple(i for i in leaving if i not in kept)
    terminated = attempt("terminate", ports.fleet.terminate, decision.pool, leaving) if leaving else ()
    # Consolidation marks go to the job store, where the agents read them with their heartbeats.
    for node_id in (i for i in decision.cordon if i in ours):
        attempt("cordon", ports.nodes.set_cordon, decision.pool, node_id, True)
    for node_id in (i for i in decision.uncordon if i in ours):
        attempt("uncordon", ports.nodes.set_cordon, decision.pool, node_id, False)
    for node_id, keys in (p for p in decision.preempt if p[0] in ours):  # the agent stops these and hands them back
        attempt("preempt", ports.nodes.set_preempt, decision.pool, node_id, list(keys))
    base_after = group.on_demand_base
    if decision.on_demand_base is not None and decision.on_demand_base != group.on_demand_base:
        refused = len(failed)
        attempt("set_on_demand_base", ports.fleet.set_on_demand_base, decision.pool, decision.on_demand_base)
        base_after = decision.on_demand_base if len(failed) == refused else group.on_demand_base
    if terminated is None:
        # Which nodes went (each with a decrement) is unknown: any desired computed now could
        # undo a decrement (a relaunch) or be low enough for the group to pick a victim. The
        # next tick observes again.
        return {"terminated": [], "desired_after": group.desired, "base_after": base_after, "failed": failed,
                "skipped": "set_desired: the terminate before it failed", **({"kept": kept} if kept else {})}  # fmt: skip
    # Only nodes really terminated leave the floor: one the group refused to terminate (still
    # Pending, say) stays, and a lower desired would let the group pick a victim instead.
    target = max(decision.desired, _live_capacity(env, decision.pool, group, terminated))
    # Above max the group refuses any desired (max lowered under live nodes, or a MaxSize that
    # differs from the config's): it picks the victims down to max itself, whatever is asked.
    target = min(target, group.max)
    # After terminations the group's desired already dropped by their weights; setting the
    # absolute target again is a no-op then, and corrects it if the decrement differed.
    desired_after = target
    if terminated or target != group.desired:
        refused = len(failed)
        attempt("set_desired", ports.fleet.set_desired, decision.pool, target)
        if len(failed) > refused:  # the group keeps its own: as observed, less the terminations' decrements
            gone = (i for i in group.instances if i.id in terminated)
            desired_after = max(0, group.desired - _units(env, decision.pool, gone))
    done: dict = {"terminated": list(terminated), "desired_after": desired_after, "base_after": base_after}
    if kept:
        done["kept"] = kept
    if desired_after == target and target != decision.desired:  # (a refused set: its failure says why)
        done["held"] = _held(env, decision, group, target)
    if failed:
        done["failed"] = failed
    return done


def _held(env: Environment, decision: PoolDecision, group: GroupState, target: int) -> str:
    """Why desired was set to `target`, not to what the policy decided."""
    if target < decision.desired:  # the policy never asks above the config's max: the group's MaxSize is lower
        return (
            f"desired capped at the group's MaxSize {group.max} (config max {env.pools[decision.pool].max}), "
            f"not {decision.desired}: deploy the environment to apply it"
        )
    return f"desired kept at {target}, not {decision.desired}: lower would let the group choose which running node to stop"


def tick(
    env: Environment,
    ports: Ports,
    now: float,
    *,
    pools: Iterable[str] | None = None,
    dry_run: bool = False,
    report: Callable[[FleetView, tuple[PoolDecision, ...]], object] | None = None,
    acted: Callable[[str, dict], object] | None = None,
    tick_s: float | None = None,
    deadline: Deadline | None = None,
) -> tuple[PoolDecision, ...]:
    """Observe → decide → act for these pools (default: all), logging one JSON line per pool.
    `tick_s`: when the next scheduled tick comes (default `scaler.tick_s`; a deployed function's
    schedule is `scaler.scheduled_tick_s`): the leave grant lasts until the one after.
    `report(fleet, decisions)` is told what was seen and decided (the metrics), failures or not.
    `acted(pool, done)` is told what acting on each pool did (`act`'s result: `desired_after`,
    and why it differs from the decision: `held`, `failed`, `skipped`, `error`); not in a dry run.

    With a `deadline` (a cloud function's), a step its time does not hold is left to the next
    tick (`Deadline`), said in one line and kept as `deadline.cut`. Pools are cut only between
    two pools' acts: one begun is acted on whole, so its terminations (each with its decrement)
    are always followed by its on-demand base and its desired capacity, kept above its running
    nodes. A pool cut is not acted on at all (no desired, terminations, marks, forgotten rows
    or new leave grant: its last one lapses, as when a tick fails) and is left out of the
    decisions returned and reported; the next tick in this process acts on it first.

    A job-store read that failed (`WITHOUT`) does not stop the tick: it decides and acts without
    it, and says so, in its line from `observe` and in the TickError it raises at the end.

    Raises TickError after acting on every other pool if some pool's actions failed, or a read."""
    dry_run = dry_run or env.scaler.dry_run
    deadline = deadline or Deadline()
    deadline.cut, began = None, deadline.time_left()
    seen = observe(env, ports, now, pools if pools is not None else env.pools)
    deadline.observed(began)
    decisions = policy.decide(env, seen.fleet, now)
    if seen.clock_ahead:
        decisions = tuple(replace(d, reasons=(*d.reasons, *_clock_lines(seen.clock_ahead.get(d.pool, {}), now)))
                          for d in decisions)  # fmt: skip
    if "hold marks" in seen.unread:  # holds unknown: none decided on a guess is written (`WITHOUT`)
        # Nor any preemption: a node with no entry keeps its marks (an entry of () would clear them).
        # The policy's lines still say what it would hold or preempt: one more line says none of it was done.
        undone = ("hold marks not read: no hold, release or preemption written this tick (lines above that "
                  "hold, release, preempt or move are what a tick that read them would do)")  # fmt: skip
        decisions = tuple(replace(d, hold=(), release=(), preempt=(), reasons=(*d.reasons, undone))
                          if d.hold or d.release or d.preempt else d for d in decisions)  # fmt: skip
    # Pools a cut left over last tick first; then those that terminate nodes, before those that
    # grow: the environment's cost cap counts the money the terminations free, so a cut must not
    # leave the launches done and the terminations undone. The policy's order otherwise.
    left_over = _LEFT_OVER.pop(env.name, frozenset())
    decisions = tuple(sorted(decisions, key=lambda d: (d.pool not in left_over, not d.terminate)))
    # (<pool>: <action>, what it raised), for TickError; the reads gone without first.
    failures = [(f"job store: {what} not read, the tick went on without them", err)
                for what, err in seen.unread.items()]  # fmt: skip
    failures += [(f"{pool}: not observed, so not decided nor acted on this tick", err)
                 for pool, err in sorted(seen.unobserved.items())]  # fmt: skip

    views = {p.name: p for p in seen.fleet.pools}

    def act_on(decision: PoolDecision) -> None:
        group = seen.groups[decision.pool]
        nodes = views[decision.pool].nodes if decision.pool in views else ()
        idle = {n.id: n.idle_since for n in nodes if n.idle_since is not None}
        # A node's idle time as its heartbeat wrote it (let_idle_go compares it), not moved back.
        idle |= {i: hb.idle_since for i, hb in seen.clock_ahead.get(decision.pool, {}).items() if i in idle}
        done: dict = {}  # what act did, for the log line
        if not dry_run:
            try:
                raised: list[tuple[str, Exception]] = []
                done |= act(ports, env, decision, group, raised, idle)
                failures.extend((f"{decision.pool}: {action}", err) for action, err in raised)
                for node_id in seen.gone.get(decision.pool, ()):
                    ports.nodes.forget_node(decision.pool, node_id)
                if seen.gone.get(decision.pool):
                    done["forgotten"] = list(seen.gone[decision.pool])
            except Exception as err:  # noqa: BLE001 - one pool's failure must not stop the others; re-raised below
                done["error"] = f"{type(err).__name__}: {err}"
                failures.append((decision.pool, err))
            if acted is not None:
                acted(decision.pool, done)
        if log.isEnabledFor(logging.INFO):  # the simulator ticks ~10^5 times with the line unread: not built
            log.info(json.dumps(_decision_line(decision, group, now, dry_run) | done))

    for at, decision in enumerate(decisions):
        if not deadline.act([d.pool for d in decisions[at:]], partial(act_on, decision)):
            decisions = decisions[:at]  # the pools acted on, which the tick reports and returns
            break
    # The writes after the pools: each one round of calls in parallel, the holds too.
    if not dry_run:
        deadline.write("leave grants", partial(grant_leave, env, ports, decisions, now, tick_s))
    if not dry_run and (marks := seen.waiting_marks):
        deadline.write("waiting marks", partial(each, lambda q: _mark_waiting(ports, q, marks[q]), list(marks),
                                                ports.calls_in_flight))  # fmt: skip
    holds = {q: now for d in decisions for q in d.hold} | {q: None for d in decisions for q in d.release}
    if not dry_run and holds and ports.stats is not None:  # no store, no marks: quotas size capacity only
        marked = deadline.write("holds", partial(each, lambda q: _mark_held(ports, q, holds[q]), list(holds),
                                                 ports.calls_in_flight))  # fmt: skip
        failures += [(f"queue {q}: {m[0]}", m[1]) for q, m in zip(holds, marked or (), strict=False) if m]
    if report is not None:
        report(seen.fleet, decisions)
    if deadline.cut:
        log.warning(json.dumps(deadline.cut))
        _LEFT_OVER[env.name] = frozenset(deadline.cut["skipped"])
    if failures:
        raise TickError(failures, decisions, deadline.cut, unread=len(seen.unread), unobserved=len(seen.unobserved))
    return decisions


def _clock_lines(ahead: dict[str, Heartbeat], now: float) -> list[str]:
    """One line per node whose clock is ahead of the scaler's (`node_view` reads it as written now)."""
    return [f"node {node_id}'s clock is {hb.at - now:.0f}s ahead of the scaler's: its heartbeat is read as "
            f"written now, and if it dies it is replaced {hb.at - now:.0f}s late (fix the node's clock: NTP)"
            for node_id, hb in sorted(ahead.items())]  # fmt: skip


def _waiting_tick_s(env: Environment) -> float | None:
    """`scaler.waiting_tick_s` where a run ticks again that soon (sooner than `tick_s`); else None."""
    wait = env.scaler.waiting_tick_s
    return float(wait) if 0 < wait < env.scaler.tick_s else None


def next_tick_s(env: Environment) -> float:
    """Seconds until the scaler decides again while items wait: the run's re-tick, else the tick."""
    wait = _waiting_tick_s(env)
    return wait if wait is not None else float(env.scaler.tick_s)


def retick_in(env: Environment, fleet: FleetView) -> float | None:
    """Seconds until the scaler should tick again within its run, or None (the schedule, kicks
    and alarms are soon enough): while a queue it may serve has items waiting, every
    `scaler.waiting_tick_s`, when that is sooner than `tick_s`. A held queue's items wait for
    their team's share, not for capacity."""
    wait = _waiting_tick_s(env)
    return wait if wait is not None and any(q.visible and not q.held for q in fleet.queues) else None


def _decision_line(decision: PoolDecision, group: GroupState, now: float, dry_run: bool) -> dict:
    """The log line of one pool's decision, before what acting on it did."""
    return {
        "pool": decision.pool,
        "at": round(now, 3),  # what the decision saw is as of this time
        "desired_before": group.desired,
        "desired": decision.desired,
        "terminate": list(decision.terminate),
        "on_demand_base_before": group.on_demand_base,
        "on_demand_base": decision.on_demand_base,
        "reasons": list(decision.reasons),
        "starved_queues": list(decision.starved_queues),
        "cordon": list(decision.cordon),
        "uncordon": list(decision.uncordon),
        "hold": list(decision.hold),
        "release": list(decision.release),
        "preempt": {node: list(keys) for node, keys in decision.preempt},
        "dry_run": dry_run,
    }


def grant_leave(env: Environment, ports: Ports, decisions: Iterable[PoolDecision], now: float,
                tick_s: float | None = None) -> None:  # fmt: skip
    """Write each pool's leave grant, until the tick after next is due (`tick` says when ticks
    come): every pool's, so that a tick that grants nothing withdraws the last grant."""
    until = now + LEAVE_GRANT_TICKS * (tick_s or env.scaler.tick_s)
    each(lambda d: _grant_leave(ports, d.pool, d.leave, now, until, d.stay_first), list(decisions), ports.calls_in_flight)


def _grant_leave(ports: Ports, pool: str, units: int, at: float, until: float, stay: int) -> None:
    try:
        ports.nodes.grant_leave(pool, units, at, until, stay)
    except Exception as err:  # noqa: BLE001 - a lost grant only leaves idle nodes to the next tick (or the last grant to expire)
        log.warning(json.dumps({"pool": pool, "action": "grant leave", "error": f"{type(err).__name__}: {err}"}))


def _mark_waiting(ports: Ports, queue: str, mark: WaitingMark | None) -> None:
    try:
        ports.stats.mark_waiting(queue, mark)
    except Exception as err:  # noqa: BLE001 - a lost mark only makes the next tick see the backlog anew
        log.warning(json.dumps({"queue": queue, "action": "mark waiting", "error": f"{type(err).__name__}: {err}"}))


def _mark_held(ports: Ports, queue: str, since: float | None) -> tuple[str, Exception] | None:
    """Hold or release a queue; `(action, exception)` if the write failed (the tick then reports
    it: a lost hold lets a team past its share until the next tick)."""
    try:
        ports.stats.mark_held(queue, since)
    except Exception as err:  # noqa: BLE001 - one failed mark must not stop the others; reported
        action = "release" if since is None else "hold"
        log.warning(json.dumps({"queue": queue, "action": action, "error": f"{type(err).__name__}: {err}"}))
        return action, err
    return None


def _release(pool: Pool, heartbeat: Heartbeat | None, now: float) -> str | None:
    """Why the interruption function lets a node held by the terminate hook go now, or None:
    busy, its agent does it once its items are handed back."""
    if heartbeat is None:
        return "never reported"
    if heartbeat.busy_slots == 0:
        return "idle"
    if _silent(pool, heartbeat, now):  # no agent left to complete it
        return (
            f"agent silent: last heartbeat {now - heartbeat.at:.0f}s ago > boot timeout {pool.boot_timeout_s}s; "
            f"its {heartbeat.busy_slots} busy slot(s) come back through the queue"
        )
    return None


def drain(
    env: Environment,
    ports: Ports,
    action: DrainNode,
    now: float,
    *,
    dry_run: bool = False,
    replace: Callable[[str], object] | None = None,
) -> dict:
    """The edge of an interruption: mark the node draining, let an idle node held by the
    terminate hook go, and if its pool still has backlog ask for a replacement at once (a
    draining node no longer counts as capacity, so the next decision launches one).

    `replace(pool)` asks for that decision; by default it runs a tick for the pool here. The
    interruption function instead kicks the scaler function, so ticks stay with one writer
    (the scaler's reserved concurrency of one) and this function needs no scaling rights.

    A busy node held by the hook is NOT released here: its agent hands its items back and
    then completes the lifecycle action itself (by its own instance id, with the hook name
    from `naming.lifecycle_hook`). Completing it now would kill the node mid-item. A busy node
    whose agent is silent past the boot timeout (rule 5: dead or hung) has no agent to do it,
    and is released. A node whose last heartbeat said idle is released only if it claimed no
    work since (`let_idle_go`, after the mark: a busy node it is, then). An item a silent node
    received after its last heartbeat is not lost: it returns to the queue when its visibility
    timeout ends. Completing an action that is no longer active (an event delivered twice, an
    agent that completed it first) is done already. Returns the log line."""
    dry_run = dry_run or env.scaler.dry_run
    pool = action.pool or pool_of_group(env, ports.fleet.group_of(action.instance_id) or "")
    line: dict = {"instance": action.instance_id, "pool": pool, "reason": action.reason, "dry_run": dry_run}
    if action.deadline is not None:
        line["deadline"] = action.deadline
    if pool is None:
        line["ignored"] = f"the instance is in no group of environment {env.name!r}"
    elif not dry_run:
        ports.nodes.mark_draining(pool, action.instance_id)
        if action.hold is not None:
            heartbeat = ports.nodes.heartbeats(pool).get(action.instance_id)
            why = _release(env.pools[pool], heartbeat, now)
            # Its last heartbeat said idle, but it may have taken an item since: the agent claims work
            # on the node's record before it starts one, and the mark above ends any later claim,
            # so a claim after that idle time is one that started work (the tick's scale-in checks
            # the same, `act`).
            claimed = (why == "idle" and heartbeat.idle_since is not None
                       and not ports.nodes.let_idle_go(pool, action.instance_id, heartbeat.idle_since))  # fmt: skip
            if claimed:
                line["held"] = "took work after its last heartbeat: its agent completes the lifecycle action"
            elif why is None:
                line["held"] = f"busy ({heartbeat.busy_slots} slots): its agent completes the lifecycle action"
            else:
                # False: no action was active any more; adapters without hooks return None
                released = ports.fleet.complete_lifecycle_action(
                    pool, action.instance_id, action.hold.hook, action.hold.token
                )
                line["released"] = "already completed" if released is False else why
        backlog = sum(b.visible + b.in_flight for b in map(ports.queues.backlog, env.queues_of(pool)))
        line["backlog"] = backlog
        if backlog:
            asked = replace(pool) if replace else [d.desired for d in tick(env, ports, now, pools=[pool])]
            line["replacement"] = asked
    log.info(json.dumps(line))
    return line
