"""One attempt's output on its way to the cloud's log service: buffered, sent by a thread of its
own, never failing or holding up the item. Both clouds' `ItemLogs` adapters hand a `send(batch)`
to a `BufferedStream`."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from email.utils import parsedate_to_datetime
from itertools import islice

log = logging.getLogger("tidefleet.agent")
LOG_FLUSH_S = 1.0  # a line waits this long at most for others to share its batch
# The end of an attempt waits this long at most for its last lines: the attempt's slot (and a
# drain) wait on it, and a log service that is down would hold them for its every timeout.
CLOSE_S = 5.0
CLOSE_FAILURES = 3  # failed sends after which the end of an attempt gives up its last lines
RETRY_MAX_S = 30.0  # a failed send is tried again after 1, 2, 4, ... s, at most this long


def stream_name(job: str, item: str, attempt: int) -> str:
    return f"{job}/{item}/{attempt}"


def stream_order(stream: str) -> tuple:
    _job, item, attempt = (stream.split("/") + ["", "", ""])[:3]
    return (item, int(attempt) if attempt.isdigit() else 0)


def cloudwatch_event_bytes(line: str) -> int:
    """What one line counts toward a PutLogEvents batch: its UTF-8 bytes plus 26 per event."""
    return len(line.encode(errors="replace")) + 26


def cut_marker(count: int, *, at_least: bool = False) -> str:
    """What ends a line cut to fit one log event: `count` characters of it are not there (`at_least`:
    more were, cut before the line reached here)."""
    return f"… [tidefleet: {'at least ' if at_least else ''}{count:,} more characters cut]"


def cut_line(line: str, limit: int, *, cut_before: bool = False) -> str:
    """`line` in at most `limit` characters: a longer one is cut, its end saying how much was
    cut (`cut_marker`, counted at most the line's length: never longer than that room).
    `cut_before`: the line was cut already where it was read (the runner keeps a line's first
    64 KiB), so the count is a floor."""
    if len(line) <= limit and not cut_before:
        return line
    room = min(len(line), limit - len(cut_marker(len(line), at_least=cut_before)))
    return line[:room] + cut_marker(len(line) - room, at_least=cut_before)


def restamped_notice(service: str, bounds: str) -> str:
    """The line before the first of a stream's lines that `service` took at its own time, not the
    line's: it does not take or keep lines stamped `bounds`."""
    return (f"tidefleet: lines from here on whose own time {service} does not take ({bounds}: is the node's "
            "clock wrong?) are stamped with its time instead")  # fmt: skip


def service_time(date: str | None) -> float | None:
    """The log service's time by its answer's Date header, if it has one that parses (a proxy may
    mangle it: the answer was still an answer)."""
    try:
        return parsedate_to_datetime(date).timestamp() if date else None
    except (TypeError, ValueError):
        return None


def put_again(call, name: str, lines: int) -> None:
    """The second put of lines a service took the request for but did not store at their own time:
    its failure must not fail the send, whose other lines were stored (sent again, they would be
    stored twice). Tried twice, then said in one warning; the lines are lost."""
    for attempt in range(2):
        try:
            call()
            return
        except Exception as err:  # noqa: BLE001 - any failure: the first put's lines stand
            if attempt:
                said = str(err).splitlines()[0][:200] if str(err) else type(err).__name__
                log.warning("item log %s: %d line(s) the log service did not store at their own time were not put "
                            "again at its time (%s)", name, lines, said)  # fmt: skip


def dropped_marker(count: int, why: str | None = None) -> str:
    """The line that stands in the stream where `count` lines were dropped, and why."""
    why = why or "the log service did not take them in time"
    return f"tidefleet: {count} line(s) of output dropped here ({why})"


def never_refused(err: Exception) -> str | None:
    """An adapter's `refused`: why the service will never take the batch its send failed with
    (the marker says it), or None for a failure that passes (an outage, throttling): the batch is
    sent again."""
    return None


class Outage:
    """Whether the log service is failing, shared by an adapter's streams: one warning when sends
    start failing and one line when they land again, not one per batch or per stream."""

    def __init__(self):
        self.lock = threading.Lock()
        self.failing = False

    def failed(self, name: str, err: Exception) -> None:
        with self.lock:
            first, self.failing = not self.failing, True
        if first:
            said = str(err).splitlines()[0][:200] if str(err) else type(err).__name__
            log.warning("item log %s: send failed (%s); keeping the newest lines to send when the log service "
                        "answers, dropping the oldest past %d", name, said, BufferedStream.MAX_BUFFERED)  # fmt: skip

    def landed(self, name: str) -> None:
        with self.lock:
            recovered, self.failing = self.failing, False
        if recovered:
            log.info("item log %s: the log service takes lines again", name)


Entry = tuple[float, str, int]  # (time written, line, its bytes in a batch)


class BufferedStream:
    """One attempt's output, sent in batches by `send(batch)` on the stream's own thread: `write`
    only buffers and `flush` only asks for a send, so neither the thread that reads the workload's
    output nor the heartbeat ever waits on the log service. Shipping logs never fails the item: a
    failed send keeps its lines for a later one (1, 2, 4, ... s later), and past `MAX_BUFFERED`
    lines or `MAX_BUFFERED_BYTES` the oldest are dropped, counted (`dropped`) and stood in for by
    one line where they were (`dropped_marker`). A batch the service will never take (the
    adapter's `refused` says why) is not sent again: it is dropped, marked with why, with one
    warning a stream, and the lines after it go on. Lines keep their order, and their times
    never go back (a batch out of order is refused, and readers order lines by time).
    A batch holds at most `MAX_BATCH_LINES` lines and `batch_bytes` bytes as `event_bytes` counts
    them, and spans at most `MAX_BATCH_SPAN_S`: a batch over the service's limits would fail on
    every retry. The defaults are CloudWatch's (PutLogEvents: 1,048,576 bytes, 24 h); GCP's
    adapter passes its own."""

    MAX_BUFFERED = 10_000
    # Several batches' worth: a burst of output is sent, not dropped, while the service keeps up.
    MAX_BUFFERED_BYTES = 32 * 1_048_576
    MAX_BATCH_LINES = 500
    # A longer line is cut, its end marked (`cut_line`): 4 UTF-8 bytes or 12 JSON-escaped bytes a
    # character at most, within a CloudWatch event (256 KiB) and a Cloud Logging entry (256 KB).
    MAX_LINE_CHARS = 16_000
    MAX_BATCH_SPAN_S = 23 * 3600.0  # under PutLogEvents' 24 h: lines held through a long outage

    def __init__(self, name: str, send, *, batch_bytes: int = 1_048_576, event_bytes=cloudwatch_event_bytes,
                 refused=never_refused, outage: Outage | None = None, flush_s: float = LOG_FLUSH_S):  # fmt: skip
        self.name, self._send, self.refused = name, send, refused
        self.batch_bytes, self.event_bytes = batch_bytes, event_bytes
        self.outage = outage or Outage()
        self.flush_s = flush_s
        self.wake = threading.Condition()  # guards the state below; never held during a send
        self.buffer: deque[Entry] = deque()
        self.bytes = 0
        self.since: float | None = None  # when the oldest buffered line came (monotonic)
        self.asked = False  # a flush was asked for
        self.dropped = 0
        self.unmarked = 0  # dropped lines that no marker line counts yet
        self.why: str | None = None  # why the service refused some of them, if it did
        self.refused_lines = 0  # dropped because the service refused them (warned at the first)
        self.last_at = 0.0  # the newest line's time: the next one's is never before it
        self.failures = 0  # failed sends in a row
        self.retry_at = 0.0
        self.sending = 0  # lines of the batch under way
        self.close_by: float | None = None  # set by close: the shipper's deadline
        # Set by close: past it, what is left is cut to the newest batch, marked: a slow service
        # then still gets the attempt's last lines, its error most often, not only its oldest.
        self.newest_from: float | None = None
        self.close_failures = 0
        self.closed = False
        self.shipper: threading.Thread | None = None

    def write(self, line: str, *, cut_before: bool = False) -> None:
        """One line of output; `cut_before`: cut already where it was read (`cut_line`)."""
        line = cut_line(line, self.MAX_LINE_CHARS, cut_before=cut_before) or " "
        size = self.event_bytes(line)
        with self.wake:
            was_empty, was_full = not self.buffer, self._full()
            self.last_at = max(time.time(), self.last_at)  # the node's clock stepped back: hold
            self.buffer.append((self.last_at, line, size))
            self.bytes += size
            self.since = self.since or time.monotonic()
            self._bound()
            if was_empty or (self._full() and not was_full):  # when a batch is due changed
                self._wake()

    def flush(self) -> None:
        """Ask for what is buffered to be sent now; returns at once (the heartbeat calls it)."""
        with self.wake:
            if self.buffer:
                self.asked = True
                self._wake()

    def close(self, timeout_s: float = CLOSE_S) -> None:
        """The end of the attempt: what is left is sent, as many batches as it takes, until none
        is left, `CLOSE_FAILURES` sends failed or `timeout_s` passed. Lines not sent by then (a
        send still under way included) are counted as dropped."""
        with self.wake:
            self.close_by = time.monotonic() + timeout_s
            self.newest_from = time.monotonic() + timeout_s / 2
            self._wake()
            self.wake.wait_for(lambda: self.shipper is None or not self.shipper.is_alive(), timeout_s)
            self.closed = True
            self.dropped += len(self.buffer) + (self.shipper is not None) * self.sending
            self.buffer.clear()
            self.bytes = 0
        if self.dropped > self.refused_lines:  # the refused were warned of when refused
            log.warning("item log %s: %d line(s) of output not sent (the log service did not take them in time)",
                        self.name, self.dropped - self.refused_lines)  # fmt: skip

    def _full(self) -> bool:
        return len(self.buffer) >= self.MAX_BATCH_LINES or self.bytes > self.batch_bytes

    def _keep_newest(self) -> None:
        """Drop, counted and marked, all but the newest batch's worth of lines (held: `wake`)."""
        while len(self.buffer) > self.MAX_BATCH_LINES:
            self.bytes -= self.buffer.popleft()[2]
            self.dropped += 1
            self.unmarked += 1

    def _bound(self) -> None:
        while len(self.buffer) > self.MAX_BUFFERED or self.bytes > self.MAX_BUFFERED_BYTES:
            self.bytes -= self.buffer.popleft()[2]
            self.dropped += 1
            self.unmarked += 1

    def _wake(self) -> None:
        """Wake the shipper; the first time, start it (held: `wake`), or at the close if it could
        not be started before."""
        if self.shipper is None and not self.closed and (self.close_by is None or self.buffer or self.unmarked):
            self.shipper = threading.Thread(target=self._run, name=f"item log {self.name}", daemon=True)
            try:
                self.shipper.start()
            except RuntimeError:  # "can't start new thread": the lines wait for the next write's try
                self.shipper = None
        self.wake.notify_all()

    def _run(self) -> None:
        while (taken := self._take()) is not None:
            batch, marked = taken
            try:
                self._send([(at, line) for at, line, _ in batch])
            except Exception as err:  # noqa: BLE001 - any failure: keep the lines, try again later
                if (why := self.refused(err)) is not None:
                    self._refused(batch[bool(marked) :], why)
                else:
                    self._failed(batch[bool(marked) :])
                    self.outage.failed(self.name, err)
            else:
                self._landed(marked)
                self.outage.landed(self.name)

    def _take(self) -> tuple[list[Entry], int] | None:
        """Wait until a batch is due and take it off the buffer: (batch, the dropped lines its
        first line marks); None once the stream is closed."""
        with self.wake:
            while True:
                now = time.monotonic()
                if self.close_by is not None and (self.closed or not (self.buffer or self.unmarked)
                                                  or now >= self.close_by or self.close_failures >= CLOSE_FAILURES):  # fmt: skip
                    self.shipper = None
                    self.wake.notify_all()
                    return None
                due_at = self._due_at(now)
                if due_at <= now:
                    if self.newest_from is not None and now >= self.newest_from:
                        self._keep_newest()
                    return self._next_batch()
                self.wake.wait(None if due_at == float("inf") else due_at - now)

    def _due_at(self, now: float) -> float:
        if not (self.buffer or self.unmarked):
            return float("inf")
        if self.close_by is not None:  # the end of the attempt waits out no backoff
            return now
        if self.failures:
            return self.retry_at
        if self.asked or self._full():
            return now
        return (self.since or now) + self.flush_s

    def _next_batch(self) -> tuple[list[Entry], int]:
        """The oldest lines that fit one batch (at least one), after a marker of the lines dropped
        before them."""
        marked, batch = self.unmarked, []
        if marked:
            line = dropped_marker(marked, self.why)
            batch.append((self.buffer[0][0] if self.buffer else self.last_at, line, self.event_bytes(line)))
        size = sum(entry[2] for entry in batch)
        for entry in islice(self.buffer, self.MAX_BATCH_LINES - len(batch)):
            size += entry[2]
            if batch and (size > self.batch_bytes or entry[0] - batch[0][0] > self.MAX_BATCH_SPAN_S):
                break
            batch.append(entry)
        self.sending = len(batch) - bool(marked)
        for _ in range(self.sending):
            self.bytes -= self.buffer.popleft()[2]
        self.since = time.monotonic() if self.buffer else None
        self.asked = self.asked and bool(self.buffer)
        return batch, marked

    def _landed(self, marked: int) -> None:
        with self.wake:
            self.unmarked -= marked  # lines dropped meanwhile are marked in the next batch
            self.why = self.why if self.unmarked else None
            self.sending = self.failures = 0

    def _refused(self, lines: list[Entry], why: str) -> None:
        """Drop the lines the service will never take, counted and marked with why: the batch
        after them is not held up behind them. An answer, not an outage: no backoff."""
        why = " ".join(why.split())[:300]  # the marker is one line
        with self.wake:
            self.sending = self.failures = 0
            self.close_failures += self.close_by is not None  # its marker may be refused too
            if self.closed:  # close counted them
                return
            first = bool(lines) and not self.refused_lines
            self.dropped += len(lines)
            self.unmarked += len(lines)
            self.refused_lines += len(lines)
            self.why = why
        if first:
            log.warning("item log %s: %d line(s) dropped (%s); marked in the stream where they were, the "
                        "lines after them still sent", self.name, len(lines), why)  # fmt: skip

    def _failed(self, lines: list[Entry]) -> None:
        """Put the lines back in front, where they were; the oldest go first if over the bound."""
        with self.wake:
            self.sending = 0
            self.failures += 1
            self.close_failures += self.close_by is not None
            self.retry_at = time.monotonic() + min(2.0 ** (self.failures - 1), RETRY_MAX_S)
            if not self.closed:
                self.buffer.extendleft(reversed(lines))
                self.bytes += sum(entry[2] for entry in lines)
                self.since = self.since or time.monotonic()
                self._bound()
