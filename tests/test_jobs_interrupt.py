"""Ctrl-C during `tidefleet submit` when the endpoint stalls or is slow: it says at once what it
waits for, a second Ctrl-C leaves at once, and the last line counts what was sent, chunks that
finished after the Ctrl-C included, and the chunks it left unconfirmed. A real subprocess and
SIGINT, boto3 through a proxy on loopback in front of the moto server that holds (or delays)
every BatchWriteItem."""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from agent_harness import Harness
from ctrl_c import as_at_a_terminal

from tidefleet.jobs import sdk

CHUNK = 10
ITEMS = 4 * CHUNK  # four chunks, all in flight at once (THREADS is 8)
# The CLI with small chunks, so a few items make several chunks.
CLI = f"import sys; from tidefleet.jobs import sdk; sdk.CHUNK = {CHUNK}; from tidefleet.cli import main; main(sys.argv[1:])"


@contextlib.contextmanager
def proxy(upstream: str, *, hold_s: float) -> Iterator[tuple[str, queue.Queue]]:
    """Forwards everything to `upstream`, each BatchWriteItem only after `hold_s` (or never, while
    the test runs, when that is longer). Yields its URL and a queue told of each one held."""
    held: queue.Queue[None] = queue.Queue()
    released = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.headers.get("X-Amz-Target", "").endswith("BatchWriteItem"):
                held.put(None)
                if released.wait(hold_s):  # the test is over
                    return
            headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
            request = urllib.request.Request(upstream + self.path, data=body, method=self.command, headers=headers)
            try:
                with urllib.request.urlopen(request, timeout=30) as answer:
                    code, data, answer_headers = answer.status, answer.read(), answer.headers
            except urllib.error.HTTPError as err:
                code, data, answer_headers = err.code, err.read(), err.headers
            self.send_response(code)
            for key, value in answer_headers.items():
                if key.lower() not in ("content-length", "transfer-encoding", "connection", "server", "date"):
                    self.send_header(key, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", held
    finally:
        released.set()
        server.shutdown()
        server.server_close()


class Submit:
    """`tidefleet submit` in a child process; its stderr, line by line."""

    def __init__(self, h: Harness, endpoint: str, items_file: str):
        env = {**os.environ, "AWS_ENDPOINT_URL": endpoint, "TIDEFLEET_KICK_URL": "http://127.0.0.1:9/"}
        self.process = subprocess.Popen(
            as_at_a_terminal([sys.executable, "-c", CLI, "submit", "--env", str(h.env_path), "--name", "slow", "--queue",
                              "work", "--items", items_file]),
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: [self.lines.put(line.rstrip("\n")) for line in self.process.stderr],
                         daemon=True).start()  # fmt: skip

    def line(self, within_s: float) -> str:
        try:
            return self.lines.get(timeout=within_s)
        except queue.Empty:
            pytest.fail(f"no line on stderr within {within_s} s")

    def interrupt(self) -> None:
        self.process.send_signal(signal.SIGINT)

    def exit_code(self, within_s: float) -> int:
        try:
            return self.process.wait(within_s)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running {within_s} s later")


@pytest.fixture
def h(tmp_path, aws, monkeypatch):
    monkeypatch.setattr(sdk, "CHUNK", CHUNK)
    return Harness(tmp_path, aws)


@pytest.fixture
def items_file(tmp_path) -> str:
    path = tmp_path / "items.txt"
    path.write_text("".join(f"s3://b/{i}\n" for i in range(ITEMS)))
    return str(path)


def resubmitted(h: Harness, items_file: str) -> sdk.Submitted:
    """The same submit again, straight to the emulator: it finishes what the stopped one left."""
    return sdk.submit(h.env, "slow", "work", sdk.read_items(items_file), kick=False)


def test_ctrl_c_on_a_stalled_endpoint_says_what_it_waits_for_and_a_second_leaves_at_once(h, items_file):
    with proxy(h.aws.url, hold_s=600) as (endpoint, held):
        submit = Submit(h, endpoint, items_file)
        job_line = submit.line(within_s=60)
        assert job_line.startswith("job slow-") and f"sending {ITEMS} item(s) to work" in job_line
        held.get(timeout=30)  # the first chunk's records reached the endpoint
        submit.interrupt()
        stopping = submit.line(within_s=5)
        assert stopping.startswith(f"stopping: 0 item(s) sent so far; waiting up to {sdk.STOP_WAIT_S:g} s for ")
        assert stopping.endswith("chunk(s) in flight; Ctrl-C again to leave now")
        chunks = int(stopping.split(" chunk(s)")[0].rsplit(" ", 1)[1])
        submit.interrupt()
        assert submit.exit_code(within_s=5) == 130
        job_id = job_line.split()[1].rstrip(":")
        assert submit.line(within_s=5) == (f"interrupted: job {job_id}: at least 0 of {ITEMS} item(s) confirmed sent, "
                                           f"{chunks} chunk(s) still in flight unconfirmed; run the same command again: "
                                           "it continues the job")  # fmt: skip
    again = resubmitted(h, items_file)
    assert again.sent == ITEMS and h.queue_depth("work") == ITEMS, "nothing lost, nothing twice"


def test_ctrl_c_counts_the_chunks_that_finished_while_it_waited(h, items_file):
    with proxy(h.aws.url, hold_s=5) as (endpoint, held):
        submit = Submit(h, endpoint, items_file)
        job_id = submit.line(within_s=60).split()[1].rstrip(":")
        for _ in range(ITEMS // CHUNK):  # every chunk in flight (chunks not started yet are dropped)
            held.get(timeout=30)
        submit.interrupt()
        assert submit.line(within_s=5).startswith(f"stopping: 0 item(s) sent so far; waiting up to {sdk.STOP_WAIT_S:g} s "
                                                  f"for {ITEMS // CHUNK} chunk(s) in flight")  # fmt: skip
        assert submit.exit_code(within_s=sdk.STOP_WAIT_S + 10) == 130
        assert submit.line(within_s=5).startswith(f"interrupted: job {job_id}: at least {ITEMS} of {ITEMS} item(s) sent")
    again = resubmitted(h, items_file)
    assert again.sent == 0 and h.queue_depth("work") == ITEMS, "every chunk was sent and marked before it left"
    assert not sdk.status(h.env, job_id).submitting
