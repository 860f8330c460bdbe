"""The records every runtime shares: jobs, items, node heartbeats, queue statistics.

Plain data: the job stores (`tidefleet.cloud.aws.dynamodb`, `tidefleet.cloud.gcp.firestore`)
store them, the control tick and the agent read them, the SDK shows them. No SDK import.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

STATS_RETRIES = 3  # a sample lost to this many concurrent writers is dropped: a statistic, not a record


@dataclass(frozen=True)
class QueueStats:
    mean_item_s: float  # exponentially weighted mean run time of succeeded items (policy.model)
    items: int  # succeeded items recorded


@dataclass(frozen=True)
class Heartbeat:
    node_id: str
    pool: str
    at: float  # when the agent wrote it
    slots: int
    busy_slots: int
    idle_since: float | None  # None while busy
    draining: bool = False
    instance_type: str = ""
    spot: bool = True
    gpus: int = 0
    # Items per second this agent took, per queue, as of `at` (`policy.model.rate_after`): the
    # scaler sums them into each queue's arrival rate, with no shared counter to contend on.
    intake: dict[str, float] = field(default_factory=dict)
    # Set and cleared by the scaler only (consolidation): the agent takes no new items while it
    # is set and finishes what it runs. The agent's own heartbeat never writes it.
    cordoned: bool = False
    running: dict[str, int] = field(default_factory=dict)  # attempts running now, by job id
    # A gang this node leads and that takes members (`tidefleet.agent.gang.Beacon`): free nodes of
    # the pool find it here and join it before they take new items. {} when none.
    gang: dict = field(default_factory=dict)
    # The attempts running on the node from preemptible queues: {"key": "job/item/attempt", "queue",
    # "since", "slots"}; and the keys of those the scaler preempts (it writes `preempt`, the agent
    # stops them and hands them back).
    runs: list[dict] = field(default_factory=list)
    preempt: list[str] = field(default_factory=list)
    # On a spot node: the items of queues with `on_demand_after_interruptions` it left for on-demand
    # capacity (interrupted that often), by queue, as job/item keys, while their records say queued.
    on_demand_wanted: dict[str, list[str]] = field(default_factory=dict)
    # Why this node takes no items, found by its agent at start (GPUs, docker, the item user); "" when it
    # can run them. The scaler holds the pool's launches after several in a row (`policy.faults`).
    fault: str = ""
    # When this machine booted (None: an agent from before it was written): the order nodes came
    # in, which a faulted agent's restarts (each rewriting `at`) do not change (`policy.faults`).
    booted_at: float | None = None
    # Messages this agent holds, by queue: received and not yet deleted (acked) or given back; a
    # gang item's one message is its lead's. Where the backlog counts them as waiting
    # (`Backlog.counts_leased`: Pub/Sub), the control tick moves them to in flight. {} when none.
    leased: dict[str, int] = field(default_factory=dict)


SCALER_OWNED = ("cordoned", "preempt")  # heartbeat fields only the scaler writes


# Item lifecycle: queued (recorded; sent once its submit chunk is marked sent) -> running -> one
# of FINAL. pending (recorded, not yet sent) is only left by submits of earlier versions.
# A retried or handed-back item goes running -> queued again.
FINAL = ("succeeded", "failed", "cancelled")
STATUSES = ("pending", "queued", "running", *FINAL)


def settled_moves(status: str | None, only_from: tuple[str, ...] | None, never_from: tuple[str, ...]) -> dict[str, int]:
    """What a conditional write of an item adds to its job's counters of settled items
    (`Job.n_succeeded`, ...): +1 to a final status entered, -1 to one left. The write's condition
    must pin down whether the item was final, and in which status, or the count would drift; a
    store applies the result in the same transaction as the write, so only a write that lands counts."""
    if status is None:
        return {}
    could_be = (set(only_from) if only_from else set(STATUSES)) - set(never_from)
    was_final = could_be & set(FINAL)
    if status in FINAL and not was_final:
        return {f"n_{status}": 1}
    if status not in FINAL and len(was_final) == 1 and was_final == could_be:
        return {f"n_{was_final.pop()}": -1}
    if status not in FINAL and not was_final:
        return {}
    raise ValueError(f"a write of status {status!r} from {sorted(could_be)} cannot be counted on its job: "
                     "give only_from / never_from that say whether the item was final, and in which status")


def ends_attempt(append: dict | None) -> bool:
    """Whether a write appends an attempt's end (its `history` entry): a store moves its job's
    `last_attempt_at` with it, so `tidefleet cost --since` knows which jobs it need not read."""
    return bool(append) and "history" in append


# A write of an attempt's end that moves no counter (a retry, a hand-back) stamps its job in a
# write of its own, at most this often per job and store client: a spot reclaim hands back every
# item of a node at once, and one job record takes them all (Firestore sustains ~1 write a
# second per document). `tidefleet cost` allows the stamp an hour (`costs.ATTEMPT_STAMP_SLACK_S`).
STAMP_EVERY_S = 60.0


class AttemptStamps:
    """A store client's own stamps of `Job.last_attempt_at` written in writes of their own."""

    def __init__(self) -> None:
        self.last: dict[str, float] = {}

    def due(self, job_id: str, at: float) -> bool:
        return at - self.last.get(job_id, float("-inf")) >= STAMP_EVERY_S

    def wrote(self, job_id: str, at: float) -> None:
        if len(self.last) >= 10_000:  # a long-lived agent's: forgetting one costs a write, never a stamp
            self.last.clear()
        self.last[job_id] = at


# A queue's waiting items by when the scaler first saw them: (seen at, items), oldest first.
Cohorts = tuple[tuple[float, int], ...]
LEGACY_COHORT = 1 << 40  # a mark from before cohorts: every waiting item counts as old as it


@dataclass(frozen=True)
class WaitingMark:
    """What the scaler keeps of a queue's backlog between ticks: its cohorts, and how many of the
    queue's items had started by then (`started`: in flight plus succeeded, `control.items_started`),
    from which the next tick knows how many waiting items left meanwhile, even where the count
    held. None in a mark from before it was kept."""

    cohorts: Cohorts
    started: int | None = None


def waiting_mark_of(record: dict) -> WaitingMark:
    """A stored waiting mark: `cohort_since` / `cohort_items` side by side (stores without nested
    lists keep them so), or a lone `since` (an older scaler's mark); `started` where kept."""
    started = int(record["started"]) if record.get("started") is not None else None
    if "cohort_since" in record:
        cohorts = tuple((float(t), int(n)) for t, n in zip(record["cohort_since"], record["cohort_items"], strict=True))
        return WaitingMark(cohorts, started)
    return WaitingMark(((float(record["since"]), LEGACY_COHORT),), started)


def waiting_mark_fields(mark: WaitingMark) -> dict:
    cohorts = mark.cohorts
    return {"since": float(cohorts[0][0]), "cohort_since": [float(t) for t, _ in cohorts],
            "cohort_items": [int(n) for _, n in cohorts],
            "started": None if mark.started is None else int(mark.started)}  # fmt: skip


def leave_answer(left: int, stay: int, at: float, until: float, units: int, idle_since: float, now: float,
                 cordoned: bool = False) -> str | None:
    """What a leave grant of `left` units whose first `stay` units stay, written by the tick at
    `at` and good until `until`, says to a node of `units` idle since `idle_since` at `now`:
    "stay" (it is one of the first to go idle: it stays, warm, for the next tick to judge; a
    cordoned node takes no items and never stays), "leave", or None (the grant is not for it). A
    node idle before the tick was judged by it (kept, or terminated): the grant is for nodes that
    go idle after. DynamoDB's `take_leave` states the same as condition expressions."""
    if not (at <= idle_since and now < until):
        return None
    if stay > 0 and not cordoned:
        return "stay"
    return "leave" if left >= units else None


LeaveGrant = tuple[int, float, float, int]  # (units left, written at, good until, units left to stay)


def take_from_grant(grant: LeaveGrant, units: int, idle_since: float, now: float,
                    cordoned: bool = False) -> tuple[LeaveGrant, bool]:  # fmt: skip
    """(the grant after a node of `units` idle since `idle_since` asked it at `now`, whether it
    leaves): `leave_answer` applied to a grant held as a value (the memory store, the simulator)."""
    left, at, until, stay = grant
    answer = leave_answer(left, stay, at, until, units, idle_since, now, cordoned)
    if answer == "stay":
        return (left, at, until, stay - units), False
    if answer == "leave":
        return (left - units, at, until, stay), True
    return grant, False


@dataclass(frozen=True)
class AttemptOutcome:
    """One finished attempt (succeeded / failed / cancelled), for the cloud's outcome metric."""

    job: str
    item: str
    attempt: int
    outcome: str
    seconds: float
    at: float  # when it ended (epoch s)


@dataclass(frozen=True)
class Fence:
    """What a write demands of the item's current record, beyond "exists and is not final".

    `attempt`: the record's attempt counter still equals this: only the attempt that holds the
    item records it (a stale node's late write loses). `claim_at`: a claim: the item is not
    running under a lease that lasts past this time. `seq`: the message's sequence number: the
    record's is not newer (a stale duplicate of an already re-sent message loses). `message`:
    (message id, copy name): the record still names that message as its attempt's (`names`), so
    a handle handed over for a message the holder has since replaced never lands."""

    attempt: int | None = None
    claim_at: float | None = None
    seq: int | None = None
    message: tuple[str, str] | None = None

    def admits(self, record: dict) -> bool:
        """The same rule as the DynamoDB condition, for stores that check in code."""
        if self.attempt is not None and (record.get("attempts") or 0) != self.attempt:
            return False
        if self.claim_at is not None and record.get("status") == "running" and (record.get("lease_until") or 0) > self.claim_at:
            return False
        if self.message is not None and not names(record.get("message_id") or "", record.get("copy") or "", *self.message):
            return False
        return self.seq is None or (record.get("seq") or 0) <= self.seq


def names(record_message_id: str, record_copy: str, message_id: str, copy: str) -> bool:
    """Whether an item's record (its `message_id`, `copy`) names a message (its queue id, its
    `ItemMessage.copy`) as its attempt's: the same copy name, and the same id, or none recorded
    yet (the holder records a fresh copy's name before it sends it, and its id after)."""
    if record_copy != copy:
        return False
    return (bool(message_id) and record_message_id == message_id) or (bool(copy) and not record_message_id)


@dataclass(frozen=True)
class ItemWrite:
    """One conditional write of `JobStore.update_item`, spelled out, for `JobStore.update_items`:
    the same arguments, the same condition, the same count on its job."""

    job_id: str
    item_id: str
    values: dict = field(default_factory=dict)
    only_from: tuple[str, ...] | None = None
    never_from: tuple[str, ...] = FINAL
    fence: Fence | None = None
    add: dict[str, int] | None = None
    append: dict[str, dict] | None = None

    def kwargs(self) -> dict:
        """`update_item`'s keyword arguments: `store.update_item(w.job_id, w.item_id, **w.kwargs())`."""
        return {"only_from": self.only_from, "never_from": self.never_from, "fence": self.fence, "add": self.add,
                "append": self.append, **self.values}  # fmt: skip


def write_chunks(writes: Sequence[ItemWrite], size: int) -> list[list[int]]:
    """Indices of `writes` in chunks of at most `size` (one store call each), an item written at
    most once per chunk (DynamoDB refuses two operations on one item in a transaction, and a
    Firestore commit checks each against one read): a repeat goes to a later chunk, so writes of
    one item land in order."""
    chunks: list[list[int]] = []
    last: dict[tuple[str, str], int] = {}  # item -> the chunk of its latest write
    for i, w in enumerate(writes):
        key = (w.job_id, w.item_id)
        at = next((c for c in range(last.get(key, -1) + 1, len(chunks)) if len(chunks[c]) < size), len(chunks))
        if at == len(chunks):
            chunks.append([])
        chunks[at].append(i)
        last[key] = at
    return chunks


@dataclass(frozen=True)
class Job:
    job_id: str
    name: str
    queue: str
    created_at: float
    total: int
    cancelled: bool = False
    items_digest: str = ""  # of the submitted item list (jobs.sdk.items_digest); "" on older jobs
    # Chunked submit (jobs.sdk.submit): items per chunk and chunks written at once; 0 on jobs
    # submitted item by item. `submitting` until every chunk is recorded and sent.
    chunk: int = 0
    window: int = 0
    submitting: bool = False
    spec: dict = field(default_factory=dict)  # the job's own image/command/env/limits (jobs.spec.JobSpec.record)
    # Who submitted (the cloud identity: an IAM ARN or a Google account; "os:NAME" when it could
    # not be read); "" on older jobs. `tidefleet cost --by user` sums by it.
    submitter: str = ""
    # Dependencies (jobs.sdk.submit `after`): items are recorded `pending` and sent only once
    # `after` has succeeded (or finished, with `after_finished`); `waiting` until then.
    after: str = ""
    after_finished: bool = False
    waiting: bool = False
    # A scheduled run (tidefleet.schedules): its schedule, and its whole-job deadline (0 = none).
    schedule: str = ""
    deadline: float = 0.0
    # When a continuation of its stopped submit last began (`JobStore.claim_resume`): one at a
    # time, as the SDK's submit is written for. 0: none yet (and on older records).
    resumed_at: float = 0.0
    cancel_reason: str = ""  # why it was cancelled when not by a user: "timed out: ..."
    # Items settled in each final status, kept by the store in the same transaction as the item's
    # write (`settled_moves`); `counted` is False on jobs submitted before these counters existed.
    counted: bool = False
    n_succeeded: int = 0
    n_failed: int = 0
    n_cancelled: int = 0
    # When the store last wrote the end of an attempt of its items (a history entry: `ends_attempt`)
    # or a gang member's part, by the writer's clock, with that write. None until then, and on
    # jobs whose attempts were recorded before it was kept: `tidefleet cost --since` reads those
    # whole, and skips a job whose last attempt ended well before its window.
    last_attempt_at: float | None = None


@dataclass(frozen=True)
class Item:
    job_id: str
    item_id: str
    args: list[str] = field(default_factory=list)
    status: str = "pending"
    attempts: int = 0  # attempts started (including interrupted ones)
    failures: int = 0  # failed attempts: these count toward the queue's max_retries
    # Attempts handed back on a spot notice / drain (what on_demand_after_interruptions counts),
    # never toward max_retries; a preemption or checkpoint-and-move is not one ("preempted" in history).
    interruptions: int = 0
    lost: int = 0  # attempts whose node died holding the item: their own, larger budget
    exit_code: int | None = None
    reason: str = ""
    node: str = ""
    cpu_s: float | None = None
    peak_rss_mb: float | None = None
    gpu_util_pct: float | None = None  # mean utilisation of its GPUs over its last attempt (agent.gpus)
    gpu_mem_peak_mb: float | None = None
    updated_at: float = 0.0
    seq: int = 0  # the newest message sent for this item (each retry or hand-back sends seq + 1)
    lease_until: float = 0.0  # while running: the holder renews it every heartbeat
    # The message the current attempt holds: its queue id, and its copy name (`ItemMessage.copy`;
    # "" for any message but a fresh copy). Set by the claim; the holder's refresh (`Agent._refresh`)
    # records its copy's name with no id before it sends it, and the id once sent (`names`).
    message_id: str = ""
    copy: str = ""
    # A handle to that message another node received while the attempt runs (`claim.HandOver`),
    # and when: its holder takes it at its next heartbeat if it holds none newer. Cleared by a
    # claim and by the holder's refresh; written only while the record still names the message.
    receipt: str = ""
    receipt_at: float = 0.0
    history: list[dict] = field(default_factory=list)  # one entry per finished attempt (gang members' parts: JobStore.parts)
    # A multi-node item's gang for the current attempt (`tidefleet.agent.gang`): its state
    # (forming, running, stopping, released), the nodes that joined in order (the lead first),
    # those that left, and why a member failed. Reset by every claim.
    gang: str = ""
    members: list[dict] = field(default_factory=list)
    left: list[dict] = field(default_factory=list)
    gang_failure: str = ""
