"""BufferedStream, the item log writer both clouds share: batches that fit the log service's
request limits, retries that keep lines, a close that sends all it can."""

from __future__ import annotations

from tidefleet.logstream import BufferedStream

PUT_LOG_EVENTS_BYTES = 1_048_576  # PutLogEvents: the messages' UTF-8 bytes plus 26 per event


class CloudWatch:
    """A send that refuses, as PutLogEvents does, a batch over its size or count limit."""

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
        self.batches.append([line for _, line in batch])


def lines_sent(send: CloudWatch) -> list[str]:
    return [line for batch in send.batches for line in batch]


def test_long_lines_go_in_batches_under_the_put_log_events_byte_limit_and_none_is_lost():
    send = CloudWatch()
    stream = BufferedStream("j/i/1", send)
    lines = [f"{n:05d}" + "x" * 20_000 for n in range(500)]  # each cut to 16,000 characters
    for line in lines:
        stream.write(line)
    stream.close()
    assert lines_sent(send) == [line[:16_000] for line in lines] and stream.dropped == 0
    assert len(send.batches) > 7  # ~8 MB of output: at least 8 batches of at most 1 MiB


def test_the_byte_limit_counts_utf8_bytes_not_characters():
    send = CloudWatch()
    stream = BufferedStream("j/i/1", send)
    for _ in range(100):
        stream.write("é" * 16_000)  # 32,000 bytes each
    stream.close()
    assert [len(b) for b in send.batches] == [32, 32, 32, 4]  # 32 * (32,000 + 26) <= 1 MiB < 33 * ...


def test_short_lines_still_go_500_to_a_batch():
    send = CloudWatch()
    stream = BufferedStream("j/i/1", send)
    for n in range(1200):
        stream.write(f"line {n}")
    stream.close()
    assert [len(b) for b in send.batches] == [500, 500, 200]
    assert lines_sent(send) == [f"line {n}" for n in range(1200)]


def test_a_failed_send_keeps_its_lines_and_close_gives_up_after_three_failures():
    send = CloudWatch(fail=2)
    stream = BufferedStream("j/i/1", send)
    stream.write("kept")
    stream.flush()
    stream.close()  # one more failure, then it lands
    assert lines_sent(send) == ["kept"] and stream.dropped == 0

    down = CloudWatch(fail=99)
    stream = BufferedStream("j/i/2", down)
    stream.write("lost")
    stream.close()
    assert stream.dropped == 1 and down.fail == 96
