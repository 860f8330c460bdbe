"""BufferedStream, the item log writer both clouds share: batches that fit the log service's
request limits, retries that keep lines, a close that sends all it can, and none of it on the
thread that reads the workload's output or on the heartbeat."""

from __future__ import annotations

import logging
import threading

from tidefleet.logstream import BufferedStream, Outage, cloudwatch_event_bytes, cut_line, dropped_marker

PUT_LOG_EVENTS_BYTES = 1_048_576  # PutLogEvents: the messages' UTF-8 bytes plus 26 per event


class CloudWatch:
    """A send that refuses, as PutLogEvents does, a batch over its size or count limit, out of
    chronological order or spanning more than 24 h."""

    def __init__(self, fail: int = 0):
        self.batches: list[list[str]] = []
        self.fail = fail

    def __call__(self, batch: list[tuple[float, str]]) -> None:
        if self.fail:
            self.fail -= 1
            raise RuntimeError("endpoint down")
        size = sum(len(line.encode()) + 26 for _, line in batch)
        if size > PUT_LOG_EVENTS_BYTES or len(batch) > 10_000:
            raise RuntimeError(f"InvalidParameterException: batch of {size} bytes")
        stamps = [at for at, _ in batch]
        if stamps != sorted(stamps) or stamps[-1] - stamps[0] > 24 * 3600:
            raise RuntimeError("InvalidParameterException: out of order, or more than 24 hours")
        self.batches.append([line for _, line in batch])


def lines_sent(send: CloudWatch) -> list[str]:
    return [line for batch in send.batches for line in batch]


def stream_of(send, name: str = "j/i/1", **kwargs) -> BufferedStream:
    """A stream that sends full batches, asked flushes and its close, never a batch because its
    first line waited a second: what each batch holds does not depend on the machine's speed."""
    return BufferedStream(name, send, flush_s=3600, **kwargs)


def test_long_lines_go_in_batches_under_the_put_log_events_byte_limit_and_none_is_lost():
    send = CloudWatch()
    stream = stream_of(send)
    lines = [f"{n:05d}" + "x" * 20_000 for n in range(500)]  # each cut to 16,000 characters, marked
    for line in lines:
        stream.write(line)
    stream.close()
    assert lines_sent(send) == [cut_line(line, 16_000) for line in lines] and stream.dropped == 0
    assert len(send.batches) > 7  # ~8 MB of output: at least 8 batches of at most 1 MiB


def test_the_byte_limit_counts_utf8_bytes_not_characters():
    send = CloudWatch()
    stream = stream_of(send)
    for _ in range(100):
        stream.write("é" * 16_000)  # 32,000 bytes each
    stream.close()
    assert [len(b) for b in send.batches] == [32, 32, 32, 4]  # 32 * (32,000 + 26) <= 1 MiB < 33 * ...


def test_short_lines_still_go_500_to_a_batch():
    send = CloudWatch()
    stream = stream_of(send)
    for n in range(1200):
        stream.write(f"line {n}")
    stream.close()
    assert [len(b) for b in send.batches] == [500, 500, 200]
    assert lines_sent(send) == [f"line {n}" for n in range(1200)]


def test_a_failed_send_keeps_its_lines_and_close_gives_up_after_three_failures():
    send = CloudWatch(fail=2)
    stream = stream_of(send)
    stream.write("kept")
    stream.flush()
    stream.close()  # one more failure, then it lands
    assert lines_sent(send) == ["kept"] and stream.dropped == 0

    down = CloudWatch(fail=99)
    stream = stream_of(down, "j/i/2")
    stream.write("lost")
    stream.close()
    assert stream.dropped == 1 and down.fail == 96


class Silent(CloudWatch):
    """A log service that takes the connection and does not answer until `answer` is set, then
    fails the first `fail` sends. A send on the caller's thread (the one that reads the
    workload's output, or the heartbeat) is refused at once and counted: it must never happen."""

    def __init__(self, fail: int = 0):
        super().__init__(fail)
        self.caller = threading.current_thread()
        self.on_caller = 0
        self.entered, self.answer = threading.Event(), threading.Event()
        self.under_way = 0

    def __call__(self, batch: list[tuple[float, str]]) -> None:
        if threading.current_thread() is self.caller:
            self.on_caller += 1
            raise RuntimeError("sent on the caller's thread")
        self.under_way += 1
        self.entered.set()
        try:
            self.answer.wait(60)
            super().__call__(batch)
        finally:
            self.under_way -= 1


def test_a_silent_log_service_holds_up_neither_writes_nor_flushes_and_the_oldest_lines_go_first_marked():
    send = Silent(fail=1)
    stream = stream_of(send)
    try:
        stream.write("line 0")
        stream.flush()
        assert send.entered.wait(10), "the shipper sends what a flush asks for"
        for n in range(1, 25_001):  # while that send hangs
            stream.write(f"line {n}")
        stream.flush()  # the heartbeat's: it asks, and returns
        assert send.on_caller == 0
        assert len(stream.buffer) == BufferedStream.MAX_BUFFERED and stream.dropped == 15_000
    finally:
        send.answer.set()  # the hung send fails: "line 0" goes back in front, the oldest, and is dropped
    stream.close(timeout_s=60)
    assert lines_sent(send) == [dropped_marker(15_001)] + [f"line {n}" for n in range(15_001, 25_001)]
    assert stream.dropped == 15_001 and send.on_caller == 0


def test_the_buffer_is_bounded_in_bytes_too():
    send = Silent()
    stream = stream_of(send)
    try:
        stream.write("first")
        stream.flush()
        assert send.entered.wait(10)
        for n in range(4_000):  # 4,000 lines of 16,000 characters: 64 MB, twice the bound
            stream.write(f"{n:05d}" + "x" * 20_000)
        assert stream.bytes <= BufferedStream.MAX_BUFFERED_BYTES
        cut = cut_line("00000" + "x" * 20_000, 16_000)
        assert len(stream.buffer) == BufferedStream.MAX_BUFFERED_BYTES // cloudwatch_event_bytes(cut)
    finally:
        send.answer.set()
    stream.close(timeout_s=60)
    kept = len(lines_sent(send)) - 2  # less "first" and the marker
    assert lines_sent(send)[:2] == ["first", dropped_marker(4_000 - kept)] and stream.dropped == 4_000 - kept


def test_the_end_of_an_attempt_waits_a_bounded_time_for_a_send_that_hangs():
    send = Silent()
    stream = stream_of(send)
    try:
        stream.write("never answered")
        stream.close(timeout_s=0.5)
        assert send.under_way == 1, "close returned while the send still hangs"
        assert stream.dropped == 1 and send.on_caller == 0
    finally:
        send.answer.set()


def test_a_slow_service_still_gets_an_attempts_last_lines_at_its_end():
    sent: list[str] = []

    def slow(batch):
        threading.Event().wait(0.5)  # a throttled but working service: 0.5 s a batch
        sent.extend(line for _, line in batch)

    stream = stream_of(slow)
    for n in range(9_999):
        stream.write(f"step {n}")
    stream.write("Traceback: the error that ended it")
    stream.close(timeout_s=6)  # 10,000 lines would take 10 s: half the time goes oldest first, then the newest
    assert sent[-1] == "Traceback: the error that ended it" and sent[0] == "step 0"
    assert any(line.startswith("tidefleet:") and "dropped" in line for line in sent), "the gap is marked"


def test_a_write_never_raises_when_no_thread_can_start_and_the_next_one_sends(monkeypatch):
    start, refused = threading.Thread.start, []

    def start_once_refused(thread):
        if not refused:
            refused.append(thread)
            raise RuntimeError("can't start new thread")  # a pids limit on a crowded node
        start(thread)

    monkeypatch.setattr(threading.Thread, "start", start_once_refused)
    send = CloudWatch()
    stream = stream_of(send)
    stream.write("first")  # the item's runner thread must not die of it
    stream.write("second")
    stream.close()
    assert refused and lines_sent(send) == ["first", "second"]


def test_an_outage_is_one_warning_for_all_streams_and_batches_and_one_line_when_it_ends(caplog):
    outage, down = Outage(), CloudWatch(fail=6)
    with caplog.at_level(logging.INFO, logger="tidefleet.agent"):
        for n in (1, 2, 3):  # two streams fail three sends each, the third lands
            stream = stream_of(down, f"j/i/{n}", outage=outage)
            stream.write(f"from {n}")
            stream.close()
    failed = [r.getMessage() for r in caplog.records if "send failed" in r.getMessage()]
    back = [r.getMessage() for r in caplog.records if "takes lines again" in r.getMessage()]
    assert down.fail == 0 and lines_sent(down) == ["from 3"]
    assert len(failed) == 1 and "j/i/1" in failed[0] and len(back) == 1 and "j/i/3" in back[0]
