"""`tidefleet jobs` reads what its lines show and no more: on AWS the job records through the table's
jobs index (`resources.JOBS_INDEX`), never a scan of every item and heartbeat (a table deployed
before the index still lists its jobs, scanned, with one line saying a deploy adds the index); a
job's counts from its counters, not its items; each pool's heartbeats once. DynamoDB through the
moto server, its calls counted at the client's `before-parameter-build` hook."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter

import boto3
import pytest

from tidefleet import naming
from tidefleet.cloud.aws.dynamodb import DynamoStore, create_table
from tidefleet.config import load_environment
from tidefleet.records import Heartbeat, Item, Job

ENV = load_environment("sandbox")
JOBS = [Job("b", "second", "work", 20.0, 2, counted=True), Job("a", "first", "work", 10.0, 1, counted=True),
        Job("c", "other queue", "short", 30.0, 1, counted=True)]  # fmt: skip


def counted_calls(store: DynamoStore) -> Counter:
    calls: Counter = Counter()

    def count(model, params, **_):
        calls[model.name] += 1
        if params.get("IndexName"):
            calls[f"{model.name} on {params['IndexName']}"] += 1

    store.table.meta.client.meta.events.register("before-parameter-build.dynamodb.*", count)
    return calls


def filled(store: DynamoStore) -> DynamoStore:
    for job in JOBS:
        store.put_job(job)
    for i in range(2):
        store.put_item_if_new(Item("b", f"{i:06d}", args=["x"], status="queued"))
    store.put_heartbeat(Heartbeat("i-1", "cpu", 50.0, 1, 0, 40.0))
    return store


def test_jobs_come_from_the_index_and_their_records_no_scan(aws):
    create_table(ENV.name, ENV.region)
    store = filled(DynamoStore(ENV.name, ENV.region))
    calls = counted_calls(store)
    assert [j.job_id for j in store.jobs()] == ["a", "b", "c"]
    assert store.jobs("work") == [JOBS[1], JOBS[0]], "whole records, oldest first"
    assert [j.job_id for j in store.jobs(since=15.0)] == ["b", "c"]
    assert calls["Scan"] == 0 and calls["Query on jobs"] == calls["Query"] == 3, calls
    assert calls["BatchGetItem"] == 3, calls


def old_table() -> None:
    """The table as stacks before the index declared it: keys only."""
    boto3.client("dynamodb", region_name=ENV.region).create_table(
        TableName=naming.table(ENV.name),
        AttributeDefinitions=[{"AttributeName": k, "AttributeType": "S"} for k in ("pk", "sk")],
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
        BillingMode="PAY_PER_REQUEST",
    )


def test_a_table_from_before_the_index_is_scanned_and_says_a_deploy_adds_it(aws, caplog):
    old_table()
    store = filled(DynamoStore(ENV.name, ENV.region))
    calls = counted_calls(store)
    with caplog.at_level("WARNING", logger="tidefleet.store"):
        assert [j.job_id for j in store.jobs()] == ["a", "b", "c"]
        assert [j.job_id for j in store.jobs("work", since=15.0)] == ["b"]
    assert calls["Scan"] == 2, calls
    (first, _) = [r.getMessage() for r in caplog.records]
    assert f"table {naming.table(ENV.name)} has no 'jobs' index" in first and "deploy the environment again" in first


@pytest.mark.parametrize("code, message", [
    ("ValidationException", "One or more parameter values were invalid"),
    ("AccessDeniedException", "not authorized to perform: dynamodb:Query on resource: .../index/jobs"),
])  # fmt: skip
def test_other_query_errors_are_raised_not_scanned_around(aws, code, message):
    from botocore.exceptions import ClientError

    create_table(ENV.name, ENV.region)
    store = filled(DynamoStore(ENV.name, ENV.region))

    def refuse(**_):
        raise ClientError({"Error": {"Code": code, "Message": message}}, "Query")

    store.table.meta.client.meta.events.register("before-call.dynamodb.Query", refuse)
    calls = counted_calls(store)
    with pytest.raises(ClientError, match=code):
        store.jobs()
    assert calls["Scan"] == 0


def test_the_cli_on_a_table_from_before_the_index_lists_the_jobs_with_one_warning_line(aws, tmp_path):
    old_table()
    filled(DynamoStore(ENV.name, ENV.region))
    done = subprocess.run([sys.executable, "-m", "tidefleet.cli", "jobs", "--env", "sandbox"], check=False,
                          capture_output=True, text=True, env=os.environ, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert [line.split("  ")[0] for line in done.stdout.splitlines()] == ["a", "b", "c"]
    (warning,) = done.stderr.splitlines()
    assert warning.startswith("warning: table ") and "deploy the environment again" in warning


def test_listing_a_job_with_failed_items_reads_its_counters_not_its_items(aws, monkeypatch):
    """A 250k-item job with one failure was read item by item for a line that shows counts only."""
    from tidefleet.jobs import sdk

    create_table(ENV.name, ENV.region)
    DynamoStore(ENV.name, ENV.region).put_job(Job("f", "failing", "work", 10.0, 3, counted=True, n_succeeded=2, n_failed=1))
    monkeypatch.setattr(DynamoStore, "items", lambda *_, **__: pytest.fail("the job's items were read"))
    (listed,) = sdk.jobs(ENV)
    assert (listed.state, listed.counts["failed"], listed.counts["succeeded"], listed.items) == ("failed", 1, 2, [])


def test_listing_running_jobs_reads_each_pools_heartbeats_once(aws, monkeypatch):
    from tidefleet.cloud import for_env
    from tidefleet.jobs import sdk

    create_table(ENV.name, ENV.region)
    store = DynamoStore(ENV.name, ENV.region)
    for n in range(4):
        store.put_job(Job(f"r{n}", "running", "demo", 10.0 + n, 2, counted=True))
    store.put_heartbeat(Heartbeat("i-1", "cpu", time.time(), 4, 4, None, running={f"r{n}": 1 for n in range(4)}))
    cloud = for_env(ENV)
    monkeypatch.setattr(sdk, "for_env", lambda env: cloud)
    calls = counted_calls(cloud.store)
    listed = sdk.jobs(ENV)
    assert [(s.job.job_id, s.counts["running"], s.counts["queued"]) for s in listed] == [(f"r{n}", 1, 1) for n in range(4)]
    assert calls["Query"] == 2, f"the jobs index and the pool's heartbeats, once: {calls}"
