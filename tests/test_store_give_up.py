"""A job store that gives up (throttled batch calls left unprocessed round after round, a write
race lost every time, a write refused) raises one of its cloud's errors, never a bare
RuntimeError: callers handle it as any refused call (the agent logs one line and tries again
later, tests/test_gcp_agent_store_contention.py; the CLI explains it in one line), never as a bug.
DynamoDB through the moto server, each batch call answered unprocessed at the client's
`before-call` hook (moto never throttles); Firestore through the real client against
tests/gcp_fake.py."""

from __future__ import annotations

import json

import pytest
from botocore.awsrequest import AWSResponse

from tests.test_gcp_agent_store_contention import rival_writer
from tests.test_gcp_jobs import ENV as GCP_ENV
from tests.test_gcp_jobs import gcp  # noqa: F401 - a fixture
from tidefleet.cloud import for_env
from tidefleet.cloud.aws import dynamodb
from tidefleet.cloud.aws.dynamodb import DynamoStore, create_table
from tidefleet.cloud.gcp import firestore
from tidefleet.config import load_environment
from tidefleet.records import Item, Job

AWS_ENV = load_environment("sandbox")


def one_line(cloud, err: BaseException) -> str:
    assert isinstance(err, cloud.errors), f"{type(err).__name__} is none of the cloud's errors"
    line = cloud.explain(err)
    assert "\n" not in line
    return line


@pytest.fixture
def throttled(aws, monkeypatch):
    """The environment's DynamoDB store, whose batch calls leave some of what they were given
    unprocessed (DynamoDB's throttled answer, in its wire form) and do not sleep between rounds;
    the calls made, by operation."""
    create_table(AWS_ENV.name, AWS_ENV.region)
    store = DynamoStore(AWS_ENV.name, AWS_ENV.region)
    monkeypatch.setattr(dynamodb.time, "sleep", lambda s: None)
    calls: list[str] = []
    table = store.table.name

    def answer(model, **_):
        calls.append(model.name)
        if len(calls) > 100:  # a loop that never gives up: stop it, failing the test
            raise AssertionError(f"{model.name}: still asking after 100 unprocessed answers")
        if model.name == "BatchWriteItem":
            return AWSResponse("", 200, {}, None), {"UnprocessedItems": {table: [
                {"PutRequest": {"Item": {"pk": {"S": "JOB#j"}, "sk": {"S": "ITEM#000000"}}}}]}}  # fmt: skip
        return AWSResponse("", 200, {}, None), {"Responses": {}, "UnprocessedKeys": {table: {
            "Keys": [{"pk": {"S": "QUEUE#work"}, "sk": {"S": "HELD"}}], "ConsistentRead": True}}}  # fmt: skip

    for operation in ("BatchWriteItem", "BatchGetItem"):
        store.table.meta.client.meta.events.register(f"before-call.dynamodb.{operation}", answer)
    return store, calls


def test_dynamodb_items_left_unprocessed_through_every_retry_raise_a_throttling_error(throttled):
    store, calls = throttled
    with pytest.raises(Exception) as raised:
        store.create_items([Item("j", "000000", args=[])], unseen=True)
    line = one_line(for_env(AWS_ENV), raised.value)
    assert "ProvisionedThroughputExceededException" in line and "run the same submit again" in line, line
    assert calls == ["BatchWriteItem"] * (dynamodb.RETRIES + 1)


@pytest.mark.parametrize("read", [
    lambda s: s.items_by_id("j", ["000000"]),
    lambda s: s.held_since(["work"]),  # the agent reads it every heartbeat
    lambda s: s.queue_stats(["work"]),  # the scaler's tick reads it
], ids=["items by id", "held queues", "queue stats"])  # fmt: skip
def test_dynamodb_keys_left_unread_through_every_retry_raise_a_throttling_error_not_a_loop(throttled, read):
    store, calls = throttled
    with pytest.raises(Exception) as raised:
        read(store)
    assert "keys unread" in one_line(for_env(AWS_ENV), raised.value)
    assert calls == ["BatchGetItem"] * (dynamodb.RETRIES + 1)


def test_a_dynamodb_give_up_counts_what_the_batches_after_it_left_too(aws, monkeypatch):
    """60 items, 25 a batch: the first batch goes through, the second never does, the third is not
    tried. The message said "25 item(s) unwritten" where 35 were; keys alike."""
    create_table(AWS_ENV.name, AWS_ENV.region)
    store = DynamoStore(AWS_ENV.name, AWS_ENV.region)
    monkeypatch.setattr(dynamodb.time, "sleep", lambda s: None)
    calls = []

    def answer(model, params, **_):
        calls.append(model.name)
        if len(calls) == 1:
            return None  # to the moto server
        asked = json.loads(params["body"])["RequestItems"]  # the serialized request: in DynamoDB's wire form
        if model.name == "BatchWriteItem":
            return AWSResponse("", 200, {}, None), {"UnprocessedItems": asked}
        return AWSResponse("", 200, {}, None), {"Responses": {}, "UnprocessedKeys": asked}

    items = [Item("j", f"{i:06d}", args=[]) for i in range(60)]
    for operation in ("BatchWriteItem", "BatchGetItem"):
        store.table.meta.client.meta.events.register(f"before-call.dynamodb.{operation}", answer)
    with pytest.raises(dynamodb.Unprocessed, match="35 of 60 item[(]s[)] unwritten"):
        store.create_items(items, unseen=True)
    calls.clear()
    keys = [f"{i:06d}" for i in range(120)]  # the first chunk of keys answered, the second never
    with pytest.raises(dynamodb.Unprocessed, match=rf"keys unread [(]{120 - dynamodb.GET_BATCH} of 120[)]"):
        store.items_by_id("j", keys)


@pytest.fixture
def firestore_store(gcp, monkeypatch):  # noqa: F811 - the fixture's value
    monkeypatch.setattr(firestore.time, "sleep", lambda s: None)
    cloud = for_env(GCP_ENV)
    cloud.store.put_job(Job("j", "items", "default", 0.0, 1))
    return cloud


def test_firestore_writes_throttled_through_every_retry_raise_one_of_the_cloud_s_errors(gcp, firestore_store):  # noqa: F811
    gcp.unavailable_writes = firestore.RETRIES + 1
    with pytest.raises(Exception) as raised:
        firestore_store.store.create_items([Item("j", "000000", args=[])])
    assert "unwritten after 8 retries (throttled); run the same submit again" in one_line(firestore_store, raised.value)


def test_a_firestore_write_refused_is_the_cloud_s_error_of_that_code(gcp, firestore_store):  # noqa: F811
    real = gcp._batch

    def refusing(verb: str, body: dict):
        if verb != "batchWrite":
            return real(verb, body)
        return 200, {}, '{"writeResults": [{}], "status": [{"code": 7, "message": "Missing or insufficient permissions."}]}'

    gcp._batch = refusing
    with pytest.raises(Exception) as raised:
        firestore_store.store.create_items([Item("j", "000000", args=[])])
    line = one_line(firestore_store, raised.value)
    assert line.startswith("permission denied in project acme-ml-dev (Firestore refused item j/000000: Missing"), line


def test_a_firestore_write_race_lost_every_time_raises_one_of_the_cloud_s_errors(gcp, firestore_store):  # noqa: F811
    firestore_store.store.put_item_if_new(Item("j", "000000", args=[]))
    with rival_writer(gcp, "/jobs/j/items/000000"), pytest.raises(Exception) as raised:
        firestore_store.store.update_item("j", "000000", status="running")
    line = one_line(firestore_store, raised.value)
    assert line == f"GaveUp: item j/000000: still changing after {firestore.WRITE_RACES} attempts; try again (project acme-ml-dev)"
