"""One attempt's output on its way to the cloud's log service: buffered, retried, never failing
the item. Both clouds' `ItemLogs` adapters hand a `send(batch)` to a `BufferedStream`."""

from __future__ import annotations

import logging
import threading
import time

log = logging.getLogger("tidefleet.agent")
LOG_FLUSH_S = 1.0


def stream_name(job: str, item: str, attempt: int) -> str:
    return f"{job}/{item}/{attempt}"


def stream_order(stream: str) -> tuple:
    _job, item, attempt = (stream.split("/") + ["", "", ""])[:3]
    return (item, int(attempt) if attempt.isdigit() else 0)


def cloudwatch_event_bytes(line: str) -> int:
    """What one line counts toward a PutLogEvents batch: its UTF-8 bytes plus 26 per event."""
    return len(line.encode(errors="replace")) + 26


class BufferedStream:
    """One attempt's output, sent in batches by `send(batch)`. Shipping logs never fails the
    item: a failed send keeps its lines for the next flush, and past `MAX_BUFFERED` lines the
    oldest are dropped and counted (`dropped`). `write` and `flush` never raise.
    A batch holds at most `MAX_BATCH_LINES` lines and `batch_bytes` bytes as `event_bytes` counts
    them: a batch over the service's size limit would fail on every retry. The defaults are
    CloudWatch's (PutLogEvents: 1,048,576 bytes); GCP's adapter passes its own."""

    MAX_BUFFERED = 10_000
    MAX_BATCH_LINES = 500
    MAX_LINE_CHARS = 16_000

    def __init__(self, name: str, send, *, batch_bytes: int = 1_048_576, event_bytes=cloudwatch_event_bytes):
        self.name, self._send = name, send
        self.batch_bytes, self.event_bytes = batch_bytes, event_bytes
        self.lock = threading.Lock()
        self.buffer: list[tuple[float, str]] = []
        self.flushed_at = time.monotonic()
        self.dropped = 0
        self.failures = 0

    def write(self, line: str) -> None:
        with self.lock:
            self.buffer.append((time.time(), line[: self.MAX_LINE_CHARS] or " "))
            if len(self.buffer) > self.MAX_BUFFERED:
                del self.buffer[0]
                self.dropped += 1
            due = len(self.buffer) >= self.MAX_BATCH_LINES or time.monotonic() - self.flushed_at >= LOG_FLUSH_S
        if due:
            self.flush()

    def _next_batch(self) -> list[tuple[float, str]]:
        """The oldest lines that fit one batch (at least one line)."""
        size = 0
        for n, (_, line) in enumerate(self.buffer[: self.MAX_BATCH_LINES]):
            size += self.event_bytes(line)
            if size > self.batch_bytes and n > 0:
                return self.buffer[:n]
        return self.buffer[: self.MAX_BATCH_LINES]

    def flush(self) -> None:
        self._send_batch()

    def _send_batch(self) -> bool:
        """Send one batch; False when the send failed."""
        with self.lock:
            batch = self._next_batch()
            self.flushed_at = time.monotonic()
            if not batch:
                return True
            try:
                self._send(batch)
            except Exception as err:  # noqa: BLE001 - any failure: keep the lines, try again next flush
                self.failures += 1
                if self.failures == 1:
                    log.warning("item log %s: send failed (%s); keeping the lines to retry",
                                self.name, str(err).splitlines()[0][:200] if str(err) else type(err).__name__)
                return False
            del self.buffer[: len(batch)]
            return True

    def close(self) -> None:
        """Last flushes at the end of the attempt, as many batches as it takes while sends succeed;
        after 3 failed sends, what is left is counted as dropped."""
        failed = 0
        while self.buffer and failed < 3:
            failed += not self._send_batch()
        with self.lock:
            self.dropped += len(self.buffer)
            self.buffer = []
        if self.dropped:
            log.warning("item log %s: %d line(s) dropped (the log endpoint kept failing)", self.name, self.dropped)
