"""The ItemLogs contract (`tidefleet.ports.ItemLogs`), on every item log adapter: CloudWatch Logs
on the moto server, Cloud Logging through google-auth on the GCP fake. What `tidefleet logs`
relies on: one stream per attempt, lines in the order written, read back item by item, attempt by
attempt."""

from __future__ import annotations

from agent_harness import wait_until

from tidefleet.records import AttemptOutcome

QUEUE = "demo"


def write(logs, job: str, item: str, attempt: int, *lines: str, close: bool = True) -> None:
    stream = logs.stream(QUEUE, job, item, attempt)
    for line in lines:
        stream.write(line)
    stream.close() if close else stream.flush()


def test_lines_come_back_per_item_then_attempt_each_stream_in_the_order_written(item_logs):
    write(item_logs, "job-1", "item-b", 1, "b first")
    write(item_logs, "job-1", "item-a", 2, "second 1", "second 2", "second 3")  # the retry, written first
    write(item_logs, "job-1", "item-a", 1, "first 1", "first 2")
    write(item_logs, "job-2", "item-a", 1, "another job")
    assert list(item_logs.lines(QUEUE, "job-1")) == [
        ("job-1/item-a/1", "first 1"), ("job-1/item-a/1", "first 2"),
        ("job-1/item-a/2", "second 1"), ("job-1/item-a/2", "second 2"), ("job-1/item-a/2", "second 3"),
        ("job-1/item-b/1", "b first"),
    ]  # fmt: skip
    assert [line for _, line in item_logs.lines(QUEUE, "job-1", "item-b")] == ["b first"]


def test_a_flush_sends_what_was_written_so_far_and_close_sends_the_rest(item_logs):
    stream = item_logs.stream(QUEUE, "job-1", "item-a", 1)
    stream.write("before the flush")
    stream.flush()  # asks the stream's own thread to send it, at once (never on the caller's thread)
    first = [("job-1/item-a/1", "before the flush")]
    wait_until(lambda: list(item_logs.lines(QUEUE, "job-1")) == first, 10, "the flushed line")
    stream.write("after it")
    stream.close()
    assert [line for _, line in item_logs.lines(QUEUE, "job-1")] == ["before the flush", "after it"]


def test_an_attempts_outcome_is_not_output(item_logs):
    write(item_logs, "job-1", "item-a", 1, "output")
    item_logs.record_outcomes(QUEUE, [AttemptOutcome("job-1", "item-a", 1, "succeeded", 1.5, 1.0)])
    assert list(item_logs.lines(QUEUE, "job-1")) == [("job-1/item-a/1", "output")]


def test_a_job_without_output_has_no_lines(item_logs):
    assert list(item_logs.lines(QUEUE, "never-ran")) == []
    assert list(item_logs.lines(QUEUE, "never-ran", "item-a")) == []
