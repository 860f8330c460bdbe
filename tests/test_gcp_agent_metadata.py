"""The agent's GCE preemption watch against a real HTTP metadata server on loopback."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tidefleet.cloud.gcp.metadata import PREEMPTED, GceMetadata


@pytest.fixture
def metadata_server():
    state = {"preempted": "FALSE", "headers": []}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            state["headers"].append(self.headers.get("Metadata-Flavor"))
            if self.path != PREEMPTED or self.headers.get("Metadata-Flavor") != "Google":
                self.send_response(403 if self.path == PREEMPTED else 404)
                self.end_headers()
                return
            body = state["preempted"].encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}", state
    server.shutdown()


def test_no_notice_until_the_vm_is_preempted_then_a_notice(metadata_server):
    url, state = metadata_server
    metadata = GceMetadata(url)
    assert metadata.notice() is None
    state["preempted"] = "TRUE"
    notice = metadata.notice()
    assert notice is not None and "preemption" in notice.reason and not notice.lifecycle
    assert set(state["headers"]) == {"Google"}, "the metadata server refuses requests without Metadata-Flavor"


def test_no_metadata_server_means_no_notice_never_a_crash():
    assert GceMetadata("http://127.0.0.1:9", timeout_s=0.2).notice() is None


def _identity_server(answers: dict[str, tuple[int, str]], down_for: int = 0):
    """A metadata server answering `answers` {path: (status, body)} (404 for the rest), after
    refusing its first `down_for` requests with 503."""
    seen = {"requests": 0}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            seen["requests"] += 1
            status, body = (503, "") if seen["requests"] <= down_for else answers.get(self.path, (404, ""))
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, seen


BASE = "/computeMetadata/v1/instance"
ON_DEMAND = {f"{BASE}/name": (200, "vm-1"), f"{BASE}/machine-type": (200, "projects/1/machineTypes/n2-standard-4")}


@pytest.mark.parametrize(
    "scheduling, spot",
    [
        ({f"{BASE}/scheduling/provisioning-model": (200, "STANDARD")}, False),
        ({f"{BASE}/scheduling/provisioning-model": (200, "SPOT")}, True),
        ({f"{BASE}/scheduling/preemptible": (200, "FALSE")}, False),  # no provisioning model: preemptible says
        ({f"{BASE}/scheduling/preemptible": (200, "TRUE")}, True),
        ({}, True),  # neither: Spot, the cautious side
    ],
)
def test_spot_is_the_provisioning_model_else_preemptible_else_spot(scheduling, spot):
    server, _ = _identity_server(ON_DEMAND | scheduling)
    try:
        assert GceMetadata(f"http://127.0.0.1:{server.server_port}").identity() == ("vm-1", "n2-standard-4", spot)
    finally:
        server.shutdown()


def test_an_on_demand_node_whose_metadata_server_is_not_up_yet_at_boot_is_not_read_as_spot(monkeypatch):
    """The audit: one failed read made an on-demand node Spot for its life, and it left the items
    that wait for on-demand capacity for ever."""
    from tidefleet.cloud.gcp import metadata

    monkeypatch.setattr(metadata, "IDENTITY_PAUSE_S", 0.01)
    server, seen = _identity_server(ON_DEMAND | {f"{BASE}/scheduling/provisioning-model": (200, "STANDARD")}, down_for=3)
    try:
        assert GceMetadata(f"http://127.0.0.1:{server.server_port}").identity() == ("vm-1", "n2-standard-4", False)
    finally:
        server.shutdown()
    assert seen["requests"] == 3 + 3


def test_with_no_metadata_server_at_all_only_the_first_read_is_tried_again(monkeypatch):
    """An agent run off GCE (a laptop) waits one read's tries, not every read's."""
    from tidefleet.cloud.gcp import metadata

    monkeypatch.setattr(metadata, "IDENTITY_PAUSE_S", 0.01)
    reads: list[str] = []
    gce = GceMetadata("http://127.0.0.1:9")
    monkeypatch.setattr(gce, "_read", lambda path: (reads.append(path), (False, None))[1])
    assert gce.identity() == (None, None, True)
    assert len(reads) == metadata.IDENTITY_TRIES + 3
