"""Item logs on AWS: one CloudWatch Logs stream per attempt."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import boto3
from botocore.exceptions import ClientError

from tidefleet import naming
from tidefleet.logstream import (
    BufferedStream,
    Outage,
    put_again,
    restamped_notice,
    service_time,
    stream_name,
    stream_order,
)

if TYPE_CHECKING:  # settings are loaded (pydantic) by the runtime, not on import
    from tidefleet.config import Environment
    from tidefleet.records import AttemptOutcome


# Empty pages in a row after which a stream's read stops though its token still moves: a bound, for
# a service that never gives the token back (the end), on a stream quiet for far longer than any item.
MAX_EMPTY_PAGES = 1000


class CloudWatchItemLogs:
    """One log stream per attempt (`<queue>/<job>/<item>/<attempt>`: naming.item_log_stream_prefix)
    in the environment's item log group; shown without the queue. The client is built as every
    adapter's is: with the process's fail-fast config (`cloud.aws.CLIENT_CONFIG`, set by AwsCloud)."""

    def __init__(self, env: Environment, *, client=None):
        self.logs = client or boto3.client("logs", region_name=env.region)
        self.group = naming.item_log_group(env.name)
        self.env_name = env.name
        self.outage = Outage()  # the streams' one warning while CloudWatch Logs fails

    def stream(self, queue: str, job: str, item: str, attempt: int) -> BufferedStream:
        name = naming.item_log_stream_prefix(queue) + stream_name(job, item, attempt)
        created, restamping = [], []

        def send(batch: list[tuple[float, str]]) -> None:
            if not created:  # lazily, in the first send: a failure is the stream's to retry
                self._create(name)
                created.append(True)
            events = [{"timestamp": int(at * 1000), "message": line} for at, line in batch]
            if self._put_in_time(name, events, said=bool(restamping)):
                restamping.append(True)

        return BufferedStream(name, send, refused=refused, outage=self.outage)

    def _create(self, stream: str) -> None:
        try:
            self.logs.create_log_stream(logGroupName=self.group, logStreamName=stream)
        except ClientError as err:
            if err.response["Error"]["Code"] != "ResourceAlreadyExistsException":
                raise

    def _put(self, stream: str, events: list[dict]) -> dict:
        """PutLogEvents, creating the stream where it is gone (deleted while the attempt ran). A
        log group gone fails that too, an outage to retry: the group is the stack's (its
        retention, its key), not the agent's to create."""
        try:
            return self.logs.put_log_events(logGroupName=self.group, logStreamName=stream, logEvents=events)
        except ClientError as err:
            code = err.response["Error"]["Code"]
            if code == "DataAlreadyAcceptedException":  # an earlier try of this batch landed
                return {}
            if code != "ResourceNotFoundException":
                raise
        self._create(stream)
        return self.logs.put_log_events(logGroupName=self.group, logStreamName=stream, logEvents=events)

    def _put_in_time(self, stream: str, events: list[dict], *, said: bool, stamp=None) -> bool:
        """PutLogEvents, and the events it rejected for their time put again at CloudWatch's
        (`restamped`); whether there were any."""
        answer = self._put(stream, events)
        if not (rejected := answer.get("rejectedLogEventsInfo")):
            return False
        again = restamped(events, rejected, answer, said=said, stamp=stamp)
        # The notice in a put of its own: a batch filled to PutLogEvents' 1 MiB has no room for one
        # more line, and the put refused for it would lose the whole batch.
        said_now = again[:1] if again and again[0]["message"] == RESTAMPED else []
        for part in (said_now, again[len(said_now):]):
            if part:
                put_again(lambda part=part: self._put(stream, part), stream, len(part))
        return True

    def record_outcomes(self, queue: str, outcomes: list[AttemptOutcome]) -> None:
        """The attempts' outcome metrics (`tidefleet.metrics.attempt_points`) as EMF events in the
        queue's outcome stream, one PutLogEvents for all: CloudWatch turns them into the metrics
        the alarms watch. Those rejected for their time (a node's clock far off) are put again at
        CloudWatch's, their metrics' time with them (EMF takes the same 14 days back, 2 h ahead),
        with no line saying so: the stream is metrics only."""
        from tidefleet import metrics  # the agent's path only: not the scaler's cold import
        from tidefleet.cloud.aws.metrics import outcome_stream

        name = outcome_stream(queue)
        events = [{"timestamp": int(o.at * 1000), "message": line}
                  for o in sorted(outcomes, key=lambda o: o.at)
                  for line in metrics.emf(metrics.attempt_points(self.env_name, queue, o.outcome), int(o.at * 1000))]
        if events:
            self._put_in_time(name, events, said=True, stamp=metrics.emf_at)

    def lines(self, queue: str, job: str, item: str | None = None) -> Iterator[tuple[str, str]]:
        queue_prefix = naming.item_log_stream_prefix(queue)
        prefix = f"{queue_prefix}{job}/" + (f"{item}/" if item else "")
        streams = []
        for page in self.logs.get_paginator("describe_log_streams").paginate(logGroupName=self.group,
                                                                             logStreamNamePrefix=prefix):  # fmt: skip
            streams += [s["logStreamName"].removeprefix(queue_prefix) for s in page["logStreams"]]
        for stream in sorted(streams, key=stream_order):
            token, empty = None, 0
            while True:
                kwargs = {"logGroupName": self.group, "logStreamName": queue_prefix + stream, "startFromHead": True}
                if token:
                    kwargs["nextToken"] = token
                page = self.logs.get_log_events(**kwargs)
                for event in page["events"]:
                    yield stream, event["message"]
                # The end is the token given back unchanged: pages are cut by time, so a quiet stretch
                # reads as an empty page mid-stream (an attempt silent for hours, then its traceback).
                empty = 0 if page["events"] else empty + 1
                if page.get("nextForwardToken") in (None, token) or empty >= MAX_EMPTY_PAGES:
                    break
                token = page["nextForwardToken"]


def refused(err: Exception) -> str | None:
    """Why CloudWatch Logs will never take the batch a send failed with (`BufferedStream`'s
    `refused`), or None to send it again. InvalidParameterException is about the batch itself;
    throttling, an outage, AccessDenied (a role fixed while the attempt runs) and a log group
    deleted (until it is deployed again) pass."""
    error = err.response["Error"] if isinstance(err, ClientError) else {}
    if error.get("Code") != "InvalidParameterException":
        return None
    return f"CloudWatch Logs refused them: {error['Code']}: {error.get('Message', '')}"


RESTAMPED = restamped_notice("CloudWatch Logs", "over 14 days back or 2 h ahead")
BACK_S, AHEAD_S = 14 * 86_400.0, 2 * 3_600.0  # what PutLogEvents takes, by its clock


def restamped(events: list[dict], rejected: dict, answer: dict, *, said: bool, stamp=None) -> list[dict]:
    """The events PutLogEvents took the request for but rejected for their time (a node whose
    clock is far off), stamped with CloudWatch's (its answer's Date) so that they are read;
    after a line saying so where a stream's first are (`said`: it was said before). `stamp(message,
    ms)` puts the new time in a message that carries its own (an EMF document's)."""
    now = service_time(answer["ResponseMetadata"]["HTTPHeaders"].get("date")) or time.time()
    # The indices as AWS documents them (the old ones' end exclusive, the new ones' start inclusive),
    # and the events its bounds put out by time (14 days back, 2 h ahead): an emulator that counts
    # the end inclusive loses none, and no stored event is put twice.
    old = max(rejected.get("tooOldLogEventEndIndex", 0), rejected.get("expiredLogEventEndIndex", 0))
    new = rejected.get("tooNewLogEventStartIndex", len(events))
    lo, hi = (now - BACK_S) * 1000, (now + AHEAD_S) * 1000
    again = [e for i, e in enumerate(events) if i < old or i >= new or not lo <= e["timestamp"] <= hi]
    at = int(now * 1000)
    stamp = stamp or (lambda message, _ms: message)
    return [{"timestamp": at, "message": RESTAMPED}][said:] + [
        {"timestamp": at, "message": stamp(event["message"], at)} for event in again
    ]
