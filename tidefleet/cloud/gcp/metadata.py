"""GCE metadata server: the Spot preemption signal, for the agent's metadata watch.

Drop-in for `tidefleet.cloud.aws.imds.Metadata` (same `notice()`), so a preemption takes the
agent's one stop-intake / checkpoint / hand-back path. GCE gives a Spot VM about 30 seconds:
the agent's grace on GCP stays well inside that (`GRACE_S` in tidefleet.cloud.gcp). The base URL comes
from TIDEFLEET_IMDS_URL so tests and the sandbox can serve their own; no metadata server
(a laptop) means no notice, never a crash.
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request

from tidefleet.ports import Notice

DEFAULT_URL = "http://metadata.google.internal"
PREEMPTED = "/computeMetadata/v1/instance/preempted"
NOTICE_S = 30


class GceMetadata:
    def __init__(self, base_url: str | None = None, timeout_s: float = 1.0):
        self.base_url = (base_url or os.environ.get("TIDEFLEET_IMDS_URL") or DEFAULT_URL).rstrip("/")
        self.timeout_s = timeout_s

    def get(self, path: str) -> str | None:
        """Body of a 200; None for any error or an unreachable server."""
        request = urllib.request.Request(self.base_url + path, headers={"Metadata-Flavor": "Google"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return response.read().decode()
        except (urllib.error.HTTPError, OSError):
            return None

    def identity(self) -> tuple[str | None, str | None, bool]:
        """(instance name, machine type, spot), as `Metadata.identity`. The name is the node id:
        the scaler deletes instances and reads heartbeats by it."""
        machine = self.get("/computeMetadata/v1/instance/machine-type")  # projects/<n>/machineTypes/<type>
        model = self.get("/computeMetadata/v1/instance/scheduling/provisioning-model")
        return self.get("/computeMetadata/v1/instance/name"), machine.rsplit("/", 1)[-1] if machine else None, model != "STANDARD"

    def address(self) -> str | None:
        return self.get("/computeMetadata/v1/instance/network-interfaces/0/ip")

    def notice(self) -> Notice | None:
        if (self.get(PREEMPTED) or "").strip().upper() == "TRUE":
            return Notice(f"spot preemption notice (GCE gives about {NOTICE_S}s)")
        return None
