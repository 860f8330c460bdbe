"""An item's output against the log services' own limits and refusals: CloudWatch Logs on the moto
server (what moto does not model, AWS's answers at the client's `before-call` hook), Cloud
Logging through google-auth against tests/gcp_fake.py. A refusal that passes (throttling, an
outage, a role or a group not there yet) is retried and the batch lands; one that never will
(the batch itself is refused) drops that batch, counted and marked where it was, with one
warning, and the stream goes on; what the sender can fix (order, span, a clock far off, a
stream deleted) it fixes. None of it ever fails the item."""

from __future__ import annotations

import itertools
import json
import logging
import re
import time
from datetime import UTC, datetime
from email.utils import formatdate

import boto3
import google.auth
import pytest
import responses
from agent_harness import wait_until
from botocore.awsrequest import AWSResponse
from google.auth.credentials import AnonymousCredentials
from test_logstream import CloudWatch, stream_of

from tests.gcp_fake import FakeGcp
from tidefleet import logstream, metrics, naming
from tidefleet.cloud import for_env
from tidefleet.cloud.aws.logs import RESTAMPED, restamped
from tidefleet.cloud.aws.metrics import outcome_stream
from tidefleet.cloud.gcp import cloud_logging
from tidefleet.config import load_environment
from tidefleet.logstream import dropped_marker
from tidefleet.records import AttemptOutcome

QUEUE = "demo"
AWS_ENV, GCP_ENV = load_environment("sandbox"), load_environment("gcp-dev")
ENV_NAMES = itertools.count()


class NodeClock:
    """The node's wall clock as logstream reads it, `offset` s off the log service's; its
    monotonic clock (batches' timing) stays the real one."""

    monotonic = staticmethod(time.monotonic)

    def __init__(self, offset: float = 0.0):
        self.offset = offset

    def time(self) -> float:
        return time.time() + self.offset


@pytest.fixture
def clock(monkeypatch) -> NodeClock:
    node = NodeClock()
    monkeypatch.setattr(logstream, "time", node)
    return node


@pytest.fixture
def cloudwatch(moto_server, monkeypatch):
    """CloudWatch item logs of an environment of its own on the moto server, its group created
    (the stack's)."""
    for key, value in moto_server.env().items():
        monkeypatch.setenv(key, value)
    env = AWS_ENV.model_copy(update={"name": f"limits-{next(ENV_NAMES)}"})
    boto3.client("logs", region_name=env.region).create_log_group(
        logGroupName=naming.item_log_group(env.name)
    )
    return for_env(env).logs


def output(logs, item: str = "item-a") -> list[str]:
    return [line for _, line in logs.lines(QUEUE, "job-1", item)]


def answer_puts(logs, refuse) -> list[list[str]]:
    """Answer PutLogEvents as AWS would where `refuse(messages)` gives an error code (with its
    message after a colon); other calls go to moto. Returns each put's messages, refused or not."""
    seen: list[list[str]] = []

    def before_put(params, **_):
        messages = [e["message"] for e in json.loads(params["body"])["logEvents"]]
        seen.append(messages)
        if error := refuse(messages):
            code, _, message = error.partition(": ")
            return AWSResponse("", 400, {}, None), {"Error": {"Code": code, "Message": message or code}}
        return None

    logs.logs.meta.events.register("before-call.cloudwatch-logs.PutLogEvents", before_put)
    return seen


# -- CloudWatch Logs ----------------------------------------------------------------------------
def test_lines_written_while_the_nodes_clock_steps_back_land_in_the_order_written(cloudwatch, clock):
    stream = cloudwatch.stream(QUEUE, "job-1", "item-a", 1)
    stream.write("before the step")
    clock.offset = -60.0  # NTP steps the clock back a minute between two lines of one batch
    stream.write("after the step")
    stream.close()
    assert output(cloudwatch) == ["before the step", "after the step"] and stream.dropped == 0


def test_lines_from_a_node_whose_clock_is_weeks_behind_land_at_cloudwatchs_time_after_a_line_saying_so(
    cloudwatch, clock
):
    clock.offset = -15 * 86400.0  # PutLogEvents takes the request and rejects every event in it
    stream = cloudwatch.stream(QUEUE, "job-1", "item-a", 1)
    for line in ("epoch 1", "epoch 2"):
        stream.write(line)
        stream.flush()  # each its own batch: the line saying so comes once
        wait_until(lambda line=line: line in output(cloudwatch), 10, f"{line!r} to land")
    stream.write("epoch 3")
    stream.close()
    assert output(cloudwatch) == [RESTAMPED, "epoch 1", "epoch 2", "epoch 3"] and stream.dropped == 0


def test_a_line_from_a_node_whose_clock_is_hours_ahead_lands_at_cloudwatchs_time_after_a_line_saying_so(
    cloudwatch, clock
):
    # One line: moto answers tooNewLogEventStartIndex with the last too-new event's index, AWS
    # with the first's; of one event both are 0.
    clock.offset = 3 * 3600.0
    stream = cloudwatch.stream(QUEUE, "job-1", "item-a", 1)
    stream.write("epoch 1")
    stream.close()
    assert output(cloudwatch) == [RESTAMPED, "epoch 1"] and stream.dropped == 0


@pytest.mark.parametrize(("offset_s", "attempts"), [
    (-15 * 86400.0, 2),  # every event rejected as too old
    (3 * 3600.0, 1),  # too new; one, as above
])  # fmt: skip
def test_outcome_metrics_from_a_node_whose_clock_is_far_off_are_put_at_cloudwatchs_time_metrics_and_all(
    cloudwatch, offset_s, attempts
):
    at = time.time() + offset_s
    cloudwatch.record_outcomes(
        QUEUE, [AttemptOutcome("job-1", f"item-{n}", 1, "failed", 1.0, at + n) for n in range(attempts)]
    )
    events = cloudwatch.logs.get_log_events(
        logGroupName=cloudwatch.group, logStreamName=outcome_stream(QUEUE), startFromHead=True
    )["events"]
    documents = [metrics.from_emf(event["message"]) for event in events]  # no line saying so: metrics only
    assert [points for _, points in documents] == [
        metrics.attempt_points(cloudwatch.env_name, QUEUE, "failed")
    ] * attempts
    # The metrics' own time (what CloudWatch extracts them at) moved with the event's.
    assert [stamp for stamp, _ in documents] == [event["timestamp"] for event in events]
    assert all(abs(event["timestamp"] / 1000 - time.time()) < 600 for event in events)


@pytest.mark.parametrize("end", [1, 0], ids=["exclusive, as AWS documents it", "inclusive, as moto answers"])
def test_of_a_batch_across_the_14_day_bound_only_the_rejected_events_are_put_again(end):
    """AWS: tooOldLogEventEndIndex is "the index of the last log event that is too old ... exclusive".
    Taken as inclusive, an event CloudWatch had stored was put a second time (on the outcome stream,
    an attempt counted twice); the events' own times settle what an emulator counts otherwise."""
    now = 1_790_000_000.0
    day = 86_400_000
    events = [{"timestamp": int(now * 1000) - 15 * day, "message": "too old"},
              {"timestamp": int(now * 1000) - 13 * day, "message": "stored"},
              {"timestamp": int(now * 1000), "message": "stored too"}]  # fmt: skip
    answer = {"ResponseMetadata": {"HTTPHeaders": {"date": "Mon, 21 Sep 2026 14:13:20 GMT"}}}  # `now`
    again = restamped(events, {"tooOldLogEventEndIndex": end}, answer, said=True)
    assert again == [{"timestamp": int(now * 1000), "message": "too old"}]


def test_a_batch_whose_second_put_fails_once_lands_each_line_once(cloudwatch, clock):
    """The second put (the lines rejected for their time) throttled: the send failed, and the whole
    batch, stored but for those lines, was sent again and stored twice."""
    failed = []

    def throttle_the_first_second_put(messages):
        if messages[0] == RESTAMPED and not failed:
            failed.append(messages)
            return "ThrottlingException: Rate exceeded"
        return None

    answer_puts(cloudwatch, throttle_the_first_second_put)
    stream = cloudwatch.stream(QUEUE, "job-1", "item-a", 1)
    clock.offset = -14 * 86400.0 - 600
    stream.write("too old")
    clock.offset = -14 * 86400.0 + 3600
    stream.write("stored")
    stream.close(timeout_s=10)
    assert failed and sorted(output(cloudwatch)) == sorted([RESTAMPED, "too old", "stored"])


def test_a_log_stream_deleted_while_the_attempt_runs_is_created_again(cloudwatch):
    stream = cloudwatch.stream(QUEUE, "job-1", "item-a", 1)
    stream.write("first")
    stream.flush()
    wait_until(lambda: output(cloudwatch) == ["first"], 10, "the first line")
    cloudwatch.logs.delete_log_stream(logGroupName=cloudwatch.group, logStreamName=f"{QUEUE}/job-1/item-a/1")
    stream.write("second")
    stream.close()
    assert output(cloudwatch) == ["second"] and stream.dropped == 0


def test_a_log_group_deleted_while_the_attempt_runs_holds_its_lines_until_the_group_is_back(cloudwatch):
    stream = cloudwatch.stream(QUEUE, "job-1", "item-a", 1)
    stream.write("first")
    stream.flush()
    wait_until(lambda: output(cloudwatch) == ["first"], 10, "the first line")
    cloudwatch.logs.delete_log_group(logGroupName=cloudwatch.group)  # not the agent's to create: the stack's
    stream.write("second")
    stream.flush()
    wait_until(lambda: stream.failures, 10, "a send to the missing group to fail")
    cloudwatch.logs.create_log_group(logGroupName=cloudwatch.group)  # deployed again
    stream.close()
    assert output(cloudwatch) == ["second"] and stream.dropped == 0


def test_a_log_group_gone_for_good_costs_the_attempt_its_lines_counted_and_the_close_returns(
    cloudwatch, caplog
):
    cloudwatch.logs.delete_log_group(logGroupName=cloudwatch.group)
    stream = cloudwatch.stream(QUEUE, "job-1", "item-a", 1)
    stream.write("lost")
    with caplog.at_level(logging.WARNING, logger="tidefleet.agent"):
        stream.close()
    assert stream.dropped == 1
    assert any("log group does not exist" in r.getMessage() for r in caplog.records)


def test_a_batch_cloudwatch_refuses_for_good_is_dropped_marked_with_why_and_the_stream_goes_on(
    cloudwatch, caplog
):
    puts = answer_puts(
        cloudwatch, lambda messages: "poison" in messages and "InvalidParameterException: bad event"
    )
    stream = cloudwatch.stream(QUEUE, "job-1", "item-a", 1)
    with caplog.at_level(logging.WARNING, logger="tidefleet.agent"):
        for line in ("poison", "fine 1", "poison", "fine 2"):  # each its own batch
            before = len(puts)
            stream.write(line)
            stream.flush()
            wait_until(lambda before=before: len(puts) > before, 10, f"{line!r} to be sent")
        stream.close()
    marker = dropped_marker(1, "CloudWatch Logs refused them: InvalidParameterException: bad event")
    assert output(cloudwatch) == [marker, "fine 1", marker, "fine 2"]
    assert stream.dropped == 2 and puts.count(["poison"]) == 2, "a refused batch is not sent again"
    warned = [r.getMessage() for r in caplog.records if r.name == "tidefleet.agent"]
    assert len(warned) == 1 and "refused" in warned[0] and "InvalidParameterException" in warned[0]


@pytest.mark.parametrize("error", [
    "ThrottlingException: Rate exceeded",
    "ServiceUnavailableException: try again",
    "AccessDeniedException: not authorized to perform: logs:PutLogEvents",  # fixed while it runs: IAM
    "InvalidSequenceTokenException: The given sequenceToken is invalid",
])  # fmt: skip
def test_a_refusal_that_passes_is_retried_and_the_batch_lands_once(cloudwatch, error):
    answers = iter([error])  # then moto's
    puts = answer_puts(cloudwatch, lambda _: next(answers, None))
    stream = cloudwatch.stream(QUEUE, "job-1", "item-a", 1)
    stream.write("kept")
    stream.close()  # the refusal, then the same batch again
    assert output(cloudwatch) == ["kept"] and puts == [["kept"], ["kept"]] and stream.dropped == 0


def test_data_already_accepted_is_a_batch_that_landed_not_one_to_send_again(cloudwatch, caplog):
    puts = answer_puts(cloudwatch, lambda _: "DataAlreadyAcceptedException: already accepted")
    stream = cloudwatch.stream(QUEUE, "job-1", "item-a", 1)
    stream.write("landed before")
    with caplog.at_level(logging.WARNING, logger="tidefleet.agent"):
        stream.close()
    assert puts == [["landed before"]] and stream.dropped == 0
    assert not [r for r in caplog.records if r.name == "tidefleet.agent"]


def test_nul_bytes_and_invalid_utf8_in_output_land_as_the_runner_decodes_them(cloudwatch):
    stream = cloudwatch.stream(QUEUE, "job-1", "item-a", 1)
    # The runner decodes output with errors="replace": U+FFFD for each byte that is not UTF-8.
    lines = ["a\x00b", b"caf\xe9 \xff".decode(errors="replace")]
    for line in lines:
        stream.write(line)
    stream.close()
    assert output(cloudwatch) == lines == ["a\x00b", "caf\ufffd \ufffd"]


# -- the sender, whatever the cloud ------------------------------------------------------------
def test_lines_more_than_a_day_apart_go_in_separate_batches(clock):
    send = CloudWatch()  # refuses, as PutLogEvents does, a batch that spans more than 24 h
    stream = stream_of(send)
    clock.offset = -25 * 3600.0  # held since the service went down a day ago: lines kept for it
    stream.write("yesterday")
    clock.offset = 0.0
    stream.write("today")
    stream.close()
    assert send.batches == [["yesterday"], ["today"]] and stream.dropped == 0


@pytest.mark.parametrize("char", [
    "x",
    "\U0001F600",  # 4 UTF-8 bytes; JSON-escaped as two \\uXXXX: 12 bytes
    "\x00",  # JSON-escaped as \\u0000: 6 bytes
])  # fmt: skip
def test_a_line_too_long_for_one_event_ends_saying_how_much_was_cut_within_both_services_event_limits(char):
    sent = []
    stream = logstream.BufferedStream("j/i/1", sent.extend, flush_s=3600)
    written = "start " + char * 70_000
    stream.write(written)
    stream.close()
    ((_, line),) = sent
    kept, count = re.fullmatch(
        r"(.*)\u2026 \[tidefleet: ([\d,]+) more characters cut\]", line, re.DOTALL
    ).groups()
    assert written.startswith(kept) and len(kept) + int(count.replace(",", "")) == len(written)
    assert len(line) <= logstream.BufferedStream.MAX_LINE_CHARS
    assert logstream.cloudwatch_event_bytes(line) <= 256 * 1024  # a PutLogEvents event, its 26 bytes included
    assert cloud_logging._entry_bytes(line) <= 256_000  # a Cloud Logging entry, as the batches count it


def test_a_service_that_refuses_every_batch_costs_the_close_at_most_three_sends():
    sends = []

    def refuse(batch):
        sends.append(batch)
        raise ValueError("refused")

    stream = logstream.BufferedStream("j/i/1", refuse, flush_s=3600, refused=lambda err: str(err))
    for n in range(3):
        stream.write(f"line {n}")
    stream.close(timeout_s=30)  # its marker of the refused lines is refused too
    assert len(sends) == logstream.CLOSE_FAILURES and stream.dropped == 3


# -- Cloud Logging --------------------------------------------------------------------------------
def _at(entry: dict) -> float:
    return datetime.fromisoformat(entry["timestamp"]).timestamp()


@pytest.fixture
def gcp(monkeypatch):
    """Cloud Logging as the fake serves it, with the API's answers the fake lacks: each dated by
    its clock; a request holding a "poison" entry, or one stamped over a day ahead, refused (400
    INVALID_ARGUMENT, nothing written); an entry stamped further back than the bucket keeps taken, not stored; one
    with no timestamp stamped with its time."""
    monkeypatch.setattr(google.auth, "default", lambda *a, **k: (AnonymousCredentials(), GCP_ENV.project))
    fake = FakeGcp(GCP_ENV.project, GCP_ENV.region)
    fake.refused, serve = 0, fake._logging

    def refusing(request):
        now = time.time()
        date = {"Date": formatdate(now, usegmt=True)}
        body = json.loads(request.body)
        entries = body.get("entries", [])
        if any(e.get("textPayload") == "poison" for e in entries):
            fake.refused += 1
            error = {"code": 400, "message": "Log entry with size 300K exceeds maximum size of 256.0K",
                     "status": "INVALID_ARGUMENT"}  # fmt: skip
            return 400, date, json.dumps({"error": error})
        if any("timestamp" in e and _at(e) > now + 86400 for e in entries):
            error = {
                "code": 400,
                "message": "Timestamp is over a day in the future",
                "status": "INVALID_ARGUMENT",
            }
            return 400, date, json.dumps({"error": error})
        if entries:
            stamped = [{"timestamp": datetime.fromtimestamp(now, UTC).isoformat(), **e} for e in entries]
            request.body = json.dumps(body | {"entries": [e for e in stamped if _at(e) >= now - cloud_logging.BACK_S]})
        status, headers, text = serve(request)
        return status, headers | date, text

    fake._logging = refusing
    with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
        fake.install(mock)
        yield fake


def test_a_request_cloud_logging_refuses_is_dropped_marked_with_why_and_the_stream_goes_on(gcp, caplog):
    logs = for_env(GCP_ENV).logs
    stream = logs.stream(QUEUE, "job-1", "item-a", 1)
    with caplog.at_level(logging.WARNING, logger="tidefleet.agent"):
        stream.write("poison")
        stream.flush()
        wait_until(lambda: gcp.refused, 10, "the poison entry to be refused")
        stream.write("after it")
        stream.close()
    why = "Cloud Logging refused them: 400 INVALID_ARGUMENT: Log entry with size 300K exceeds maximum size of 256.0K"
    assert output(logs) == [dropped_marker(1, why), "after it"]
    assert gcp.refused == 1 and stream.dropped == 1
    (warned,) = [r.getMessage() for r in caplog.records if r.name == "tidefleet.agent"]
    assert "refused" in warned and "INVALID_ARGUMENT" in warned


def stored_at(gcp) -> list[float]:
    return [_at(entry) for entry in gcp.log_entries]


@pytest.mark.parametrize("offset_s", [
    2 * 86400.0,  # the request refused: nothing written
    -400 * 86400.0,  # past the bucket's 365 days: the request taken, its entries not stored, nothing said
])  # fmt: skip
def test_lines_from_a_node_whose_clock_is_far_off_land_at_cloud_loggings_time_after_a_line_saying_so(
    gcp, clock, offset_s
):
    clock.offset = offset_s
    logs = for_env(GCP_ENV).logs
    stream = logs.stream(QUEUE, "job-1", "item-a", 1)
    stream.write("epoch 1")
    stream.flush()  # its own batch: the line saying so comes once
    wait_until(lambda: "epoch 1" in output(logs), 10, "'epoch 1' to land")
    stream.write("epoch 2")
    stream.close()
    assert output(logs) == [cloud_logging.RESTAMPED, "epoch 1", "epoch 2"] and stream.dropped == 0
    assert all(abs(at - time.time()) < 600 for at in stored_at(gcp))


def test_outcomes_from_a_node_whose_clock_is_days_ahead_are_counted_at_cloud_loggings_time(gcp):
    logs = for_env(GCP_ENV).logs
    logs.record_outcomes(
        QUEUE, [AttemptOutcome("job-1", "item-a", 1, "failed", 1.0, time.time() + 2 * 86400)]
    )
    (entry,) = gcp.log_entries  # no line saying so: no one reads these entries
    assert entry["jsonPayload"]["outcome"] == "failed" and abs(_at(entry) - time.time()) < 600


def test_a_date_header_that_does_not_parse_is_no_time_not_a_failed_send():
    """A proxy mangling the answer's Date made every stored batch a failure, sent again and stored again."""
    assert logstream.service_time("not a date") is None and logstream.service_time(None) is None
    assert logstream.service_time("Mon, 21 Sep 2026 14:13:20 GMT") == 1_790_000_000.0


def test_lines_weeks_behind_but_within_the_buckets_retention_are_stored_once_at_their_own_time(gcp, clock):
    """30 days is a default bucket's bound; the stack's item-log bucket keeps 365: lines 45 days back
    were stored, then written again at Cloud Logging's time (each line twice)."""
    clock.offset = -45 * 86400.0
    logs = for_env(GCP_ENV).logs
    stream = logs.stream(QUEUE, "job-1", "item-a", 1)
    stream.write("epoch 1")
    stream.close()
    assert output(logs) == ["epoch 1"] and stream.dropped == 0


class _Pages:
    """GetLogEvents as AWS documents it: pages cut by time, so a quiet stretch is an empty page
    mid-stream; the end is the token given back unchanged. (moto never answers an empty middle page.)"""

    def __init__(self, pages: dict):
        self.pages, self.calls = pages, 0

    def get_paginator(self, name):
        streams = [{"logStreamName": "work/L1/000000/1"}]
        return type("P", (), {"paginate": lambda self, **kw: [{"logStreams": streams}]})()

    def get_log_events(self, **kwargs):
        self.calls += 1
        lines, forward = self.pages[kwargs.get("nextToken")]
        return {"events": [{"message": line} for line in lines], "nextForwardToken": forward}


def test_a_quiet_stretch_mid_stream_does_not_end_the_read_before_the_attempts_last_lines():
    """The logs audit: an attempt that printed, went quiet for hours and crashed lost its traceback;
    an empty first page showed nothing at all."""
    from tidefleet.cloud.aws.logs import CloudWatchItemLogs
    from tidefleet.config import load_environment

    pages = {None: ([], "f/1"), "f/1": (["epoch 1"], "f/2"), "f/2": ([], "f/3"),
             "f/3": (["Traceback ...", "CUDA error: out of memory"], "f/4"), "f/4": ([], "f/4")}  # fmt: skip
    logs = CloudWatchItemLogs(load_environment("dev"), client=_Pages(pages))
    assert [line for _, line in logs.lines("work", "L1")] == ["epoch 1", "Traceback ...", "CUDA error: out of memory"]


def test_a_token_that_keeps_moving_over_empty_pages_still_ends(monkeypatch):
    from tidefleet.cloud.aws import logs as aws_logs

    monkeypatch.setattr(aws_logs, "MAX_EMPTY_PAGES", 5)
    endless = type("Endless", (dict,), {"__missing__": lambda self, token: ([], f"{token}+")})({None: (["one"], "t")})
    client = _Pages(endless)
    from tidefleet.config import load_environment

    assert [line for _, line in aws_logs.CloudWatchItemLogs(load_environment("dev"), client=client).lines("work", "L1")] == ["one"]
    assert client.calls == 1 + 5


def test_the_line_saying_lines_were_restamped_goes_in_a_put_of_its_own(cloudwatch, clock):
    """The logs audit: added to the rejected lines' put, it could take a batch filled to
    PutLogEvents' 1 MiB past it, and that put's refusal lost every line of it."""
    puts: list[list[str]] = []
    answer_puts(cloudwatch, lambda messages: puts.append(list(messages)))
    clock.offset = -15 * 86400.0
    stream = cloudwatch.stream(QUEUE, "job-1", "item-a", 1)
    for line in ("epoch 1", "epoch 2"):
        stream.write(line)
    stream.close()
    assert [RESTAMPED] in puts and all(RESTAMPED not in p for p in puts if p != [RESTAMPED]), puts
    assert output(cloudwatch) == [RESTAMPED, "epoch 1", "epoch 2"]
