"""The work-queue and item-log ports the worker agent and the job SDK use, and their AWS
implementations (SQS, CloudWatch Logs). The GCP ones (Pub/Sub, Cloud Logging) live in
`tidefleet.cloud.gcp_work`; `tidefleet.jobs.sdk.Cloud` picks by `env.cloud`.

A queue is named by its config name; `dead_letter=True` means its dead-letter queue (SQS) or
dead-letter topic and subscription (Pub/Sub). A message is an opaque text body: what it means
(`ItemMessage`) is the SDK's business, not the port's.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import boto3
from botocore.exceptions import BotoCoreError, ClientError
from botocore.parsers import ResponseParserError

from tidefleet import naming
from tidefleet.config import Environment

log = logging.getLogger("tidefleet.agent")
SQS_BATCH = 10
LOG_FLUSH_S = 1.0


def _cloud_errors() -> tuple[type[BaseException], ...]:
    """What a cloud call may raise: API errors, transport errors, a garbled answer (a 500
    page). The Google libraries are the optional `gcp` extra, so an AWS node may lack them."""
    errors: tuple[type[BaseException], ...] = (BotoCoreError, ClientError, ResponseParserError, RuntimeError)
    try:
        from google.api_core.exceptions import GoogleAPIError
        from google.auth.exceptions import GoogleAuthError
        from requests import RequestException
    except ImportError:
        return errors
    return (*errors, GoogleAPIError, GoogleAuthError, RequestException)


CLOUD_ERRORS = _cloud_errors()


@dataclass(frozen=True)
class Delivery:
    handle: str  # what extend / delete / release take: SQS receipt handle, Pub/Sub ack id
    body: str
    deliveries: int  # times this message has been delivered, this one included (1 = first)
    message_id: str = ""  # the queue's id of the message: the same on every delivery of it


class WorkQueues(Protocol):
    def lease_s(self, queue: str) -> int:
        """How long a received message stays hidden from others (visibility / ack deadline)."""

    def receive(self, queue: str, max_messages: int, wait_s: int, *, dead_letter: bool = False,
                hold_s: int | None = None) -> list[Delivery]:  # fmt: skip
        """Up to max_messages, waiting up to wait_s for the first; hold_s overrides the lease."""

    def extend(self, queue: str, handles: list[str], seconds: int) -> dict[str, str]:
        """Keep these messages hidden `seconds` more; returns the error of each handle that failed."""

    def delete(self, queue: str, handles: list[str], *, dead_letter: bool = False) -> list[str]:
        """Done with them (SQS delete / Pub/Sub ack); returns the error of each that failed."""

    def send(self, queue: str, bodies: list[str], *, dead_letter: bool = False) -> None:
        """Raises if any body was refused: nothing is silently dropped."""

    def release(self, queue: str, handles: list[str], *, dead_letter: bool = False) -> None:
        """Visible to everyone again now (SQS visibility 0 / Pub/Sub nack). Counts as a delivery."""


class ItemLogs(Protocol):
    def stream(self, queue: str, job: str, item: str, attempt: int):
        """A writer with write(line), flush() and close() for one attempt's output."""

    def lines(self, queue: str, job: str, item: str | None = None) -> Iterator[tuple[str, str]]:
        """(stream, line) for every attempt of the job's items (or one item), oldest first per stream;
        `queue` is the job's (a node may write only its own queues' logs)."""

    def record_outcome(self, queue: str, job: str, item: str, attempt: int, outcome: str, seconds: float) -> None:
        """One finished attempt (succeeded / failed / cancelled), for the cloud's outcome metric."""


def stream_name(job: str, item: str, attempt: int) -> str:
    return f"{job}/{item}/{attempt}"


def stream_order(stream: str) -> tuple:
    _job, item, attempt = (stream.split("/") + ["", "", ""])[:3]
    return (item, int(attempt) if attempt.isdigit() else 0)


# -- SQS ------------------------------------------------------------------------------------
class SqsWorkQueues:
    def __init__(self, env: Environment, *, client=None):
        self.env = env
        self.sqs = client or boto3.client("sqs", region_name=env.region)
        self._urls: dict[str, str] = {}

    def url(self, queue: str, *, dead_letter: bool = False) -> str:
        name = naming.dead_letter_queue(self.env.name, queue) if dead_letter else naming.queue(self.env.name, queue)
        if name not in self._urls:
            self._urls[name] = self.sqs.get_queue_url(QueueName=name)["QueueUrl"]
        return self._urls[name]

    def lease_s(self, queue: str) -> int:
        attrs = self.sqs.get_queue_attributes(QueueUrl=self.url(queue), AttributeNames=["VisibilityTimeout"])
        return int(attrs["Attributes"]["VisibilityTimeout"])

    def receive(self, queue, max_messages, wait_s, *, dead_letter=False, hold_s=None) -> list[Delivery]:
        kwargs = {"VisibilityTimeout": hold_s} if hold_s is not None else {}
        messages = self.sqs.receive_message(
            QueueUrl=self.url(queue, dead_letter=dead_letter), MaxNumberOfMessages=max_messages, WaitTimeSeconds=wait_s,
            MessageSystemAttributeNames=["ApproximateReceiveCount"], **kwargs,
        ).get("Messages", [])  # fmt: skip
        return [Delivery(m["ReceiptHandle"], m["Body"], int(m.get("Attributes", {}).get("ApproximateReceiveCount", "1")),
                         m.get("MessageId", "")) for m in messages]  # fmt: skip

    def _batches(self, method, queue: str, dead_letter: bool, entries: list[dict]) -> list[dict]:
        """One batch call per ten entries (ids are positions); returns every failed entry."""
        failed = []
        for start in range(0, len(entries), SQS_BATCH):
            batch = [{"Id": str(start + i), **e} for i, e in enumerate(entries[start : start + SQS_BATCH])]
            failed += method(QueueUrl=self.url(queue, dead_letter=dead_letter), Entries=batch).get("Failed", [])
        return failed

    def extend(self, queue, handles, seconds) -> dict[str, str]:
        entries = [{"ReceiptHandle": h, "VisibilityTimeout": seconds} for h in handles]
        failed = self._batches(self.sqs.change_message_visibility_batch, queue, False, entries)
        return {handles[int(f["Id"])]: f.get("Message", f.get("Code", "?")) for f in failed}

    def delete(self, queue, handles, *, dead_letter=False) -> list[str]:
        failed = self._batches(self.sqs.delete_message_batch, queue, dead_letter, [{"ReceiptHandle": h} for h in handles])
        return [f.get("Message", f.get("Code", "?")) for f in failed]

    def send(self, queue, bodies, *, dead_letter=False) -> None:
        failed = self._batches(self.sqs.send_message_batch, queue, dead_letter, [{"MessageBody": b} for b in bodies])
        if failed:
            raise RuntimeError(f"SQS refused {len(failed)} message(s): {failed[0].get('Message', failed[0])}")

    def release(self, queue, handles, *, dead_letter=False) -> None:
        entries = [{"ReceiptHandle": h, "VisibilityTimeout": 0} for h in handles]
        self._batches(self.sqs.change_message_visibility_batch, queue, dead_letter, entries)


# -- CloudWatch Logs ------------------------------------------------------------------------
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


class CloudWatchItemLogs:
    """One log stream per attempt (`<queue>/<job>/<item>/<attempt>`: naming.item_log_stream_prefix)
    in the environment's item log group; shown without the queue."""

    def __init__(self, env: Environment, *, client=None):
        self.logs = client or boto3.client("logs", region_name=env.region)
        self.group = naming.item_log_group(env.name)

    def stream(self, queue: str, job: str, item: str, attempt: int) -> BufferedStream:
        name = naming.item_log_stream_prefix(queue) + stream_name(job, item, attempt)
        created = []

        def send(batch: list[tuple[float, str]]) -> None:
            if not created:  # lazily, in the first send: a failure is the stream's to retry
                try:
                    self.logs.create_log_stream(logGroupName=self.group, logStreamName=name)
                except ClientError as err:
                    if err.response["Error"]["Code"] != "ResourceAlreadyExistsException":
                        raise
                created.append(True)
            self.logs.put_log_events(logGroupName=self.group, logStreamName=name,
                                     logEvents=[{"timestamp": int(at * 1000), "message": line} for at, line in batch])

        return BufferedStream(name, send)

    def record_outcome(self, queue: str, job: str, item: str, attempt: int, outcome: str, seconds: float) -> None:
        """Nothing on AWS: no stack resource counts outcome entries (the job store's item history has them)."""

    def lines(self, queue: str, job: str, item: str | None = None) -> Iterator[tuple[str, str]]:
        queue_prefix = naming.item_log_stream_prefix(queue)
        prefix = f"{queue_prefix}{job}/" + (f"{item}/" if item else "")
        streams = []
        for page in self.logs.get_paginator("describe_log_streams").paginate(logGroupName=self.group,
                                                                             logStreamNamePrefix=prefix):  # fmt: skip
            streams += [s["logStreamName"].removeprefix(queue_prefix) for s in page["logStreams"]]
        for stream in sorted(streams, key=stream_order):
            token = None
            while True:
                kwargs = {"logGroupName": self.group, "logStreamName": queue_prefix + stream, "startFromHead": True}
                if token:
                    kwargs["nextToken"] = token
                page = self.logs.get_log_events(**kwargs)
                for event in page["events"]:
                    yield stream, event["message"]
                if not page["events"] or page.get("nextForwardToken") == token:
                    break
                token = page.get("nextForwardToken")
