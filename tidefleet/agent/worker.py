"""The worker agent: the thin loop that takes items from its pool's queues and runs them, never
losing one. Decisions live in pure modules; this one reads, feeds them, and carries them out
through the ports (`self.cloud`, `self.node`):

  * `tidefleet.agent.claim`: what a received message is (poison, a duplicate, the holder's own, a
    lost node's) and what to do with it.
  * `tidefleet.agent.attempt`: one attempt's life (stop, signal, timeout, hand back) and its one
    outcome; what a failure or a hand-back sends.
  * `tidefleet.agent.runner`: the workload's process, folder, signals and output.

How an item's attempts are counted, on SQS and Pub/Sub alike:
  * The message carries the item's `failures` and `interruptions` (`ItemMessage`). To
    retry a failed item or hand back an interrupted one, the agent SENDS A NEW MESSAGE with
    the updated counts and then deletes (acks) the one it holds. A fresh message starts at
    delivery count 1, so the queue's redrive / dead-letter policy (SQS maxReceiveCount,
    Pub/Sub max_delivery_attempts) never sees polite interruptions: an item interrupted five
    times is simply queued a sixth time. On Pub/Sub this is why a hand-back is not a nack: a
    nack raises the delivery attempt and Pub/Sub would dead-letter the item by itself.
    `interruptions` (read by `on_demand_after_interruptions`) counts spot reclaims and drains
    only: an attempt the scaler's preempt mark stopped (a preemption, a checkpoint-and-move) goes
    back as a new message with its counts unchanged, "preempted" in the item's history.
  * When `failures` exceeds the queue's max_retries the agent itself sends the message to
    the dead-letter queue and marks the item failed with the reason.
  * An attempt that outruns how long the queue hides a message (SQS: 12 h from a receive,
    `WorkQueues.max_hold_s`) replaces its message with a fresh copy, named on the item's record
    before it is sent, and whichever node receives the copy gives it back to the holder
    (`_refresh`, `claim.HandOver`): a running item's message never comes back to be counted by
    the redrive.
  * A message delivered more than once was held by an agent that vanished without a
    word (kill -9, kernel panic, spot reclaim without notice). That attempt is "lost", not
    failed: it is retried without spending max_retries, but losses have their own budget
    (`NODE_LOSSES_TOLERATED`), so an item that kills its node every time still ends in the
    dead-letter queue instead of looping forever.
  * Order is always: send the new message, record, then delete the old one (batched with
    others, `Acks`; a success's record is batched too, `Records`: a flush's in one store call).
    A crash in between can duplicate a message, never lose one: the record is conditional, so
    a duplicate can never finish an item twice, and the old message, if redelivered, meets a
    final record or a newer seq and is dropped by its claim.

One attempt at a time: an attempt starts only by a conditional write to the item's record (the
claim, `claim.py`). The holder renews the lease every heartbeat; every record it writes is fenced
on its attempt number, so a node that lost its lease (paused, partitioned) cannot overwrite the
newer attempt's record, and its workload is killed at its next heartbeat.

Interruption: a spot notice or a Terminated lifecycle state (instance metadata, polled), the
`draining` flag in the node's own heartbeat record, or SIGTERM to the agent all take the same
path: stop intake, ask every attempt to stop (stop file and SIGTERM), wait up to `grace_s`, then
SIGKILL what is left and hand every unfinished item back in one batch. On GCP the notice is the
metadata server's `preempted` (about 30 s before the VM stops, hence a 15 s grace there), and
there is no scale-in protection to set: the scaler deletes only the idle instances it names,
judged by their heartbeats.
"""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import psutil

from tidefleet.agent import checkpoint, claim, gang
from tidefleet.agent.attempt import (
    Attempt,
    Crashed,
    Decision,
    Event,
    Exited,
    GraceOver,
    LateSuccess,
    Outcome,
    Record,
    Signal,
    Started,
    Stop,
    StopAsked,
    Tick,
    after_failure,
    handed_back,
)
from tidefleet.agent.gpus import Devices, GpuProblem, Usage, account, query, sample
from tidefleet.agent.runner import (
    CannotStart,
    NodeFault,
    Workload,
    checkpoint_uri,
    free_port,
    item_user,
    remove_leftover_containers,
)
from tidefleet.cloud import for_env
from tidefleet.config import NODE_LOSSES_TOLERATED, Environment, Queue
from tidefleet.jobs.sdk import ItemMessage, send_messages
from tidefleet.jobs.spec import JobSpec, Resolved, resolve
from tidefleet.logstream import CLOSE_S
from tidefleet.policy.model import rate_after, rate_at
from tidefleet.ports import Delivery, NodeMetadata
from tidefleet.records import AttemptOutcome, Fence, Heartbeat, Item, ItemWrite, Job
from tidefleet.resources import redrive_receives

log = logging.getLogger("tidefleet.agent")
RECEIVE_BATCH = 10  # SQS's most per receive; more than a node's free slots anyway
RECEIVE_BACKS = 3  # tries to receive a fresh copy back (`Agent._refresh`): at once, then a heartbeat apart
ACK_BATCH = 10  # messages deleted per call (SQS DeleteMessageBatch's most)
RECEIVES_PER_QUEUE = 3  # short polls of a queue in one intake pass, before a lower-priority one
ACK_FLUSH_S = 0.5  # a recorded item's message is deleted within this, batched with others
RECORD_BATCH = 50  # ended items recorded per store call at most; a flush sends fewer within ACK_FLUSH_S
RECORD_RETRY_S = 1.0  # an end whose record failed is tried again this long after
# An end whose record cannot land for this long is given up: its message is no longer kept hidden,
# so it comes back (a succeeded item runs again, at least once; a cancelled one is cancelled at its
# receipt). Until then a store outage re-runs nothing.
RECORD_KEEP_S = 900.0
OUTCOME_BATCH = 500  # finished attempts per outcome-metric write (CloudWatch takes 10,000 events in one)
SETTLE_S = 5.0  # after the grace: time for an exited workload's runner to record its result
MIN_LEASE_S = 30.0  # an attempt's claim lasts this (or 6 heartbeats) past its last renewal
CANCEL_GRACE_S = 10.0  # at most: a cancelled workload's time to leave before SIGKILL
# A node that just went idle polls this long (at most) before it asks for the scaler's leave
# grant: a long poll of 1 s or more asks every SQS server, so an empty answer means no item.
LEAVE_POLL_S = 2
# A poison message's dead-letter envelope at most (SQS takes 262,144 bytes): JSON escaping may
# double a body (quotes) or make it six times longer (\uXXXX), so a long body is cut to fit.
POISON_ENVELOPE_MAX = 200_000
YIELD_S = 5.0  # after an item left to on-demand nodes shows again: time for one of them to receive it


def _first_line(err: BaseException) -> str:
    return str(err).splitlines()[0][:300] if str(err) else type(err).__name__


def _preempted(held: Held) -> bool:
    """An attempt the scaler's preempt mark stopped (`Run.preempted`): handed back without counting
    an interruption (`attempt.handed_back`), whoever hands it back (its own exit, or a drain that
    began while it checkpointed)."""
    return isinstance(held, Run) and held.preempted


def poison_envelope(reason: str, body: str) -> str:
    """The dead-letter message of a poison body: its reason and the body, cut (and said so) to fit
    `POISON_ENVELOPE_MAX`."""
    kept = body
    while True:
        envelope = {"tidefleet_poison": reason[:1000], "body": kept}
        if len(kept) < len(body):
            envelope["body_truncated"] = f"the first {len(kept)} of {len(body)} characters"
        text = json.dumps(envelope)
        size = len(text.encode())
        if size <= POISON_ENVELOPE_MAX:
            return text
        kept = kept[: int(len(kept) * POISON_ENVELOPE_MAX / size * 0.95)]


@dataclass(frozen=True)
class Settings:
    node_id: str
    instance_type: str
    spot: bool
    work_dir: Path  # absolute (`agent.cli` makes it so): the attempts' folders, their bind mounts
    checkpoint_root: Path | None = None  # local checkpoints (sandbox); None = the artifacts bucket
    heartbeat_s: float = 5.0
    imds_poll_s: float = 5.0
    grace_s: float | None = None  # None: the node's cloud's (`NodeHost.grace_s`)
    wait_s: int = 10  # long poll when every queue was empty
    item_user: str | None = None  # run workloads as this user (user-data creates tidefleet-item); None: as the agent


@dataclass(eq=False)
class Held:
    """A received message this agent is responsible for until it sends, deletes or hands it back."""

    queue: str
    receipt: str  # the queue's handle for this delivery (SQS receipt handle, Pub/Sub ack id)
    message: ItemMessage
    attempt: int = 0  # the record's attempt number once claimed (every record is fenced on it)
    what: Resolved | None = None  # the job's command/container, slots, timeout, retries (`jobs.spec`)


@dataclass(eq=False)
class Run(Held):
    """A claimed attempt: its state machine, its workload, and how many slots it takes."""

    slots: int = 1
    gpus: list[int] = field(default_factory=list)  # the node's GPUs this attempt holds (its only visible ones)
    began: float = field(default_factory=time.time)
    held_since: float = field(default_factory=time.time)  # when `receipt` was received (max_hold_s counts from it)
    # Its message's refreshes (`Agent._refresh`): copies sent (their names count them), failed tries in
    # a row and when the next may start, when the last copy went out and how often it was received back.
    copies: int = 0
    refresh_tries: int = 0
    refresh_after: float = 0.0
    copy_sent_at: float = 0.0
    receive_backs: int = 0
    state: Attempt = field(kw_only=True)
    workload: Workload = field(kw_only=True)
    # A multi-node item this node leads (`agent.gang`): the gang's (min, max) nodes, and which
    # member failed (then the attempt fails).
    gang: tuple[int, int] | None = None
    gang_failure: str = ""
    # Stopped alone, while the node goes on (its gang stopped, or the scaler preempted it): why
    # (then the item goes back whole: an interruption, or a preemption, `preempted`), and when
    # (SIGKILL after the grace).
    stop_note: str = ""
    stop_at: float | None = None
    # The scaler's preempt mark stopped it (a preemption, or checkpoint-and-move): its heartbeat
    # still lists it while it checkpoints (`_preemptible`).
    preempted: bool = False


@dataclass(eq=False)
class Member:
    """This node's part in a gang item another node leads: it holds the node's slots while the gang
    forms and runs, never the item's message or lease (the lead's)."""

    queue: str
    job: str
    item: str
    attempt: int
    slots: int
    gang: tuple[int, int]
    state: Attempt
    workload: Workload
    gpus: list[int] = field(default_factory=list)
    rank: int | None = None  # once started
    stop_at: float | None = None  # when the gang asked it to stop: SIGKILL after the grace


class Batches:
    """What the agent sends per queue in batches (`add`): a call per `size` entries of a queue,
    none waiting longer than `ACK_FLUSH_S`. `send(queue, entries)` returns the entries' errors
    (or raises); `_failed` decides what of a failed send is sent again (here nothing: logged, see
    `Acks` and `Outcomes`; `Records` keeps its entries)."""

    def __init__(self, send, size: int, what: str):
        self.send, self.size, self.what = send, size, what
        self.lock = threading.Lock()
        self.pending: dict[str, list] = defaultdict(list)
        self.since: float | None = None  # when the oldest pending one was added
        self.sending: dict[int, tuple[str, list]] = {}  # taken by a flush whose send has not returned yet

    def add(self, queue: str, entry) -> None:
        with self.lock:
            self.pending[queue].append(entry)
            self.since = self.since or time.monotonic()
            full = len(self.pending[queue]) >= self.size
        if full:
            self.flush()

    def flush(self, *, due_only: bool = False) -> None:
        with self.lock:
            if self.since is None or (due_only and time.monotonic() - self.since < ACK_FLUSH_S):
                return
            pending, self.pending, self.since = self.pending, defaultdict(list), None
            self.sending |= {id(entries): (queue, entries) for queue, entries in pending.items()}
        for queue, entries in pending.items():
            try:
                errors = self.send(queue, entries)
            except Exception as err:  # noqa: BLE001 - see the callers: nothing is lost by it
                errors = [_first_line(err)] * len(entries)
            kept = self._failed(queue, entries, errors) if errors else []
            with self.lock:
                del self.sending[id(entries)]
                if kept:
                    self.pending[queue][:0] = kept
                    retry_at = time.monotonic() + RECORD_RETRY_S - ACK_FLUSH_S  # due again in RECORD_RETRY_S
                    self.since = retry_at if self.since is None else min(self.since, retry_at)

    def _failed(self, queue: str, entries: list, errors: list[str]) -> list:
        """Log a failed send; return the entries to send again at a later flush."""
        log.warning("could not %s: %d of %s (%s)", self.what, len(errors), queue, errors[0])
        return []


class Acks(Batches):
    """Messages whose item is recorded, deleted (acked) in batches. Only ever given a message
    after its record is written, so a crash before the delete only redelivers it, and its claim
    drops it (the item is final or newer). A failed delete is the same case: the queue
    redelivers, the claim drops."""

    def __init__(self, queues):
        super().__init__(queues.delete, ACK_BATCH, "delete recorded messages (the queue redelivers them and the "
                         "agent drops them)")  # fmt: skip

    def add(self, queue: str, entry: str) -> None:
        if entry:  # "": a fresh copy whose handle never came back (`Agent._refresh`); its claim drops it
            super().add(queue, entry)


@dataclass(frozen=True)
class Ended:
    """An item's final record (succeeded, or cancelled: its job was; or a failure whose own write
    failed, its retry already sent) waiting for the next flush of `Records`. `attempt` 0: cancelled
    at its receipt, never started."""

    receipt: str
    write: ItemWrite
    attempt: int
    seconds: float
    since: float = field(default_factory=time.monotonic)  # when it ended: kept RECORD_KEEP_S at most

    @property
    def status(self) -> str:
        return self.write.values["status"]


class Records(Batches):
    """Final records (succeeded and cancelled items) written a flush at a time
    (`JobStore.update_items`: one store call for many), then their messages deleted: the delete
    only ever follows the record. A flush that fails keeps its records for the next (every
    `RECORD_RETRY_S`), and the heartbeat keeps their messages hidden meanwhile (`waiting`), so a
    store outage runs nothing again and leaves no cancelled item shown running; only a record
    kept `RECORD_KEEP_S` in vain is given up, and its message comes back (at least once, as when a
    node dies between an item's end and its record).
    `recorded(queue, ended, landed)` is called per item once its write was sent."""

    def __init__(self, store, recorded):
        self.store, self.recorded = store, recorded
        self.failing = False  # one line per outage, not one per retry
        super().__init__(self._write, RECORD_BATCH, "record ended items")

    def _write(self, queue: str, entries: list[Ended]) -> list[str]:
        landed = self.store.update_items([e.write for e in entries])
        if self.failing:
            self.failing = False
            log.info("recorded %d ended item(s) of %s that waited for the job store", len(entries), queue)
        for entry, ok in zip(entries, landed):
            self.recorded(queue, entry, ok)
        return []

    def _failed(self, queue: str, entries: list[Ended], errors: list[str]) -> list[Ended]:
        now = time.monotonic()
        kept = [e for e in entries if now - e.since < RECORD_KEEP_S]
        if len(kept) < len(entries):
            log.warning("could not record %d ended item(s) of %s for %.0fs (%s); giving up: the queue redelivers "
                        "them (a succeeded one runs again)", len(entries) - len(kept), queue, RECORD_KEEP_S,
                        errors[0])  # fmt: skip
        elif not self.failing:
            log.warning("could not record %d ended item(s) of %s (%s); retrying, their messages kept hidden",
                        len(entries), queue, errors[0])  # fmt: skip
        self.failing = self.failing or bool(kept)
        return kept

    def waiting(self) -> dict[str, list[str]]:
        """Per queue, the receipts of ends not recorded yet (a slow store call's included): their
        messages must stay hidden."""
        out: dict[str, list[str]] = defaultdict(list)
        with self.lock:
            for queue, entries in [*self.pending.items(), *self.sending.values()]:
                out[queue] += [e.receipt for e in entries if e.receipt]
        return {q: receipts for q, receipts in out.items() if receipts}


class Outcomes(Batches):
    """Finished attempts for the cloud's outcome metric (the alarms on failure rates): one write
    per queue per flush, not a call per item. Sent once the attempt ended (a success's record may
    still wait for its flush); a lost batch only thins the metric."""

    def __init__(self, logs):
        super().__init__(logs.record_outcomes, OUTCOME_BATCH, "record the outcome metric of attempts")


class Agent:
    def __init__(self, env: Environment, pool: str, settings: Settings, metadata: NodeMetadata | None = None):
        self.cloud = for_env(env)
        self.node = self.cloud.node_host(metadata)
        if settings.grace_s is None:
            settings = replace(settings, grace_s=self.node.grace_s)
        # A stop is acted on once the receive in flight returns: on GCE's 30-s notice a 10-s pull
        # left the hand-back no time after the grace.
        settings = replace(settings, wait_s=min(settings.wait_s, self.node.longest_poll_s))
        self.env, self.pool_name, self.pool, self.s = env, pool, env.pools[pool], settings
        self.booted_at = psutil.boot_time()  # this machine's boot: every heartbeat says it (`Heartbeat.booted_at`)
        self.metadata = self.node.metadata
        self.store = self.cloud.store
        self.queues: list[tuple[str, Queue]] = sorted(env.queues_of(pool).items(), key=lambda kv: -kv[1].priority)
        itype = next((t for t in self.pool.instance_types if t.type == settings.instance_type), None)
        if itype is None:
            itype = self.pool.instance_types[0]
            log.warning("instance type %r is not in pool %s; sizing as %s", settings.instance_type, pool, itype.type)
        self.slots, self.gpus, self.weight = self.pool.slots(itype), itype.gpus, itype.weight
        self.lock = threading.RLock()  # re-entrant: the SIGTERM handler may run while the main thread holds it
        self.changed = threading.Condition(self.lock)
        self.runs: list[Run] = []
        self.members: list[Member] = []  # this node's parts in gangs other nodes lead
        self.beacon: dict = {}  # the gang this node leads that takes members (`gang.Beacon`), for the heartbeat
        self.address = "127.0.0.1"  # where the nodes of a gang this node leads reach it (`_prepare`)
        self.stopping = threading.Event()
        self.cordoned = False  # the scaler's consolidation mark, read back with each heartbeat
        self.retiring = False  # left the group on the scaler's leave grant: takes nothing more
        self.asked_leave: float | None = None  # the idle period (its idle_since) that asked for the grant
        # The idle time (idle_since) a heartbeat showed the scaler, which may be letting the node
        # go on it (`_claim_work`).
        self.idle_shown: float | None = None
        self.held: set[str] = set()  # queues the scaler holds (their team is at its quota), read likewise
        # (queue, job, item) left to on-demand nodes (`_defer`) -> when its message shows again
        self.deferred: dict[tuple[str, str, str], float] = {}
        self.intake: dict[str, float] = {}  # queue -> items taken per second, as of intake_at
        self.intake_at = time.time()
        self.finished = threading.Event()
        self.stop_reason = ""
        self.lifecycle_terminating = False
        self.idle_since = time.time()
        self.protected: bool | None = None  # last protection state the group accepted
        self.visibility: dict[str, int] = {}
        self.lease_s = max(MIN_LEASE_S, 6 * settings.heartbeat_s)
        self.jobs: dict[str, tuple[float, Job | None]] = {}  # job id -> (read at, the job)
        self.streams: set = set()
        self.checkpoint_base = ""
        self.devices: Devices | None = None  # the node's GPUs by slot (`_prepare`); None: no GPUs
        self.gpu_usage: dict[int, Usage] = {}  # id(run or member) -> what its GPUs did so far
        self.acks = Acks(self.cloud.queues)
        self.records = Records(self.store, self._recorded)
        self.outcomes = Outcomes(self.cloud.logs)
        self.item_seconds: dict[str, list[float]] = defaultdict(list)  # succeeded items' run times, per beat

    # -- life of the agent --------------------------------------------------------------
    def run(self) -> int:
        self._prepare()
        signal.signal(signal.SIGTERM, lambda *_: self.request_stop("SIGTERM to the agent"))
        threads = [threading.Thread(target=self._loop, args=(f, s), daemon=True) for f, s in (
            (self._beat, self.s.heartbeat_s), (self._watch_metadata, self.s.imds_poll_s),
            (self._flush_batches, ACK_FLUSH_S), (self._flush_outcomes, ACK_FLUSH_S),
            *([(self._sample_gpus, self.s.heartbeat_s)] if self.devices is not None else []))]
        for t in threads:
            t.start()
        log.info("agent %s up: pool %s, %d slot(s), queues %s", self.s.node_id, self.pool_name, self.slots,
                 ", ".join(n for n, _ in self.queues))
        try:
            self._intake()
        finally:
            try:
                self._drain()
            finally:  # whatever the drain met: record what ended, flush the acks, let the node go
                self._leave()
        return 0

    def request_stop(self, reason: str) -> None:
        if self.stopping.is_set():
            return
        self.stop_reason = reason
        self.stopping.set()
        log.info("stopping intake: %s", reason)
        with self.changed:
            self.changed.notify_all()

    def _prepare(self) -> None:
        # Before any item: containers a killed agent left hold GPUs. A docker that does not answer,
        # or a missing item user, would fail every item it takes: take none (as a broken GPU driver).
        unanswered = remove_leftover_containers(self.pool, self.s.work_dir)
        faults = [f"its docker does not answer ({unanswered})"] if unanswered else []
        try:
            item_user(self.s.item_user)
        except NodeFault as err:
            faults.append(str(err))
        if faults:
            self._step("heartbeat", self._write_unhealthy, "; ".join(faults))
            raise NodeFault(f"this node cannot run items: {'; '.join(faults)}; it takes no items and is marked "
                            "draining, so the scaler replaces it")  # fmt: skip
        for name, _ in self.queues:
            # Extend by what the queue itself uses: the deployed queue is the truth.
            self.visibility[name] = self.cloud.queues.lease_s(name)
            if self.s.heartbeat_s * 2 > self.visibility[name]:
                log.warning("heartbeat every %ss is slow for queue %s (visibility %ss)", self.s.heartbeat_s, name,
                            self.visibility[name])
        # After the queues' first call, which ends the agent in one line where the cloud cannot be
        # reached; before its first heartbeat, which would keep an old machine's marks.
        self._step("a previous incarnation's record", self._forget_previous_incarnation)
        if self.gpus:
            try:
                self.devices = Devices.for_node(query(self.gpus), self.slots)
            except GpuProblem as err:  # take nothing; the scaler replaces a draining idle node
                self._step("heartbeat", self._write_unhealthy, f"its GPUs are not usable: {err}")
                raise GpuProblem(f"this node's GPUs are not usable: {err}; it takes no items and is marked "
                                 "draining, so the scaler replaces it") from None  # fmt: skip
            log.info("GPUs %s, %d slot(s) each", [g.index for g in self.devices.gpus], self.devices.slots_per_gpu)
        if any(q.gang[1] > 1 for _, q in self.queues):  # where the nodes of a gang it leads reach it
            self.address = self.metadata.address() or self.address
        if self.s.checkpoint_root is not None:
            self.checkpoint_base = self.s.checkpoint_root.resolve().as_uri()
        else:
            self.checkpoint_base = self.node.checkpoint_base()

    def _forget_previous_incarnation(self) -> None:
        """Before the first heartbeat: a record of this node id last written before this machine
        booted is a previous machine's of the same name (GCE: a managed instance group recreates
        a preempted Spot VM under its name), whose sticky marks (draining, cordon, preempt, its
        idle claim) would keep this one from taking any work: forgotten. A mark-only record (no
        heartbeat yet: a spot notice's draining) is this machine's, and kept. AWS instance ids are
        never reused: nothing to forget there."""
        own = self.store.heartbeat(self.pool_name, self.s.node_id)  # None: no record, or a mark only
        booted = self.booted_at
        if own is None or own.at >= booted:
            return
        self.store.forget_node(self.pool_name, self.s.node_id)
        log.info("forgot node %s's record from before this machine booted (last heartbeat %.0f s before the boot%s): a "
                 "previous machine of the same name", self.s.node_id, booted - own.at,
                 ", draining" if own.draining else "")  # fmt: skip

    def _loop(self, step, every_s: float) -> None:
        while not self.finished.is_set():
            try:
                step()
            except Exception:
                log.exception("%s failed; retrying in %ss", step.__name__, every_s)
            self.finished.wait(every_s)

    # -- intake -------------------------------------------------------------------------
    def _free_slots(self) -> int:
        with self.lock:
            return self.slots - sum(r.slots for r in self.runs) - sum(m.slots for m in self.members)

    def _intake(self) -> None:
        self._step("read holds", self._read_holds)  # before the first receive, not a heartbeat later
        while not self.stopping.is_set():
            try:
                # cordoned: finish, take nothing new; retiring: the group is letting it go
                free = 0 if self.cordoned or self.retiring else self._free_slots()
                fitting = [(n, q) for n, q in self.queues
                           if n not in self.held and q.slots_per_item <= free and self._gpus_fit(q.slots_per_item)
                           and not self._yielding(n)]
                if not fitting:
                    self._leave_if_granted()  # idle because cordoned or held: nothing to receive either
                    with self.changed:
                        self.changed.wait(timeout=1.0)
                    continue
                whole = free == self.slots and self._gpus_fit(self.slots)  # a member holds all its GPUs
                if whole and self._join_gang([(n, q) for n, q in fitting if q.gang[1] > 1]):
                    continue  # a gang that forms goes before new items
                got = sum(self._receive_queue(n, q) for n, q in fitting)  # highest priority first
                if not got and not self.stopping.is_set():
                    with self.lock:
                        asking = self.idle_since is not None and self.idle_since != self.asked_leave
                    wait_s = min(self.s.wait_s, LEAVE_POLL_S) if asking else self.s.wait_s
                    if not self._receive(*fitting[0], wait_s=wait_s):
                        self._leave_if_granted()
            except self.cloud.errors as err:
                log.warning("receive failed (%s); retrying", _first_line(err))
                self.stopping.wait(1.0)
            except Exception:  # the intake loop is the node's life: never let it end
                log.exception("intake failed; retrying")
                self.stopping.wait(1.0)

    def _leave_if_granted(self) -> None:
        """Idle, with nothing to receive for a whole long poll: leave the group (terminate with a
        decrement) if the scaler's leave grant has units for a node idle since then (`policy`
        rule 4 between ticks), once per idle period; one of the first nodes to go idle that the
        grant keeps warm stays instead, for the next tick to judge. The group's termination then
        reaches this agent as any other does (the lifecycle hook, SIGTERM), and it takes nothing
        meanwhile.
        Any failure leaves an idle node for the next tick to judge."""
        with self.lock:
            idle_since = self.idle_since
            if (idle_since is None or idle_since == self.asked_leave or self.runs or self.members or self.beacon
                    or self.retiring or self.stopping.is_set()):
                return
            self.asked_leave = idle_since
        try:
            self.records.flush()  # the last ends are recorded before the node may go
            if self.records.waiting():  # not recorded yet: stay to retry, and ask again once they are
                with self.lock:
                    self.asked_leave = None
                return
            if not self.store.take_leave(self.pool_name, self.weight, idle_since, time.time(), self.cordoned):
                return
            self.retiring = True
            self.node.retire(self.pool_name, self.s.node_id)
        except Exception as err:  # noqa: BLE001 - an idle node that stays costs a tick; a dead intake would wedge it
            self.retiring = False
            log.warning("could not leave the group (%s: %s); the scaler removes this idle node at its next tick",
                        type(err).__name__, next(iter(str(err).splitlines()), ""))
            return
        log.info("leaving the group: idle since %.0f s ago with nothing to receive, on the scaler's leave grant",
                 time.time() - idle_since)

    def _gpus_fit(self, slots: int) -> bool:
        with self.lock:
            return self.devices is None or self.devices.fits(slots)

    def _receive_queue(self, name: str, queue: Queue) -> int:
        """Short polls of one queue while they return messages, RECEIVES_PER_QUEUE at most: a
        short poll returns only some of what waits (SQS samples a few of its servers), and messages
        that take no slot (a cancelled job's, dropped) would otherwise leave the slots free for a
        lower-priority queue while this one still has items."""
        got = 0
        for _ in range(RECEIVES_PER_QUEUE):
            received = self._receive(name, queue, wait_s=0)
            got += received
            if not received or self.stopping.is_set():
                break
        return got

    def _receive(self, name: str, queue: Queue, wait_s: int) -> int:
        room = min(RECEIVE_BATCH, self._free_slots() // queue.slots_per_item)
        if room <= 0:
            return 0
        deliveries = self.cloud.queues.receive(name, room, wait_s)
        for delivery in deliveries:
            try:
                self._accept(name, queue, delivery)
            except self.cloud.errors as err:  # the message comes back after its visibility timeout
                log.warning("could not take a message of %s (%s); the queue redelivers it", name, _first_line(err))
            except Exception:  # never the thread's end, and never the message's
                # Not poison: a bug of the agent's or of an adapter's says nothing about the
                # message, which may be a good queued item or a running item's.
                # It comes back after its visibility timeout; one that breaks the agent every
                # time ends in the dead-letter queue by the queue's own redrive.
                log.exception("could not take a message of %s; the queue redelivers it", name)
        return len(deliveries)

    def _poison(self, name: str, delivery: Delivery, reason: str) -> None:
        """A message that can never run: to the dead-letter queue once, wrapped with its reason.
        Never raises: the other messages of its receive batch are taken all the same."""
        log.error("poison message on %s: %s; moving it to the dead-letter queue", name, reason[:1000])
        try:
            self.cloud.queues.send(name, [poison_envelope(reason, delivery.body)], dead_letter=True)
            self.cloud.queues.delete(name, [delivery.handle])
        except Exception as err:  # noqa: BLE001 - it comes back; the queue's redrive policy dead-letters it in the end
            log.warning("could not move a poison message of %s to the dead-letter queue (%s); the queue redelivers "
                        "it", name, _first_line(err))

    def _accept(self, name: str, queue: Queue, delivery: Delivery, *, taking: bool = True) -> None:
        """`taking` False: received back by `_receive_back`, which starts nothing."""
        try:
            msg = ItemMessage.parse(delivery.body)
        except ValueError as err:
            self._poison(name, delivery, str(err))
            return
        held = Held(name, delivery.handle, msg)
        if not taking:  # a running item's goes to its holder (this node, mostly); any other is visible again at once
            if not self._to_holder(name, delivery, msg):
                self.cloud.queues.release(name, [delivery.handle])
            return
        # Received during a long poll that began before this node stopped taking items (stopping,
        # cordoned, its group letting it go, the queue held): not ours to start. A cordoned node
        # would otherwise take back the very item the scaler just moved off it.
        if self.stopping.is_set() or self.cordoned or self.retiring or name in self.held:
            if not self._to_holder(name, delivery, msg):
                self._requeue([held], interrupted=False)
            return
        job = self._job(msg.job)
        action = claim.on_receipt(msg, job)
        if isinstance(action, claim.Poison):
            self._poison(name, delivery, action.reason)
            return
        if isinstance(action, claim.Cancel):
            self._settle_cancelled(held)
            return
        # The deployed redrive count: Pub/Sub clamps max_delivery_attempts to 5..100.
        defer = claim.on_spot(msg, delivery, after=queue.on_demand_after_interruptions,
                              max_receives=redrive_receives(self.env.cloud, queue)) if self.s.spot else None  # fmt: skip
        if defer is not None:
            if not self._to_holder(name, delivery, msg):
                self._defer(name, delivery, msg, defer)
            return
        held.what = resolve(JobSpec.from_record(job.spec if job else None), queue, self.pool)
        if not self._gpus_fit(held.what.slots):  # free slots, but not on whole GPUs: the next node's
            if not self._to_holder(name, delivery, msg):
                self._requeue([held], interrupted=False)
            return
        if not self._claim_work():
            self._requeue([held], interrupted=False)
            return
        # Delivered before: its last holder may have died mid-attempt (then the record still says
        # running, under a lapsed lease), or the message was only hidden again on purpose.
        before = self.store.item(msg.job, msg.item) if delivery.deliveries > 1 else None
        now = time.time()
        # A gang item's claim makes this node its lead and starts the gang afresh.
        lead = {"gang": gang.FORMING, "members": [self._member_entry(now, port=free_port())], "left": [],
                "gang_failure": ""} if queue.gang[1] > 1 else {}  # fmt: skip
        item = self.store.update_item(
            msg.job, msg.item, status="running", node=self.s.node_id, args=msg.args, seq=msg.seq,
            lease_until=now + self.lease_s, message_id=delivery.message_id, copy=msg.copy, receipt="",
            receipt_at=None, add={"attempts": 1}, fence=Fence(claim_at=now, seq=msg.seq), **lead,
        )  # fmt: skip
        if item is None:
            self._refused(name, delivery, msg, now)
            return
        held.attempt = item.attempts
        try:
            self._start(held, queue, item, before, lead=bool(lead))
        except Exception as err:  # noqa: BLE001 - the claim landed: its message is the item's, never poison
            self._stranded(held, err)

    def _claim_work(self) -> bool:
        """Before this node starts work while idle, if a heartbeat showed it idle: a scaler tick
        may be letting it go right now, and the group terminates busy nodes too. The claim and the
        scaler's mark race on the node's record (`JobStore.claim_work`): False if the scaler won,
        and then this node starts nothing and stops taking items (its termination is coming).
        A claim that starts nothing (the item's claim refused, no room in the gang) leaves the
        node idle since the claim: the idle time its next heartbeat shows, which a tick may let go."""
        with self.lock:
            idle_since = self.idle_since
            if idle_since is None or idle_since != self.idle_shown:
                return True
        at = time.time()
        if not self.store.claim_work(self.pool_name, self.s.node_id, at):
            self.request_stop("the scaler is letting this idle node go")
            return False
        with self.lock:
            if self.idle_since == idle_since:  # still idle: work that starts now clears it
                self.idle_since = at
        return True

    def _start(self, held: Held, queue: Queue, item: Item, before: Item | None, *, lead: bool) -> None:
        """After the claim landed: record an earlier completion or a lost node, else start the attempt."""
        name, msg = held.queue, held.message
        if item.attempts > 1 and self._completed_earlier(held, item):
            return
        if claim.node_lost(before):
            self._failed(held, queue, None, claim.NODE_LOST, {}, lost=True)
            return
        run = Run(name, held.receipt, msg, attempt=item.attempts, what=held.what, slots=held.what.slots,
                  state=Attempt(held.what.timeout_s, min(self.s.grace_s, CANCEL_GRACE_S)),
                  workload=Workload(self.s.work_dir / msg.job / msg.item / str(item.attempts)),
                  gang=queue.gang if lead else None)  # fmt: skip
        with self.lock:
            if self.devices is not None:  # only this thread takes devices: what fit above still fits
                run.gpus = self.devices.take(str(id(run)), run.slots)
            self.runs.append(run)
            self.idle_since = None
            self._count_intake(name, time.time())
        try:
            threading.Thread(target=self._lead if lead else self._execute, args=(run, queue), daemon=True,
                             name=f"attempt {msg.job}/{msg.item}").start()
        except BaseException:
            self._forget([run])
            raise

    def _stranded(self, held: Held, err: Exception) -> None:
        """The claim landed but what follows failed (a refused send on the lost-node path, a store
        error, the agent's own): the record says running on this node, so the message is a running
        item's, not poison. It stays hidden until the claim lapses; the next claim counts this
        attempt as a lost node's, and the item runs then."""
        msg, back_in = held.message, int(self.lease_s) + 1
        self._failure(err, "%s/%s: could not start attempt %d after claiming it; its message comes back in %ss, once "
                      "the claim lapses", msg.job, msg.item, held.attempt, back_in)  # fmt: skip
        self._step("hide a stranded claim's message", self.cloud.queues.extend, held.queue, [held.receipt], back_in)

    def _defer(self, name: str, delivery: Delivery, msg: ItemMessage, defer: claim.Defer) -> None:
        """Leave the item to an on-demand node; the heartbeat asks the scaler for one while it waits."""
        if defer.resend:
            send_messages(self.cloud, name, [msg])  # the same seq: a leftover copy is dropped by its claim
            self.cloud.queues.delete(name, [delivery.handle])
        else:
            self.cloud.queues.extend(name, [delivery.handle], claim.DEFER_S)
        with self.lock:
            new = (name, msg.job, msg.item) not in self.deferred
            self.deferred[name, msg.job, msg.item] = time.time() + claim.DEFER_S
        if new:
            log.info("%s", defer.why)

    def _yielding(self, queue: str) -> bool:
        """While an item it left to on-demand nodes shows again, a spot node does not receive from its
        queue (a long poll started before counts): the message goes to an on-demand node's receive,
        not back to this node's. Other spot nodes may still get it, and then yield likewise."""
        now = time.time()
        with self.lock:
            return any(q == queue and -self.s.wait_s - 1 <= now - shows <= YIELD_S
                       for (q, _, _), shows in self.deferred.items())  # fmt: skip

    def _count_intake(self, queue: str, now: float) -> None:
        """One more item taken: the per-queue rates the heartbeat carries to the scaler."""
        self.intake = {q: rate_at(r, self.intake_at, now) for q, r in self.intake.items()}
        self.intake[queue] = self.intake.get(queue, 0.0) + rate_after(0.0, now, now)
        self.intake_at = now

    def _to_holder(self, name: str, delivery: Delivery, msg: ItemMessage) -> bool:
        """A message this node starts nothing of may be a running item's (its holder replaced it,
        `_refresh`, or its visibility ran out): then the claim's refusal rules give it back to its
        holder (True). Sent out again as a copy instead, a claim would drop it as a duplicate,
        leaving the item no message if its node dies; deferred, it would come back every DEFER_S,
        each receive counting toward the queue's redrive."""
        now = time.time()
        current = self.store.item(msg.job, msg.item)
        if current is None or current.status != "running" or current.lease_until <= now:
            return False
        self._refused(name, delivery, msg, now, current)
        return True

    def _refused(self, name: str, delivery: Delivery, msg: ItemMessage, now: float, current: Item | None = None) -> None:
        """The claim was refused: do with the message what the reason calls for (`claim.on_refusal`)."""
        current = current or self.store.item(msg.job, msg.item)
        mine = self._run_of(msg, current.attempts) if current is not None else None
        action = claim.on_refusal(current, msg, delivery, now=now, heartbeat_s=self.s.heartbeat_s,
                                  mine=mine is not None)  # fmt: skip
        if isinstance(action, claim.Poison):
            self._poison(name, delivery, action.reason)
        elif isinstance(action, claim.Drop):
            log.info("%s", action.why)
            self.acks.add(name, delivery.handle)
        elif isinstance(action, claim.Hide):
            if action.why:
                log.info("%s", action.why)
            self.cloud.queues.extend(name, [delivery.handle], action.seconds)
        elif isinstance(action, claim.HandOver):
            log.info("%s", action.why)
            self.cloud.queues.extend(name, [delivery.handle], action.seconds)
            # Only while the record still names this message (the holder may have replaced it since
            # the read); with its id, if the holder's refresh has not recorded it yet.
            named = {"message_id": delivery.message_id} if delivery.message_id else {}
            if self.store.update_item(msg.job, msg.item, only_from=("running",), receipt=delivery.handle, receipt_at=now,
                                      fence=Fence(attempt=current.attempts, message=(delivery.message_id, msg.copy)),
                                      **named) is None:  # fmt: skip
                log.info("%s/%s: its record no longer names this message; it comes back in %ss", msg.job, msg.item,
                         action.seconds)  # fmt: skip
        elif mine is not None:  # claim.Adopt
            if not current.message_id and delivery.message_id:  # a copy known by its name: record its id too
                self._step("record a fresh copy's id", self._record_copy_id, msg, mine.attempt, delivery.message_id)
            self._adopt(mine, delivery.handle, now, msg.copy)

    def _record_copy_id(self, msg: ItemMessage, attempt: int, message_id: str) -> Item | None:
        """The id of a fresh copy whose name the item's record already has (`_refresh`): from then
        on the message it replaced is a duplicate, as is any other message of that name."""
        return self.store.update_item(msg.job, msg.item, only_from=("running",), message_id=message_id,
                                      fence=Fence(attempt=attempt, message=(message_id, msg.copy)))  # fmt: skip

    def _adopt(self, run: Run, handle: str, received_at: float, copy: str) -> bool:
        """Hold `handle`, a handle to the message the item's record names (our own receive's, or
        one another node handed over), unless the run holds one received later. A handle to a
        different message (a fresh copy) replaces the one it held, which no record names any more."""
        with self.lock:
            if handle == run.receipt or (run.receipt and received_at <= run.held_since):
                return False
            old, replaced = run.receipt, copy != run.message.copy
            run.receipt, run.held_since = handle, received_at
            if replaced:
                run.message = replace(run.message, copy=copy)
        if old and replaced:
            self.acks.add(run.queue, old)
        return True

    def _completed_earlier(self, held: Held, item: Item) -> bool:
        """An earlier attempt declared completion (`checkpoint.complete()`) but its node died
        before recording its end: record the success now instead of running the item again. The
        marker names its attempt; one recorded failed (it exited nonzero after complete(), and this
        is its retry) does not count; one handed back (a notice's SIGKILL after complete()) does.
        An empty marker is an older agent's: it counts."""
        msg = held.message
        try:
            marker = checkpoint.load(checkpoint.COMPLETE_MARKER, base=self._checkpoint_uri(held.queue, msg))
            ended = {str(entry.get("attempt")) for entry in item.history if entry.get("outcome") == "failed"}
            if marker is None or marker.strip().decode(errors="replace") in ended:
                return False
        except Exception as err:  # noqa: BLE001 - unreadable: run it (at least once beats never)
            log.warning("%s/%s: could not read its completion marker (%s); running it", msg.job, msg.item, err)
            return False
        entry = {"attempt": held.attempt, "node": self.s.node_id, "outcome": "succeeded",
                 "reason": "completed by an earlier attempt whose node was lost before recording it"}
        self.store.update_item(msg.job, msg.item, status="succeeded", exit_code=0, reason="", node="",
                               lease_until=None, append={"history": entry})  # fmt: skip
        self.acks.add(held.queue, held.receipt)
        log.info("%s/%s: completed by an earlier attempt; recorded, not run again", msg.job, msg.item)
        return True

    def _run_of(self, msg: ItemMessage, attempt: int) -> Run | None:
        with self.lock:
            return next((r for r in self.runs if (r.message.job, r.message.item, r.attempt) == (msg.job, msg.item, attempt)),
                        None)  # fmt: skip

    # -- gangs: items that run on several nodes at once (`agent.gang`) ---------------------
    def _member_entry(self, now: float, port: int | None = None) -> dict:
        return {"node": self.s.node_id, "addr": self.address, "at": now, **({"port": port} if port else {})}

    def _join_gang(self, fitting: list[tuple[str, Queue]]) -> bool:
        """Join the first live gang of these queues that has room: True if this node joined one."""
        if not fitting:
            return False
        queues = dict(fitting)
        now = time.time()
        beacons = gang.beacons(self.store.heartbeats(self.pool_name), own_node=self.s.node_id, queues=set(queues),
                               now=now, heartbeat_s=self.s.heartbeat_s)  # fmt: skip
        if not beacons or not self._claim_work():
            return False
        for beacon in beacons:
            item = self.store.update_item(beacon.job, beacon.item, only_from=("running",), fence=Fence(attempt=beacon.attempt),
                                          append={"members": self._member_entry(now)})  # fmt: skip
            verdict = gang.for_member(item, beacon.attempt, self.s.node_id, queues[beacon.queue].gang[1], now)
            if isinstance(verdict, gang.Leave):
                if item is not None:  # joined past the gang's size: surplus, off the roster for good
                    self._step("gang leave", self._mark_left, beacon.job, beacon.item, beacon.attempt)
                continue
            queue = queues[beacon.queue]
            member = Member(beacon.queue, beacon.job, beacon.item, beacon.attempt, slots=self.slots, gang=queue.gang,
                            state=Attempt(queue.item_timeout_s, self.s.grace_s),
                            workload=Workload(self.s.work_dir / beacon.job / beacon.item / f"{beacon.attempt}-member"))  # fmt: skip
            with self.lock:
                if self.devices is not None:
                    member.gpus = self.devices.take(str(id(member)), member.slots)
                self.members.append(member)
                self.idle_since = None
            log.info("joined the gang of %s/%s (attempt %d) led by another node", beacon.job, beacon.item, beacon.attempt)
            threading.Thread(target=self._member, args=(member, queue, list(item.args)), daemon=True,
                             name=f"gang member {beacon.job}/{beacon.item}").start()
            return True
        return False

    def _mark_left(self, job: str, item: str, attempt: int) -> None:
        self.store.update_item(job, item, fence=Fence(attempt=attempt), append={"left": {"node": self.s.node_id}})

    def _lead(self, run: Run, queue: Queue) -> None:
        """The thread of a gang item this node claimed: form the gang, then run it as node rank 0.
        Whatever raises while it forms, the item goes back and the node's slots come free."""
        try:
            self._form(run, queue)
        except Exception as err:  # noqa: BLE001 - never a wedged node: give the item back, else let its lease lapse
            self._failure(err, "%s/%s: forming its gang failed; giving the item back", run.message.job, run.message.item)
            try:
                self._release(run, "its gang could not be formed (an agent error)")
            except Exception:  # noqa: BLE001 - unrecorded: the message comes back after its visibility timeout
                self._feed(run, StopAsked(Stop.SUPERSEDED, time.monotonic()))
                self._forget([run])
                self.beacon = {}

    def _form(self, run: Run, queue: Queue) -> None:
        """Wait for the gang's nodes, then start. The item goes back (no attempt spent) if an
        older gang is forming in the pool or this one does not form in time."""
        msg, (low, high) = run.message, run.gang
        self.beacon = gang.Beacon(run.queue, msg.job, msg.item, run.attempt, time.time(), forming=True,
                                  short=low - 1).record()
        self._step("heartbeat", self._beat)  # free nodes find the gang now, not a heartbeat later
        deadline = time.monotonic() + self.pool.boot_timeout_s  # the members may have to boot first
        why = ""
        while not why:
            if run.state.stop is not None:  # a drain, a cancel, a newer attempt: settled as any attempt's
                self.beacon = {}
                self._settle(run, queue, Exited(-signal.SIGTERM, False, "stopped before its gang formed"), {})
                self._free(run)
                return
            try:
                item = self.store.item(msg.job, msg.item)
                pool = self.store.heartbeats(self.pool_name)
            except self.cloud.errors as err:  # the lease is renewed meanwhile: look again
                log.warning("%s/%s: could not read its gang (%s); trying again", msg.job, msg.item, err)
                self.finished.wait(1.0)
                continue
            if item is None or item.attempts != run.attempt or item.status != "running":
                self._superseded(run)
                continue
            joined = len(gang.roster(item.members, item.left, high))
            if joined >= low:
                break
            if self.beacon:  # what the scaler places, as members join
                self.beacon = {**self.beacon, "short": low - joined}
            own = gang.Beacon.parse(self.beacon)
            older = gang.yields_to(own, gang.beacons(pool, own_node=self.s.node_id, queues={run.queue}, now=time.time(),
                                                     heartbeat_s=self.s.heartbeat_s))  # fmt: skip
            if older is not None:
                why = f"an older gang ({older.job}/{older.item}) is forming in the pool; joining it first"
            elif time.monotonic() > deadline:
                why = f"its gang did not form within {self.pool.boot_timeout_s}s (pool boot_timeout_s)"
            else:
                self.finished.wait(1.0)
        if why:
            self._release(run, why)
            return
        started = self.store.update_item(msg.job, msg.item, only_from=("running",), fence=Fence(attempt=run.attempt),
                                         gang=gang.RUNNING)  # fmt: skip
        if started is None:
            self.beacon = {}
            self._superseded(run)
            self._settle(run, queue, Exited(-signal.SIGTERM, False), {})
            self._free(run)
            return
        members = tuple(gang.roster(started.members, started.left, high))
        # A member left since the last look (its node stopping): started short, the next beat would
        # stop it and hand the item back as an interruption. Members that saw it running stop too.
        if len(members) < low:
            self._release(run, f"a member left as its gang started: {len(members)} node(s) left, below min {low}")
            return
        self.beacon = {**self.beacon, "forming": False} if low < high and len(members) < high else {}
        log.info("%s/%s: gang of %d node(s) formed; starting as node rank 0", msg.job, msg.item, len(members))
        self._execute(run, queue, gang.workload_env(members, 0, slots=self.slots, low=low, high=high,
                                                    rendezvous_id=f"{msg.job}-{msg.item}-{run.attempt}"))  # fmt: skip

    def _release(self, run: Run, why: str) -> None:
        """Give a gang item back before it ran: a fresh message (seq + 1, so the old one is dropped
        wherever it turns up), the record queued again ("released" in its history): counted neither
        as an interruption nor as a failure."""
        msg = run.message
        self.beacon = {}
        back = replace(msg, seq=msg.seq + 1, copy="")  # a new message, not a fresh copy of the held one
        send_messages(self.cloud, run.queue, [back])
        self._record(run, status="queued", seq=back.seq, gang=gang.RELEASED,
                     history={"attempt": run.attempt, "node": self.s.node_id, "outcome": "released", "reason": why})  # fmt: skip
        self.acks.add(run.queue, run.receipt)
        self._feed(run, StopAsked(Stop.SUPERSEDED, time.monotonic()))
        self._feed(run, Exited(-signal.SIGTERM, False))
        self._forget([run])
        log.info("%s/%s: gave the item back: %s", msg.job, msg.item, why)

    def _after_exit(self, run: Run, queue: Queue, usage: dict) -> None:
        """After a workload ended: a gang it led takes no members any more; an attempt stopped
        alone while the node goes on (its gang stopped, a preemption) goes back whole (an
        interruption; a preemption counts none), or fails if a member of its gang failed."""
        if run.gang is not None:
            self.beacon = {}
        if not run.state.exited or self.stopping.is_set():
            return  # recorded by `_settle`, or the drain hands it back with the rest
        if Record(Outcome.HANDED_BACK) not in self._feed(run, GraceOver()):
            return
        if run.gang_failure:
            self._failed(run, queue, None, f"gang member failed: {run.gang_failure}", usage)
        else:
            self._requeue([run], interrupted=True, reason=run.stop_note)

    def _member(self, member: Member, queue: Queue, args: list[str]) -> None:
        """A member's thread: wait for the gang to start, run this node's part, leave. Whatever
        raises, the node's slots come free and the gang learns of it."""
        stream, verdict = None, gang.Wait()
        # This node's part, recorded once it started whatever ends it: (exit code, usage, why; None
        # if it raised), so a member whose workload or log stream broke is still billed its time.
        began, ended = 0.0, (None, {}, "")
        # A lead gives up on a gang that has not formed within the boot timeout; a member that
        # cannot even learn that (the store unreadable) gives up a little later.
        give_up = time.monotonic() + self.pool.boot_timeout_s + MIN_LEASE_S
        try:
            while isinstance(verdict, gang.Wait) and member.state.stop is None and not self.stopping.is_set():
                verdict = self._member_verdict(member)
                if isinstance(verdict, gang.Wait) and time.monotonic() > give_up:
                    verdict = gang.Leave(f"the gang did not start within {self.pool.boot_timeout_s + MIN_LEASE_S:.0f}s")
                elif isinstance(verdict, gang.Wait):
                    self.finished.wait(1.0)
            if not isinstance(verdict, gang.Start) or member.state.stop is not None or self.stopping.is_set():
                log.info("%s/%s: leaving its gang before it started (%s)", member.job, member.item,
                         verdict.why if isinstance(verdict, gang.Leave) else "stopping")  # fmt: skip
                self._feed(member, Exited(-signal.SIGTERM, False))
                return
            member.rank = verdict.rank
            low, high = member.gang
            job = self._job(member.job)
            what = resolve(JobSpec.from_record(job.spec if job else None), queue, self.pool)
            message = ItemMessage(member.job, member.item, args)
            env = gang.workload_env(verdict.members, verdict.rank, slots=self.slots, low=low, high=high,
                                    rendezvous_id=f"{member.job}-{member.item}-{member.attempt}")  # fmt: skip
            stream = self.cloud.logs.stream(member.queue, member.job, member.item, member.attempt)
            with self.lock:
                self.streams.add(stream)
            began = time.time()
            member.workload.start(what, message, member.attempt, self._checkpoint_uri(member.queue, message),
                                  checkpoint_root=self.s.checkpoint_root, user_name=self.s.item_user,
                                  gpu_indices=member.gpus, extra_env=env, grace_s=self.s.grace_s)  # fmt: skip
            self._feed(member, Started())
            log.info("%s/%s: started as node rank %d of %d", member.job, member.item, member.rank, len(verdict.members))
            code, usage, last_line = member.workload.wait(stream)
            if member.workload.daemon_unreachable(code, last_line):  # dockerd died since the agent started
                raise NodeFault(f"its docker daemon does not answer: {last_line}")
            ended = (code, usage, "")
            self._feed(member, Exited(code, member.workload.completed(), last_line))
            if code != 0 and member.state.stop is None:  # its failure is the item's: the lead records it
                tail = f": {last_line[:200]}" if last_line else ""
                self._step("gang failure", self._fail_gang, member, f"node {self.s.node_id} (rank {member.rank}) exited {code}{tail}")
        except self.cloud.errors as err:  # the cloud, not the item: leave, the gang goes on or re-forms
            log.warning("%s/%s: could not run this node's part of the gang (%s); leaving it", member.job, member.item,
                        _first_line(err))  # fmt: skip
            ended = (None, {}, _first_line(err))
            self._feed(member, Crashed(str(err)))
        except NodeFault as err:  # the node's, not the item's (as `_unfit`): leave, and take no more items
            log.error("%s/%s: this node cannot run items: %s; leaving its gang", member.job, member.item, err)
            self.request_stop(f"this node cannot run items: {err}; it takes no more items and is marked draining, "
                              "so the scaler replaces it")  # fmt: skip
            ended = (None, {}, f"this node cannot run items: {err}"[:300])
            self._feed(member, Crashed(str(err)))
        except Exception as err:  # the item's failure (a program that does not start): never the node's
            log.exception("%s/%s: this node's part of the gang failed", member.job, member.item)
            ended = (None, {}, f"{type(err).__name__}: {err}"[:300])
            self._step("gang failure", self._fail_gang, member, f"node {self.s.node_id}: {type(err).__name__}: {err}")
            self._feed(member, Crashed(str(err)))
        finally:
            if member.state.started:
                self._step("record the gang member's part", self._record_member, member, *ended, began)
            else:
                self._step("gang leave", self._leave_unstarted, member, isinstance(verdict, gang.Start))
            if stream is not None:
                stream.close()
                with self.lock:
                    self.streams.discard(stream)
            member.workload.remove()
            with self.lock:
                if member in self.members:
                    self.members.remove(member)
                if self.devices is not None:
                    self.devices.give_back(str(id(member)))
                self.gpu_usage.pop(id(member), None)
            self._forget([])

    def _record_member(self, member: Member, code: int | None, usage: dict, why: str, began: float) -> None:
        """This node's part of a gang attempt, whatever the item's status by now (`JobStore.record_part`):
        the lead's history entry covers the lead's node only, so without it `tidefleet cost` billed
        a gang of N nodes as one, and right-sizing never saw the members' usage. `code` None: the
        part raised (`why`) after its workload started; its time is billed all the same."""
        with self.lock:
            gpu = self.gpu_usage.pop(id(member), None)
        entry = {"attempt": member.attempt, "node": self.s.node_id, "rank": member.rank, "outcome": "member",
                 "exit_code": code, "seconds": round(time.time() - began, 3), **usage, **(gpu.record() if gpu else {}),
                 **({"reason": why} if why else {}), **self._placement(member.slots)}  # fmt: skip
        self.store.record_part(member.job, member.item, entry)

    def _fail_gang(self, member: Member, failure: str) -> None:
        self.store.update_item(member.job, member.item, only_from=("running",), fence=Fence(attempt=member.attempt),
                               gang_failure=failure)  # fmt: skip

    def _leave_unstarted(self, member: Member, running: bool) -> None:
        """Off the roster, so the gang forms without this node; but a fixed gang that started
        counts on it: the gang stops (the item goes back whole) rather than wait for it."""
        if running and member.gang[0] == member.gang[1]:
            self.store.update_item(member.job, member.item, only_from=("running",), fence=Fence(attempt=member.attempt),
                                   gang=gang.STOPPING)  # fmt: skip
        else:
            self._mark_left(member.job, member.item, member.attempt)

    def _member_verdict(self, member: Member) -> gang.Wait | gang.Start | gang.Leave:
        """What the member does now; Wait (look again) when the store cannot be read."""
        try:
            item = self.store.item(member.job, member.item)
        except self.cloud.errors as err:
            log.warning("%s/%s: could not read the gang (%s); trying again", member.job, member.item, err)
            return gang.Wait()
        return gang.for_member(item, member.attempt, self.s.node_id, member.gang[1], time.time())

    def _watch_gangs(self, leads: list[Run], members: list[Member]) -> None:
        """Each heartbeat: a lead stops when its gang stops, fails or shrinks below min; a member
        stops when its gang or its lead ends."""
        clock = time.monotonic()
        for run in leads:
            if run.state.stop is not None or not run.state.started:
                continue
            item = self.store.item(run.message.job, run.message.item)
            if item is None or item.attempts != run.attempt:
                continue  # the lease renewal stops a superseded attempt
            low, high = run.gang
            ranked = gang.roster(item.members, item.left, high)
            if item.gang_failure:
                run.gang_failure = item.gang_failure
            elif item.gang == gang.STOPPING:
                run.stop_note = "a node of its gang was interrupted"
            elif len(ranked) < low:
                run.stop_note = f"its gang fell to {len(ranked)} node(s), below min {low}"
                self.store.update_item(run.message.job, run.message.item, only_from=("running",),
                                       fence=Fence(attempt=run.attempt), gang=gang.STOPPING)  # fmt: skip
            else:
                if self.beacon and low < high:  # an elastic gang takes joiners while it has room
                    self.beacon = {**self.beacon, "forming": False} if len(ranked) < high else {}
                continue
            log.info("%s/%s: stopping the gang's workload: %s", run.message.job, run.message.item,
                     run.gang_failure or run.stop_note)  # fmt: skip
            run.stop_at = clock
            self._feed(run, StopAsked(Stop.INTERRUPT, clock))
        for member in members:
            if member.state.stop is None and member.state.started:
                verdict = self._member_verdict(member)
                if isinstance(verdict, gang.Leave):
                    log.info("%s/%s: stopping this node's part: %s", member.job, member.item, verdict.why)
                    member.stop_at = clock
                    self._feed(member, StopAsked(Stop.INTERRUPT, clock))

    def _kill_overdue(self, parts: list[Run | Member]) -> None:
        """A workload stopped alone (its gang, a preemption) had the grace to checkpoint: SIGKILL."""
        clock = time.monotonic()
        for part in parts:
            if part.stop_at is not None and clock - part.stop_at > self.s.grace_s:
                part.workload.signal(Signal.KILL)

    def _preempt(self, keys: set[str], moved: bool) -> None:
        """The scaler preempts these attempts: each checkpoints and goes back to its queue. On a
        cordoned node that is checkpoint-and-move (priority preemption never marks one)."""
        with self.lock:
            runs = [r for r in self.runs if self._run_key(r) in keys and r.state.stop is None]
        for run in runs:
            run.stop_note = ("moved off this cordoned node by the scaler (checkpoint-and-move)" if moved
                             else "preempted by the scaler for a higher-priority queue's items")  # fmt: skip
            run.stop_at, run.preempted = time.monotonic(), True
            log.info("%s/%s: %s", run.message.job, run.message.item, run.stop_note)
            self._feed(run, StopAsked(Stop.INTERRUPT, run.stop_at))

    @staticmethod
    def _run_key(run: Run) -> str:
        return f"{run.message.job}/{run.message.item}/{run.attempt}"

    def _leave_gang(self, part: Run | Member) -> None:
        """This node is going away: its gang stops with it (the item goes back whole), or, for an
        elastic gang with enough nodes left, goes on without it."""
        job, item_id = (part.message.job, part.message.item) if isinstance(part, Run) else (part.job, part.item)
        low, high = part.gang
        item = self.store.item(job, item_id)
        if item is None or item.attempts != part.attempt:
            return
        if isinstance(part, Member) and part.rank is None:
            return  # not started: it leaves the roster as its thread ends, and the gang forms without it
        if isinstance(part, Run) or gang.on_member_stop(item, self.s.node_id, low, high) == gang.STOPPING:
            self.store.update_item(job, item_id, only_from=("running",), fence=Fence(attempt=part.attempt), gang=gang.STOPPING)
        else:
            self._mark_left(job, item_id, part.attempt)

    # -- one attempt ----------------------------------------------------------------------
    def _checkpoint_uri(self, queue: str, msg: ItemMessage) -> str:
        return checkpoint_uri(self.checkpoint_base, self.s.checkpoint_root, queue, msg)

    def _feed(self, run: Run, event: Event) -> tuple[Decision, ...]:
        """Move the attempt's state machine by one event and send the signals it decides; the
        rest of what it decides is the caller's to carry out."""
        with self.changed:
            decisions = run.state.on(event)
            for decision in decisions:
                if isinstance(decision, Signal):
                    run.workload.signal(decision)
            self.changed.notify_all()  # the drain waits for attempts to end
        return decisions

    def _execute(self, run: Run, queue: Queue, gang_env: dict | None = None) -> None:
        """The runner thread of one attempt: whatever raises, the attempt settles once and the
        slot is freed, after its outcome is recorded and its container removed."""
        msg = run.message
        stream, usage, unfit, unrecorded = None, {}, None, False
        try:
            stream = self.cloud.logs.stream(run.queue, msg.job, msg.item, run.attempt)
            with self.lock:
                self.streams.add(stream)
            run.workload.start(run.what, msg, run.attempt, self._checkpoint_uri(run.queue, msg),
                               checkpoint_root=self.s.checkpoint_root, user_name=self.s.item_user,
                               gpu_indices=run.gpus, extra_env=gang_env, grace_s=self.s.grace_s)  # fmt: skip
            self._feed(run, Started())
            timer = threading.Timer(run.what.timeout_s, lambda: self._feed(run, StopAsked(Stop.TIMEOUT, time.monotonic())))
            timer.daemon = True
            timer.start()
            try:
                code, usage, last_line = run.workload.wait(stream)
            finally:
                timer.cancel()
            if run.workload.daemon_unreachable(code, last_line):  # dockerd died since the agent started
                raise NodeFault(f"its docker daemon does not answer: {last_line}")
            with self.lock:
                gpu = self.gpu_usage.pop(id(run), None)
            usage |= gpu.record() if gpu else {}
            ended: Exited | Crashed = Exited(code, run.workload.completed(), last_line, run.workload.exited_at)
        except Exception as err:  # a bad item fails that item, never the node
            if isinstance(err, OSError) and not run.state.started:
                # Before the process exists, an OSError is making this node's own folders (the
                # attempt's, a local checkpoint's: disk full, read-only, a file in the way): the
                # node's fault, which every item would meet here. Failing them would dead-letter
                # them all within a second.
                unfit = f"this node cannot prepare the attempt's folder ({type(err).__name__}: {err})"
            elif isinstance(err, NodeFault):  # as much the node's: its dockerd, its item user
                unfit = f"this node cannot run items: {err}"
            else:
                if not isinstance(err, CannotStart):
                    log.exception("%s/%s attempt %d could not run", msg.job, msg.item, run.attempt)
                why = f"tidefleet: {err}" if isinstance(err, CannotStart) else \
                    f"tidefleet: could not run the item: {type(err).__name__}: {err}"  # fmt: skip
                if stream is not None:
                    stream.write(why)
                ended = Crashed(why, run.workload.completed())
        try:
            if unfit is not None:
                self._unfit(run, unfit)
            else:
                self._settle(run, queue, ended, usage)
                self._after_exit(run, queue, usage)
        except Exception as err:  # noqa: BLE001 - unrecorded, the message comes back after its visibility timeout
            self._failure(err, "could not record %s/%s; the queue redelivers it", msg.job, msg.item)
            unrecorded = True
        finally:
            if stream is not None:
                stream.close()
                with self.lock:
                    self.streams.discard(stream)
            # Only now: a hung dockerd holds the container's removal up to DOCKER_S, longer than a
            # drain waits for an exited workload's outcome (SETTLE_S), which it would hand back.
            run.workload.remove()
            if unrecorded:
                self._forget([run])
            else:
                self._free(run)

    def _unfit(self, run: Run, why: str) -> None:
        """This node cannot run the attempt (`why`: its folder, its dockerd, its item user): hand
        the item back (an interruption, never a failure) and stop taking items; its heartbeat
        says draining, so the scaler replaces the node."""
        msg = run.message
        log.error("%s/%s: %s; handing the item back", msg.job, msg.item, why)
        self.request_stop(f"{why}; it takes no more items and is marked draining, so the scaler replaces it")
        self._feed(run, StopAsked(Stop.INTERRUPT, time.monotonic()))
        self._feed(run, Exited(-signal.SIGTERM, False))
        # Whoever ends the grace hands it back: this thread, or a drain that began meanwhile.
        if Record(Outcome.HANDED_BACK) in self._feed(run, GraceOver()):
            self._requeue([run], interrupted=True, reason=why[:300])
            self._forget([run])

    def _settle(self, run: Run, queue: Queue, ended: Exited | Crashed, usage: dict) -> None:
        """Carry out what the attempt decides once its workload has ended."""
        for decision in self._feed(run, ended):
            if isinstance(decision, LateSuccess):
                self._step("late success", self.store.update_item, run.message.job, run.message.item,
                           status="succeeded", exit_code=0, reason="")
            elif isinstance(decision, Record):
                self._record_outcome(run, queue, decision, usage)

    def _record_outcome(self, run: Run, queue: Queue, record: Record, usage: dict) -> None:
        msg = run.message
        entry = {"attempt": run.attempt, "node": self.s.node_id, "exit_code": record.exit_code,
                 "seconds": round(time.time() - run.began, 3), **usage, **self._placement(run.slots)}
        try:
            if record.outcome is Outcome.DROPPED:
                log.warning("%s/%s attempt %d: another attempt holds the item now; recording nothing",
                            msg.job, msg.item, run.attempt)
            elif record.outcome is Outcome.CANCELLED:
                self._settle_cancelled(run, entry)
            elif record.outcome is Outcome.SUCCEEDED:
                self._succeeded(run, usage, entry)
            else:
                self._failed(run, queue, record.exit_code, record.reason, usage, entry)
        except self.cloud.errors as err:
            # The message stays in flight; with no heartbeat it comes back after the visibility timeout.
            log.error("could not record %s/%s (%s); the queue will redeliver it", msg.job, msg.item, _first_line(err))
        if record.outcome is not Outcome.DROPPED:
            self.outcomes.add(run.queue, AttemptOutcome(msg.job, msg.item, run.attempt, record.outcome.value,
                                                        entry["seconds"], time.time()))

    def _placement(self, slots: int) -> dict:
        """What the attempt ran on, for `tidefleet cost`: heartbeats are gone once the node is."""
        return {"instance_type": self.s.instance_type, "spot": self.s.spot, "slots": slots,
                "node_slots": self.slots, "ended_at": round(time.time(), 3)}

    def _free(self, run: Run) -> None:
        """Free the slot of an attempt whose outcome is decided. One that exited after the drain
        asked it to stop is not yet: the drain hands it back with the rest, and frees it then."""
        if run.state.result is not None:
            self._forget([run])

    def _forget(self, runs: list[Run]) -> None:
        with self.lock:
            for run in runs:
                if run in self.runs:
                    self.runs.remove(run)
                if self.devices is not None:
                    self.devices.give_back(str(id(run)))
                self.gpu_usage.pop(id(run), None)
            if not self.runs and not self.members and self.idle_since is None:
                self.idle_since = time.time()
            self.changed.notify_all()

    def _succeeded(self, run: Run, usage: dict, entry: dict) -> None:
        """Recorded at the next flush (`Records`), with the other successes meanwhile. Not fenced on
        the attempt: a success stands even if another attempt took the item meanwhile (that one
        sees it final at its next heartbeat and stops)."""
        write = ItemWrite(run.message.job, run.message.item, append={"history": {**entry, "outcome": "succeeded"}},
                          values={"status": "succeeded", "exit_code": 0, "reason": "", "lease_until": None, **usage})  # fmt: skip
        self.records.add(run.queue, Ended(run.receipt, write, run.attempt, entry["seconds"]))

    def _recorded(self, queue: str, done: Ended, landed: bool) -> None:
        job, item = done.write.job_id, done.write.item_id
        if done.status not in ("succeeded", "cancelled"):  # a failure whose record had failed (`_failed`)
            if not landed:  # a newer attempt holds the item: its history keeps this one's end
                self._step("record a failed attempt's history", self.store.update_item, job, item, never_from=(),
                           append=done.write.append)  # fmt: skip
            self.acks.add(queue, done.receipt)
            log.info("%s/%s: recorded its failure once the job store answered", job, item)
            return
        self.acks.add(queue, done.receipt)
        if done.status != "succeeded":
            # A cancel marks the job's waiting items final itself: their messages meet them final.
            log.info("%s/%s cancelled%s", job, item, "" if landed else " (recorded by the cancel)")
            return
        if not landed:
            log.warning("%s/%s was already final; not marking it %s", job, item, done.status)
        with self.lock:  # folded into the queue's mean at the next heartbeat
            self.item_seconds[queue].append(done.seconds)
        log.info("%s/%s succeeded (attempt %d)", job, item, done.attempt)

    def _settle_cancelled(self, held: Held, entry: dict | None = None) -> None:
        """Recorded like a success (`Records`): a store outage keeps it and its message hidden, not
        the item shown running until its message comes back."""
        extra = {"append": {"history": {**entry, "outcome": "cancelled"}}} if entry else {}
        write = ItemWrite(held.message.job, held.message.item, **extra,
                          values={"status": "cancelled", "reason": "job cancelled", "lease_until": None})  # fmt: skip
        self.records.add(held.queue, Ended(held.receipt, write, held.attempt, entry["seconds"] if entry else 0.0))

    def _failed(self, held: Held, queue: Queue, code: int | None, reason: str, usage: dict,
                entry: dict | None = None, *, lost: bool = False) -> None:
        """Send the retry (or the dead letter, `attempt.after_failure`), delete what we held, record."""
        max_retries = held.what.max_retries if held.what else queue.max_retries
        retry = after_failure(held.message, reason, max_retries=max_retries,
                              losses_tolerated=NODE_LOSSES_TOLERATED, lost=lost)  # fmt: skip
        send_messages(self.cloud, held.queue, [retry.message], dead_letter=retry.dead_letter)
        history = {"node": self.s.node_id, **(entry or {}), "outcome": "lost" if lost else "failed",
                   "reason": retry.reason}  # fmt: skip
        values = {"status": retry.status, "failures": retry.message.failures, "lost": retry.message.lost,
                  "exit_code": code, "reason": retry.reason, "seq": retry.message.seq, **usage}  # fmt: skip
        try:
            self._record(held, history=history, **values)
        except self.cloud.errors as err:
            # Its retry (or dead letter) is out: the held message must not come back, where its claim
            # would read a running record under a lapsed lease and count a lost node (a second run of
            # an item with no retries left). The record waits for the next flushes as a success's
            # does, the message hidden until it lands.
            log.warning("could not record %s/%s's failure (%s); retrying, its message kept hidden",
                        held.message.job, held.message.item, _first_line(err))  # fmt: skip
            self.records.failing = True  # this outage's one line: said once it lands, not again per try
            write = ItemWrite(held.message.job, held.message.item, values={"node": "", "lease_until": None, **values},
                              fence=Fence(attempt=held.attempt), append={"history": history})  # fmt: skip
            self.records.add(held.queue, Ended(held.receipt, write, held.attempt, (entry or {}).get("seconds", 0.0)))
            return
        self.acks.add(held.queue, held.receipt)  # a redelivery of it meets the newer seq recorded: dropped
        log.info("%s/%s %s: %s", held.message.job, held.message.item,
                 "dead-lettered" if retry.dead_letter else "will retry", retry.reason)  # fmt: skip

    def _record(self, held: Held, *, history: dict, **values) -> None:
        """Record the end of the attempt `held` claimed, fenced on that attempt: if a newer one
        took the item since (its record stands), only the history entry is kept."""
        msg = held.message
        if self.store.update_item(msg.job, msg.item, node="", lease_until=None, append={"history": history},
                                  fence=Fence(attempt=held.attempt), **values) is None:  # fmt: skip
            self.store.update_item(msg.job, msg.item, never_from=(), append={"history": history})

    def _requeue(self, helds: list[Held], *, interrupted: bool, reason: str = "") -> None:
        """Send each item back as a fresh message (receive count 1), then delete what we held. Never
        raises: a queue whose send fails keeps its items' messages (they come back after their
        visibility timeout) and their records, and the other queues' items go back all the same."""
        reason = reason or self.stop_reason
        by_queue: dict[str, list[Held]] = defaultdict(list)
        for h in helds:
            by_queue[h.queue].append(h)
        sent: list[Held] = []
        for queue, group in by_queue.items():
            try:
                send_messages(self.cloud, queue, [handed_back(h.message, interrupted=interrupted, preempted=_preempted(h))
                                                  for h in group])  # fmt: skip
            except Exception as err:  # noqa: BLE001 - nothing sent is recorded: the held messages stay the items'
                log.error("could not hand back %d item(s) of %s (%s); the queue redelivers them after their visibility "
                          "timeout", len(group), queue, _first_line(err))  # fmt: skip
                continue
            sent += group
            # "": a fresh copy whose handle never came back (`_refresh`); the newer seq drops it
            self._step("delete handed-back messages (the newer seq drops them)", self._delete, queue,
                       [h.receipt for h in group if h.receipt], "handed-back")
        unrecorded = []
        for h in sent:
            if interrupted and h.attempt:
                ran = {"seconds": round(time.time() - h.began, 3), **self._placement(h.slots)} if isinstance(h, Run) else {}
                # The scaler's mark: "preempted" in its history (its reason says why: a higher-priority
                # queue, or checkpoint-and-move), not counted in `interruptions`, as its message.
                counted = {} if _preempted(h) else {"add": {"interruptions": 1}}
                try:
                    self._record(h, status="queued", seq=h.message.seq + 1, **counted,
                                 history={"attempt": h.attempt, "node": self.s.node_id,
                                          "outcome": "preempted" if _preempted(h) else "interrupted",
                                          "reason": h.stop_note if _preempted(h) else reason, **ran})  # fmt: skip
                except Exception as err:  # noqa: BLE001 - its new message is out: a claim of it counts a lost node
                    unrecorded.append(err)
        if unrecorded:
            log.warning("could not record %d hand-back(s) (%s); their items show running until their new messages "
                        "are claimed", len(unrecorded), _first_line(unrecorded[0]))  # fmt: skip
        if sent:
            log.info("handed back %d item(s)%s", len(sent), f" ({reason})" if interrupted else "")

    def _delete(self, queue: str, handles: list[str], what: str) -> None:
        errors = self.cloud.queues.delete(queue, handles)
        if errors:
            log.warning("could not delete %d %s message(s): %s", len(errors), what, errors[0])

    # -- stopping ---------------------------------------------------------------------------
    def _drain(self) -> None:
        with self.lock:
            for run in self.runs:
                self._feed(run, StopAsked(Stop.INTERRUPT, time.monotonic()))
            for member in self.members:
                self._feed(member, StopAsked(Stop.INTERRUPT, time.monotonic()))
            busy = len(self.runs) + len(self.members)
            gangs = [r for r in self.runs if r.gang] + list(self.members)
        for part in gangs:  # the other nodes of this node's gangs stop with it, or go on without it
            self._step("gang stop", self._leave_gang, part)
        if busy:
            log.info("asked %d workload(s) to checkpoint; waiting up to %ss", busy, self.s.grace_s)
        deadline = time.monotonic() + self.s.grace_s
        with self.changed:
            while any(p.state.running for p in [*self.runs, *self.members]) and time.monotonic() < deadline:
                self.changed.wait(min(0.2, max(0.0, deadline - time.monotonic())))
            for member in self.members:
                self._feed(member, GraceOver())  # SIGKILL what is left; members hand nothing back
            # A workload that exited just before the deadline may not be settled yet (its runner
            # is still reading the last output): handing it back would run a finished item again.
            settle_by = time.monotonic() + SETTLE_S
            while any(r.state.running and r.workload.has_exited() for r in self.runs) and time.monotonic() < settle_by:
                self.changed.wait(0.1)
            left = [r for r in list(self.runs) if Record(Outcome.HANDED_BACK) in self._feed(r, GraceOver())]
        self._requeue(left, interrupted=True)  # never raises: what it cannot send comes back after its visibility
        self._forget(left)

    def _leave(self) -> None:
        # Runners close their attempts' item logs as they end, the last lines going out then (within
        # logstream.CLOSE_S): the agent's process, whose threads are daemons, must not end under them.
        streams_by = time.monotonic() + CLOSE_S + 1
        with self.lock:
            while self.streams and time.monotonic() < streams_by:
                self.changed.wait(0.1)
        self.records.flush()
        give_up = time.monotonic() + SETTLE_S  # a store blip as the agent stops must not run items again
        while self.records.waiting() and time.monotonic() < give_up:
            time.sleep(RECORD_RETRY_S)
            self.records.flush()
        if self.records.waiting():
            log.warning("leaving with %d ended item(s) unrecorded; the queue redelivers them",
                        sum(map(len, self.records.waiting().values())))
        self.acks.flush()
        self.outcomes.flush()  # before letting the node go, which ends it
        if self.lifecycle_terminating:
            try:
                self.node.leave(self.pool_name, self.s.node_id)
            except Exception as err:  # noqa: BLE001 - leaving must not fail on a cloud error
                log.warning("complete_lifecycle_action failed (%s); the hook's timeout lets the node go", err)
        # Finished first: the last beat lifts scale-in protection (a node that just went idle
        # counts as busy), or a node left running (a SIGTERM, the store's draining flag) would
        # stay protected with no agent.
        self.finished.set()
        self._beat()
        log.info("agent %s done: %s", self.s.node_id, self.stop_reason or "stopped")

    # -- background steps ---------------------------------------------------------------
    def _watch_metadata(self) -> None:
        if self.stopping.is_set():
            return
        notice = self.metadata.notice()
        if notice is not None:
            self.lifecycle_terminating |= notice.lifecycle
            self.request_stop(notice.reason)

    def _job(self, job_id: str) -> Job | None:
        """The job's record (None: not in the store), read at most once per heartbeat interval
        until it is cancelled."""
        read_at, job = self.jobs.get(job_id, (0.0, None))
        if not (job and job.cancelled) and time.monotonic() - read_at >= self.s.heartbeat_s:
            job = self.store.job(job_id)
            self.jobs[job_id] = (time.monotonic(), job)
        return job

    def _cancelled(self, job_id: str) -> bool:
        job = self._job(job_id)
        return bool(job and job.cancelled)

    def _beat(self) -> None:
        with self.lock:
            runs = [r for r in self.runs if r.state.result is None]  # still holding their messages
            members = list(self.members)
            busy = sum(r.slots for r in self.runs) + sum(m.slots for m in members)
            idle_since = self.idle_shown = self.idle_since
            streams = list(self.streams)
            running = Counter([*(r.message.job for r in self.runs), *(m.job for m in members)])
        unrecorded = self.records.waiting()
        leased = Counter({q: len(receipts) for q, receipts in unrecorded.items()})
        leased.update(r.queue for r in runs if r.receipt)  # a gang's message is its lead's; members hold none
        self._step("on-demand items", self._forget_placed)
        self._step("heartbeat", self._write_heartbeat, busy, idle_since, dict(running), dict(leased))
        self._step("gangs", self._watch_gangs, [r for r in runs if r.gang], members)
        self._step("stop deadlines", self._kill_overdue, [*runs, *members])
        self._step("visibility", self._extend_visibility, runs)
        # Read again now: the flush thread records ends and deletes their messages meanwhile.
        self._step("visibility of unrecorded ends", self._keep_hidden, self.records.waiting(), "unrecorded end(s)",
                   self.records.waiting)  # fmt: skip
        self._step("lease", self._renew_leases, runs)
        self._refresh_due(runs)
        self._step("cancel check", self._stop_cancelled, runs)
        self._step("queue stats", self._record_item_seconds)
        # Idle for less than a beat counts as busy: a node taking items back to back keeps its
        # protection instead of flipping it (a call each way) whenever a beat falls between two.
        recently = idle_since is not None and time.time() - idle_since < self.s.heartbeat_s
        self._step("scale-in protection", self._protect,
                   (busy > 0 or recently or bool(unrecorded)) and not self.finished.is_set())
        for stream in streams:
            stream.flush()

    def _flush_batches(self) -> None:
        self.records.flush(due_only=True)
        self.acks.flush(due_only=True)

    def _flush_outcomes(self) -> None:
        # A thread of its own: outcome metrics go to the log service, whose outage must not hold
        # up the records and acks that end items.
        self.outcomes.flush(due_only=True)

    def _record_item_seconds(self) -> None:
        """The scaler's boot-horizon rule reads each queue's mean; a lost sample only nudges it."""
        with self.lock:
            samples, self.item_seconds = self.item_seconds, defaultdict(list)
        for queue, seconds in samples.items():
            self.store.record_item_seconds(queue, *seconds)

    def _failure(self, err: Exception, msg: str, *args) -> None:
        """Log a failed step, from its except clause: one line for the cloud's errors (a refused
        call, or a store that gave up on its retries: throttled, contended), which are the cloud's
        passing trouble, and a traceback for anything else, a bug."""
        if isinstance(err, self.cloud.errors):
            log.warning(f"{msg} (%s)", *args, _first_line(err))
        else:
            log.exception(msg, *args)

    @staticmethod
    def _step(what: str, fn, *args) -> None:
        try:
            fn(*args)
        except Exception as err:  # noqa: BLE001 - one failed step must not stop the others
            log.warning("%s failed: %s", what, _first_line(err))

    def _write_heartbeat(self, busy: int, idle_since: float | None, running: dict[str, int],
                         leased: dict[str, int] | None = None) -> None:
        """`leased`: the messages this agent holds, by queue (`Heartbeat.leased`): its unsettled
        attempts' and those of ended items whose records wait for the store (kept hidden)."""
        now = time.time()
        with self.lock:
            intake = {q: rate_at(r, self.intake_at, now) for q, r in self.intake.items()}
        self.store.put_heartbeat(Heartbeat(
            self.s.node_id, self.pool_name, at=now, slots=self.slots, busy_slots=busy,
            idle_since=idle_since, draining=self.stopping.is_set(), instance_type=self.s.instance_type,
            spot=self.s.spot, gpus=self.gpus, intake=intake, running=running, gang=self.beacon, runs=self._preemptible(),
            on_demand_wanted=self._on_demand_wanted(), leased=leased or {}, booted_at=self.booted_at,
        ))
        own = self.store.heartbeat(self.pool_name, self.s.node_id)
        if own is not None and own.draining:
            self.request_stop("node marked draining in the job store")
        if own is not None and own.preempt:
            self._preempt(set(own.preempt), moved=own.cordoned)
        cordoned = own is not None and own.cordoned
        if cordoned != self.cordoned:
            log.info("intake %s: %s by the scaler", "stopped" if cordoned else "resumed",
                     "cordoned" if cordoned else "uncordoned")
            self.cordoned = cordoned
            with self.changed:
                self.changed.notify_all()
        self._read_holds()

    def _read_holds(self) -> None:
        held = set(self.store.held_since([n for n, _ in self.queues]))
        if held != self.held:
            log.info("queues held by the scaler (team at its quota): %s", ", ".join(sorted(held)) or "none")
            self.held = held
            with self.changed:
                self.changed.notify_all()

    def _preemptible(self) -> list[dict]:
        """This node's started attempts of preemptible queues, for the scaler's preemption rule: those
        not asked to stop, and those its mark stopped until they are handed back. Unlisted while it
        checkpoints, a marked attempt was neither room being made nor a move under way to the next
        tick, which cleared its mark and stopped another attempt for the same waiting item (or sent
        another node's attempts to the moving node's room)."""
        with self.lock:
            return [{"key": self._run_key(r), "queue": r.queue, "since": r.began, "slots": r.slots} for r in self.runs
                    if self.env.queues[r.queue].preemptible and r.state.started
                    and (r.state.stop is None or r.preempted) and r.state.result is None]  # fmt: skip

    def _forget_placed(self) -> None:
        """Items left to on-demand nodes that no longer wait (an on-demand node claimed them, or they
        ended): the scaler must not launch for them any more."""
        with self.lock:
            deferred = list(self.deferred)
        for key in deferred:
            item = self.store.item(key[1], key[2])
            if item is None or item.status != "queued":
                with self.lock:
                    self.deferred.pop(key, None)

    def _on_demand_wanted(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = defaultdict(list)
        with self.lock:
            for queue, job, item in sorted(self.deferred):
                out[queue].append(f"{job}/{item}")
        return dict(out)

    def _write_unhealthy(self, fault: str) -> None:
        """A node that must not take items says so, and why: draining and idle, the scaler removes it
        (and holds the pool's launches after several in a row, `policy.faults`)."""
        now = time.time()
        self.store.put_heartbeat(Heartbeat(
            self.s.node_id, self.pool_name, at=now, slots=self.slots, busy_slots=0, idle_since=now, draining=True,
            instance_type=self.s.instance_type, spot=self.s.spot, gpus=self.gpus, fault=fault[:500],
            booted_at=self.booted_at,
        ))  # fmt: skip

    def _sample_gpus(self) -> None:
        """A thread of its own, every heartbeat: nvidia-smi may hang for its whole QUERY_TIMEOUT_S
        (20 s), which in the heartbeat would hold up the claims' renewals (30 s) with it. A sample
        the driver does not give is one line and a reading fewer; anything else goes to `_loop`.
        Idle too: a GPU missing from the readings (fallen off the bus) is said once, and given to
        no item until it is back (`Devices.seen`), so the next item does not fail on it."""
        try:
            readings = sample()
        except GpuProblem as err:
            log.warning("GPU usage not sampled: %s", str(err)[:300])
            return
        with self.lock:
            gone, back = self.devices.seen(readings)
            account(self.gpu_usage, {id(r): r.gpus for r in [*self.runs, *self.members] if r.gpus and r.state.result is None},
                    readings)  # fmt: skip
        for gpu in gone:
            log.warning("GPU %d (%s) is missing from nvidia-smi's readings: no item is given it until it is back",
                        gpu.index, gpu.uuid)  # fmt: skip
        for gpu in back:
            log.warning("GPU %d (%s) is back in nvidia-smi's readings: items are given it again", gpu.index, gpu.uuid)

    def _extend_visibility(self, runs: list[Run]) -> None:
        by_queue: dict[str, list[Run]] = defaultdict(list)
        for run in runs:
            if run.receipt:  # "": its fresh copy's handle has not come back yet (`_refresh`)
                by_queue[run.queue].append(run)
        for queue, group in by_queue.items():
            failed = self.cloud.queues.extend(queue, [r.receipt for r in group], self.visibility[queue])
            for run in group:
                if run.receipt in failed:
                    log.warning("could not extend %s: %s", run.message.item, failed[run.receipt])

    def _keep_hidden(self, receipts: dict[str, list[str]], what: str,
                     waiting: Callable[[], dict[str, list[str]]] | None = None) -> None:  # fmt: skip
        """Messages that must not come back meanwhile, or their items would run again. `waiting`
        says which still must after a refusal: one deleted since (its end recorded) is refused as
        an invalid receipt, and that is no warning's."""
        for queue, handles in receipts.items():
            failed = self.cloud.queues.extend(queue, handles, self.visibility[queue])
            if failed and waiting is not None:
                still = set(waiting().get(queue, ()))
                failed = {handle: why for handle, why in failed.items() if handle in still}
            if failed:
                log.warning("could not keep %d %s of %s hidden: %s", len(failed), what, queue,
                            next(iter(failed.values())))  # fmt: skip

    def _renew_leases(self, runs: list[Run]) -> None:
        """Extend each running attempt's claim; an attempt whose claim another took, or whose
        item is final, is stopped at once (its late records would be refused anyway)."""
        until = time.time() + self.lease_s
        adopted: dict[str, list[str]] = defaultdict(list)
        for run in runs:
            msg = run.message
            item = self.store.update_item(msg.job, msg.item, only_from=("running",), lease_until=until,
                                          fence=Fence(attempt=run.attempt))  # fmt: skip
            if item is None:
                self._superseded(run)
            elif item.receipt and self._adopt(run, item.receipt, item.receipt_at, item.copy):
                adopted[run.queue].append(item.receipt)  # another node received our message (`claim.HandOver`)
        # Hidden from now, as the held ones were a moment ago: the node's hand-over hid it only until
        # the lease it read would lapse, and this renewal outlasts that.
        self._keep_hidden(adopted, "handed-over message(s)")

    def _refresh_due(self, runs: list[Run]) -> None:
        """Halfway through the queue's `max_hold_s` (SQS: 12 h from a receive), the other half
        leaves ample room for an extension, a slow heartbeat, failed tries and the copy's way back.
        A copy not received back yet is tried again a heartbeat later, a few times."""
        limit = self.cloud.queues.max_hold_s
        for run in runs:
            now = time.time()
            if not run.receipt:
                if run.receive_backs < RECEIVE_BACKS and now - run.copy_sent_at >= self.s.heartbeat_s:
                    self._step("receive back its fresh copy", self._receive_back, run)
            elif limit is not None and now - run.held_since >= limit / 2 and now >= run.refresh_after:
                self._step("message refresh", self._refresh, run, limit)

    def _refresh(self, run: Run, limit: float) -> None:
        """Replace the message of an attempt that outruns the queue's hold limit with a fresh copy.
        Record first: the copy's name (`ItemMessage.copy`) goes on the item's record before the copy
        is sent, so whichever node receives it, however soon, knows it for the holder's (`claim.Adopt`,
        `claim.HandOver`), and the message it replaces is kept until the copy's id is recorded. A
        node that dies anywhere in between leaves one or both messages for the next claim, which
        drops the other. Receiving the old one again instead would count toward the queue's
        redrive, once per limit, and dead-letter an item that is still running. A failed try is
        tried again with backoff, under a new name: a copy it may have sent anyway is a duplicate."""
        msg, old = run.message, run.receipt
        run.refresh_tries += 1  # if this try fails: the next after 1, 2, 4 ... heartbeats, at most limit / 16
        run.refresh_after = time.time() + min(self.s.heartbeat_s * 2 ** (run.refresh_tries - 1),
                                              max(self.s.heartbeat_s, limit / 16))  # fmt: skip
        run.copies += 1
        copy = f"{run.attempt}.{run.copies}"
        if self.store.update_item(msg.job, msg.item, only_from=("running",), fence=Fence(attempt=run.attempt),
                                  copy=copy, message_id="", receipt="", receipt_at=None) is None:  # fmt: skip
            self._superseded(run)
            return
        (message_id,) = self.cloud.queues.send(run.queue, [replace(msg, copy=copy).body()])  # the same seq
        held_for = time.time() - run.held_since
        with self.lock:  # our intake may have received the copy meanwhile and adopted it (`_adopt`)
            if run.receipt == old:
                run.receipt = ""  # the copy's handle is on its way: extend, delete, hide nothing meanwhile
            run.message = replace(run.message, copy=copy)
            run.refresh_tries, run.copy_sent_at, run.receive_backs = 0, time.time(), 0
        try:
            recorded = self._record_copy_id(replace(msg, copy=copy), run.attempt, message_id)
        except Exception as err:  # noqa: BLE001 - the copy's name is recorded: whoever receives it records its id
            log.warning("%s/%s: could not record its fresh copy's id (%s); the node that receives it does",
                        msg.job, msg.item, _first_line(err))  # fmt: skip
            recorded = True
        if recorded is None:  # a newer attempt holds the item (and maybe the old message): leave it be
            self._superseded(run)
            return
        # A failed delete only brings the old message back after its visibility: a claim drops it
        # (a running item's message that is not its recorded one).
        self._step("delete a replaced message", self._delete, run.queue, [old], "replaced")
        log.info("%s/%s: replaced its message with a fresh copy after holding it %.0fs (a held message is replaced "
                 "halfway to the queue's hold limit, %.0fs, long before it could expire)", msg.job, msg.item, held_for,
                 limit)  # fmt: skip
        # Received back at once, it waits for no other node to hand it over, nor counts as an item
        # waiting meanwhile (scaler).
        self._step("receive back its fresh copy", self._receive_back, run)

    def _receive_back(self, run: Run) -> None:
        """One receive of one message: the copy, adopted (`claim.Adopt`); another running item's
        goes to its holder, and any other message is made visible again at once (`release`), not
        sent again as a copy, which would reset its receive count (the evidence of a lost node)."""
        run.receive_backs += 1
        for delivery in self.cloud.queues.receive(run.queue, 1, 1):
            self._accept(run.queue, self.env.queues[run.queue], delivery, taking=False)

    def _superseded(self, run: Run) -> None:
        if self._feed(run, StopAsked(Stop.SUPERSEDED, time.monotonic())):
            log.warning("%s/%s attempt %d: the item is final or held by a newer attempt; stopped this one",
                        run.message.job, run.message.item, run.attempt)

    def _stop_cancelled(self, runs: list[Run]) -> None:
        now = time.monotonic()
        for run in runs:
            # Read the job only for a run not yet asked to stop: a stopped one needs no reason more.
            if run.state.stop is None and self._cancelled(run.message.job) and \
                    self._feed(run, StopAsked(Stop.CANCEL, now)):  # fmt: skip
                log.info("%s/%s: job cancelled, stopping it", run.message.job, run.message.item)
            self._feed(run, Tick(now))

    def _protect(self, busy: bool) -> None:
        if busy == self.protected:
            return
        # Recorded before the call: a node outside any group (a laptop) would otherwise warn
        # every heartbeat; the scaler never removes a busy node by its heartbeat anyway.
        self.protected = busy
        self.node.protect(self.pool_name, self.s.node_id, busy)
