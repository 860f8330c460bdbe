"""The embedded AWS: a moto server on 127.0.0.1, as a child process.

Used by the sandbox and the integration tests. boto3 code is the product's own; only the
endpoint differs (`AWS_ENDPOINT_URL`, honoured natively by boto3).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

FAKE_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
}


# moto's server, less werkzeug's line per request: its log keeps what went wrong (a failed request's
# traceback, a crash), not every call the agents make.
_MOTO = ("import logging, sys; logging.getLogger('werkzeug').setLevel(logging.WARNING); "
         "from moto.server import main; main(sys.argv[1:])")  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class MotoServer:
    url: str
    process: subprocess.Popen
    log: Path | None = None  # its stdout and stderr; None: discarded

    def exited(self) -> str | None:
        """None while it runs; else how it ended, in words ("was killed by SIGKILL")."""
        code = self.process.poll()
        if code is None:
            return None
        if code < 0:
            name = signal.Signals(-code).name if -code in signal.valid_signals() else f"signal {-code}"
            return f"was killed by {name}" + (" (out of memory? see dmesg)" if code == -signal.SIGKILL else "")
        return f"exited with code {code}"

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


def start_moto(port: int | None = None, timeout_s: float = 30.0, log: Path | None = None) -> MotoServer:
    """log: a file for the server's output (appended), where its errors and its end are kept."""
    port = port or free_port()
    url = f"http://127.0.0.1:{port}"
    out = open(log, "ab") if log is not None else subprocess.DEVNULL  # noqa: SIM115 - the child keeps its copy
    try:
        process = subprocess.Popen(
            [sys.executable, "-c", _MOTO, "-H", "127.0.0.1", "-p", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT if log is not None else subprocess.DEVNULL,
            env={**os.environ, **FAKE_CREDENTIALS},
        )
    finally:
        if log is not None:
            out.close()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            see = f"; see {log}" if log is not None else ""
            raise RuntimeError(f"moto server exited at start (code {process.returncode}); is moto[server] installed?{see}")
        try:
            urllib.request.urlopen(f"{url}/moto-api/", timeout=1).close()
            return MotoServer(url=url, process=process, log=log)
        except OSError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"moto server did not answer on {url} within {timeout_s:.0f}s")
