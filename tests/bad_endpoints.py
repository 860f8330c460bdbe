"""Wrong things a user may give as AWS_ENDPOINT_URL, served on loopback by threads of the test:
a web server that answers an empty 202 (the sandbox's kick URL), one that serves HTML pages (an
error page for POST, like `python -m http.server`), and a port that takes the connection and
never answers (a paused emulator)."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class _Empty(BaseHTTPRequestHandler):
    body = b""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(202 if not self.body else 200)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    do_GET = do_PUT = do_HEAD = do_POST

    def log_message(self, *args) -> None:
        pass


class _Html(BaseHTTPRequestHandler):
    """Every method is unsupported: http.server's 501 page, a whole HTML document."""

    def log_message(self, *args) -> None:
        pass


@contextlib.contextmanager
def _http(handler) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def empty_answers() -> contextlib.AbstractContextManager[str]:
    return _http(_Empty)


def empty_objects() -> contextlib.AbstractContextManager[str]:
    """A 200 with `{}` to every call: well-formed JSON that no AWS call but a lookup of nothing gives."""
    return _http(type("EmptyObjects", (_Empty,), {"body": b"{}"}))


def html_pages() -> contextlib.AbstractContextManager[str]:
    return _http(_Html)


@contextlib.contextmanager
def silent() -> Iterator[str]:
    """Accepts every connection, reads nothing, answers nothing."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            held.append(conn)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        with contextlib.suppress(OSError):
            listener.shutdown(socket.SHUT_RDWR)  # wakes the accept
        listener.close()
        for conn in held:
            conn.close()


def aws_errors(code: str, message: str, status: int = 400) -> contextlib.AbstractContextManager[str]:
    """An endpoint that answers every call with AWS error `code` in the call's protocol: JSON
    (DynamoDB, SQS, Logs: `__type`) or XML (Auto Scaling, STS: an ErrorResponse), as AWS does
    for an expired token, a denied action or throttling."""

    class AwsError(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if "json" in (self.headers.get("Content-Type") or ""):
                body = json.dumps({"__type": f"com.amazonaws#{code}", "message": message}).encode()
                kind = "application/x-amz-json-1.0"
            else:
                body = (f"<ErrorResponse><Error><Type>Sender</Type><Code>{code}</Code><Message>{message}</Message>"
                        "</Error><RequestId>0</RequestId></ErrorResponse>").encode()
                kind = "text/xml"
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("x-amzn-RequestId", "0")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_PUT = do_POST

        def log_message(self, *args) -> None:
            pass

    return _http(AwsError)
