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


class BufferedStream:
    """One attempt's output, sent in batches by `send(batch)`. Shipping logs never fails the
    item: a failed send keeps its lines for the next flush, and past `MAX_BUFFERED` lines the
    oldest are dropped and counted (`dropped`). `write` and `flush` never raise."""

    MAX_BUFFERED = 10_000

    def __init__(self, name: str, send):
        self.name, self._send = name, send
        self.lock = threading.Lock()
        self.buffer: list[tuple[float, str]] = []
        self.flushed_at = time.monotonic()
        self.dropped = 0
        self.failures = 0

    def write(self, line: str) -> None:
        with self.lock:
            self.buffer.append((time.time(), line[:16000] or " "))
            if len(self.buffer) > self.MAX_BUFFERED:
                del self.buffer[0]
                self.dropped += 1
            due = len(self.buffer) >= 500 or time.monotonic() - self.flushed_at >= LOG_FLUSH_S
        if due:
            self.flush()

    def flush(self) -> None:
        with self.lock:
            batch = self.buffer[:500]
            self.flushed_at = time.monotonic()
            if not batch:
                return
            try:
                self._send(batch)
            except Exception as err:  # noqa: BLE001 - any failure: keep the lines, try again next flush
                self.failures += 1
                if self.failures == 1:
                    log.warning("item log %s: send failed (%s); keeping the lines to retry",
                                self.name, str(err).splitlines()[0][:200] if str(err) else type(err).__name__)
                return
            del self.buffer[: len(batch)]

    def close(self) -> None:
        """Last flushes at the end of the attempt; what still cannot be sent is counted as dropped."""
        for _ in range(3):
            if not self.buffer:
                break
            self.flush()
        with self.lock:
            self.dropped += len(self.buffer)
            self.buffer = []
        if self.dropped:
            log.warning("item log %s: %d line(s) dropped (the log endpoint kept failing)", self.name, self.dropped)
