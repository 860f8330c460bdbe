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
