"""Writing `tidefleet.metrics` points on AWS.

The scaler function prints them as Embedded Metric Format lines on stdout: Lambda ships stdout
to CloudWatch Logs, which extracts the metrics (no PutMetricData call, no extra permission).
An agent puts its attempts' points as EMF events into the item log group (`OUTCOME_STREAM` of
the queue's streams, which its role may already write), extracted the same way.

The moto server stores log events but extracts nothing, so the sandbox runs `EmfToCloudWatch`:
it reads the same EMF lines and publishes them with PutMetricData, and the dashboard can be
checked against what a real run published (`list_metrics`).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterable

import boto3
from botocore.exceptions import ClientError

from tidefleet import metrics, naming
from tidefleet.config import Environment

OUTCOME_STREAM = "_outcomes"  # a job id starts with a letter or digit: never an item's stream
PUT_METRIC_DATA_MAX = 1000  # metric data per PutMetricData request


def outcome_stream(queue: str) -> str:
    return naming.item_log_stream_prefix(queue) + OUTCOME_STREAM


def emf_stdout(env: Environment, points: list[metrics.Point]) -> None:
    """The scaler function's emitter: one EMF line per dimension set on stdout."""
    for line in metrics.emf(points, int(time.time() * 1000)):
        sys.stdout.write(line + "\n")
    sys.stdout.flush()


class EmfToCloudWatch:
    """CloudWatch's EMF extraction, for an emulator that has none: EMF lines (the scaler's, and
    the agents' events in the item log group) published with PutMetricData."""

    def __init__(self, env: Environment, *, cloudwatch=None, logs=None):
        self.env = env
        self.cloudwatch = cloudwatch or boto3.client("cloudwatch", region_name=env.region)
        self.logs = logs or boto3.client("logs", region_name=env.region)
        self._tokens: dict[str, str] = {}  # per outcome stream: where the last read stopped
        self._reading = threading.Lock()  # the control loop and a final pump may overlap

    def emit(self, env: Environment, points: list[metrics.Point]) -> None:
        """The same lines the scaler function prints, published (the triggers' `emit`)."""
        self.publish(metrics.emf(points, int(time.time() * 1000)))

    def publish(self, lines: Iterable[str]) -> int:
        data = []
        for line in lines:
            stamp, points = metrics.from_emf(line)
            data += [{"MetricName": p.name, "Value": p.value, "Unit": p.metric.unit, "Timestamp": stamp / 1000,
                      "Dimensions": [{"Name": k, "Value": v} for k, v in p.dimensions]} for p in points]  # fmt: skip
        for at in range(0, len(data), PUT_METRIC_DATA_MAX):
            self.cloudwatch.put_metric_data(Namespace=metrics.NAMESPACE, MetricData=data[at : at + PUT_METRIC_DATA_MAX])
        return len(data)

    def pump_outcomes(self) -> int:
        """Publish the agents' EMF events written since the last call; returns the points published."""
        with self._reading:
            return self._pump(naming.item_log_group(self.env.name))

    def _pump(self, group: str) -> int:
        published = 0
        for queue in sorted(self.env.queues):
            stream = outcome_stream(queue)
            while True:
                kwargs = {"logGroupName": group, "logStreamName": stream, "startFromHead": True}
                if stream in self._tokens:
                    kwargs["nextToken"] = self._tokens[stream]
                try:
                    page = self.logs.get_log_events(**kwargs)
                except ClientError as err:
                    if err.response["Error"]["Code"] == "ResourceNotFoundException":
                        break  # no attempt of this queue finished yet
                    raise
                published += self.publish(event["message"] for event in page["events"])
                self._tokens[stream] = page["nextForwardToken"]
                if not page["events"]:
                    break
        return published
