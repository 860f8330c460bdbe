"""GCE metadata server: the Spot preemption signal, for the agent's metadata watch.

Drop-in for `tidefleet.cloud.aws.imds.Metadata` (same `notice()`), so a preemption takes the
agent's one stop-intake / checkpoint / hand-back path. GCE gives a Spot VM about 30 seconds:
the agent's grace on GCP stays well inside that (`GRACE_S` in tidefleet.cloud.gcp). The base URL comes
from TIDEFLEET_IMDS_URL so tests and the sandbox can serve their own; no metadata server
(a laptop) means no notice, never a crash.
"""

from __future__ import annotations

import logging
import os
import time
import urllib.error
import urllib.request

from tidefleet.ports import Notice

DEFAULT_URL = "http://metadata.google.internal"
PREEMPTED = "/computeMetadata/v1/instance/preempted"
NOTICE_S = 30
# At boot the metadata server may not answer yet: its identity reads are tried this often, a pause apart.
IDENTITY_TRIES, IDENTITY_PAUSE_S = 6, 2.0

log = logging.getLogger(__name__)


class GceMetadata:
    def __init__(self, base_url: str | None = None, timeout_s: float = 1.0):
        self.base_url = (base_url or os.environ.get("TIDEFLEET_IMDS_URL") or DEFAULT_URL).rstrip("/")
        self.timeout_s = timeout_s
        self.unanswered = False  # an identity read went unanswered every try (`_at_boot`)

    def get(self, path: str) -> str | None:
        """Body of a 200; None for any error or an unreachable server."""
        return self._read(path)[1]

    def _read(self, path: str) -> tuple[bool, str | None]:
        """(whether the server answered, the body of a 200 else None)."""
        request = urllib.request.Request(self.base_url + path, headers={"Metadata-Flavor": "Google"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return True, response.read().decode()
        except urllib.error.HTTPError as err:
            return err.code < 500, None
        except OSError:
            return False, None

    def _at_boot(self, path: str) -> str | None:
        """`get`, tried again while the server does not answer (at boot, briefly): what the node is
        read once and kept for its life. Once a read went unanswered every try, the rest get one
        (no server: an agent run off GCE)."""
        tries = 1 if self.unanswered else IDENTITY_TRIES
        for attempt in range(tries):
            answered, body = self._read(path)
            if answered:
                return body
            if attempt < tries - 1:
                time.sleep(IDENTITY_PAUSE_S)
        self.unanswered = True
        return None

    def identity(self) -> tuple[str | None, str | None, bool]:
        """(instance name, machine type, spot), as `Metadata.identity`. The name is the node id:
        the scaler deletes instances and reads heartbeats by it. Spot from the provisioning model,
        else from `preemptible` (TRUE for Spot VMs too); neither read: Spot, as on AWS. An
        on-demand node read as Spot would leave the items that wait for on-demand capacity
        (`on_demand_after_interruptions`) for ever, so the reads are tried again while the server
        does not answer."""
        machine = self._at_boot("/computeMetadata/v1/instance/machine-type")  # projects/<n>/machineTypes/<type>
        model = self._at_boot("/computeMetadata/v1/instance/scheduling/provisioning-model")
        if model not in ("STANDARD", "SPOT"):
            preemptible = (self._at_boot("/computeMetadata/v1/instance/scheduling/preemptible") or "").strip().upper()
            model = {"FALSE": "STANDARD", "TRUE": "SPOT"}.get(preemptible)
        if model is None and not self.unanswered:  # off GCE (no server at all) there is nothing to say
            log.warning("the metadata server did not say whether this VM is Spot; taking it as Spot")
        return self._at_boot("/computeMetadata/v1/instance/name"), machine.rsplit("/", 1)[-1] if machine else None, model != "STANDARD"

    def address(self) -> str | None:
        return self.get("/computeMetadata/v1/instance/network-interfaces/0/ip")

    def notice(self) -> Notice | None:
        if (self.get(PREEMPTED) or "").strip().upper() == "TRUE":
            return Notice(f"spot preemption notice (GCE gives about {NOTICE_S}s)")
        return None
