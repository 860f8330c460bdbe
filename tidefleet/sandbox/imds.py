"""Instance metadata for sandbox nodes: the part of EC2's IMDS the agent reads.

One threaded HTTP server on loopback answers for every node under its own path prefix,
so a node's `TIDEFLEET_IMDS_URL` is `http://127.0.0.1:PORT/<instance-id>` and the agent
appends the usual `/latest/...` paths. IMDSv2 as on EC2: PUT a token first, then send it
with every GET; a missing or wrong token is 401. The spot notice is 404 until one is sent.
"""

from __future__ import annotations

import json
import secrets
import sys
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TOKEN_PATH = "/latest/api/token"


@dataclass
class NodeMetadata:
    instance_id: str
    instance_type: str
    life_cycle: str  # "spot" or "on-demand"
    availability_zone: str
    token: str
    spot_action: dict | None = None  # {"action": "terminate", "time": ISO-8601} once noticed
    target_lifecycle_state: str = "InService"

    def answer(self, path: str) -> str | None:
        """The body for a metadata path, or None for 404."""
        fixed = {
            "/latest/meta-data/instance-id": self.instance_id,
            "/latest/meta-data/instance-type": self.instance_type,
            "/latest/meta-data/instance-life-cycle": self.life_cycle,
            "/latest/meta-data/placement/availability-zone": self.availability_zone,
            "/latest/meta-data/placement/region": self.availability_zone[:-1],
            "/latest/meta-data/autoscaling/target-lifecycle-state": self.target_lifecycle_state,
            "/latest/meta-data/local-ipv4": "127.0.0.1",  # every sandbox node is a process on this machine
        }
        if path == "/latest/meta-data/spot/instance-action":
            return json.dumps(self.spot_action) if self.spot_action else None
        return fixed.get(path)


class LoopbackServer(ThreadingHTTPServer):
    """The sandbox's servers (metadata, kicks). A client gone before its answer is written (a node
    killed by Ctrl-C or --chaos) is no error: socketserver printed its traceback over the live view."""

    def handle_error(self, request, client_address) -> None:
        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)


class MetadataServer:
    def __init__(self) -> None:
        self._nodes: dict[str, NodeMetadata] = {}
        self._lock = threading.Lock()
        self._http = LoopbackServer(("127.0.0.1", 0), _handler_for(self))
        self._http.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._http.server_address[1]}"
        self._thread = threading.Thread(target=self._http.serve_forever, name="imds", daemon=True)

    def start(self) -> MetadataServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._http.shutdown()
        self._http.server_close()

    def add(self, instance_id: str, instance_type: str, *, spot: bool, availability_zone: str) -> str:
        """Serve metadata for a new node; returns its base URL."""
        with self._lock:
            self._nodes[instance_id] = NodeMetadata(
                instance_id,
                instance_type,
                "spot" if spot else "on-demand",
                availability_zone,
                secrets.token_hex(16),
            )
        return f"{self.url}/{instance_id}"

    def remove(self, instance_id: str) -> None:
        with self._lock:
            self._nodes.pop(instance_id, None)

    def send_spot_notice(self, instance_id: str, *, in_s: float = 120.0) -> None:
        """What EC2 posts two minutes before it reclaims a spot instance."""
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + in_s))
        with self._lock:
            self._nodes[instance_id].spot_action = {"action": "terminate", "time": when}

    def set_target_lifecycle_state(self, instance_id: str, state: str) -> None:
        with self._lock:
            if instance_id in self._nodes:
                self._nodes[instance_id].target_lifecycle_state = state

    def node(self, instance_id: str) -> NodeMetadata | None:
        with self._lock:
            return self._nodes.get(instance_id)


def _handler_for(server: MetadataServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _route(self) -> tuple[NodeMetadata | None, str]:
            _, node_id, rest = (self.path.split("?")[0] + "/").split("/", 2)
            return server.node(node_id), "/" + rest.rstrip("/")

        def _send(self, code: int, body: str = "") -> None:
            data = body.encode()
            self.send_response(code)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_PUT(self) -> None:
            node, path = self._route()
            if node is None or path != TOKEN_PATH:
                return self._send(404)
            if not self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                return self._send(400, "X-aws-ec2-metadata-token-ttl-seconds is required")
            self._send(200, node.token)

        def do_GET(self) -> None:
            node, path = self._route()
            if node is None:
                return self._send(404)
            if self.headers.get("X-aws-ec2-metadata-token") != node.token:
                return self._send(401)
            body = node.answer(path)
            self._send(404) if body is None else self._send(200, body)

        def log_message(self, *args) -> None:  # the live view owns the terminal
            pass

    return Handler
