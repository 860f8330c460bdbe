"""Instance metadata (IMDSv2): identity, and the two signals that a node is going away.

The base URL comes from TIDEFLEET_IMDS_URL so the sandbox and the tests can serve their own.
Every read is best-effort: no metadata service (a laptop) means no notice, never a crash.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request

from tidefleet.ports import Notice

DEFAULT_URL = "http://169.254.169.254"
TOKEN_TTL_S = 21600


class Metadata:
    def __init__(self, base_url: str | None = None, timeout_s: float = 1.0):
        self.base_url = (base_url or os.environ.get("TIDEFLEET_IMDS_URL") or DEFAULT_URL).rstrip("/")
        self.timeout_s = timeout_s
        self._token: str | None = None

    def _request(self, path: str, method: str = "GET", headers: dict | None = None) -> str | None:
        """Body of a 200, None for a 404 or an unreachable service."""
        request = urllib.request.Request(self.base_url + path, method=method, headers=headers or {})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return response.read().decode()
        except urllib.error.HTTPError as err:
            if err.code == 401:  # token expired: fetch a new one next time
                self._token = None
            return None
        except OSError:
            return None

    def get(self, path: str) -> str | None:
        if self._token is None:
            self._token = self._request(
                "/latest/api/token", "PUT", {"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL_S)}
            )
            if self._token is None:
                return None
        return self._request(path, headers={"X-aws-ec2-metadata-token": self._token})

    def identity(self) -> tuple[str | None, str | None, bool]:
        """(instance id, instance type, spot); None where unknown. An unknown lifecycle (no
        metadata service) counts as spot: the cautious assumption."""
        return (self.get("/latest/meta-data/instance-id"), self.get("/latest/meta-data/instance-type"),
                self.get("/latest/meta-data/instance-life-cycle") != "on-demand")  # fmt: skip

    def address(self) -> str | None:
        return self.get("/latest/meta-data/local-ipv4")

    def notice(self) -> Notice | None:
        """A spot interruption notice or a group termination, whichever is present."""
        action = self.get("/latest/meta-data/spot/instance-action")
        if action is not None:
            try:
                detail = json.loads(action)
                return Notice(f"spot interruption notice: {detail.get('action', '?')} at {detail.get('time', '?')}")
            except (json.JSONDecodeError, AttributeError):
                return Notice(f"spot interruption notice: {action[:100]!r}")
        if self.get("/latest/meta-data/autoscaling/target-lifecycle-state") == "Terminated":
            return Notice("the group is terminating this node (target lifecycle state Terminated)", lifecycle=True)
        return None
