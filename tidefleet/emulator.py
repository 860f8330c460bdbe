"""The embedded AWS: a moto server on 127.0.0.1, as a child process.

Used by the sandbox and the integration tests. boto3 code is the product's own; only the
endpoint differs (`AWS_ENDPOINT_URL`, honoured natively by boto3).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass

FAKE_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class MotoServer:
    url: str
    process: subprocess.Popen

    def env(self, region: str = "us-east-1") -> dict[str, str]:
        """Variables that point boto3 (in this or a child process) at this server."""
        return {**FAKE_CREDENTIALS, "AWS_ENDPOINT_URL": self.url, "AWS_DEFAULT_REGION": region}

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_moto(port: int | None = None, timeout_s: float = 30.0) -> MotoServer:
    port = port or free_port()
    url = f"http://127.0.0.1:{port}"
    process = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, **FAKE_CREDENTIALS},
    )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"moto server exited at start (code {process.returncode}); is moto[server] installed?")
        try:
            urllib.request.urlopen(f"{url}/moto-api/", timeout=1).close()
            return MotoServer(url=url, process=process)
        except OSError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"moto server did not answer on {url} within {timeout_s:.0f}s")
