"""The ports: what the core needs from a cloud, as small protocols, and the plain data they carry.

The core (control tick, policy, agent, job SDK, simulator) talks only to these. Each cloud's
adapters live in its package, `tidefleet.cloud.aws` (boto3: SQS, DynamoDB, Auto Scaling,
CloudWatch Logs, instance metadata) and `tidefleet.cloud.gcp` (Pub/Sub, Firestore, managed
instance groups, Cloud Logging, the GCE metadata server); `tidefleet.cloud.memory` is the
in-memory one the simulator and tests use. `tidefleet.cloud.for_env(env)` picks one, once:
nothing else branches on the cloud. No SDK import here.

Ports of the control tick: `QueuePort` (backlog), `FleetPort` (groups), `NodeStatePort`
(heartbeats), `QueueStatsPort`. Ports of the agent and the SDK: `WorkQueues` (messages),
`JobStore` (jobs, items, heartbeats), `ItemLogs`, `NodeHost` (the node's metadata and group).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from tidefleet.records import (
    FINAL,
    AttemptOutcome,
    Fence,
    Heartbeat,
    Item,
    ItemWrite,
    Job,
    QueueStats,
    WaitingMark,
)

if TYPE_CHECKING:
    from pathlib import Path



@dataclass(frozen=True, slots=True)
class Backlog:
    visible: int  # waiting items
    in_flight: int  # received by an agent, not yet deleted
    oldest_age_s: float | None = None  # the oldest waiting item's age; None = the cloud did not say
    # True: `visible` also counts messages agents hold (received, not yet deleted), as Pub/Sub's
    # num_undelivered_messages does, and `in_flight` is 0; the control tick moves the count the
    # agents' heartbeats say they hold (`Heartbeat.leased`) from visible to in_flight.
    counts_leased: bool = False
    # When the cloud counted them (epoch s); None = now. Cloud Monitoring's count of a Pub/Sub
    # subscription trails by one to three minutes: the control tick trusts an idle node's newer word.
    as_of: float | None = None


@dataclass(frozen=True, slots=True)
class GroupInstance:
    id: str
    instance_type: str
    lifecycle_state: str  # the group's word: Pending, InService, Terminating:Wait, ...
    spot: bool
    launched_at: float | None  # epoch seconds; None if EC2 does not list it yet (eventual consistency)
    protected: bool  # scale-in protection (set by a busy agent)
    weight: int | None = None  # the group's weighted capacity, when it reports one


@dataclass(frozen=True, slots=True)
class GroupState:
    name: str
    desired: int  # capacity units
    min: int
    max: int
    on_demand_base: int
    instances: tuple[GroupInstance, ...]
    spot_failures: tuple[float, ...] = ()  # start times of recent failed spot launches


class QueuePort(Protocol):
    def backlog(self, queue: str) -> Backlog:
        """Current backlog of a configured queue (the config name, not the cloud name)."""


class FleetPort(Protocol):
    def groups(self, pools: list[str], since: float) -> dict[str, GroupState]:
        """The group of each pool that exists, by pool; spot failures started at or after `since`."""

    def set_desired(self, pool: str, desired: int) -> None: ...

    def terminate(self, pool: str, instance_ids: tuple[str, ...]) -> tuple[str, ...]:
        """Terminate these instances WITH a decrement of desired capacity, so the group never
        launches a replacement nor picks a victim of its own. Instances already gone or no
        longer in service are skipped, not an error. Returns the ids actually terminated."""

    def set_on_demand_base(self, pool: str, units: int) -> None: ...

    def group_of(self, instance_id: str) -> str | None:
        """The name of the group the instance belongs to, or None."""

    def complete_lifecycle_action(self, pool: str, instance_id: str, hook: str, token: str | None) -> bool | None:
        """Let a node held by the terminate lifecycle hook go now (result CONTINUE), by its action's
        token or, without one, by its instance. True: released now; False: no action was active
        (completed already, by an earlier delivery of the same event or by the node's own agent,
        or the node is gone), which is the goal too, not an error. None from an adapter whose
        groups have no hooks (GCE): nothing ever holds a node there."""


class NodeStatePort(Protocol):
    def heartbeats(self, pool: str) -> dict[str, Heartbeat]:
        """Every heartbeat of a pool, by node id: `node_rows(pool)[0]`."""

    def node_rows(self, pool: str) -> tuple[dict[str, Heartbeat], frozenset[str]]:
        """(every heartbeat of a pool by node id, the nodes the store holds only a mark of), in one
        read. A mark (draining, cordon, preempt) set before a node's first heartbeat is kept for
        it but is no heartbeat; a node that never reports writes no heartbeat that could age out,
        so the control tick forgets such a row (`forget_node`) once its node left the group."""

    def mark_draining(self, pool: str, node_id: str) -> None: ...

    def let_idle_go(self, pool: str, node_id: str, idle_since: float) -> bool:
        """Before the scaler terminates an idle node: mark it draining if its record still says
        idle since `idle_since` (the heartbeat the tick decided on) and it claimed no work since
        (`JobStore.claim_work`; a claim at its idle time itself does not keep it). True: marked,
        and the node's agent can claim nothing more. False: it took work in between (or went busy
        and idle again): keep it. One conditional write: of a scaler letting a node go and the
        node taking an item, exactly one wins."""

    def set_cordon(self, pool: str, node_id: str, cordoned: bool) -> None:
        """Stop (True) or resume (False) the node's intake; its agent reads the mark back with its
        next heartbeat. A later heartbeat never clears it; a node never heard from gets the mark
        waiting for its first heartbeat."""

    def set_preempt(self, pool: str, node_id: str, keys: list[str]) -> None:
        """The attempts (job/item/attempt) the node's agent must stop and hand back (preemption);
        replaces the node's previous list. Like the cordon mark, a heartbeat never clears it."""

    def forget_node(self, pool: str, node_id: str) -> None: ...

    def grant_leave(self, pool: str, units: int, at: float, until: float, stay: int = 0) -> None:
        """Let nodes of the pool that go idle after `at` (the tick's time) leave on their own, up
        to `units` units in all, until `until` (the next tick replaces the grant; 0 withdraws it),
        once the first `stay` units of them stayed (`records.leave_answer`)."""


class QueueStatsPort(Protocol):
    def queue_stats(self, queues: list[str]) -> dict[str, QueueStats]:
        """Recorded statistics of these queues (mean item run time), by name; absent if none yet."""

    def waiting_marks(self, queues: list[str]) -> dict[str, WaitingMark]:
        """Each queue's backlog as the scaler last marked it (`mark_waiting`); absent: none."""

    def mark_waiting(self, queue: str, mark: WaitingMark | None) -> None:
        """Record the queue's backlog by when each part was first seen, and the items started by
        then (None: it emptied; the mark goes)."""

    def held_since(self, queues: list[str]) -> dict[str, float]:
        """Since when the scaler holds each queue (`mark_held`); absent: not held. Agents read it too."""

    def mark_held(self, queue: str, since: float | None) -> None:
        """Hold the queue (its team is at its share: agents take no new items) or, with None, release it."""


@dataclass(frozen=True)
class Ports:
    queues: QueuePort
    fleet: FleetPort
    nodes: NodeStatePort
    stats: QueueStatsPort | None = None  # None: mean item times unknown, the policy counts slots only
    # Observe calls the tick may have in flight at once: a remote cloud answers many queues and
    # pools faster side by side (1k queues, one call each); in memory, 1 (no threads at all).
    calls_in_flight: int = 1


# -- the agent's and the SDK's ports ------------------------------------------------------
@dataclass(frozen=True)
class Delivery:
    handle: str  # what extend / delete / release take: SQS receipt handle, Pub/Sub ack id
    body: str
    deliveries: int  # times this message has been delivered, this one included (1 = first)
    message_id: str = ""  # the queue's id of the message: the same on every delivery of it


class WorkQueues(Protocol):
    """A queue is named by its config name; `dead_letter=True` means its dead-letter queue (SQS)
    or dead-letter subscription (Pub/Sub). A body is opaque text: what it means (`ItemMessage`)
    is the SDK's business, not the port's."""

    # How long the agent may hold one message before it replaces it with a fresh copy
    # (`Agent._refresh`, at half of it); None: as long as it likes. SQS: 12 h, the most a handle
    # keeps its message hidden after the receive that gave it. Pub/Sub: 2 days, well inside the 7
    # days a subscription keeps a message after its publish (leased or not), since it may have
    # waited before its receive.
    max_hold_s: int | None

    def lease_s(self, queue: str) -> int:
        """How long a received message stays hidden from others (visibility / ack deadline)."""

    def receive(self, queue: str, max_messages: int, wait_s: int, *, dead_letter: bool = False,
                hold_s: int | None = None) -> list[Delivery]:  # fmt: skip
        """Up to max_messages, waiting up to wait_s for the first; hold_s overrides the lease."""

    def extend(self, queue: str, handles: list[str], seconds: int) -> dict[str, str]:
        """Keep these messages hidden `seconds` more; returns the error of each handle that failed."""

    def delete(self, queue: str, handles: list[str], *, dead_letter: bool = False) -> list[str]:
        """Done with them (SQS delete / Pub/Sub ack); returns the error of each that failed."""

    def send(self, queue: str, bodies: list[str], *, dead_letter: bool = False) -> list[str]:
        """The sent messages' ids, in order; raises if any body was refused: nothing is silently dropped."""

    def release(self, queue: str, handles: list[str], *, dead_letter: bool = False) -> None:
        """Visible to everyone again now (SQS visibility 0 / Pub/Sub nack). Counts as a delivery."""

    def counts(self, queue: str, *, dead_letter: bool = False) -> Backlog | None:
        """Its messages now, visible and hidden (received, not yet deleted), where the queue can say
        at once (SQS); None where it cannot (Pub/Sub: only Cloud Monitoring, minutes late)."""


class LogStream(Protocol):
    def write(self, line: str, *, cut_before: bool = False) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


class ItemLogs(Protocol):
    def stream(self, queue: str, job: str, item: str, attempt: int) -> LogStream:
        """A writer for one attempt's output (`tidefleet.logstream.BufferedStream`)."""

    def lines(self, queue: str, job: str, item: str | None = None) -> Iterator[tuple[str, str]]:
        """(stream, line) for every attempt of the job's items (or one item), oldest first per stream;
        `queue` is the job's (a node may write only its own queues' logs)."""

    def record_outcomes(self, queue: str, outcomes: list[AttemptOutcome]) -> None:
        """Finished attempts of one queue, oldest first, in one write: the cloud's outcome metric."""


class JobStore(NodeStatePort, QueueStatsPort, Protocol):
    """Jobs, items, node heartbeats and queue statistics of one environment. Every write of an
    item is conditional: the store never creates an item record by updating it, never moves
    one out of a final status (`FINAL`), and applies a `Fence` exactly as `Fence.admits` says.
    `tests/contracts/` holds the contract every adapter of each port passes."""

    def put_heartbeat(self, hb: Heartbeat) -> None: ...

    def heartbeat(self, pool: str, node_id: str) -> Heartbeat | None: ...

    def claim_work(self, pool: str, node_id: str, at: float) -> bool:
        """Before an idle node whose idle time the store may show (a heartbeat wrote it) starts
        work: note that it took work at `at`, unless the node is marked draining (the scaler let it
        go, `NodeStatePort.let_idle_go`, or a spot notice came): False then, and it must start
        nothing. One conditional write."""

    def take_leave(self, pool: str, units: int, idle_since: float, now: float, cordoned: bool = False) -> bool:
        """Take `units` from the pool's leave grant for a node idle since `idle_since`: if the
        grant came before then, has not lapsed at `now`, has no units left to stay (those are
        taken first: the node stays, False) and still holds them (conditional writes: two nodes
        never take the same units). False if not. See `records.leave_answer`."""

    def record_item_seconds(self, queue: str, *seconds: float) -> None:
        """Fold succeeded items' run times, in order, into the queue's mean (one write for all)."""

    def put_job(self, job: Job) -> Job:
        """Create the job unless it exists; returns the stored job either way (idempotent submit)."""

    def job(self, job_id: str) -> Job | None: ...

    def jobs(self, queue: str | None = None, since: float = 0.0) -> list[Job]:
        """Every job (of one queue, created at `since` or later), oldest first."""

    def set_job_total(self, job_id: str, total: int) -> None: ...

    def cancel_job(self, job_id: str, reason: str = "") -> None: ...

    def end_wait(self, job_id: str) -> None:
        """The job's held messages are all sent: clear `waiting`."""

    def watch(self, job_id: str) -> None:
        """Add the job to the few the minute watch looks after (tidefleet.schedules.watch)."""

    def unwatch(self, job_id: str) -> None: ...

    def watched(self) -> list[str]:
        """The watched jobs' ids: one small read, never a scan of every job."""

    def put_item_if_new(self, item: Item) -> bool:
        """False if an item with this id already exists in the job (left untouched)."""

    def create_items(self, items: list[Item], *, unseen: bool = False) -> list[str]:
        """Record each item that does not exist yet, in the store's batch writes (retrying what
        it throttles); returns the ids created. `unseen`: the caller knows none exists (a chunk
        of a job created by this submit), so a store without conditional batch writes may write
        them unconditionally (DynamoDB BatchWriteItem); otherwise it must check each."""

    def items_by_id(self, job_id: str, item_ids: list[str]) -> dict[str, Item]:
        """Those of these items that exist, by id (batched reads)."""

    def mark_sent(self, job_id: str, chunk: int, count: int) -> None:
        """Submit chunk `chunk` (`count` items) is recorded and its messages were accepted."""

    def sent_chunks(self, job_id: str) -> dict[int, int]:
        """Every chunk marked sent, with its item count."""

    def end_submit(self, job_id: str, total: int) -> None:
        """Every item is recorded and sent: set the job's total and clear `submitting`."""

    def claim_resume(self, job_id: str, at: float, stale_before: float) -> bool:
        """Before a continuation of the job's stopped submit (`jobs.scheduled.resume`): set its
        `resumed_at` to `at` if the job exists, is still `submitting` and its `resumed_at` is before
        `stale_before` (no other continuation may still be going). False if not: nothing written.
        One conditional write, so of two continuations racing one wins."""

    def release_resume(self, job_id: str, at: float) -> None:
        """A continuation that claimed at `at` ended without finishing (an error): clear its claim
        (`resumed_at` 0), unless another continuation claimed since."""

    def item(self, job_id: str, item_id: str) -> Item | None: ...

    def items(self, job_id: str) -> list[Item]:
        """Every item of a job, in item-id order."""

    def failed_items(self, job_id: str) -> list[Item] | None:
        """The job's items whose status is failed, in item-id order, without reading the others;
        None where the store cannot tell them apart yet (a DynamoDB table deployed before its
        failed-items index). May miss an item that failed a moment ago, or one that failed before
        the store kept them apart: check the count against the job's `n_failed`."""

    def record_part(self, job_id: str, item_id: str, entry: dict) -> None:
        """A gang member's part of an attempt (`entry`: its `attempt`, `node`, run time, usage and
        placement), kept beside the item, not on it: a gang of up to 1000 nodes, interrupted again
        and again, would outgrow the item's record (DynamoDB: 400 KB) and stop its claims. Written
        again for the same attempt and node, it replaces the first."""

    def parts(self, job_id: str) -> dict[str, list[dict]]:
        """The job's gang members' parts, by item id."""

    def update_item(self, job_id: str, item_id: str, *, only_from: tuple[str, ...] | None = None,
                    never_from: tuple[str, ...] = FINAL, fence: Fence | None = None,
                    add: dict[str, int] | None = None, append: dict[str, dict] | None = None,
                    **values) -> Item | None:  # fmt: skip
        """Set `values`, add `add` to counters and append one entry per `append` list, only if the
        item exists, its status is in `only_from` (when given) and not in `never_from`, and `fence`
        admits it. Returns the new item, or None when the condition failed."""

    def update_items(self, writes: Sequence[ItemWrite]) -> list[bool]:
        """`update_item` for each write, in as few calls as the store allows (the agent records
        finished items a flush at a time): per write, whether it landed. A write whose condition
        fails lands nowhere and keeps none of the others from landing; settling writes count on
        their jobs exactly as `update_item`'s do. Raises only when the store itself failed; then
        some writes may have landed (a settling write that did fails its condition if repeated)."""


@dataclass(frozen=True)
class Notice:
    """Why this node must stop taking work; `lifecycle` means the group is terminating it."""

    reason: str
    lifecycle: bool = False


class NodeMetadata(Protocol):
    def identity(self) -> tuple[str | None, str | None, bool]:
        """(instance id, instance type, spot); None where unknown (no metadata service)."""

    def notice(self) -> Notice | None:
        """A spot reclaim or a group's termination of this node, if one is under way."""

    def address(self) -> str | None:
        """The node's private IP, where the other nodes of a gang reach it; None where unknown."""


class NodeHost(Protocol):
    """What an agent needs from the cloud of the node it runs on."""

    grace_s: float  # from a stop notice to the machine's end: the workload's time to checkpoint
    # The longest an idle receive may wait: a stop (a notice, a SIGTERM) is acted on once the receive
    # in flight returns, so on a short notice a long poll eats the time to hand items back.
    longest_poll_s: int
    metadata: NodeMetadata

    def protect(self, pool: str, node_id: str, busy: bool) -> None:
        """Keep a busy node out of the group's scale-in (a no-op where groups never pick victims)."""

    def leave(self, pool: str, node_id: str) -> None:
        """Let the group's drain hook release this node now (a no-op where there is none). An
        action no longer active (the interruption function released the node first) is done, not
        an error; any other refusal raises."""

    def retire(self, pool: str, node_id: str) -> None:
        """Take this node out of its group for good, the group's size lowered with it (the
        agent's leave on the scaler's grant). Raises if the group refused."""

    def checkpoint_base(self) -> str:
        """The URI under which items' checkpoints live (the environment's artifacts bucket)."""


class Objects(Protocol):
    """An object store (S3, Cloud Storage): where workloads' checkpoints live."""

    def put(self, bucket: str, key: str, body: bytes) -> None: ...

    def get(self, bucket: str, key: str) -> bytes | None:
        """The object, or None if there is none."""


class Cloud(Protocol):
    """One environment's adapters, from `tidefleet.cloud.for_env(env)`."""

    name: str  # "aws" | "gcp"
    errors: tuple[type[BaseException], ...]  # what a call to this cloud may raise
    queues: WorkQueues
    store: JobStore
    logs: ItemLogs

    def control_ports(self) -> Ports:
        """The control tick's ports (backlog, fleet, heartbeats, statistics)."""

    def node_host(self) -> NodeHost: ...

    def group_members(self) -> dict[str, tuple[int, tuple[str, ...]]]:
        """(desired capacity units, the ids of its instances) of each pool whose group exists."""

    def kick(self, payload: bytes) -> str:
        """Tell the scaler function there is work; returns what was kicked. Raises on failure."""

    def upload(self, key: str, path: Path) -> str:
        """Put a file in the environment's artifacts bucket under `key`; returns its URI."""

    def artifacts_location(self) -> str:
        """The artifacts bucket's URI, once it is known to exist: publish asks before its slow build."""

    def identity(self) -> str:
        """Who is calling: the IAM ARN (STS GetCallerIdentity) or the Google account of the
        application default credentials. Raises one of `errors` when it cannot be read."""

    def explain(self, err: BaseException) -> str:
        """One line for a person: what went wrong with this cloud call and what to do."""
