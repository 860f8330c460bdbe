"""A fake of the few Google Cloud REST endpoints the GCP adapters call, behind the `responses`
library: the REAL google-cloud-compute / firestore GAPIC clients and google-auth sessions
build and send the requests; this answers them from in-memory state and records each one.

No local emulator exists for Compute Engine or Cloud Monitoring (and the Firestore emulator
needs Java and gcloud), so this is the narrowest honest seam: everything above HTTP is real.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlparse

import responses

COMPUTE = "https://compute.googleapis.com/compute/v1"
FIRESTORE = "https://firestore.googleapis.com/v1"
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
    docs: dict[str, dict] = field(default_factory=dict)  # document name -> fields (REST JSON)
    calls: list[tuple[str, str, dict | None]] = field(default_factory=list)  # method, path+query, body

    def _url(self, vm: FakeVm) -> str:
        return f"{COMPUTE}/projects/{self.project}/zones/{vm.zone}/instances/{vm.name}"

    def install(self, mock: responses.RequestsMock) -> None:
        igm = re.compile(rf"{COMPUTE}/projects/{self.project}/regions/{self.region}/instanceGroupManagers/([^/?]+)(/\w+)?")
        mock.add_callback(responses.GET, igm, callback=self._igm)
        mock.add_callback(responses.POST, igm, callback=self._igm)
        mock.add_callback(responses.GET, re.compile(rf"{COMPUTE}/projects/{self.project}/aggregated/instances"),
                          callback=self._aggregated)  # fmt: skip
        mock.add_callback(responses.GET, re.compile(r"https://monitoring.googleapis.com/v3/.*"), callback=self._series)
        docs = re.compile(rf"{FIRESTORE}/(projects/.+)")
        for method in (responses.GET, responses.PATCH, responses.DELETE):
            mock.add_callback(method, docs, callback=self._firestore)

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
        point = {"interval": {"endTime": query["interval.endTime"]}, "value": {"int64Value": str(self.undelivered[sub])}}
        return 200, {}, json.dumps({"timeSeries": [{"points": [point]}]})

    # -- firestore ----------------------------------------------------------------------
    def _firestore(self, request):
        path, _ = self._record(request)
        name = path.removeprefix("/v1/")
        if request.method == "PATCH":
            mask = parse_qs(urlparse(request.url).query).get("updateMask.fieldPaths", [])
            current = self.docs.setdefault(name, {})
            given = json.loads(request.body).get("fields", {})
            for field_path in mask:
                if field_path in given:
                    current[field_path] = given[field_path]
                else:
                    current.pop(field_path, None)
            return 200, {}, json.dumps({"name": name, "fields": current})
        if request.method == "DELETE":
            self.docs.pop(name, None)
            return 200, {}, "{}"
        if name in self.docs:
            return 200, {}, json.dumps({"name": name, "fields": self.docs[name]})
        children = [{"name": n, "fields": f} for n, f in sorted(self.docs.items()) if n.rsplit("/", 1)[0] == name]
        if children or name.count("/") % 2 == 1:  # a collection: an even number of path segments
            return 200, {}, json.dumps({"documents": children})
        return 404, {}, json.dumps({"error": {"code": 404, "message": "document not found", "status": "NOT_FOUND"}})
