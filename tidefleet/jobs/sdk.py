"""The job SDK: submit a job's items, follow its progress, cancel it, read its logs, send
its dead-lettered items back, and list the nodes working on it.

A job is a name, a queue and a list of items; each item is a list of string arguments
appended to the pool's command. Submitting is idempotent: the job id derives from the name
(unless given) and item ids from positions (unless given), records are conditional puts, and
only items not yet sent are sent, so running the same submit twice creates nothing twice.

The message of an item carries its failure and interruption counts (`ItemMessage`): the
agent re-sends a message to retry or hand back an item, so the queue's delivery count (and
its redrive / dead-letter policy) only ever sees lost nodes, never polite interruptions.
`Cloud` is the environment's queues, store and logs: SQS, DynamoDB and CloudWatch Logs on
AWS; Pub/Sub, Firestore and Cloud Logging on GCP. The kick is an asynchronous invoke of the
scaler on AWS and a message on the scaler's trigger topic (naming.kick_topic) on GCP.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import boto3

from tidefleet import naming
from tidefleet.cloud.work import CloudWatchItemLogs, SqsWorkQueues
from tidefleet.config import Environment
from tidefleet.store import Item, Job, Store

SEND_BATCH = 10  # items sent between store updates (one SQS batch)


class JobError(Exception):
    """A user mistake or a missing resource; the message says what to do."""


# What a message may carry: ids become log stream names and paths on the node.
MESSAGE_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:-]{0,199}")


@dataclass(frozen=True)
class ItemMessage:
    job: str
    item: str
    args: list[str]
    failures: int = 0
    interruptions: int = 0
    lost: int = 0  # attempts whose node died holding the item (see NODE_LOSSES_TOLERATED)
    seq: int = 0  # each re-send (retry, hand-back) carries seq + 1: a stale duplicate is known by it

    def body(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def parse(cls, body: str) -> ItemMessage:
        """The message, or ValueError saying what is wrong with it (a poison message)."""
        try:
            data = json.loads(body)
        except ValueError:
            raise ValueError(f"not JSON: {body[:200]!r}") from None
        if not isinstance(data, dict) or not {"job", "item", "args"} <= data.keys():
            raise ValueError(f"not a tidefleet item message: {body[:200]!r}")
        for key in ("job", "item"):
            if not isinstance(data[key], str) or not MESSAGE_ID.fullmatch(data[key]) or ".." in data[key]:
                raise ValueError(f"{key}: not a valid id ({data[key]!r})")
        args = data["args"]
        if not isinstance(args, list) or not all(isinstance(a, str) and "\0" not in a for a in args):
            raise ValueError(f"args: must be a list of strings without NUL bytes (got {str(args)[:200]})")
        counters = {k: data[k] for k in ("failures", "interruptions", "lost", "seq") if k in data}
        for key, value in counters.items():
            if type(value) is not int or value < 0:
                raise ValueError(f"{key}: must be a whole number >= 0 (got {value!r})")
        return cls(data["job"], data["item"], list(args), **counters)


@dataclass(frozen=True)
class ItemSpec:
    item_id: str
    args: list[str]


# -- reading items ------------------------------------------------------------------------
def _spec(position: int, value, where: str) -> ItemSpec:
    """One item from a URI string, a list of args, or {"id": ..., "args": [...] | "..."}."""
    default_id = f"{position:06d}"
    if isinstance(value, str):
        return ItemSpec(default_id, [value])
    if isinstance(value, list) and all(isinstance(a, str) for a in value):
        return ItemSpec(default_id, list(value))
    if isinstance(value, dict) and set(value) <= {"id", "args"} and "args" in value:
        item_id = str(value.get("id", default_id))
        if not re.fullmatch(r"[A-Za-z0-9_.:-]{1,200}", item_id):
            raise JobError(f"{where}: item id {item_id!r} may use only letters, digits and _ . : - (1-200 chars)")
        return replace(_spec(position, value["args"], where), item_id=item_id)
    raise JobError(
        f"{where}: not an item (got {value!r}); use a URI string, a list of string args, "
        'or {"id": "...", "args": [...]}'
    )


def read_items(source: Iterable | str | Path | io.TextIOBase) -> list[ItemSpec]:
    """Items from a Python list, a file path ('-' = stdin) or an open text stream.

    Files: one item per line; a line starting with '{', '[' or '"' is JSON, any other line
    is a URI (one argument). Blank lines and lines starting with '#' are skipped."""
    if isinstance(source, (str, Path)):
        if str(source) == "-":
            return read_items(sys.stdin)
        path = Path(source)
        if not path.is_file():
            raise JobError(f"items: no such file {str(path)!r}; give a file of URIs or JSON lines, or '-' for stdin")
        with path.open() as stream:
            return _unique(_lines(stream, str(path)))
    if isinstance(source, io.TextIOBase) or hasattr(source, "readline"):
        return _unique(_lines(source, "stdin"))
    return _unique([_spec(i, v, f"items[{i}]") for i, v in enumerate(source)])


def _lines(stream, name: str) -> list[ItemSpec]:
    out: list[ItemSpec] = []
    for number, line in enumerate(stream, start=1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        value = text
        if text[0] in '{["':
            try:
                value = json.loads(text)
            except json.JSONDecodeError as err:
                raise JobError(f"{name}:{number}: not valid JSON ({err.msg}); fix the line or give a plain URI") from None
        out.append(_spec(len(out), value, f"{name}:{number}"))
    return out


def _unique(specs: list[ItemSpec]) -> list[ItemSpec]:
    seen = Counter(s.item_id for s in specs)
    dup = [i for i, n in seen.items() if n > 1]
    if dup:
        raise JobError(f"items: duplicate item id(s) {', '.join(sorted(dup)[:5])}; give each item its own id")
    if not specs:
        raise JobError("items: none given; a job needs at least one item")
    return specs


def job_id_for(name: str) -> str:
    """Deterministic and readable: the slug of the name plus a short hash of the exact name."""
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:40] or "job"
    return f"{slug}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"


# -- cloud access -------------------------------------------------------------------------
class Cloud:
    """The environment's work queues, job store and item logs: SQS, DynamoDB and CloudWatch
    Logs on AWS (endpoint from AWS_ENDPOINT_URL when set); Pub/Sub, Firestore and Cloud
    Logging on GCP (credentials from google.auth.default)."""

    def __init__(self, env: Environment):
        self.env = env
        if env.cloud == "gcp":
            from tidefleet.cloud.firestore import FirestoreStore
            from tidefleet.cloud.gcp_work import CloudLoggingItemLogs, PubSubWorkQueues

            self.queues, self.store, self.logs = PubSubWorkQueues(env), FirestoreStore(env), CloudLoggingItemLogs(env)
        else:
            self.queues, self.store, self.logs = SqsWorkQueues(env), Store(env.name, env.region), CloudWatchItemLogs(env)

    def send(self, queue: str, messages: list[ItemMessage], *, dead_letter: bool = False) -> None:
        self.queues.send(queue, [m.body() for m in messages], dead_letter=dead_letter)


# -- submit -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Submitted:
    job_id: str
    new_items: int  # recorded by this call
    sent: int  # sent by this call (new ones plus any a crashed earlier submit left unsent)
    total: int
    kick: str  # how the scaler was told, or why it was not


def submit(
    env: Environment, name: str, queue: str, items: list[ItemSpec], *, job_id: str | None = None, kick: bool = True,
    progress: Callable[[int], None] | None = None,
) -> Submitted:
    """Record the job and its items, send them, kick the scaler. Idempotent: submitting the same
    job and items again creates and sends nothing twice. `progress(n)` is told as items go out."""
    if queue not in env.queues:
        known = ", ".join(sorted(env.queues))
        raise JobError(f"queue: unknown queue {queue!r} in environment {env.name!r}; known queues: {known}")
    job_id = job_id or job_id_for(name)
    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,100}", job_id):
        raise JobError(f"job id: {job_id!r} may use only letters, digits and _ . - (1-100 chars)")
    cloud = Cloud(env)
    stored = cloud.store.put_job(Job(job_id, name, queue, time.time(), len(items)))
    if stored.queue != queue:
        raise JobError(f"job {job_id!r} already exists on queue {stored.queue!r}; use another name or --job-id")
    if stored.cancelled:
        raise JobError(f"job {job_id!r} was cancelled; submit under another name or --job-id")
    existing = {i.item_id: i for i in cloud.store.items(job_id)}
    new_ids = {s.item_id for s in items if s.item_id not in existing}
    # "pending" = recorded but maybe not sent: a submit that crashed between the two is
    # completed by the next one, so no item is ever recorded and never queued.
    unsent = [s for s in items if s.item_id in new_ids or existing[s.item_id].status == "pending"]
    recorded, how = 0, "not needed"
    for start in range(0, len(unsent), SEND_BATCH):
        batch = unsent[start : start + SEND_BATCH]
        recorded += sum(
            cloud.store.put_item_if_new(Item(job_id, s.item_id, s.args, status="pending"))
            for s in batch
            if s.item_id in new_ids
        )
        cloud.send(queue, [ItemMessage(job_id, s.item_id, s.args) for s in batch])
        for s in batch:  # an agent may already have started it: only pending becomes queued
            cloud.store.update_item(job_id, s.item_id, only_from=("pending",), status="queued")
        if kick and start == 0:  # work is waiting now: nodes boot while the rest is sent
            how = kick_scaler(env, f"submit {job_id}")
        if progress:
            progress(len(batch))
    total = len(existing) + recorded
    if total != stored.total:
        cloud.store.set_job_total(job_id, total)
    return Submitted(job_id, recorded, len(unsent), total, how)


def kick_scaler(env: Environment, reason: str) -> str:
    """Tell the scaler there is work now. Never raises: the schedule picks it up within a tick."""
    payload = json.dumps({"tidefleet": "kick", "env": env.name, "reason": reason}).encode()
    url = os.environ.get("TIDEFLEET_KICK_URL")
    try:
        if url:
            request = urllib.request.Request(url, data=payload, headers={"Content-Type": "application/json"})
            urllib.request.urlopen(request, timeout=5).close()
            return f"kicked {url}"
        if env.cloud == "gcp":  # the scaler function's trigger topic
            from tidefleet.cloud.gcp_work import publish

            publish(env, naming.kick_topic(env.name), [payload])
            return f"kicked {naming.kick_topic(env.name)}"
        boto3.client("lambda", region_name=env.region).invoke(
            FunctionName=naming.function(env.name, "scaler"), InvocationType="Event", Payload=payload
        )
        return f"kicked {naming.function(env.name, 'scaler')}"
    except Exception as err:  # noqa: BLE001 - any failure here only delays scaling by a tick
        return f"warning: could not kick the scaler ({err}); the schedule picks the job up within {env.scaler.tick_s}s"


# -- progress -----------------------------------------------------------------------------
STATES = ("succeeded", "running", "queued", "failed", "cancelled")


@dataclass(frozen=True)
class JobStatus:
    job: Job
    counts: dict[str, int]  # every state in STATES, pending counted as queued
    items: list[Item]

    @property
    def done(self) -> bool:
        return self.counts["running"] == 0 and self.counts["queued"] == 0


def status(env: Environment, job_id: str) -> JobStatus:
    store = Cloud(env).store
    job = store.job(job_id)
    if job is None:
        raise JobError(f"job {job_id!r} not found in environment {env.name!r}; check the id printed by submit")
    items = store.items(job_id)
    counts = Counter("queued" if i.status == "pending" else i.status for i in items)
    return JobStatus(job, {s: counts.get(s, 0) for s in STATES}, items)


def cancel(env: Environment, job_id: str) -> int:
    """Flag the job (agents stop its running items) and cancel its waiting items; returns how many."""
    store = Cloud(env).store
    if store.job(job_id) is None:
        raise JobError(f"job {job_id!r} not found in environment {env.name!r}; nothing to cancel")
    store.cancel_job(job_id)
    waiting = [i for i in store.items(job_id) if i.status in ("pending", "queued")]
    return sum(
        store.update_item(job_id, i.item_id, only_from=("pending", "queued"), status="cancelled", reason="cancelled")
        is not None
        for i in waiting
    )


def retry_failed(env: Environment, job_id: str) -> int:
    """Move this job's messages from the dead-letter queue back to its queue with a fresh retry budget."""
    cloud = Cloud(env)
    job = cloud.store.job(job_id)
    if job is None:
        raise JobError(f"job {job_id!r} not found in environment {env.name!r}")
    others: list[str] = []  # other jobs' messages: hidden while we scan, released at the end
    moved = 0
    try:
        while True:
            got = cloud.queues.receive(job.queue, SEND_BATCH, 0, dead_letter=True, hold_s=120)
            if not got:
                return moved
            mine = []
            for m in got:
                try:
                    msg = ItemMessage.parse(m.body)
                except ValueError:
                    others.append(m.handle)
                    continue
                if msg.job == job_id:
                    mine.append((msg, m.handle))
                else:
                    others.append(m.handle)
            if mine:
                # Store first: an agent drops a message whose item is still final, so the item
                # must be queued again before its message can be received.
                for msg, _ in mine:
                    cloud.store.update_item(
                        job_id, msg.item, never_from=("succeeded", "cancelled"), status="queued", failures=0, reason=""
                    )
                cloud.send(job.queue, [replace(msg, failures=0) for msg, _ in mine])
                cloud.queues.delete(job.queue, [r for _, r in mine], dead_letter=True)
                moved += len(mine)
    finally:
        if others:
            cloud.queues.release(job.queue, others, dead_letter=True)


def log_lines(env: Environment, job_id: str, item_id: str | None = None) -> Iterator[tuple[str, str]]:
    """(stream, line) for every attempt of the job's items (or one item), oldest first per stream."""
    return Cloud(env).logs.lines(job_id, item_id)


# -- nodes --------------------------------------------------------------------------------
@dataclass(frozen=True)
class NodeRow:
    pool: str
    node_id: str
    instance_type: str
    spot: bool
    busy_slots: int
    slots: int
    gpus: int
    draining: bool
    heartbeat_age_s: float


@dataclass(frozen=True)
class PoolRow:
    pool: str
    desired: int | None  # None: the group was not found
    instances: int | None
    nodes: list[NodeRow]


def _group_sizes(env: Environment) -> dict[str, tuple[int, int]]:
    """(desired capacity units, instances) of each pool whose group exists."""
    if env.cloud == "gcp":  # a pool is a Spot and an on-demand managed instance group
        from tidefleet.cloud.gcp import MigFleet

        return {p: (g.desired, len(g.instances)) for p, g in MigFleet(env).groups(list(env.pools), since=0).items()}
    autoscaling = boto3.client("autoscaling", region_name=env.region)
    names = {naming.group(env.name, p): p for p in env.pools}
    found = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=list(names))["AutoScalingGroups"]
    return {names[g["AutoScalingGroupName"]]: (g["DesiredCapacity"], len(g["Instances"])) for g in found}


def nodes(env: Environment, now: float | None = None) -> list[PoolRow]:
    """Per pool: the group's desired size and instances, and each node's last heartbeat."""
    now = time.time() if now is None else now
    store = Cloud(env).store
    sizes = _group_sizes(env)
    out = []
    for pool in env.pools:
        desired, instances = sizes.get(pool, (None, None))
        rows = [
            NodeRow(pool, hb.node_id, hb.instance_type, hb.spot, hb.busy_slots, hb.slots, hb.gpus, hb.draining, now - hb.at)
            for hb in sorted(store.heartbeats(pool).values(), key=lambda h: h.node_id)
        ]
        out.append(PoolRow(pool, desired, instances, rows))
    return out
