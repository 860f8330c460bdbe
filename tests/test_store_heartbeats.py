"""Node heartbeats round-trip through DynamoDB on the moto server; draining is sticky."""

from tidefleet.store import Heartbeat, Store, create_table


def test_heartbeat_round_trip_and_draining_is_sticky(aws):
    create_table("t")
    store = Store("t", "us-east-1")
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
