"""Item logs on AWS: one CloudWatch Logs stream per attempt."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import boto3
from botocore.exceptions import ClientError

from tidefleet import naming
from tidefleet.logstream import BufferedStream, Outage, stream_name, stream_order

if TYPE_CHECKING:  # settings are loaded (pydantic) by the runtime, not on import
    from tidefleet.config import Environment
    from tidefleet.records import AttemptOutcome


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

        return BufferedStream(name, send, outage=self.outage)

    def record_outcomes(self, queue: str, outcomes: list[AttemptOutcome]) -> None:
        """The attempts' outcome metrics (`tidefleet.metrics.attempt_points`) as EMF events in the
        queue's outcome stream, one PutLogEvents for all: CloudWatch turns them into the metrics
        the alarms watch."""
        from tidefleet import metrics  # the agent's path only: not the scaler's cold import
        from tidefleet.cloud.aws.metrics import outcome_stream

        name = outcome_stream(queue)
        events = [{"timestamp": int(o.at * 1000), "message": line}
                  for o in sorted(outcomes, key=lambda o: o.at)
                  for line in metrics.emf(metrics.attempt_points(self.env_name, queue, o.outcome), int(o.at * 1000))]
        if not events:
            return
        try:
            self.logs.put_log_events(logGroupName=self.group, logStreamName=name, logEvents=events)
        except ClientError as err:
            if err.response["Error"]["Code"] != "ResourceNotFoundException":
                raise
            self.logs.create_log_stream(logGroupName=self.group, logStreamName=name)
            self.logs.put_log_events(logGroupName=self.group, logStreamName=name, logEvents=events)

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
