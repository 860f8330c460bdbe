"""A fake of the few Google Cloud REST endpoints the GCP adapters call, behind the `responses`
library: the REAL google-cloud-compute / firestore / pubsub GAPIC clients (REST transport) and
google-auth sessions build and send the requests; this answers them from in-memory state and
records each one.

No local emulator exists for Compute Engine, Cloud Monitoring or Cloud Logging (and the
Firestore and Pub/Sub emulators need Java and gcloud), so this is the narrowest honest seam:
everything above HTTP is real. What it models, because the product depends on it: Firestore's
preconditions (exists / updateTime) and field masks; Pub/Sub's ack deadlines, delivery attempts
and dead-letter policy (a message delivered `max_delivery_attempts` times and not acked goes to
the dead-letter topic instead of being delivered again), and, where a subscription sets one, its
retention (a message dropped that long after its publish, leased or not).
"""

from __future__ import annotations

import base64
import itertools
import json
import re
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from urllib.parse import parse_qs, urlparse

import requests
import responses

COMPUTE = "https://compute.googleapis.com/compute/v1"
FIRESTORE = "https://firestore.googleapis.com/v1"
PUBSUB = "https://pubsub.googleapis.com/v1"
LOGGING = "https://logging.googleapis.com/v2"
STORAGE_UPLOAD = "https://storage.googleapis.com/upload/storage/v1"
STORAGE_API = "https://storage.googleapis.com/storage/v1"
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
OPERATION = {"name": "operation-1", "status": "DONE", "kind": "compute#operation"}


@dataclass
class FakeVm:
    name: str
    zone: str = "us-central1-a"
    action: str = "NONE"
    status: str = "RUNNING"
    machine_type: str = "n2-standard-4"
    created: str = "2026-01-01T00:00:00.000-00:00"


@dataclass
class FakeGcp:
    project: str
    region: str
    groups: dict[str, int] = field(default_factory=dict)  # name -> target size
    vms: dict[str, list[FakeVm]] = field(default_factory=dict)  # group -> its instances
    errors: dict[str, list[dict]] = field(default_factory=dict)
    undelivered: dict[str, int] = field(default_factory=dict)  # subscription id -> count
    undelivered_lag_s: float = 0.0  # how long before the read's end its newest point was sampled
    docs: dict[str, dict] = field(default_factory=dict)  # document name -> fields (REST JSON)
    versions: dict[str, int] = field(default_factory=dict)  # document name -> its update counter
    before_write: list = field(default_factory=list)  # callables run (once each) before the next PATCH
    unavailable_writes: int = 0  # the next this many writes of a batchWrite fail UNAVAILABLE (throttled), unapplied
    subscriptions: dict[str, FakeSubscription] = field(default_factory=dict)  # by subscription id
    published: dict[str, list[bytes]] = field(default_factory=dict)  # topic id -> every body published
    log_entries: list[dict] = field(default_factory=list)  # entries:write, labels merged into each
    time_series: list[dict] = field(default_factory=list)  # every series timeSeries.create received
    log_page: int = 1000
    read_refusals: int = 0  # the next this many entries:list calls answer 429 (the read quota)
    objects: dict[str, bytes] = field(default_factory=dict)  # "bucket/object name" -> what was uploaded
    pull_hold_s: float = 0.2  # how long an empty pull is held before it answers with nothing
    pull_timeouts: list[float] = field(default_factory=list)  # the client's timeout on each pull
    calls: list[tuple[str, str, dict | None]] = field(default_factory=list)  # method, path+query, body
    expired: list[str] = field(default_factory=list)  # ids of the messages a subscription's retention dropped
    lock: threading.RLock = field(default_factory=threading.RLock)  # agent threads; re-entered by before_write
    clock_offset: float = 0.0
    short_publishes: int = 0  # the next this many publishes publish and answer one message fewer than given


    def now(self) -> float:
        return time.monotonic() + self.clock_offset

    def _url(self, vm: FakeVm) -> str:
        return f"{COMPUTE}/projects/{self.project}/zones/{vm.zone}/instances/{vm.name}"

    def install(self, mock: responses.RequestsMock) -> None:
        igm = re.compile(rf"{COMPUTE}/projects/{self.project}/regions/{self.region}/instanceGroupManagers/([^/?]+)(/\w+)?")
        mock.add_callback(responses.GET, igm, callback=self._igm)
        mock.add_callback(responses.POST, igm, callback=self._igm)
        mock.add_callback(responses.GET, re.compile(rf"{COMPUTE}/projects/{self.project}/aggregated/instances"),
                          callback=self._aggregated)  # fmt: skip
        mock.add_callback(responses.GET, re.compile(r"https://monitoring.googleapis.com/v3/.*"), callback=self._series)
        mock.add_callback(responses.POST, re.compile(rf"https://monitoring.googleapis.com/v3/projects/{self.project}/timeSeries"),
                          callback=self._locked(self._create_series))  # fmt: skip
        docs = re.compile(rf"{FIRESTORE}/(projects/.+)")
        for method in (responses.GET, responses.PATCH, responses.DELETE, responses.POST):
            mock.add_callback(method, docs, callback=self._locked(self._firestore))
        pubsub = re.compile(rf"{PUBSUB}/projects/{self.project}/(subscriptions|topics)/.+")
        for method in (responses.GET, responses.POST):
            mock.add_callback(method, pubsub, callback=self._pull_waits(self._locked(self._pubsub)))
        mock.add_callback(responses.POST, re.compile(rf"{LOGGING}/entries:\w+"), callback=self._locked(self._logging))
        mock.add_callback(responses.POST, re.compile(rf"{STORAGE_UPLOAD}/b/[^/]+/o"), callback=self._locked(self._upload))
        mock.add_callback(responses.GET, re.compile(rf"{STORAGE_API}/b/[^/?]+(\?.*)?$"), callback=self._locked(self._bucket))

    def _pull_waits(self, handler):
        """An empty pull is held a while, as the server does (an agent polling an empty
        subscription must not spin); a client timeout shorter than that ends it, as requests does."""

        def waiting(request):
            answer = handler(request)
            if urlparse(request.url).path.endswith(":pull"):
                timeout = request.req_kwargs["timeout"]
                self.pull_timeouts.append(timeout)
                if answer[2] == '{"receivedMessages": []}':
                    time.sleep(min(self.pull_hold_s, timeout))
                    if timeout < self.pull_hold_s:
                        raise requests.exceptions.ReadTimeout(f"fake: pull held longer than {timeout}s")
            return answer

        return waiting

    def _locked(self, handler):
        def locked(request):
            with self.lock:
                return handler(request)

        return locked

    def _record(self, request) -> tuple[str, dict]:
        url = urlparse(request.url)
        query = {k: v[0] if len(v) == 1 else v for k, v in parse_qs(url.query).items() if k != "$alt"}
        body = json.loads(request.body) if request.body else None
        self.calls.append((request.method, url.path, {"query": query, "body": body}))
        return url.path, query

    # -- compute ------------------------------------------------------------------------
    def _igm(self, request):
        path, query = self._record(request)
        name, verb = re.search(r"instanceGroupManagers/([^/]+)(?:/(\w+))?$", path).groups()
        if name not in self.groups:
            return 404, {}, json.dumps({"error": {"code": 404, "message": f"{name} not found"}})
        if verb is None:
            return 200, {}, json.dumps({"name": name, "targetSize": self.groups[name]})
        if verb == "listManagedInstances":
            managed = [{"instance": self._url(vm), "name": vm.name, "currentAction": vm.action,
                        "instanceStatus": vm.status} for vm in self.vms.get(name, [])]  # fmt: skip
            return 200, {}, json.dumps({"managedInstances": managed})
        if verb == "listErrors":
            return 200, {}, json.dumps({"items": self.errors.get(name, [])})
        if verb == "resize":
            self.groups[name] = int(query["size"])
            # Below the instances it runs, the group deletes some of its own choosing (busy or not).
            live = [vm for vm in self.vms.get(name, []) if vm.action != "DELETING"]
            for vm in live[self.groups[name] :]:
                vm.action = "DELETING"
            return 200, {}, json.dumps(OPERATION)
        if verb == "deleteInstances":
            gone = set(json.loads(request.body)["instances"])
            for vm in self.vms.get(name, []):
                if self._url(vm) in gone:
                    vm.action = "DELETING"
                    self.groups[name] -= 1  # deleteInstances lowers the target size with them
            return 200, {}, json.dumps(OPERATION)
        return 400, {}, json.dumps({"error": {"code": 400, "message": f"fake: no {verb}"}})

    def _aggregated(self, request):
        self._record(request)
        zones: dict[str, list] = {}
        for vm in (vm for vms in self.vms.values() for vm in vms):
            zones.setdefault(f"zones/{vm.zone}", []).append({
                "name": vm.name, "selfLink": self._url(vm), "creationTimestamp": vm.created,
                "machineType": f"{COMPUTE}/projects/{self.project}/zones/{vm.zone}/machineTypes/{vm.machine_type}",
            })  # fmt: skip
        return 200, {}, json.dumps({"items": {z: {"instances": i} for z, i in zones.items()}})

    # -- monitoring ---------------------------------------------------------------------
    def _series(self, request):
        _, query = self._record(request)
        sub = re.search(r'subscription_id = "([^"]+)"', query["filter"]).group(1)
        if sub not in self.undelivered:
            return 200, {}, json.dumps({})
        end = datetime.fromisoformat(query["interval.endTime"]) - timedelta(seconds=self.undelivered_lag_s)
        point = {"interval": {"endTime": end.strftime("%Y-%m-%dT%H:%M:%SZ")}, "value": {"int64Value": str(self.undelivered[sub])}}
        return 200, {}, json.dumps({"timeSeries": [{"points": [point]}]})

    def _create_series(self, request):
        _, _ = self._record(request)
        series = json.loads(request.body)["timeSeries"]
        if len(series) > 200:
            return self._error(400, "INVALID_ARGUMENT", "at most 200 time series per request")
        self.time_series += series
        return 200, {}, "{}"

    # -- firestore ----------------------------------------------------------------------
    def _doc(self, name: str) -> dict:
        stamp = (EPOCH + timedelta(microseconds=self.versions.get(name, 0))).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        return {"name": name, "fields": self.docs[name], "updateTime": stamp}

    @staticmethod
    def _error(code: int, status: str, message: str):
        return code, {}, json.dumps({"error": {"code": code, "message": message, "status": status}})

    def _precondition_failed(self, name: str, query: dict):
        exists = query.get("currentDocument.exists")
        if exists == "false" and name in self.docs:
            return self._error(409, "ALREADY_EXISTS", f"document already exists: {name}")
        if exists == "true" and name not in self.docs:
            return self._error(404, "NOT_FOUND", f"no document to update: {name}")
        if "currentDocument.updateTime" in query:
            given = datetime.fromisoformat(query["currentDocument.updateTime"])
            if name not in self.docs or given != EPOCH + timedelta(microseconds=self.versions.get(name, 0)):
                return self._error(400, "FAILED_PRECONDITION", "the document was changed since it was read")
        return None

    def _batch(self, verb: str, body: dict):
        """documents:batchWrite (each write applied or refused on its own, with its status) and
        documents:batchGet (a streamed JSON array: one found or missing entry per name)."""
        if verb == "commit":
            return self._commit(body["writes"])
        if verb == "batchGet":
            return 200, {}, json.dumps([{"found": self._doc(n)} if n in self.docs else {"missing": n}
                                        for n in body["documents"]])  # fmt: skip
        statuses, results = [], []
        for write in body["writes"]:
            name = write["update"]["name"]
            exists = write.get("currentDocument", {}).get("exists")
            if self.unavailable_writes:
                self.unavailable_writes -= 1
                statuses.append({"code": 14, "message": "fake: throttled"})
            elif exists is False and name in self.docs:
                statuses.append({"code": 6, "message": f"document already exists: {name}"})
            elif exists is True and name not in self.docs:
                statuses.append({"code": 5, "message": f"no document to update: {name}"})
            else:
                self.docs[name] = dict(write["update"].get("fields", {}))
                self.versions[name] = self.versions.get(name, 0) + 1
                statuses.append({})  # code 0 (OK) is the default, left out of JSON
                results.append({"updateTime": self._doc(name)["updateTime"]})
                continue
            results.append({})
        return 200, {}, json.dumps({"writeResults": results, "status": statuses})

    def _run_query(self, parent: str, query: dict):
        """documents:runQuery of one collection under `parent`, with at most one filter: equality,
        or at least a number (a streamed JSON array: one entry per document, in name order). As
        Firestore's, a range on numbers matches integers and doubles alike and nothing else."""
        (selector,) = query["from"]
        collection = f"{parent}/{selector['collectionId']}"
        test = query.get("where", {}).get("fieldFilter")
        ops = {"EQUAL": "eq", 5: "eq", "GREATER_THAN_OR_EQUAL": "ge", 4: "ge"}  # the client sends enums as numbers
        if test is not None and test["op"] not in ops:
            return self._error(400, "INVALID_ARGUMENT", f"the fake runs = and >= filters only (got {test['op']})")

        def number(value: dict | None) -> float | None:
            held = (value or {}).get("doubleValue", (value or {}).get("integerValue"))
            return None if held is None else float(held)

        def passes(fields: dict) -> bool:
            held = fields.get(test["field"]["fieldPath"])
            if ops[test["op"]] == "eq":
                return held == test["value"]
            return number(held) is not None and number(held) >= number(test["value"])

        found = [n for n in sorted(self.docs) if n.rsplit("/", 1)[0] == collection and (test is None or passes(self.docs[n]))]
        read = {"readTime": EPOCH.isoformat().replace("+00:00", "Z")}
        return 200, {}, json.dumps([{"document": self._doc(n), **read} for n in found] or [read])

    def _commit(self, writes: list[dict]):
        """documents:commit: every write's precondition holds, then all apply, or none does.
        Writes are updates (with a mask) or transforms (field increments and maximums)."""
        while self.before_write:  # another writer, in between our read and our write
            self.before_write.pop(0)()
        for write in writes:
            name = (write.get("update") or write["transform"])["document" if "transform" in write else "name"]
            given = write.get("currentDocument", {})
            query = {f"currentDocument.{k}": str(v).lower() if isinstance(v, bool) else v for k, v in given.items()}
            failed = self._precondition_failed(name, query)
            if failed:
                return failed
        for write in writes:
            if "transform" in write:
                name = write["transform"]["document"]
                fields = self.docs.setdefault(name, {})
                for t in write["transform"]["fieldTransforms"]:
                    if "maximum" in t:  # of a double given: a field not a number (or none) takes the value
                        held = fields.get(t["fieldPath"], {})
                        before = held.get("doubleValue", held.get("integerValue"))
                        given = float(t["maximum"]["doubleValue"])
                        fields[t["fieldPath"]] = {"doubleValue": given if before is None else max(float(before), given)}
                        continue
                    before = int(fields.get(t["fieldPath"], {}).get("integerValue", 0))
                    fields[t["fieldPath"]] = {"integerValue": str(before + int(t["increment"]["integerValue"]))}
            else:
                name, given = write["update"]["name"], write["update"].get("fields", {})
                current = self.docs.setdefault(name, {})
                for field_path in write.get("updateMask", {}).get("fieldPaths", list(given)):
                    if field_path in given:
                        current[field_path] = given[field_path]
                    else:
                        current.pop(field_path, None)
            self.versions[name] = self.versions.get(name, 0) + 1
        return 200, {}, json.dumps({"writeResults": [{} for _ in writes]})

    def _firestore(self, request):
        path, query = self._record(request)
        name = path.removeprefix("/v1/")
        if request.method == "POST":
            name, verb = name.rsplit(":", 1)
            if verb == "runQuery":
                return self._run_query(name, json.loads(request.body)["structuredQuery"])
            return self._batch(verb, json.loads(request.body))
        if request.method == "PATCH":
            while self.before_write:  # another writer, in between our read and our write
                self.before_write.pop(0)()
            failed = self._precondition_failed(name, query)
            if failed:
                return failed
            given = json.loads(request.body).get("fields", {})
            mask = parse_qs(urlparse(request.url).query).get("updateMask.fieldPaths")
            if mask is None:  # no mask: the document is replaced
                self.docs[name] = dict(given)
            else:
                current = self.docs.setdefault(name, {})
                for field_path in mask:
                    if field_path in given:
                        current[field_path] = given[field_path]
                    else:
                        current.pop(field_path, None)
            self.versions[name] = self.versions.get(name, 0) + 1
            return 200, {}, json.dumps(self._doc(name))
        if request.method == "DELETE":
            self.docs.pop(name, None)
            return 200, {}, "{}"
        if name in self.docs:
            return 200, {}, json.dumps(self._doc(name))
        children = [self._doc(n) for n in sorted(self.docs) if n.rsplit("/", 1)[0] == name]
        if children or name.count("/") % 2 == 1:  # a collection: an even number of path segments
            return 200, {}, json.dumps({"documents": children})
        return self._error(404, "NOT_FOUND", "document not found")

    # -- pub/sub --------------------------------------------------------------------------
    def add_queue(self, name: str, *, ack_deadline_s: int = 60, max_delivery_attempts: int = 5) -> None:
        """A topic and subscription `name` with a dead-letter topic and subscription `name-dlq`,
        as stacks/gcp/messaging declares them."""
        self.subscriptions[f"{name}-dlq"] = FakeSubscription(f"{name}-dlq", ack_deadline_s=60)
        self.subscriptions[name] = FakeSubscription(name, ack_deadline_s, max_delivery_attempts, f"{name}-dlq")

    def add_topic(self, topic: str) -> None:
        self.published.setdefault(topic, [])

    def publish(self, topic: str, body: bytes) -> str:
        """The message's id: one per published message, the same in every subscription (as Pub/Sub)."""
        self.published.setdefault(topic, []).append(body)
        message_id = str(next(IDS))
        for sub in self.subscriptions.values():
            if sub.topic == topic:
                sub.messages.append(FakeMessage(message_id, body, published_at=self.now()))
        return message_id

    def _expire(self, sub: FakeSubscription) -> None:
        """Pub/Sub drops a message its retention after the publish, whatever its ack state."""
        if sub.retention_s is None:
            return
        gone = [m for m in sub.messages if self.now() - m.published_at >= sub.retention_s]
        sub.messages = [m for m in sub.messages if m not in gone]
        self.expired += [m.id for m in gone]

    def bodies(self, subscription: str) -> list[bytes]:
        """What waits in a subscription (delivered or not), oldest first."""
        with self.lock:
            self._expire(self.subscriptions[subscription])
            return [m.data for m in self.subscriptions[subscription].messages]

    def _pubsub(self, request):
        path, _ = self._record(request)
        kind, name, verb = re.search(r"/(subscriptions|topics)/([^/:]+)(?::(\w+))?$", path).groups()
        body = json.loads(request.body) if request.body else {}
        if kind == "topics":
            if name not in self.published and not any(s.topic == name for s in self.subscriptions.values()):
                return self._error(404, "NOT_FOUND", f"Resource not found (resource={name}).")
            messages = body.get("messages", [])
            if self.short_publishes:
                self.short_publishes -= 1
                messages = messages[:-1]
            ids = [self.publish(name, base64.b64decode(m.get("data", ""))) for m in messages]
            return 200, {}, json.dumps({"messageIds": ids})
        sub = self.subscriptions.get(name)
        if sub is None:
            return self._error(404, "NOT_FOUND", f"Resource not found (resource={name}).")
        if verb is None:
            return 200, {}, json.dumps({"name": f"projects/{self.project}/subscriptions/{name}",
                                        "topic": f"projects/{self.project}/topics/{sub.topic}",
                                        "ackDeadlineSeconds": sub.ack_deadline_s})  # fmt: skip
        now = self.now()
        self._expire(sub)
        if verb == "pull":
            return 200, {}, json.dumps({"receivedMessages": self._deliver(sub, int(body.get("maxMessages", 1)), now)})
        held = {m.ack_id: m for m in sub.messages if m.ack_id in body.get("ackIds", [])}
        if verb == "acknowledge":
            sub.messages = [m for m in sub.messages if m.ack_id not in held]
        elif verb == "modifyAckDeadline":
            for m in held.values():
                m.visible_at = now + int(body.get("ackDeadlineSeconds", 0))
        else:
            return self._error(400, "INVALID_ARGUMENT", f"fake: no {verb}")
        return 200, {}, "{}"

    def _deliver(self, sub: FakeSubscription, most: int, now: float) -> list[dict]:
        out = []
        for m in list(sub.messages):
            if len(out) == most or m.visible_at > now:
                continue
            if sub.dead_letter and m.deliveries >= sub.max_delivery_attempts:
                sub.messages.remove(m)  # Pub/Sub forwards it instead of delivering it again
                self.publish(sub.dead_letter, m.data)
                continue
            m.deliveries += 1
            m.ack_id = f"ack-{next(IDS)}"
            m.visible_at = now + sub.ack_deadline_s
            received = {"ackId": m.ack_id, "message": {"data": base64.b64encode(m.data).decode(), "messageId": m.id}}
            if sub.dead_letter:  # deliveryAttempt is only set on subscriptions with a dead-letter policy
                received["deliveryAttempt"] = m.deliveries
            out.append(received)
        return out

    # -- logging --------------------------------------------------------------------------
    def _logging(self, request):
        path, _ = self._record(request)
        body = json.loads(request.body)
        if path.endswith(":write"):
            for entry in body["entries"]:
                self.log_entries.append({"logName": body.get("logName"), **entry,
                                         "labels": {**body.get("labels", {}), **entry.get("labels", {})}})  # fmt: skip
            return 200, {}, "{}"
        if self.read_refusals:
            self.read_refusals -= 1
            return self._error(429, "RESOURCE_EXHAUSTED", "Quota exceeded for quota metric 'Read requests'")
        wanted = dict(re.findall(r'labels\.(\w+)="([^"]*)"', body["filter"]))
        log_name = re.search(r'logName="([^"]+)"', body["filter"]).group(1)
        found = [e for e in self.log_entries if e["logName"] == log_name
                 and all(e["labels"].get(k) == v for k, v in wanted.items())
                 and ("textPayload" in e or "textPayload:*" not in body["filter"])]  # fmt: skip
        start = int(body.get("pageToken") or 0)
        page = {"entries": found[start : start + self.log_page]}
        if start + self.log_page < len(found):
            page["nextPageToken"] = str(start + self.log_page)
        return 200, {}, json.dumps(page)

    # -- cloud storage ----------------------------------------------------------------------
    def _bucket(self, request):
        """Every artifacts bucket exists (the stack creates it)."""
        name = urlparse(request.url).path.rsplit("/", 1)[1]
        self.calls.append((request.method, urlparse(request.url).path, {"query": {}, "body": None, "content_type": None}))
        return 200, {}, json.dumps({"name": name})

    def _upload(self, request):
        url = urlparse(request.url)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        self.calls.append((request.method, url.path, {"query": query, "body": None,
                                                      "content_type": request.headers.get("Content-Type")}))  # fmt: skip
        bucket = re.search(r"/b/([^/]+)/o$", url.path).group(1)
        if query.get("uploadType") != "media" or "name" not in query:
            return self._error(400, "INVALID_ARGUMENT", "fake: only uploadType=media with a name")
        self.objects[f"{bucket}/{query['name']}"] = request.body
        return 200, {}, json.dumps({"bucket": bucket, "name": query["name"]})


IDS = itertools.count(1)


@dataclass
class FakeMessage:
    id: str
    data: bytes
    deliveries: int = 0
    ack_id: str = ""
    visible_at: float = 0.0
    published_at: float = 0.0  # FakeGcp.now() at its publish


@dataclass
class FakeSubscription:
    topic: str
    ack_deadline_s: int = 60
    max_delivery_attempts: int = 0
    dead_letter: str = ""  # topic
    messages: list[FakeMessage] = field(default_factory=list)
    retention_s: float | None = None  # message_retention_duration; None: kept until acked
