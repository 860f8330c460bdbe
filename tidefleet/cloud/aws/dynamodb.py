"""The job store on AWS: one DynamoDB table per environment holding jobs, items and node heartbeats.

Keys (pk, sk), all strings:
  JOB#<job_id>   JOB              the job: name, queue, created_at, total, cancelled
  JOB#<job_id>   ITEM#<item_id>   an item: status, attempts, interruptions, exit_code, reason, ...
  JOB#<job_id>   SENT#<chunk>     a submit chunk recorded and sent: n (its item count)
  POOL#<pool>    NODE#<node_id>   a node's heartbeat: see `Heartbeat`
  POOL#<pool>    LEAVE            the scaler's leave grant: units, at, until, stay (`grant_leave`)
  WATCH          JOB#<job_id>     a job the minute watch looks after (tidefleet.schedules)
  QUEUE#<queue>  STATS            mean_item_s (EWMA of succeeded items' run time), items (count)

The index `jobs` (`tidefleet.resources.JOBS_INDEX`: hash sk, range created_at, keys only) holds
the job records alone, as only they have a `created_at`: `jobs` lists them without a scan.

Node heartbeats are written by the agent and read by the scaler; `draining` is also set by
the interruption function, and by the scaler before it terminates an idle node (`let_idle_go`),
against the agent's `claimed_at` (`claim_work`): one conditional write on the one record each. Numbers go through Decimal because DynamoDB wants it.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, fields
from decimal import Decimal
from functools import reduce

import boto3
from botocore.exceptions import ClientError

from tidefleet import naming
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
    settled_moves,
    waiting_mark_fields,
    waiting_mark_of,
    write_chunks,
)
from tidefleet.resources import FAILED_INDEX, JOBS_INDEX, table_spec

log = logging.getLogger("tidefleet.store")

WRITE_BATCH = 25  # BatchWriteItem's limit
GET_BATCH = 100  # BatchGetItem's limit
RETRIES = 8  # rounds of unprocessed items (throttling) before giving up; backoff doubles from BACKOFF_S
BACKOFF_S = 0.05
TRANSACT_WRITES = 50  # item writes per TransactWriteItems: its limit is 100 actions, job counters included
TRANSACT_RETRIES = 4  # conflicts with other transactions (agents counting on one job) before giving up
# Items per Query page. DynamoDB ends a page at 1 MB (~2,000 items of a job), but the moto server
# behind the sandbox answers in ~2 ms an item (its response serializer): a 1 MB page of ~4,000
# small items took over 8 s, past the clients' read timeout (`READ_TIMEOUT_S`), so `tidefleet
# cancel` of a big job timed out. 500 keeps a page near a second there, for a few more calls on AWS.
QUERY_PAGE = 500


class Unprocessed(ClientError):
    """A batch call that answered but left requests unprocessed through every retry, as DynamoDB
    does with what it throttles: a ClientError of its throttling code, so that every caller treats
    it as a throttled call (the cloud's `errors`, `explain`), never as a bug."""

    def __init__(self, message: str, operation: str):
        super().__init__({"Error": {"Code": "ProvisionedThroughputExceededException", "Message": message}}, operation)


def still_throttled(left: str, operation: str, table: str, then: str) -> Unprocessed:
    """What a batch call still left after RETRIES + 1 calls (the first, then RETRIES retries of
    what it left): botocore retries an error, never a 200 answer with requests left in it. Short:
    `explain` keeps 200 characters of it."""
    return Unprocessed(
        f"DynamoDB table {table} left {left} after {RETRIES + 1} {operation} calls ({RETRIES} retries), "
        f"throttled: {then}; if it persists, check the table's capacity mode",
        operation,
    )


def backoff(attempt: int) -> None:
    """Full jitter: concurrent writers throttled together do not retry together."""
    time.sleep(random.uniform(0, BACKOFF_S * 2**attempt))


def _to_dynamo(value):
    if isinstance(value, float):
        return Decimal(repr(value))
    if isinstance(value, dict):
        return {k: _to_dynamo(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [_to_dynamo(v) for v in value]
    return value


def _from_dynamo(value):
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, dict):
        return {k: _from_dynamo(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_from_dynamo(v) for v in value]
    return value


def _no_index(err: ClientError) -> bool:
    """DynamoDB's answer to a query of an index the table does not have, or has not filled yet
    (a deploy that adds it to a table with records); moto words the first its own way."""
    code, message = err.response.get("Error", {}).get("Code"), err.response.get("Error", {}).get("Message", "")
    if code == "ValidationException":
        return "does not have the specified index" in message or "backfilling" in message
    return code == "ResourceNotFoundException" and message.startswith("Invalid index")


def _record(cls, raw: dict):
    known = {f.name for f in fields(cls)}
    return cls(**{k: _from_dynamo(v) for k, v in raw.items() if k in known})


class DynamoStore:
    def __init__(self, env_name: str, region: str | None = None, *, table=None):
        self.env_name = env_name
        self.table = table or boto3.resource("dynamodb", region_name=region).Table(naming.table(env_name))
        self.stamps = AttemptStamps()

    # -- node heartbeats --------------------------------------------------------------
    def put_heartbeat(self, hb: Heartbeat) -> None:
        item = {k: _to_dynamo(v) for k, v in asdict(hb).items() if v is not None and k not in SCALER_OWNED}
        # draining is sticky: once the interruption function (or the agent) set it, a later
        # heartbeat must not clear it, so it is only ever written as True.
        if not hb.draining:
            item.pop("draining")
        update = ", ".join(f"#{k} = :{k}" for k in item if k not in ("node_id", "pool"))
        remove = "" if hb.idle_since is not None else " REMOVE #idle_since"
        names = {f"#{k}": k for k in item if k not in ("node_id", "pool")}
        if remove:
            names["#idle_since"] = "idle_since"
        self.table.update_item(
            Key={"pk": f"POOL#{hb.pool}", "sk": f"NODE#{hb.node_id}"},
            UpdateExpression=f"SET {update}{remove}",
            ExpressionAttributeNames=names,
            ExpressionAttributeValues={f":{k}": v for k, v in item.items() if k not in ("node_id", "pool")},
        )

    def heartbeats(self, pool: str) -> dict[str, Heartbeat]:
        """Every heartbeat of a pool, by node id (paginated query)."""
        return self.node_rows(pool)[0]

    def node_rows(self, pool: str) -> tuple[dict[str, Heartbeat], frozenset[str]]:
        """(every heartbeat of a pool by node id, the nodes with only a mark), in one paginated
        query. A mark-only row (draining, cordon or preempt, set before the agent's first
        heartbeat) is not a heartbeat yet; the mark is sticky, so the first heartbeat comes back
        with it. The control tick forgets such a row once its node left the group: a node that
        never reported writes no heartbeat that could ever age out."""
        out: dict[str, Heartbeat] = {}
        marked: set[str] = set()
        for raw in self._query("pk = :pk AND begins_with(sk, :node)", {":pk": f"POOL#{pool}", ":node": "NODE#"},
                               consistent=False):  # fmt: skip
            node_id = raw["sk"].removeprefix("NODE#")
            if "at" not in raw:
                marked.add(node_id)
                continue
            fields = {k: _from_dynamo(v) for k, v in raw.items() if k in Heartbeat.__dataclass_fields__}
            fields.setdefault("idle_since", None)
            out[node_id] = Heartbeat(node_id=node_id, pool=pool, **fields)
        return out, frozenset(marked)

    def _query(self, condition: str, values: dict, *, consistent: bool = True, index: str | None = None) -> Iterator[dict]:
        """Every record a Query of this key condition matches (of the table, or of `index`, which
        reads are never consistent), in sort-key order, `QUERY_PAGE` a call."""
        kwargs = {"KeyConditionExpression": condition, "ExpressionAttributeValues": values, "Limit": QUERY_PAGE}
        if index is not None:
            kwargs["IndexName"] = index
        elif consistent:
            kwargs["ConsistentRead"] = True
        while True:
            page = self.table.query(**kwargs)
            yield from page["Items"]
            if "LastEvaluatedKey" not in page:
                return
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]

    def mark_draining(self, pool: str, node_id: str) -> None:
        """Idempotent: the node takes no new items; the scaler stops counting it as capacity."""
        self.table.update_item(
            Key={"pk": f"POOL#{pool}", "sk": f"NODE#{node_id}"},
            UpdateExpression="SET draining = :t",
            ExpressionAttributeValues={":t": True},
        )

    def let_idle_go(self, pool: str, node_id: str, idle_since: float) -> bool:
        return self._node_if(pool, node_id, "SET draining = :t",
                             "idle_since = :i AND (attribute_not_exists(claimed_at) OR claimed_at <= :i)",
                             {":t": True, ":i": _to_dynamo(float(idle_since))})  # fmt: skip

    def claim_work(self, pool: str, node_id: str, at: float) -> bool:
        return self._node_if(pool, node_id, "SET claimed_at = :a", "attribute_not_exists(draining) OR draining = :f",
                             {":a": _to_dynamo(float(at)), ":f": False})  # fmt: skip

    def _node_if(self, pool: str, node_id: str, update: str, condition: str, values: dict) -> bool:
        """One conditional update of the node's record: False where its condition does not hold."""
        try:
            self.table.update_item(Key={"pk": f"POOL#{pool}", "sk": f"NODE#{node_id}"}, UpdateExpression=update,
                                   ConditionExpression=condition, ExpressionAttributeValues=values)  # fmt: skip
        except ClientError as err:
            if err.response["Error"]["Code"] == "ConditionalCheckFailedException":
                return False
            raise
        return True

    def set_cordon(self, pool: str, node_id: str, cordoned: bool) -> None:
        """The agent reads it back after each heartbeat write (`heartbeat`), which never sets it."""
        self.table.update_item(
            Key={"pk": f"POOL#{pool}", "sk": f"NODE#{node_id}"},
            UpdateExpression="SET cordoned = :c",
            ExpressionAttributeValues={":c": cordoned},
        )

    def set_preempt(self, pool: str, node_id: str, keys: list[str]) -> None:
        self.table.update_item(
            Key={"pk": f"POOL#{pool}", "sk": f"NODE#{node_id}"},
            UpdateExpression="SET preempt = :p",
            ExpressionAttributeValues={":p": list(keys)},
        )

    def forget_node(self, pool: str, node_id: str) -> None:
        self.table.delete_item(Key={"pk": f"POOL#{pool}", "sk": f"NODE#{node_id}"})

    def grant_leave(self, pool: str, units: int, at: float, until: float, stay: int = 0) -> None:
        self.table.update_item(Key={"pk": f"POOL#{pool}", "sk": "LEAVE"}, UpdateExpression="SET units = :u, #a = :a, #t = :t, stay = :s",
                               ExpressionAttributeNames={"#a": "at", "#t": "until"},
                               ExpressionAttributeValues={":u": int(units), ":a": _to_dynamo(float(at)),
                                                          ":t": _to_dynamo(float(until)), ":s": int(stay)})  # fmt: skip

    def take_leave(self, pool: str, units: int, idle_since: float, now: float, cordoned: bool = False) -> bool:
        """`records.leave_answer` as two conditional writes: the first takes a unit to stay (a
        grant written before `stay` existed has none), the second one to leave."""
        key = {"pk": f"POOL#{pool}", "sk": "LEAVE"}
        applies = "#a <= :idle AND #t > :now"
        names = {"#a": "at", "#t": "until"}
        values = {":u": int(units), ":idle": _to_dynamo(float(idle_since)), ":now": _to_dynamo(float(now))}
        leave = ("SET units = units - :u", f"units >= :u AND {applies}", {}, True)
        if not cordoned:  # DynamoDB refuses values an expression does not use: :zero only here
            zero, no_stay = {":zero": 0}, " AND (attribute_not_exists(stay) OR stay <= :zero)"
            takes = [("SET stay = stay - :u", f"stay > :zero AND {applies}", zero, False),
                     (leave[0], leave[1] + no_stay, zero, True)]  # fmt: skip
        else:
            takes = [leave]
        for update, condition, extra, leaves in takes:
            try:
                self.table.update_item(Key=key, UpdateExpression=update, ConditionExpression=condition,
                                       ExpressionAttributeNames=names, ExpressionAttributeValues=values | extra)  # fmt: skip
            except ClientError as err:
                if err.response["Error"]["Code"] != "ConditionalCheckFailedException":
                    raise
                continue  # none to stay: try to leave; none left, expired, or never granted: False
            return leaves
        return False

    # -- queue statistics (the scaler's boot-horizon rule reads them) -------------------
    def record_item_seconds(self, queue: str, *seconds: float) -> None:
        """Fold succeeded items' run times, in order, into their queue's mean: one read and one
        write however many. Compare-and-set on the count, so concurrent agents never overwrite
        each other's samples."""
        # Imported here, on the agent's path: the policy package would weigh on the scaler's cold import.
        from tidefleet.policy.model import item_seconds_mean

        key = {"pk": f"QUEUE#{queue}", "sk": "STATS"}
        for _ in range(STATS_RETRIES):
            current = self.queue_stats([queue]).get(queue)
            mean = reduce(item_seconds_mean, seconds, current.mean_item_s if current else None)
            try:
                self.table.update_item(
                    Key=key,
                    UpdateExpression="SET mean_item_s = :mean, #items = :next",
                    ConditionExpression="attribute_not_exists(pk)" if current is None else "#items = :items",
                    ExpressionAttributeNames={"#items": "items"},
                    ExpressionAttributeValues={
                        ":mean": _to_dynamo(float(mean)),
                        ":next": (current.items if current else 0) + len(seconds),
                        **({":items": current.items} if current else {}),
                    },
                )
                return
            except ClientError as err:
                if err.response["Error"]["Code"] != "ConditionalCheckFailedException":
                    raise

    def queue_stats(self, queues: list[str]) -> dict[str, QueueStats]:
        """The recorded statistics of these queues, by name; a queue with no succeeded item yet is absent."""
        found = self._batch_get([{"pk": f"QUEUE#{q}", "sk": "STATS"} for q in queues])
        return {raw["pk"].removeprefix("QUEUE#"): QueueStats(float(raw["mean_item_s"]), int(raw["items"])) for raw in found}

    def waiting_marks(self, queues: list[str]) -> dict[str, WaitingMark]:
        return {q: waiting_mark_of(raw) for q, raw in self._queue_marks("WAITING", queues).items()}

    def mark_waiting(self, queue: str, mark: WaitingMark | None) -> None:
        self._mark_queue("WAITING", queue, waiting_mark_fields(mark) if mark else None)

    def held_since(self, queues: list[str]) -> dict[str, float]:
        return {q: float(raw["since"]) for q, raw in self._queue_marks("HELD", queues).items()}

    def mark_held(self, queue: str, since: float | None) -> None:
        self._mark_queue("HELD", queue, None if since is None else {"since": float(since)})

    def _queue_marks(self, mark: str, queues: list[str]) -> dict[str, dict]:
        found = self._batch_get([{"pk": f"QUEUE#{q}", "sk": mark} for q in queues])
        return {raw["pk"].removeprefix("QUEUE#"): _from_dynamo(raw) for raw in found}

    def _mark_queue(self, mark: str, queue: str, values: dict | None) -> None:
        key = {"pk": f"QUEUE#{queue}", "sk": mark}
        if values is None:
            self.table.delete_item(Key=key)
        else:
            # UpdateItem, not PutItem: the scaler's role may update and delete, never put. A value
            # of None removes the attribute: the mark is replaced whole, as Firestore's is.
            kept = {k: v for k, v in values.items() if v is not None}
            gone = [k for k, v in values.items() if v is None]
            self.table.update_item(Key=key, UpdateExpression="SET " + ", ".join(f"{k} = :{k}" for k in kept)
                                   + (" REMOVE " + ", ".join(gone) if gone else ""),
                                   ExpressionAttributeValues={f":{k}": _to_dynamo(v) for k, v in kept.items()})  # fmt: skip

    def heartbeat(self, pool: str, node_id: str) -> Heartbeat | None:
        raw = self.table.get_item(Key={"pk": f"POOL#{pool}", "sk": f"NODE#{node_id}"}, ConsistentRead=True).get("Item")
        if raw is None or "at" not in raw:  # none, or only a draining mark: not a heartbeat yet
            return None
        values = {k: _from_dynamo(v) for k, v in raw.items() if k in Heartbeat.__dataclass_fields__}
        return Heartbeat(**{"node_id": node_id, "pool": pool, "idle_since": None, **values})

    # -- jobs and items ---------------------------------------------------------------
    def put_job(self, job: Job) -> Job:
        """Create the job unless it exists; returns the stored job either way (idempotent submit)."""
        item = {"pk": f"JOB#{job.job_id}", "sk": "JOB", **{k: _to_dynamo(v) for k, v in asdict(job).items() if v is not None}}
        try:
            self.table.put_item(Item=item, ConditionExpression="attribute_not_exists(pk)")
            return job
        except ClientError as err:
            if err.response["Error"]["Code"] != "ConditionalCheckFailedException":
                raise
        return self.job(job.job_id)

    def job(self, job_id: str) -> Job | None:
        raw = self.table.get_item(Key={"pk": f"JOB#{job_id}", "sk": "JOB"}, ConsistentRead=True).get("Item")
        return None if raw is None else _record(Job, raw)

    def jobs(self, queue: str | None = None, since: float = 0.0) -> list[Job]:
        """Every job (of one queue, created at `since` or later), oldest first: the keys the jobs
        index holds (a job written in the last second may be missing: an index lags its table),
        then their records. A table deployed before the index has none: it is scanned whole
        (items and heartbeats too), with a warning that a deploy adds the index."""
        condition, values = "sk = :job AND created_at >= :since", {":job": "JOB", ":since": _to_dynamo(float(since))}
        try:
            keys = [{"pk": raw["pk"], "sk": raw["sk"]} for raw in self._query(condition, values, index=JOBS_INDEX.name)]
        except ClientError as err:
            if not _no_index(err):
                raise
            self._no_index_warning(JOBS_INDEX.name, "record of it is read to list the jobs")
            found = self._scanned_jobs()
        else:
            found = [_record(Job, raw) for raw in self._batch_get(keys)]
        return sorted((j for j in found if (queue is None or j.queue == queue) and j.created_at >= since),
                      key=lambda j: (j.created_at, j.job_id))  # fmt: skip

    def _no_index_warning(self, index: str, instead: str) -> None:
        """One line: the table has no `index` ready, so every `instead`; a deploy adds it."""
        log.warning("warning: table %s has no %r index ready (deployed before it was added, or filling it): every "
                    "%s; deploy the environment again to add it", self.table.name, index, instead)  # fmt: skip

    def _scanned_jobs(self) -> list[Job]:
        """Every job record, found by a Scan of the whole table filtered on sk = JOB."""
        kwargs = {"FilterExpression": "sk = :job", "ExpressionAttributeValues": {":job": "JOB"}, "ConsistentRead": True}
        out: list[Job] = []
        while True:
            page = self.table.scan(**kwargs)
            out += [_record(Job, raw) for raw in page["Items"]]
            if "LastEvaluatedKey" not in page:
                return out
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]

    def set_job_total(self, job_id: str, total: int) -> None:
        self.table.update_item(
            Key={"pk": f"JOB#{job_id}", "sk": "JOB"},
            UpdateExpression="SET #t = :t",
            ConditionExpression="attribute_exists(pk)",  # never creates a job record without its fields
            ExpressionAttributeNames={"#t": "total"},
            ExpressionAttributeValues={":t": total},
        )

    def cancel_job(self, job_id: str, reason: str = "") -> None:
        self.table.update_item(
            Key={"pk": f"JOB#{job_id}", "sk": "JOB"},
            UpdateExpression="SET cancelled = :t, cancel_reason = :r",
            ConditionExpression="attribute_exists(pk)",
            ExpressionAttributeValues={":t": True, ":r": reason},
        )

    def end_wait(self, job_id: str) -> None:
        self.table.update_item(Key={"pk": f"JOB#{job_id}", "sk": "JOB"}, UpdateExpression="SET waiting = :f",
                               ConditionExpression="attribute_exists(pk)", ExpressionAttributeValues={":f": False})  # fmt: skip

    def watch(self, job_id: str) -> None:
        self.table.put_item(Item={"pk": "WATCH", "sk": f"JOB#{job_id}"})

    def unwatch(self, job_id: str) -> None:
        self.table.delete_item(Key={"pk": "WATCH", "sk": f"JOB#{job_id}"})

    def watched(self) -> list[str]:
        """One Query of the WATCH partition (paginated): a handful of keys, not a table scan."""
        return [raw["sk"].removeprefix("JOB#") for raw in self._query("pk = :w", {":w": "WATCH"})]

    def put_item_if_new(self, item: Item) -> bool:
        """False if an item with this id already exists in the job (left untouched)."""
        try:
            self.table.meta.client.put_item(TableName=self.table.name, Item=self._item_record(item),
                                            ConditionExpression="attribute_not_exists(pk)")  # fmt: skip
            return True
        except ClientError as err:
            if err.response["Error"]["Code"] != "ConditionalCheckFailedException":
                raise
            return False

    def _item_record(self, item: Item) -> dict:
        record = {"pk": f"JOB#{item.job_id}", "sk": f"ITEM#{item.item_id}",
                  **{k: _to_dynamo(v) for k, v in asdict(item).items() if v is not None}}  # fmt: skip
        if item.status == "failed":
            record[FAILED_INDEX.hash_key] = record["pk"]
        return record

    def create_items(self, items: list[Item], *, unseen: bool = False) -> list[str]:
        """BatchWriteItem (25 a call, unprocessed ones retried with backoff) when `unseen`: it has
        no conditions, so it is only for items that cannot exist yet. Otherwise a conditional
        put each (`put_item_if_new`)."""
        if not unseen:
            return [i.item_id for i in items if self.put_item_if_new(i)]
        client = self.table.meta.client  # a client is thread-safe, a resource is not
        for start in range(0, len(items), WRITE_BATCH):
            pending = {self.table.name: [{"PutRequest": {"Item": self._item_record(i)}}
                                         for i in items[start : start + WRITE_BATCH]]}  # fmt: skip
            for attempt in range(RETRIES + 1):
                pending = client.batch_write_item(RequestItems=pending).get("UnprocessedItems") or {}
                if not pending:
                    break
                if attempt == RETRIES:  # the batches after this one are not tried: unwritten too
                    left = len(pending[self.table.name]) + max(0, len(items) - start - WRITE_BATCH)
                    raise still_throttled(f"{left} of {len(items)} item(s) unwritten", "BatchWriteItem",
                                          self.table.name, "run the same submit again")  # fmt: skip
                backoff(attempt)
        return [i.item_id for i in items]

    def items_by_id(self, job_id: str, item_ids: list[str]) -> dict[str, Item]:
        found = self._batch_get([{"pk": f"JOB#{job_id}", "sk": f"ITEM#{i}"} for i in item_ids])
        return {raw["item_id"]: _record(Item, raw) for raw in found}

    def _batch_get(self, keys: list[dict]) -> list[dict]:
        """The records of these keys that exist (BatchGetItem, `GET_BATCH` keys a call, consistent).
        Keys left unprocessed (throttled) are asked again with backoff, `RETRIES` times at most."""
        out: list[dict] = []
        client = self.table.meta.client  # the resource's client: plain Python values, not {"S": ...}
        for start in range(0, len(keys), GET_BATCH):
            chunk = keys[start : start + GET_BATCH]
            pending = {self.table.name: {"Keys": chunk, "ConsistentRead": True}}
            for attempt in range(RETRIES + 1):
                page = client.batch_get_item(RequestItems=pending)
                out += page["Responses"].get(self.table.name, [])
                pending = page.get("UnprocessedKeys") or {}
                if not pending:
                    break
                if attempt == RETRIES:  # the chunks after this one are not asked: unread too
                    unread = len(pending[self.table.name]["Keys"]) + max(0, len(keys) - start - GET_BATCH)
                    left = f"keys unread ({unread} of {len(keys)})"
                    raise still_throttled(left, "BatchGetItem", self.table.name, "try again")
                backoff(attempt)
        return out

    def mark_sent(self, job_id: str, chunk: int, count: int) -> None:
        self.table.meta.client.put_item(TableName=self.table.name,
                                        Item={"pk": f"JOB#{job_id}", "sk": f"SENT#{chunk:08d}", "n": count})  # fmt: skip

    def sent_chunks(self, job_id: str) -> dict[int, int]:
        sent = self._query("pk = :pk AND begins_with(sk, :sent)", {":pk": f"JOB#{job_id}", ":sent": "SENT#"})
        return {int(raw["sk"].removeprefix("SENT#")): int(raw["n"]) for raw in sent}

    def end_submit(self, job_id: str, total: int) -> None:
        self.table.update_item(
            Key={"pk": f"JOB#{job_id}", "sk": "JOB"},
            UpdateExpression="SET #t = :t, submitting = :f",
            ExpressionAttributeNames={"#t": "total"},
            ExpressionAttributeValues={":t": total, ":f": False},
        )

    def claim_resume(self, job_id: str, at: float, stale_before: float) -> bool:
        return self._job_if(job_id, "SET resumed_at = :at",
                            "submitting = :t AND (attribute_not_exists(resumed_at) OR resumed_at < :stale)",
                            {":at": _to_dynamo(float(at)), ":t": True, ":stale": _to_dynamo(float(stale_before))})  # fmt: skip

    def release_resume(self, job_id: str, at: float) -> None:
        self._job_if(job_id, "SET resumed_at = :zero", "resumed_at = :at", {":zero": 0, ":at": _to_dynamo(float(at))})

    def _job_if(self, job_id: str, update: str, condition: str, values: dict) -> bool:
        """One conditional update of an existing job's record: False where its condition does not hold."""
        try:
            self.table.update_item(Key={"pk": f"JOB#{job_id}", "sk": "JOB"}, UpdateExpression=update,
                                   ConditionExpression=f"attribute_exists(pk) AND {condition}",
                                   ExpressionAttributeValues=values)  # fmt: skip
        except ClientError as err:
            if err.response["Error"]["Code"] == "ConditionalCheckFailedException":
                return False
            raise
        return True

    def item(self, job_id: str, item_id: str) -> Item | None:
        raw = self.table.get_item(Key={"pk": f"JOB#{job_id}", "sk": f"ITEM#{item_id}"}, ConsistentRead=True).get("Item")
        return None if raw is None else _record(Item, raw)

    def failed_items(self, job_id: str) -> list[Item] | None:
        """The job's failed items, in item-id order, through the failed-items index (`FAILED_INDEX`:
        an item is in it while its status is failed); None where the table has none ready (deployed
        before it was added, or filling it). The index lags its table by up to a second, and items
        that failed before it was added are not in it: the caller checks the job's count."""
        try:
            return [_record(Item, raw) for raw in self._query(f"{FAILED_INDEX.hash_key} = :job", {":job": f"JOB#{job_id}"},
                                                              index=FAILED_INDEX.name)]  # fmt: skip
        except ClientError as err:
            if not _no_index(err):
                raise
            self._no_index_warning(FAILED_INDEX.name, f"item of job {job_id} is read to find its failed ones")
            return None

    def items(self, job_id: str) -> list[Item]:
        """Every item of a job, in item-id order (paginated query)."""
        items = self._query("pk = :pk AND begins_with(sk, :item)", {":pk": f"JOB#{job_id}", ":item": "ITEM#"})
        return [_record(Item, raw) for raw in items]

    def record_part(self, job_id: str, item_id: str, entry: dict) -> None:
        """UpdateItem (an upsert), not PutItem: the node role may update, never put. The job's
        `last_attempt_at` first, so a part is never written without it."""
        self._stamp(job_id, time.time())
        self.table.update_item(Key={"pk": f"JOB#{job_id}", "sk": f"PART#{item_id}#{entry['attempt']}#{entry['node']}"},
                               UpdateExpression="SET #i = :i, #e = :e", ExpressionAttributeNames={"#i": "item", "#e": "entry"},
                               ExpressionAttributeValues={":i": item_id, ":e": _to_dynamo(entry)})  # fmt: skip

    def _stamp(self, job_id: str, at: float) -> None:
        """The job's `last_attempt_at` raised to `at`, if the job exists and it is lower (a
        failed condition is either: nothing to do), unless this client did so lately (`AttemptStamps`)."""
        if not self.stamps.due(job_id, at):
            return
        try:
            self.table.update_item(Key={"pk": f"JOB#{job_id}", "sk": "JOB"}, UpdateExpression="SET last_attempt_at = :at",
                                   ConditionExpression="attribute_exists(pk) AND (attribute_not_exists(last_attempt_at) "
                                                       "OR last_attempt_at < :at)",
                                   ExpressionAttributeValues={":at": _to_dynamo(at)})  # fmt: skip
        except ClientError as err:
            if err.response["Error"]["Code"] != "ConditionalCheckFailedException":
                raise
        self.stamps.wrote(job_id, at)

    def parts(self, job_id: str) -> dict[str, list[dict]]:
        out: dict[str, list[dict]] = {}
        for raw in self._query("pk = :pk AND begins_with(sk, :part)", {":pk": f"JOB#{job_id}", ":part": "PART#"}):
            out.setdefault(raw["item"], []).append(_from_dynamo(raw["entry"]))
        return out

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
        """Set `values` and add `add` to counters, only if the item exists, its status is in
        `only_from` (when given) and not in `never_from`, and `fence` admits it; `append` adds one
        entry to a list. Returns the new item, or None when the condition failed. The condition
        is what keeps an item from being finished twice or run by two nodes at once, and what
        keeps a message for an item that was never submitted from creating a record.

        A write that settles the item (or takes it out of a final status) also counts it on its
        job (`settled_moves`): one TransactWriteItems of both, so only a write that lands counts.
        A transaction returns no values: that write returns the item as far as it wrote it.
        Another write that ends an attempt (`ends_attempt`) moves its job's `last_attempt_at` first."""
        if settled_moves(values.get("status"), only_from, never_from):  # with its job's count: one transaction
            if not self.update_items([ItemWrite(job_id, item_id, values, only_from, never_from, fence, add, append)])[0]:
                return None
            written = {k: v for k, v in values.items() if k in Item.__dataclass_fields__ and v is not None}
            return Item(job_id=job_id, item_id=item_id, **written)
        if ends_attempt(append):  # before the write: a stamp too new only has the job read
            self._stamp(job_id, time.time())
        request, _ = _item_update(job_id, item_id, only_from, never_from, fence, add, append, values)
        try:
            return _record(Item, self.table.update_item(**request, ReturnValues="ALL_NEW")["Attributes"])
        except ClientError as err:
            if err.response["Error"]["Code"] != "ConditionalCheckFailedException":
                raise
            return None

    def update_items(self, writes: Sequence[ItemWrite]) -> list[bool]:
        """As `JobStore.update_items`: TransactWriteItems of up to `TRANSACT_WRITES` writes, with one
        counter update per job for the writes that settle its items. A transaction is all or
        nothing, so writes whose condition failed (`CancellationReasons`) are dropped and the rest
        sent again; a conflict with another transaction on the same records (another agent
        counting on the job) is retried after a short jittered pause."""
        landed = [False] * len(writes)
        for chunk in write_chunks(writes, TRANSACT_WRITES):
            left, conflicts = list(chunk), 0
            while left:
                at = time.time()
                requests = [(i, *_item_update(writes[i].job_id, writes[i].item_id, writes[i].only_from, writes[i].never_from,
                                              writes[i].fence, writes[i].add, writes[i].append, dict(writes[i].values)))
                            for i in left]  # fmt: skip
                counts: dict[str, dict[str, int]] = {}
                stamped = {writes[i].job_id for i in left if ends_attempt(writes[i].append)}
                for i, _, moves in requests:
                    job = counts.setdefault(writes[i].job_id, {})
                    for k, n in moves.items():
                        job[k] = job.get(k, 0) + n
                jobs = [job_id for job_id, moves in counts.items() if any(moves.values()) or job_id in stamped]
                actions = [{"Update": {"TableName": self.table.name, **r}} for _, r, _ in requests]
                actions += [{"Update": {"TableName": self.table.name,
                                        **_job_update(job_id, counts[job_id], at if job_id in stamped else None)}}
                            for job_id in jobs]  # fmt: skip
                try:
                    self.table.meta.client.transact_write_items(TransactItems=actions)
                except ClientError as err:
                    if err.response["Error"]["Code"] != "TransactionCanceledException":
                        raise
                    reasons = [r.get("Code") or "None" for r in err.response.get("CancellationReasons", [])]
                    failed = {i for (i, _, _), code in zip(requests, reasons) if code == "ConditionalCheckFailed"}
                    for job_id, code in zip(jobs, reasons[len(requests):]):
                        if code == "ConditionalCheckFailed":  # the job is gone: none of its writes lands
                            failed |= {i for i, _, _ in requests if writes[i].job_id == job_id}
                    if failed:
                        left = [i for i in left if i not in failed]
                    elif "TransactionConflict" in reasons and conflicts < TRANSACT_RETRIES:
                        conflicts += 1
                        time.sleep(random.uniform(0.05, 0.2) * 2**conflicts)
                    else:
                        raise
                    continue
                for i in left:
                    landed[i] = True
                left = []
        return landed


def _item_update(job_id: str, item_id: str, only_from, never_from, fence: Fence | None, add: dict | None,
                 append: dict | None, values: dict) -> tuple[dict, dict[str, int]]:
    """The UpdateItem request (no ReturnValues) of one conditional item write, and what it moves
    on its job's settled counters (`settled_moves`). `values` gains `updated_at`."""
    moves = settled_moves(values.get("status"), only_from, never_from)
    values["updated_at"] = time.time()
    if "status" in values:  # in the failed-items index while failed, and out of it once not
        values[FAILED_INDEX.hash_key] = f"JOB#{job_id}" if values["status"] == "failed" else None
    names = {f"#{k}": k for k in [*values, *(add or {}), *(append or {})]}
    sets = [f"#{k} = :{k}" for k, v in values.items() if v is not None]
    removes = [f"#{k}" for k, v in values.items() if v is None]
    sets += [f"#{k} = if_not_exists(#{k}, :zero) + :add_{k}" for k in add or {}]
    expr_values = {f":{k}": _to_dynamo(v) for k, v in values.items() if v is not None}
    expr_values |= {f":add_{k}": v for k, v in (add or {}).items()}
    if add:
        expr_values[":zero"] = 0
    sets += [f"#{k} = list_append(if_not_exists(#{k}, :empty), :append_{k})" for k in append or {}]
    expr_values |= {f":append_{k}": [_to_dynamo(v)] for k, v in (append or {}).items()}
    if append:
        expr_values[":empty"] = []
    conditions = ["attribute_exists(pk)"]
    if only_from:
        conditions.append("#status IN (" + ", ".join(f":from{i}" for i in range(len(only_from))) + ")")
        expr_values |= {f":from{i}": s for i, s in enumerate(only_from)}
    if never_from:
        conditions.append(
            "(attribute_not_exists(#status) OR NOT #status IN ("
            + ", ".join(f":never{i}" for i in range(len(never_from)))
            + "))"
        )
        expr_values |= {f":never{i}": s for i, s in enumerate(never_from)}
    if fence is not None and fence.attempt is not None:
        conditions.append("#fence_attempts = :fence_attempt")
        names["#fence_attempts"] = "attempts"
        expr_values[":fence_attempt"] = fence.attempt
    if fence is not None and fence.claim_at is not None:
        conditions.append("(#status <> :running OR attribute_not_exists(#lease) OR #lease <= :claim_at)")
        names["#lease"] = "lease_until"
        expr_values |= {":running": "running", ":claim_at": _to_dynamo(float(fence.claim_at))}
    if fence is not None and fence.seq is not None:
        conditions.append("(attribute_not_exists(#fence_seq) OR #fence_seq <= :fence_seq)")
        names["#fence_seq"] = "seq"
        expr_values[":fence_seq"] = fence.seq
    if fence is not None and fence.message is not None:  # records.names, as a condition
        message_id, copy = fence.message
        names |= {"#fence_mid": "message_id", "#fence_copy": "copy"}
        expr_values |= {":fence_mid": message_id, ":fence_none": ""}
        unset = "(attribute_not_exists({0}) OR {0} = :fence_none)"
        if copy:  # its copy's name, and its id or none yet
            expr_values[":fence_copy"] = copy
            conditions.append(f"#fence_copy = :fence_copy AND ({unset.format('#fence_mid')} OR #fence_mid = :fence_mid)")
        else:  # no copy's name, and its id
            conditions.append(f"{unset.format('#fence_copy')} AND #fence_mid = :fence_mid AND #fence_mid <> :fence_none")
    update = "SET " + ", ".join(sets) + (" REMOVE " + ", ".join(removes) if removes else "")
    request = {
        "Key": {"pk": f"JOB#{job_id}", "sk": f"ITEM#{item_id}"},
        "UpdateExpression": update,
        # DynamoDB refuses a name no expression uses: #status only where a condition reads it.
        "ExpressionAttributeNames": names | ({"#status": "status"} if "#status" in " ".join(conditions) else {}),
        "ExpressionAttributeValues": expr_values,
        "ConditionExpression": " AND ".join(conditions),
    }
    return request, moves


def _job_update(job_id: str, moves: dict[str, int], attempt_at: float | None) -> dict:
    """The job's part of a transaction of its items' writes, if the job exists: its counters
    moved by those that settle, and `last_attempt_at` set to `attempt_at` where one ends an
    attempt (SET, not a maximum, which a condition would give only by failing the transaction:
    of two writers the later lands, a moment apart)."""
    update = "ADD " + ", ".join(f"{k} :{k}" for k in moves) if moves else ""
    values = {f":{k}": n for k, n in moves.items()}
    if attempt_at is not None:
        update += " SET last_attempt_at = :attempt_at"
        values[":attempt_at"] = _to_dynamo(attempt_at)
    return {"Key": {"pk": f"JOB#{job_id}", "sk": "JOB"}, "ConditionExpression": "attribute_exists(pk)",
            "UpdateExpression": update.strip(), "ExpressionAttributeValues": values}  # fmt: skip


def create_table(env_name: str, region: str | None = None) -> None:
    """The table as the stack declares it (`tidefleet.resources.table_spec`: pk/sk strings, the
    jobs and failed-items indexes, on-demand). For the sandbox and tests."""
    client = boto3.client("dynamodb", region_name=region)
    spec = table_spec(env_name)

    def key_schema(hash_key: str, range_key: str) -> list[dict]:
        return [{"AttributeName": hash_key, "KeyType": "HASH"}, {"AttributeName": range_key, "KeyType": "RANGE"}]

    client.create_table(
        TableName=spec.name,
        AttributeDefinitions=[{"AttributeName": k, "AttributeType": t} for k, t in spec.key_types.items()],
        KeySchema=key_schema(spec.hash_key, spec.range_key),
        GlobalSecondaryIndexes=[{"IndexName": index.name, "KeySchema": key_schema(index.hash_key, index.range_key),
                                 "Projection": {"ProjectionType": index.projection}} for index in spec.indexes],
        BillingMode=spec.billing_mode,
    )
    client.get_waiter("table_exists").wait(TableName=spec.name)
