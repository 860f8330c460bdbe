"""The job store in Firestore: the GCP adapter of the `JobStore` port (`tidefleet.ports`).

Documents in the environment's database (naming.table):
  pools/<pool>/nodes/<node_id>      a node's heartbeat (`Heartbeat` fields): `FirestoreNodes`,
                                    all the scaler needs
  jobs/<job_id>                     a job (`Job` fields)           } `FirestoreStore`, for the
  jobs/<job_id>/items/<item_id>     an item (`Item` fields)        } agent and the SDK
  jobs/<job_id>/sent/<chunk>        a submit chunk recorded and sent: n (its item count)
  watched/<job_id>                  a job the minute watch looks after (tidefleet.schedules)

Node heartbeats follow the DynamoDB rules: `draining` is sticky (a heartbeat never writes it as
False, so a mark set by anyone survives), and a mark written before a node's first heartbeat is
not a heartbeat (`node_rows` lists it apart, so the tick can forget it). Uses the GAPIC client
over REST (the high-level client is gRPC only), so the tests drive the real client through a
faked HTTP transport.
"""

from __future__ import annotations

import random
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict
from functools import reduce

from google.api_core import exceptions as gexc
from google.cloud.firestore_v1.services.firestore import FirestoreClient
from google.cloud.firestore_v1.types import (
    ArrayValue,
    Document,
    DocumentMask,
    DocumentTransform,
    MapValue,
    Precondition,
    StructuredQuery,
    Value,
    Write,
)

from tidefleet import naming
from tidefleet.cloud.gcp.calls import RETRY, RETRY_REFUSED, TRY_S
from tidefleet.config import Environment
from tidefleet.policy.model import item_seconds_mean
from tidefleet.records import (
    FINAL,
    SCALER_OWNED,
    STATS_RETRIES,
    AttemptStamps,
    Fence,
    Heartbeat,
    Item,
    ItemWrite,
    Job,
    QueueStats,
    WaitingMark,
    ends_attempt,
    leave_answer,
    settled_moves,
    waiting_mark_fields,
    waiting_mark_of,
    write_chunks,
)

PAGE = 300
WRITE_BATCH = 500  # batchWrite's limit
GET_BATCH = 300  # documents per batchGet
RETRIES = 8  # rounds of throttled writes before giving up; backoff doubles from BACKOFF_S
BACKOFF_S = 0.05
# google.rpc.Code of a write in a batchWrite: worth trying again, already there (a create's precondition).
RETRYABLE = {4, 8, 10, 13, 14}  # DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, ABORTED, INTERNAL, UNAVAILABLE
ALREADY_EXISTS = 6
COMMIT_WRITES = 200  # item writes per commit (Firestore takes 500 writes in one, job counters included)
WRITE_RACES = 20  # read-check-write rounds before giving up on a document others keep changing


class GaveUp(gexc.GoogleAPICallError):
    """A write Firestore kept refusing for a passing reason through every retry (throttled, or
    another writer changing the document between each read and write): a Google API call error, so
    that every caller treats it as any refused call (the cloud's `errors`, `explain`). The agent
    logs one line and tries again later, as after any refused call; it is no bug, nor the item's."""

    def __str__(self) -> str:
        return self.message  # no HTTP status: each call answered, the retries ran out


def _planned_write(doc: Document, current: dict, only_from: tuple[str, ...] | None, never_from: tuple[str, ...],
                   fence: Fence | None, add: dict | None, append: dict | None, values: dict) -> tuple[Write, dict] | None:
    """The commit write of one conditional item update (`update_item`'s arguments) against the
    document as read, preconditioned on its update time, and the item as it will be; None when
    the condition fails on what was read."""
    status = current.get("status")
    if (only_from and status not in only_from) or (status is not None and status in never_from):
        return None
    if fence is not None and not fence.admits(current):
        return None
    new = {**current, **{k: v for k, v in values.items() if v is not None}}
    for k in (k for k, v in values.items() if v is None):
        new.pop(k, None)
    for k, n in (add or {}).items():
        new[k] = (new.get(k) or 0) + n
    for k, entry in (append or {}).items():
        new[k] = [*(new.get(k) or []), entry]
    # A path in the mask but not in the fields is deleted: what a None value asks for.
    changed = [*values, *(add or {}), *(append or {})]
    write = Write(update=Document(name=doc.name, fields=_fields({k: new.get(k) for k in changed})),
                  update_mask=DocumentMask(field_paths=changed),
                  current_document=Precondition(update_time=doc.update_time))  # fmt: skip
    return write, new


def lost_race(err: gexc.GoogleAPICallError) -> bool:
    """A write whose precondition failed: the document changed (or appeared) since we read it.
    Over REST that is 409 (ALREADY_EXISTS, ABORTED) or a 400 whose status is FAILED_PRECONDITION
    (other 400s are real errors)."""
    if isinstance(err, (gexc.Conflict, gexc.FailedPrecondition)):
        return True
    try:
        return err.response.json()["error"]["status"] == "FAILED_PRECONDITION"
    except (AttributeError, ValueError, KeyError, TypeError):
        return False


def to_value(value) -> Value:
    if value is None:
        return Value(null_value=0)
    if isinstance(value, dict):
        return Value(map_value=MapValue(fields={k: to_value(v) for k, v in value.items()}))
    if isinstance(value, (list, tuple)):
        return Value(array_value=ArrayValue(values=[to_value(v) for v in value]))
    if isinstance(value, bool):
        return Value(boolean_value=value)
    if isinstance(value, int):
        return Value(integer_value=value)
    if isinstance(value, float):
        return Value(double_value=value)
    return Value(string_value=str(value))


def from_value(value: Value):
    kind = Value.pb(value).WhichOneof("value_type")
    if kind == "array_value":
        return [from_value(v) for v in value.array_value.values]
    if kind == "map_value":
        return {k: from_value(v) for k, v in value.map_value.fields.items()}
    return None if kind in (None, "null_value") else getattr(value, kind)


def _fields(record: dict) -> dict[str, Value]:
    return {k: to_value(v) for k, v in record.items() if v is not None}


class FirestoreNodes:
    """NodeStatePort (heartbeats and marks) plus what the agent writes."""

    def __init__(self, env: Environment, *, client: FirestoreClient | None = None, credentials=None):
        self.client = client or FirestoreClient(transport="rest", credentials=credentials)
        self.root = f"projects/{env.project}/databases/{naming.table(env.name)}/documents"
        self.database = self.root.removesuffix("/documents")

    def _doc(self, pool: str, node_id: str) -> str:
        return f"{self.root}/pools/{pool}/nodes/{node_id}"

    def _get_document(self, name: str) -> Document:
        return self.client.get_document(request={"name": name}, retry=RETRY, timeout=TRY_S)

    def _list(self, parent: str, collection: str):
        """The collection's documents, in pages (each page a call of its own)."""
        return self.client.list_documents(request={"parent": parent, "collection_id": collection, "page_size": PAGE},
                                          retry=RETRY, timeout=TRY_S)  # fmt: skip

    def put_heartbeat(self, hb: Heartbeat) -> None:
        skip = ("node_id", "pool", *SCALER_OWNED)
        fields = {k: v for k, v in asdict(hb).items() if k not in skip and v is not None}
        mask = [k for k in Heartbeat.__dataclass_fields__ if k not in skip]
        if not hb.draining:  # sticky: never written as False
            fields.pop("draining")
            mask.remove("draining")
        # idle_since in the mask but not in the fields: Firestore deletes it (busy again).
        self.client.update_document(
            document=Document(name=self._doc(hb.pool, hb.node_id), fields={k: to_value(v) for k, v in fields.items()}),
            update_mask=DocumentMask(field_paths=mask), retry=RETRY, timeout=TRY_S,
        )

    def _heartbeat(self, pool: str, doc: Document) -> Heartbeat | None:
        values = {k: from_value(v) for k, v in doc.fields.items() if k in Heartbeat.__dataclass_fields__}
        if "at" not in values:  # only a mark so far
            return None
        values.setdefault("idle_since", None)
        return Heartbeat(node_id=doc.name.rsplit("/", 1)[-1], pool=pool, **values)

    def heartbeats(self, pool: str) -> dict[str, Heartbeat]:
        return self.node_rows(pool)[0]

    def node_rows(self, pool: str) -> tuple[dict[str, Heartbeat], frozenset[str]]:
        """As `DynamoStore.node_rows`, from the one listing of the pool's node documents: a
        document without `at` holds only a mark (draining, cordon, preempt) of a node that has
        not reported yet."""
        beats: dict[str, Heartbeat] = {}
        marked: set[str] = set()
        for doc in self._list(f"{self.root}/pools/{pool}", "nodes"):
            hb = self._heartbeat(pool, doc)
            if hb is None:
                marked.add(doc.name.rsplit("/", 1)[-1])
            else:
                beats[hb.node_id] = hb
        return beats, frozenset(marked)

    def heartbeat(self, pool: str, node_id: str) -> Heartbeat | None:
        try:
            return self._heartbeat(pool, self._get_document(self._doc(pool, node_id)))
        except gexc.NotFound:
            return None

    def mark_draining(self, pool: str, node_id: str) -> None:
        """Idempotent: the node takes no new items; the scaler stops counting it as capacity."""
        self.client.update_document(
            document=Document(name=self._doc(pool, node_id), fields={"draining": to_value(True)}),
            update_mask=DocumentMask(field_paths=["draining"]), retry=RETRY, timeout=TRY_S,
        )

    def let_idle_go(self, pool: str, node_id: str, idle_since: float) -> bool:
        """As `DynamoStore.let_idle_go`: the read's update time is the write's precondition."""
        return self._node_if(pool, node_id, {"draining": True}, lambda v: v.get("idle_since") == idle_since
                             and (v.get("claimed_at") is None or v["claimed_at"] <= idle_since))  # fmt: skip

    def claim_work(self, pool: str, node_id: str, at: float) -> bool:
        """As `DynamoStore.claim_work`; a node with no document yet gets one holding only the claim.
        False only where the document says draining. The write is conditioned on the document's
        update time (Firestore has no condition on a field), so any write in between (the node's
        own heartbeat, a cordon, a preempt) makes it lose and read again; a claim that loses every
        round raises `GaveUp` (a refused call: the agent hands the item back and stays), never
        False, which the agent reads as the scaler letting the node go."""
        return self._node_if(pool, node_id, {"claimed_at": float(at)}, lambda v: not v.get("draining"),
                             rounds=WRITE_RACES, give_up=True)  # fmt: skip

    def _node_if(self, pool: str, node_id: str, fields: dict, check, *, rounds: int = STATS_RETRIES,
                 give_up: bool = False) -> bool:  # fmt: skip
        """Write `fields` to the node's document if `check(its values)` holds when written (the
        values are {} where there is no document); False if not. A write that lost a race with
        another writer (a heartbeat) reads again, `rounds` times; then False (the check's
        failure), or with `give_up` a `GaveUp`."""
        name = self._doc(pool, node_id)
        for _ in range(rounds):
            try:
                doc = self._get_document(name)
                values, precondition = {k: from_value(v) for k, v in doc.fields.items()}, Precondition(update_time=doc.update_time)
            except gexc.NotFound:
                values, precondition = {}, Precondition(exists=False)
            if not check(values):
                return False
            try:
                self.client.update_document(request={
                    "document": Document(name=name, fields=_fields(fields)),
                    "update_mask": DocumentMask(field_paths=list(fields)), "current_document": precondition,
                }, retry=RETRY_REFUSED, timeout=TRY_S)  # fmt: skip
                return True
            except gexc.GoogleAPICallError as err:
                if not lost_race(err):
                    raise
        if give_up:
            raise GaveUp(f"node {pool}/{node_id}: its record still changing after {rounds} attempts; try again")
        return False  # the node's heartbeats kept winning: the scaler keeps it

    def set_cordon(self, pool: str, node_id: str, cordoned: bool) -> None:
        """As `DynamoStore.set_cordon`: one field, so the agent's heartbeats never touch it."""
        self.client.update_document(
            document=Document(name=self._doc(pool, node_id), fields={"cordoned": to_value(cordoned)}),
            update_mask=DocumentMask(field_paths=["cordoned"]), retry=RETRY, timeout=TRY_S,
        )

    def set_preempt(self, pool: str, node_id: str, keys: list[str]) -> None:
        self.client.update_document(
            document=Document(name=self._doc(pool, node_id), fields={"preempt": to_value(list(keys))}),
            update_mask=DocumentMask(field_paths=["preempt"]), retry=RETRY, timeout=TRY_S,
        )

    def forget_node(self, pool: str, node_id: str) -> None:
        self.client.delete_document(request={"name": self._doc(pool, node_id)}, retry=RETRY, timeout=TRY_S)

    def grant_leave(self, pool: str, units: int, at: float, until: float, stay: int = 0) -> None:
        """As `DynamoStore.grant_leave`."""
        fields = _fields({"units": int(units), "at": float(at), "until": float(until), "stay": int(stay)})
        self.client.update_document(request={"document": Document(name=f"{self.root}/leave/{pool}", fields=fields)},
                                    retry=RETRY, timeout=TRY_S)  # fmt: skip

    def take_leave(self, pool: str, units: int, idle_since: float, now: float, cordoned: bool = False) -> bool:
        """As `DynamoStore.take_leave`: the read's update time is the write's precondition."""
        name = f"{self.root}/leave/{pool}"
        for _ in range(STATS_RETRIES):
            try:
                doc = self._get_document(name)
            except gexc.NotFound:
                return False
            values = {k: from_value(v) for k, v in doc.fields.items()}
            stay = int(values.get("stay", 0))
            answer = leave_answer(values["units"], stay, values["at"], values["until"], units, idle_since, now, cordoned)
            if answer is None:
                return False
            field, left = ("stay", stay) if answer == "stay" else ("units", int(values["units"]))
            try:
                self.client.update_document(request={
                    "document": Document(name=name, fields=_fields({field: left - units})),
                    "update_mask": DocumentMask(field_paths=[field]),
                    "current_document": Precondition(update_time=doc.update_time),
                }, retry=RETRY_REFUSED, timeout=TRY_S)  # fmt: skip
                return answer == "leave"
            except gexc.GoogleAPICallError as err:
                if not lost_race(err):
                    raise
        return False  # other nodes kept winning: this one stays idle, the next tick decides


class FirestoreStore(FirestoreNodes):
    """The `JobStore` port: jobs, items with conditional transitions, heartbeats.

    DynamoDB's condition expressions become read, check, then write with the read's update
    time as precondition, retried when another writer got there in between: so `succeeded`
    still can never be written twice, and counters and histories never lose an update."""

    def __init__(self, env: Environment, *, client: FirestoreClient | None = None, credentials=None):
        super().__init__(env, client=client, credentials=credentials)
        self.stamps = AttemptStamps()

    def _job_doc(self, job_id: str) -> str:
        return f"{self.root}/jobs/{job_id}"

    def _item_doc(self, job_id: str, item_id: str) -> str:
        return f"{self.root}/jobs/{job_id}/items/{item_id}"

    def _get(self, name: str) -> Document | None:
        try:
            return self._get_document(name)
        except gexc.NotFound:
            return None

    def _create(self, name: str, record: dict) -> bool:
        """False if the document already exists (left untouched)."""
        try:
            self.client.update_document(request={"document": Document(name=name, fields=_fields(record)),
                                                 "current_document": Precondition(exists=False)},
                                        retry=RETRY_REFUSED, timeout=TRY_S)  # fmt: skip
            return True
        except gexc.GoogleAPICallError as err:
            if not lost_race(err):
                raise
            return False

    def _set(self, name: str, values: dict) -> None:
        """Set fields of an existing document; NotFound if there is none (as DynamoDB's condition)."""
        self.client.update_document(request={"document": Document(name=name, fields=_fields(values)),
                                             "update_mask": DocumentMask(field_paths=list(values)),
                                             "current_document": Precondition(exists=True)},
                                    retry=RETRY, timeout=TRY_S)  # fmt: skip

    @staticmethod
    def _values(doc: Document) -> dict:
        return {k: from_value(v) for k, v in doc.fields.items()}

    # -- jobs -------------------------------------------------------------------------------
    def put_job(self, job: Job) -> Job:
        """Create the job unless it exists; returns the stored job either way (idempotent submit)."""
        return job if self._create(self._job_doc(job.job_id), asdict(job)) else self.job(job.job_id)

    def job(self, job_id: str) -> Job | None:
        doc = self._get(self._job_doc(job_id))
        return None if doc is None else self._job(doc)

    def _job(self, doc: Document) -> Job:
        return Job(**{k: v for k, v in self._values(doc).items() if k in Job.__dataclass_fields__})

    def jobs(self, queue: str | None = None, since: float = 0.0) -> list[Job]:
        """Every job (of one queue, created at `since` or later), oldest first: the jobs collection
        (jobs only: items are a subcollection), listed in pages, or with `since` a query on
        `created_at`, which Firestore's automatic single-field index serves (a month of a year's
        jobs reads that month's). The queue is filtered here: with the range, it would need a
        composite index to deploy."""
        if since > 0:
            docs = self._query(self.root, "jobs", "created_at", StructuredQuery.FieldFilter.Operator.GREATER_THAN_OR_EQUAL,
                               float(since))  # fmt: skip
        else:
            docs = self._list(self.root, "jobs")
        jobs = [self._job(doc) for doc in docs]
        return sorted((j for j in jobs if (queue is None or j.queue == queue) and j.created_at >= since),
                      key=lambda j: (j.created_at, j.job_id))  # fmt: skip

    def set_job_total(self, job_id: str, total: int) -> None:
        self._set(self._job_doc(job_id), {"total": total})

    def cancel_job(self, job_id: str, reason: str = "") -> None:
        self._set(self._job_doc(job_id), {"cancelled": True, "cancel_reason": reason})

    def end_wait(self, job_id: str) -> None:
        self._set(self._job_doc(job_id), {"waiting": False})

    def watch(self, job_id: str) -> None:
        self.client.update_document(request={"document": Document(name=f"{self.root}/watched/{job_id}",
                                                                  fields=_fields({"job_id": job_id}))},
                                    retry=RETRY, timeout=TRY_S)  # fmt: skip

    def unwatch(self, job_id: str) -> None:
        self.client.delete_document(request={"name": f"{self.root}/watched/{job_id}"}, retry=RETRY, timeout=TRY_S)

    def watched(self) -> list[str]:
        pages = self._list(self.root, "watched")
        return [doc.name.rsplit("/", 1)[-1] for doc in pages]

    # -- items ------------------------------------------------------------------------------
    @staticmethod
    def _item(job_id: str, item_id: str, values: dict) -> Item:
        known = {k: v for k, v in values.items() if k in Item.__dataclass_fields__}
        return Item(**{**known, "job_id": job_id, "item_id": item_id})

    def put_item_if_new(self, item: Item) -> bool:
        """False if an item with this id already exists in the job (left untouched)."""
        return self._create(self._item_doc(item.job_id, item.item_id), asdict(item))

    def create_items(self, items: list[Item], *, unseen: bool = False) -> list[str]:
        """batchWrite, 500 creates a call, each with the precondition "does not exist": the
        conditional batch write DynamoDB lacks, so `unseen` changes nothing here. batchWrite is
        not atomic: each write has its own status; throttled ones are retried with backoff."""
        created: list[str] = []
        database = self.database
        for start in range(0, len(items), WRITE_BATCH):
            pending = items[start : start + WRITE_BATCH]
            for attempt in range(RETRIES + 1):
                writes = [Write(update=Document(name=self._item_doc(i.job_id, i.item_id), fields=_fields(asdict(i))),
                                current_document=Precondition(exists=False)) for i in pending]  # fmt: skip
                statuses = self.client.batch_write(request={"database": database, "writes": writes},
                                                   retry=RETRY_REFUSED, timeout=TRY_S).status  # fmt: skip
                retry = []
                for item, status in zip(pending, statuses, strict=True):
                    if status.code == 0:
                        created.append(item.item_id)
                    elif status.code in RETRYABLE:
                        retry.append(item)
                    elif status.code != ALREADY_EXISTS:
                        raise gexc.from_grpc_status(status.code, f"Firestore refused item {item.job_id}/{item.item_id}: "
                                                    f"{status.message}")  # as a refused call of that code
                if not retry:
                    break
                if attempt == RETRIES:
                    raise GaveUp(f"Firestore left {len(retry)} item(s) unwritten after {RETRIES} retries "
                                 "(throttled); run the same submit again to continue")
                pending = retry
                time.sleep(random.uniform(0, BACKOFF_S * 2**attempt))  # full jitter
        return created

    def items_by_id(self, job_id: str, item_ids: list[str]) -> dict[str, Item]:
        out: dict[str, Item] = {}
        database = self.database
        for start in range(0, len(item_ids), GET_BATCH):
            names = [self._item_doc(job_id, i) for i in item_ids[start : start + GET_BATCH]]
            for got in self.client.batch_get_documents(request={"database": database, "documents": names},
                                                       retry=RETRY, timeout=TRY_S):  # fmt: skip
                if got.found.name:
                    item_id = got.found.name.rsplit("/", 1)[-1]
                    out[item_id] = self._item(job_id, item_id, self._values(got.found))
        return out

    def mark_sent(self, job_id: str, chunk: int, count: int) -> None:
        name = f"{self._job_doc(job_id)}/sent/{chunk:08d}"
        self.client.update_document(request={"document": Document(name=name, fields=_fields({"n": count}))},
                                    retry=RETRY, timeout=TRY_S)  # fmt: skip

    def sent_chunks(self, job_id: str) -> dict[int, int]:
        pages = self._list(self._job_doc(job_id), "sent")
        return {int(doc.name.rsplit("/", 1)[-1]): self._values(doc)["n"] for doc in pages}

    def end_submit(self, job_id: str, total: int) -> None:
        self._set(self._job_doc(job_id), {"total": total, "submitting": False})

    def claim_resume(self, job_id: str, at: float, stale_before: float) -> bool:
        """As `DynamoStore.claim_resume`: the read's update time is the write's precondition."""
        return self._job_if(job_id, {"resumed_at": float(at)},
                            lambda v: v.get("submitting") and (v.get("resumed_at") or 0.0) < stale_before)

    def release_resume(self, job_id: str, at: float) -> None:
        self._job_if(job_id, {"resumed_at": 0.0}, lambda v: v.get("resumed_at") == at)

    def _job_if(self, job_id: str, fields: dict, check) -> bool:
        """Write `fields` to the job's document if it exists and `check(its values)` holds when
        written; False if not. A write that lost a race with another writer (an agent counting a
        settled item on the job) reads again."""
        name = self._job_doc(job_id)
        for _ in range(WRITE_RACES):
            doc = self._get(name)
            if doc is None or not check(self._values(doc)):
                return False
            try:
                self.client.update_document(request={
                    "document": Document(name=name, fields=_fields(fields)),
                    "update_mask": DocumentMask(field_paths=list(fields)),
                    "current_document": Precondition(update_time=doc.update_time),
                }, retry=RETRY_REFUSED, timeout=TRY_S)  # fmt: skip
                return True
            except gexc.GoogleAPICallError as err:
                if not lost_race(err):
                    raise
        raise GaveUp(f"job {job_id}: its record still changing after {WRITE_RACES} attempts; try again")

    def item(self, job_id: str, item_id: str) -> Item | None:
        doc = self._get(self._item_doc(job_id, item_id))
        return None if doc is None else self._item(job_id, item_id, self._values(doc))

    def items(self, job_id: str) -> list[Item]:
        """Every item of a job, in item-id order (paginated listing)."""
        pages = self._list(self._job_doc(job_id), "items")
        items = [self._item(job_id, doc.name.rsplit("/", 1)[-1], self._values(doc)) for doc in pages]
        return sorted(items, key=lambda i: i.item_id)

    def failed_items(self, job_id: str) -> list[Item] | None:
        """As `DynamoStore.failed_items`: a query of the job's items whose status is failed
        (Firestore indexes each field by itself: there is no index to deploy)."""
        found = self._query(self._job_doc(job_id), "items", "status", StructuredQuery.FieldFilter.Operator.EQUAL, "failed")
        items = [self._item(job_id, doc.name.rsplit("/", 1)[-1], self._values(doc)) for doc in found]
        return sorted(items, key=lambda i: i.item_id)

    def _query(self, parent: str, collection: str, field: str, op: StructuredQuery.FieldFilter.Operator,
               value) -> list[Document]:  # fmt: skip
        """The documents of `parent`'s collection whose field passes one filter (runQuery)."""
        where = StructuredQuery.Filter(field_filter=StructuredQuery.FieldFilter(
            field=StructuredQuery.FieldReference(field_path=field), op=op, value=to_value(value)))  # fmt: skip
        query = StructuredQuery(from_=[StructuredQuery.CollectionSelector(collection_id=collection)], where=where)
        found = self.client.run_query(request={"parent": parent, "structured_query": query}, retry=RETRY, timeout=TRY_S)
        return [got.document for got in found if got.document.name]  # a bare read time: no document

    def record_part(self, job_id: str, item_id: str, entry: dict) -> None:
        """As `DynamoStore.record_part`: a document of the job's `parts` (':' is in no item id)."""
        name = f"{self._job_doc(job_id)}/parts/{item_id}:{entry['attempt']}:{entry['node']}"
        self._stamp(job_id, time.time())
        self.client.update_document(document=Document(name=name, fields=_fields({"item": item_id, "entry": entry})),
                                    retry=RETRY, timeout=TRY_S)  # fmt: skip

    def parts(self, job_id: str) -> dict[str, list[dict]]:
        out: dict[str, list[dict]] = {}
        for doc in self._list(self._job_doc(job_id), "parts"):
            values = self._values(doc)
            out.setdefault(values["item"], []).append(values["entry"])
        return out

    # -- queue statistics ---------------------------------------------------------------------
    def _stats_doc(self, queue: str) -> str:
        return f"{self.root}/queues/{queue}"

    def record_item_seconds(self, queue: str, *seconds: float) -> None:
        """As `DynamoStore.record_item_seconds`: the read's update time is the write's precondition."""
        name = self._stats_doc(queue)
        for _ in range(STATS_RETRIES):
            doc = self._get(name)
            current = self._values(doc) if doc is not None else {}
            new = {
                "mean_item_s": float(reduce(item_seconds_mean, seconds, current.get("mean_item_s"))),
                "items": current.get("items", 0) + len(seconds),
            }
            precondition = Precondition(update_time=doc.update_time) if doc is not None else Precondition(exists=False)
            try:
                self.client.update_document(request={
                    "document": Document(name=name, fields=_fields(new)),
                    "update_mask": DocumentMask(field_paths=list(new)), "current_document": precondition,
                }, retry=RETRY_REFUSED, timeout=TRY_S)  # fmt: skip
                return
            except gexc.GoogleAPICallError as err:
                if not lost_race(err):
                    raise

    def queue_stats(self, queues: list[str]) -> dict[str, QueueStats]:
        """As `DynamoStore.queue_stats`."""
        out = {}
        for queue in queues:
            doc = self._get(self._stats_doc(queue))
            if doc is not None:
                values = self._values(doc)
                out[queue] = QueueStats(mean_item_s=float(values["mean_item_s"]), items=int(values["items"]))
        return out

    def waiting_marks(self, queues: list[str]) -> dict[str, WaitingMark]:
        """As `DynamoStore.waiting_marks`."""
        return {q: waiting_mark_of(values) for q, values in self._queue_marks("waiting", queues).items()}

    def mark_waiting(self, queue: str, mark: WaitingMark | None) -> None:
        """As `DynamoStore.mark_waiting`."""
        self._mark_queue("waiting", queue, waiting_mark_fields(mark) if mark else None)

    def held_since(self, queues: list[str]) -> dict[str, float]:
        """As `DynamoStore.held_since`."""
        return {q: float(values["since"]) for q, values in self._queue_marks("held", queues).items()}

    def mark_held(self, queue: str, since: float | None) -> None:
        """As `DynamoStore.mark_held`."""
        self._mark_queue("held", queue, None if since is None else {"since": float(since)})

    def _queue_marks(self, mark: str, queues: list[str]) -> dict[str, dict]:
        out = {}
        for queue in queues:
            doc = self._get(f"{self.root}/{mark}/{queue}")
            if doc is not None:
                out[queue] = self._values(doc)
        return out

    def _mark_queue(self, mark: str, queue: str, values: dict | None) -> None:
        name = f"{self.root}/{mark}/{queue}"
        if values is None:
            self.client.delete_document(request={"name": name}, retry=RETRY, timeout=TRY_S)
        else:
            self.client.update_document(request={"document": Document(name=name, fields=_fields(values))},
                                        retry=RETRY, timeout=TRY_S)  # fmt: skip

    def update_item(
        self,
        job_id: str,
        item_id: str,
        *,
        only_from: tuple[str, ...] | None = None,
        never_from: tuple[str, ...] = FINAL,
        fence: Fence | None = None,
        add: dict[str, int] | None = None,
        append: dict[str, dict] | None = None,
        **values,
    ) -> Item | None:
        """As `DynamoStore.update_item`: set `values` (None deletes), add `add` to counters and one
        entry per `append` list, only if the status is in `only_from` (when given) and not in
        `never_from`, and `fence` admits it (when given); never creates an item. Returns the new item, or None when
        the condition failed. A write that settles the item (or takes it out of a final status)
        also counts it on its job (`settled_moves`): one commit of both, which moves the job's
        `last_attempt_at` too if the write ends an attempt (`ends_attempt`). Another write that
        ends one moves it first, as `DynamoStore.update_item` does."""
        moves = settled_moves(values.get("status"), only_from, never_from)
        name = self._item_doc(job_id, item_id)
        values["updated_at"] = time.time()
        attempt_at = values["updated_at"] if ends_attempt(append) else None
        if attempt_at is not None and not moves:
            self._stamp(job_id, attempt_at)
        for _ in range(WRITE_RACES):
            doc = self._get(name)
            planned = doc and _planned_write(doc, self._values(doc), only_from, never_from, fence, add, append, values)
            if not planned:
                return None
            write, new = planned
            try:
                if moves:
                    self.client.commit(request={"database": self.database, "writes": [
                        write, self._job_write(job_id, moves, attempt_at)]}, retry=RETRY_REFUSED, timeout=TRY_S)  # fmt: skip
                else:
                    self.client.update_document(request={"document": write.update, "update_mask": write.update_mask,
                                                         "current_document": write.current_document},
                                                retry=RETRY_REFUSED, timeout=TRY_S)  # fmt: skip
            except gexc.GoogleAPICallError as err:
                if not lost_race(err):
                    raise
                continue
            return self._item(job_id, item_id, new)
        raise GaveUp(f"item {job_id}/{item_id}: still changing after {WRITE_RACES} attempts; try again")

    def update_items(self, writes: Sequence[ItemWrite]) -> list[bool]:
        """As `JobStore.update_items`: per chunk one batchGet, each write's condition checked on
        what it read, then one commit of the writes that pass (each preconditioned on its
        document's update time) and their jobs' counts. A commit that lost a race (a document
        changed since the read) is done again write by write (`update_item`)."""
        landed = [False] * len(writes)
        for chunk in write_chunks(writes, COMMIT_WRITES):
            names = [self._item_doc(writes[i].job_id, writes[i].item_id) for i in chunk]
            read = {got.found.name: got.found for got in self.client.batch_get_documents(
                request={"database": self.database, "documents": names}, retry=RETRY, timeout=TRY_S)
                if got.found.name}  # fmt: skip
            planned, counts, stamps = [], defaultdict(lambda: defaultdict(int)), {}
            for i, name in zip(chunk, names):
                w, doc = writes[i], read.get(name)
                values = {**w.values, "updated_at": time.time()}
                write = doc and _planned_write(doc, self._values(doc), w.only_from, w.never_from, w.fence, w.add,
                                               w.append, values)  # fmt: skip
                if write:
                    planned.append((i, write[0]))
                    for k, n in settled_moves(values.get("status"), w.only_from, w.never_from).items():
                        counts[w.job_id][k] += n
                    if ends_attempt(w.append):
                        stamps[w.job_id] = values["updated_at"]
            if not planned:
                continue
            jobs = [self._job_write(job_id, counts.get(job_id, {}), stamps.get(job_id))
                    for job_id in {**counts, **stamps} if any(counts.get(job_id, {}).values()) or job_id in stamps]  # fmt: skip
            try:
                self.client.commit(request={"database": self.database, "writes": [w for _, w in planned] + jobs},
                                   retry=RETRY_REFUSED, timeout=TRY_S)  # fmt: skip
            except gexc.GoogleAPICallError as err:
                if not lost_race(err):
                    raise
                for i, _ in planned:
                    landed[i] = self.update_item(writes[i].job_id, writes[i].item_id, **writes[i].kwargs()) is not None
                continue
            for i, _ in planned:
                landed[i] = True
        return landed

    def _job_write(self, job_id: str, moves: dict[str, int], attempt_at: float | None) -> Write:
        """The job's part of a commit of its items' writes, if the job exists: its counters moved by
        those that settle, and `last_attempt_at` raised to `attempt_at` where one ends an attempt."""
        transforms = [DocumentTransform.FieldTransform(field_path=k, increment=Value(integer_value=n))
                      for k, n in moves.items()]  # fmt: skip
        if attempt_at is not None:
            transforms.append(DocumentTransform.FieldTransform(field_path="last_attempt_at",
                                                               maximum=Value(double_value=attempt_at)))  # fmt: skip
        job = DocumentTransform(document=self._job_doc(job_id), field_transforms=transforms)
        return Write(transform=job, current_document=Precondition(exists=True))

    def _stamp(self, job_id: str, at: float) -> None:
        """The job's `last_attempt_at` raised to `at`, if the job exists, unless this client did so
        lately (`AttemptStamps`)."""
        if not self.stamps.due(job_id, at):
            return
        try:
            self.client.commit(request={"database": self.database, "writes": [self._job_write(job_id, {}, at)]},
                               retry=RETRY_REFUSED, timeout=TRY_S)  # fmt: skip
        except gexc.NotFound:  # the job is gone: nothing to stamp
            pass
        self.stamps.wrote(job_id, at)
