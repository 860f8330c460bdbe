"""Node heartbeats round-trip through DynamoDB on the moto server; draining is sticky."""

from tidefleet.cloud.aws.dynamodb import DynamoStore, create_table
from tidefleet.records import Heartbeat, QueueStats


def test_heartbeat_round_trip_and_draining_is_sticky(aws):
    create_table("t")
    store = DynamoStore("t", "us-east-1")
    store.put_heartbeat(Heartbeat("i-1", "cpu", at=100.5, slots=2, busy_slots=0, idle_since=90.25, instance_type="c6i.large"))
    store.put_heartbeat(Heartbeat("i-2", "cpu", at=101.0, slots=2, busy_slots=2, idle_since=None))
    store.put_heartbeat(Heartbeat("i-3", "gpu", at=101.0, slots=1, busy_slots=1, idle_since=None))
    got = store.heartbeats("cpu")
    assert set(got) == {"i-1", "i-2"}
    assert got["i-1"].idle_since == 90.25 and got["i-1"].at == 100.5 and got["i-1"].instance_type == "c6i.large"
    assert got["i-2"].idle_since is None and got["i-2"].busy_slots == 2

    store.mark_draining("cpu", "i-1")
    store.put_heartbeat(Heartbeat("i-1", "cpu", at=102.0, slots=2, busy_slots=1, idle_since=None))
    got = store.heartbeats("cpu")["i-1"]
    assert got.draining and got.idle_since is None and got.busy_slots == 1

    store.forget_node("cpu", "i-1")
    assert set(store.heartbeats("cpu")) == {"i-2"}


def test_queue_stats_keep_an_exponentially_weighted_mean_of_succeeded_items(aws):
    create_table("t")
    store = DynamoStore("t", "us-east-1")
    assert store.queue_stats(["render"]) == {}
    store.record_item_seconds("render", 20.0)
    store.record_item_seconds("render", 40.0)
    store.record_item_seconds("batch", 300.5)
    stats = store.queue_stats(["render", "batch", "idle"])
    assert set(stats) == {"render", "batch"}
    assert stats["render"] == QueueStats(mean_item_s=20.0 + 0.1 * (40.0 - 20.0), items=2)
    assert stats["batch"] == QueueStats(mean_item_s=300.5, items=1)


def test_queue_stats_read_more_queues_than_one_batch_holds(aws):
    create_table("t")
    store = DynamoStore("t", "us-east-1")
    names = [f"q{i}" for i in range(130)]
    for name in names[::10]:
        store.record_item_seconds(name, 5.0)
    assert set(store.queue_stats(names)) == set(names[::10])


def test_dynamodb_claims_run_an_item_once_and_fence_stale_writers(aws):
    from tests.store_contract import check_claims_and_fences, queued_item

    create_table("t")
    store = DynamoStore("t", "us-east-1")
    store.put_item_if_new(queued_item("j"))
    check_claims_and_fences(store, "j")
