"""Metrics on the moto server: an agent's outcome becomes an EMF event in its queue's outcome
stream (what CloudWatch extracts on AWS), and the sandbox's bridge publishes EMF with
PutMetricData, so a real sandbox run can be checked against the dashboard."""

from __future__ import annotations

import json
import os
import time

import boto3
import pytest

from tidefleet import metrics, naming
from tidefleet.cloud.aws.logs import CloudWatchItemLogs
from tidefleet.cloud.aws.metrics import EmfToCloudWatch, outcome_stream
from tidefleet.cloud.aws.provision import provision
from tidefleet.config import load_environment
from tidefleet.records import AttemptOutcome

ENV = load_environment("sandbox")


def published(namespace: str = metrics.NAMESPACE) -> set[tuple[str, tuple]]:
    cloudwatch = boto3.client("cloudwatch", region_name=ENV.region)
    return {(m["MetricName"], tuple(sorted((d["Name"], d["Value"]) for d in m["Dimensions"])))
            for page in cloudwatch.get_paginator("list_metrics").paginate(Namespace=namespace)
            for m in page["Metrics"]}  # fmt: skip


def test_an_agents_outcome_is_an_emf_event_the_bridge_publishes_once(aws):
    provision(ENV, user_data={"cpu": "#!/bin/sh\n"})
    logs = CloudWatchItemLogs(ENV)
    logs.record_outcomes("demo", [AttemptOutcome("job-1", "item-2", 1, "succeeded", 1.0, time.time()),
                                  AttemptOutcome("job-1", "item-1", 1, "failed", 1.5, time.time() - 1)])
    logs.record_outcomes("demo", [])  # nothing to write
    events = boto3.client("logs", region_name=ENV.region).get_log_events(
        logGroupName=naming.item_log_group(ENV.name), logStreamName=outcome_stream("demo"), startFromHead=True)["events"]
    assert [metrics.from_emf(e["message"])[1] for e in events] == [
        metrics.attempt_points("sandbox", "demo", "failed"), metrics.attempt_points("sandbox", "demo", "succeeded")]
    assert list(logs.lines("demo", "job-1")) == []  # not an item's output

    bridge = EmfToCloudWatch(ENV)
    assert bridge.pump_outcomes() == 2 * len(metrics.OUTCOME_METRICS)
    assert bridge.pump_outcomes() == 0  # read from where it stopped
    dims = (("Environment", "sandbox"), ("Queue", "demo"))
    assert {(name, dims) for name in metrics.OUTCOME_METRICS.values()} <= published()


@pytest.mark.sandbox
def test_every_metric_the_sandbox_dashboard_shows_was_published_by_a_real_sandbox_run(tmp_path):
    from stacks.aws.alarms import dashboard
    from tidefleet.sandbox.run import Sandbox, Timing, run_demo

    saved = dict(os.environ)
    with Sandbox(ENV, tmp_path / "sandbox", Timing()) as sandbox:
        summary = run_demo(sandbox, items=12, deadline=time.time() + 120, chaos=None, on_progress=lambda _: None)
        sandbox.metrics.pump_outcomes()
        seen = published()
    assert dict(os.environ) == saved, "the sandbox points this process at its emulator only while it runs"
    assert summary.fleet_at_zero, json.dumps(summary.notes)
    shown = [w["properties"]["metrics"] for w in dashboard(ENV)["widgets"]]
    ours = [[f for f in line if not isinstance(f, dict)] for lines in shown for line in lines]
    ours = [line for line in ours if line[0] == metrics.NAMESPACE]
    assert ours
    missing = [line for line in ours
               if (line[1], tuple(sorted(zip(line[2::2], line[3::2], strict=True)))) not in seen]  # fmt: skip
    assert missing == []
