"""The JobStore contract (`tidefleet.ports.JobStore`), on every job store adapter: DynamoDB on the
moto server, Firestore through the real client on the GCP fake. These are the rules that keep an
item running once, finished once, and never invented by a late write."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from tidefleet.policy.model import ITEM_SECONDS_WEIGHT as W
from tidefleet.records import Fence, Heartbeat, Item, ItemWrite, Job, QueueStats, WaitingMark

NOW = 1000.0


def queued(job: str = "j", item: str = "000000", **values) -> Item:
    return Item(job, item, **{"args": ["a"], "status": "queued", **values})


@pytest.fixture(autouse=True)
def job_j(store):
    """The job of the items below: a settled item is counted on its job's record."""
    return store.store.put_job(Job("j", "items", "elsewhere", NOW, 3, counted=True))


# -- items: conditional writes and fences ---------------------------------------------------
def test_a_gang_claim_resets_its_roster_and_only_joins_of_that_attempt_land_in_order(store):
    """The gang protocol's writes (`agent.gang`): every claim starts the roster afresh with its lead,
    joins are appends fenced on the attempt, so a join aimed at an older attempt is refused."""
    s = store.store
    s.put_item_if_new(queued())

    def claim(node: str, at: float):
        return s.update_item("j", "000000", status="running", node=node, lease_until=at + 30, add={"attempts": 1},
                             fence=Fence(claim_at=at), gang="forming", members=[{"node": node}], left=[])  # fmt: skip

    def join(node: str, attempt: int):
        return s.update_item("j", "000000", only_from=("running",), fence=Fence(attempt=attempt),
                             append={"members": {"node": node}})  # fmt: skip

    assert claim("lead-a", NOW).attempts == 1
    assert [m["node"] for m in join("b", 1).members] == ["lead-a", "b"]
    assert [m["node"] for m in join("c", 1).members] == ["lead-a", "b", "c"]
    second = claim("lead-d", NOW + 31)  # a's lease lapsed: a new attempt, a new gang
    assert (second.attempts, second.gang, [m["node"] for m in second.members]) == (2, "forming", ["lead-d"])
    assert join("e", 1) is None, "a join aimed at the old attempt must not reach the new gang"
    assert [m["node"] for m in join("e", 2).members] == ["lead-d", "e"]


def test_claims_run_an_item_once_and_fence_stale_writers(store):
    s = store.store
    s.put_item_if_new(queued())

    def claim(node: str, seq: int, at: float):
        return s.update_item("j", "000000", status="running", node=node, seq=seq, lease_until=at + 30,
                             message_id="m-1", add={"attempts": 1}, fence=Fence(claim_at=at, seq=seq))  # fmt: skip

    first = claim("node-a", 0, NOW)
    assert (first.status, first.node, first.attempts, first.lease_until) == ("running", "node-a", 1, NOW + 30)
    assert claim("node-b", 0, NOW + 5) is None, "a second delivery must not start while A's lease is live"
    assert claim("node-b", 0, NOW + 31).node == "node-b", "a lapsed lease may be claimed: A is gone"
    # A comes back: its records are fenced on attempt 1, B holds attempt 2.
    assert s.update_item("j", "000000", status="queued", fence=Fence(attempt=1)) is None
    assert s.update_item("j", "000000", lease_until=NOW + 60, fence=Fence(attempt=1)) is None
    assert s.item("j", "000000").node == "node-b"
    # B hands it back with message seq 1: a stale copy of message 0 can no longer claim it.
    assert s.update_item("j", "000000", status="queued", seq=1, lease_until=None, fence=Fence(attempt=2)).seq == 1
    assert claim("node-c", 0, NOW + 100) is None, "a stale duplicate (older seq) must not run"
    assert claim("node-c", 1, NOW + 100).attempts == 3
    assert s.update_item("j", "000000", status="succeeded", fence=Fence(attempt=3)).status == "succeeded"
    assert claim("node-d", 1, NOW + 200) is None, "final is final"


def test_a_write_fenced_on_a_message_lands_only_while_the_record_names_it(store):
    """`Fence.message` (`records.names`): a handle handed over for a running item's message lands
    while the record names that message: by its id, or by its copy's name while the holder's
    refresh has recorded the name and not yet the id; never once the record names another."""
    s = store.store
    s.put_item_if_new(queued())
    s.update_item("j", "000000", status="running", node="a", lease_until=NOW + 30, message_id="m-1", copy="",
                  add={"attempts": 1}, fence=Fence(claim_at=NOW))  # fmt: skip

    def hand_over(message_id: str, copy: str, handle: str):
        return s.update_item("j", "000000", only_from=("running",), fence=Fence(attempt=1, message=(message_id, copy)),
                             receipt=handle, receipt_at=NOW + 1)  # fmt: skip

    assert hand_over("m-2", "", "h-dup") is None, "another message with the same body: a duplicate"
    assert hand_over("m-1", "1.1", "h-x") is None
    assert (hand_over("m-1", "", "h-1").receipt, s.item("j", "000000").receipt_at) == ("h-1", NOW + 1)
    # The holder's refresh: its copy's name first (the id unknown, the old handle cleared) ...
    refreshing = s.update_item("j", "000000", only_from=("running",), fence=Fence(attempt=1), copy="1.1",
                               message_id="", receipt="", receipt_at=None)  # fmt: skip
    assert (refreshing.copy, refreshing.message_id, refreshing.receipt, refreshing.receipt_at) == ("1.1", "", "", 0.0)
    assert hand_over("m-1", "", "h-late") is None, "the message being replaced no longer takes a handle"
    assert hand_over("m-3", "1.1", "h-3").receipt == "h-3", "the copy, known by its name before its id"
    # ... then its id: the copy's name with another id is a duplicate of it.
    assert s.update_item("j", "000000", fence=Fence(attempt=1, message=("m-3", "1.1")), message_id="m-3") is not None
    assert hand_over("m-4", "1.1", "h-4") is None
    assert hand_over("m-3", "1.1", "h-3b").receipt == "h-3b"
    assert hand_over("m-3", "1.1", "h-old-attempt") is not None and s.update_item(
        "j", "000000", fence=Fence(attempt=2, message=("m-3", "1.1")), receipt="h-never") is None


@pytest.mark.parametrize(("job", "item"), [("j", "no-such-item"), ("no-such-job", "000000")])
def test_an_update_never_creates_an_item_that_was_never_submitted(store, job, item):
    store.store.put_item_if_new(queued())
    assert store.store.update_item(job, item, status="running", add={"attempts": 1}, append={"history": {}}) is None
    assert store.store.item(job, item) is None


@pytest.mark.parametrize(("status", "kwargs", "applies"), [
    ("queued", {"only_from": ("pending", "queued")}, True),
    ("running", {"only_from": ("pending", "queued")}, False),
    ("running", {}, True),
    ("succeeded", {}, False),  # never_from defaults to the final states
    ("failed", {}, False),
    ("cancelled", {}, False),
    ("failed", {"only_from": ("failed",), "never_from": ()}, True),  # retry-failed's way out of failed
    ("cancelled", {"only_from": ("failed",), "never_from": ()}, False),
])  # fmt: skip
def test_an_item_changes_only_from_the_states_the_caller_allows(store, status, kwargs, applies):
    store.store.put_item_if_new(Item("j", "i", ["x"], status=status))
    result = store.store.update_item("j", "i", status="queued", **kwargs)
    assert (result is not None) == applies
    assert store.store.item("j", "i").status == ("queued" if applies else status)


def test_an_update_sets_adds_appends_and_removes_fields_and_returns_the_new_item(store):
    s = store.store
    s.put_item_if_new(queued(attempts=1, exit_code=3, history=[{"outcome": "failed"}]))
    item = s.update_item("j", "000000", reason="why", exit_code=None, add={"attempts": 1, "failures": 2},
                         append={"history": {"outcome": "interrupted", "seconds": 1.5}})  # fmt: skip
    assert item == s.item("j", "000000")
    assert (item.reason, item.exit_code, item.attempts, item.failures) == ("why", None, 2, 2)
    assert item.history == [{"outcome": "failed"}, {"outcome": "interrupted", "seconds": 1.5}]
    assert item.updated_at > 0 and item.args == ["a"]


@pytest.mark.parametrize("kwargs", [{"never_from": ("succeeded", "cancelled")}, {"never_from": ()},
                                    {"only_from": ("failed", "cancelled"), "never_from": ()}])  # fmt: skip
def test_a_status_write_that_may_or_may_not_leave_a_final_status_is_refused_as_uncountable(store, kwargs):
    store.store.put_item_if_new(queued(status="failed"))
    with pytest.raises(ValueError, match="cannot be counted on its job"):
        store.store.update_item("j", "000000", status="queued", **kwargs)


def test_settled_items_are_counted_on_their_job_once_however_often_the_write_is_repeated(store):
    s = store.store
    s.create_items([queued(item=f"00000{n}") for n in range(3)], unseen=True)
    for item, status in (("000000", "succeeded"), ("000001", "failed"), ("000002", "cancelled")):
        assert s.update_item("j", item, status="running") is not None, "not final: not counted"
        assert s.update_item("j", item, status=status, reason="done").status == status
        assert s.update_item("j", item, status=status, reason="again") is None, "a redelivered write lands nowhere"
    assert s.update_item("j", "000000", status="failed") is None, "final is final, and so is its count"
    job = s.job("j")
    assert (job.n_succeeded, job.n_failed, job.n_cancelled) == (1, 1, 1)
    assert s.update_item("j", "000001", status="queued", only_from=("failed",), never_from=()) is not None, "retry-failed"
    assert s.update_item("j", "000001", status="queued", only_from=("failed",), never_from=()) is None
    assert s.job("j").n_failed == 0 and s.item("j", "000001").status == "queued"


def test_a_settling_write_that_loses_a_race_counts_nothing(store):
    store.store.put_item_if_new(queued(status="running"))
    store.before_next_write(lambda: store.other().update_item("j", "000000", status="succeeded", node="other"))
    assert store.store.update_item("j", "000000", status="failed", node="me") is None
    job = store.store.job("j")
    assert (job.n_succeeded, job.n_failed) == (1, 0)


def test_a_write_that_lost_a_race_loses_no_update(store):
    store.store.put_item_if_new(queued(status="running", attempts=1))
    # Another node counts an attempt between this update's read and its write.
    store.before_next_write(lambda: store.other().update_item("j", "000000", add={"attempts": 1}))
    item = store.store.update_item("j", "000000", add={"attempts": 1}, append={"history": {"outcome": "interrupted"}})
    assert item.attempts == 3 and store.store.item("j", "000000").attempts == 3


def test_an_item_is_never_finished_twice_even_when_two_nodes_race(store):
    store.store.put_item_if_new(queued(status="running"))
    store.before_next_write(lambda: store.other().update_item("j", "000000", status="succeeded", node="other"))
    assert store.store.update_item("j", "000000", status="succeeded", node="me") is None
    assert store.store.item("j", "000000").node == "other"


def test_several_writes_land_in_one_go_each_on_its_own_condition_and_count_once_on_their_jobs(store):
    s = store.store
    s.put_job(Job("k", "items", "elsewhere", NOW, 1, counted=True))
    s.create_items([queued(item=f"00000{n}", status="running", attempts=1) for n in range(4)], unseen=True)
    s.create_items([Item("k", "000000", args=["a"], status="running", attempts=1)], unseen=True)
    s.update_item("j", "000003", status="succeeded")  # already final
    landed = s.update_items([
        ItemWrite("j", "000000", {"status": "succeeded", "exit_code": 0}, fence=Fence(attempt=1)),
        ItemWrite("j", "000001", {"status": "succeeded"}, fence=Fence(attempt=2)),  # a stale attempt's
        ItemWrite("j", "000002", {"status": "failed", "reason": "exit 1"}, append={"history": {"outcome": "failed"}}),
        ItemWrite("j", "000003", {"status": "succeeded"}),  # final is final
        ItemWrite("j", "000009", {"status": "succeeded"}),  # never submitted: never created
        ItemWrite("k", "000000", {"status": "succeeded"}),  # another job, counted on its own
        ItemWrite("j", "000001", {"node": "x"}, add={"attempts": 1}),  # conditions pass: lands
        ItemWrite("j", "000001", {"node": "y"}, add={"attempts": 1}),  # the same item again: lands after
    ])  # fmt: skip
    assert landed == [True, False, True, False, False, True, True, True]
    assert s.item("j", "000009") is None
    assert [s.item("j", f"00000{n}").status for n in range(4)] == ["succeeded", "running", "failed", "succeeded"]
    assert s.item("j", "000002").history == [{"outcome": "failed"}] and s.item("j", "000002").reason == "exit 1"
    assert (s.item("j", "000001").attempts, s.item("j", "000001").node) == (3, "y"), "in order, none lost"
    assert (s.job("j").n_succeeded, s.job("j").n_failed, s.job("k").n_succeeded) == (2, 1, 1)
    assert s.update_items([ItemWrite("j", "000000", {"status": "succeeded"})]) == [False], "a repeat lands nowhere"
    assert s.job("j").n_succeeded == 2 and s.update_items([]) == []


def test_several_writes_one_of_which_another_writer_settled_meanwhile_land_the_rest_and_count_once(store):
    s = store.store
    s.create_items([queued(item=f"00000{n}", status="running") for n in range(3)], unseen=True)
    store.before_next_write(lambda: store.other().update_item("j", "000001", status="failed", node="other"))
    writes = [ItemWrite("j", f"00000{n}", {"status": "succeeded", "node": "me"}) for n in range(3)]
    assert s.update_items(writes) == [True, False, True]
    assert [(i.status, i.node) for i in s.items("j")] == [("succeeded", "me"), ("failed", "other"), ("succeeded", "me")]
    assert (s.job("j").n_succeeded, s.job("j").n_failed) == (2, 1)


def test_more_writes_than_one_store_call_holds_all_land_and_count(store):
    s = store.store
    s.create_items([queued(item=f"{n:06d}", status="running") for n in range(120)], unseen=True)
    assert s.update_items([ItemWrite("j", f"{n:06d}", {"status": "succeeded"}) for n in range(120)]) == [True] * 120
    assert s.job("j").n_succeeded == 120


def test_each_write_that_ends_an_attempt_moves_its_jobs_last_attempt_at_and_no_other_write_does(store):
    """`tidefleet cost --since` skips a job whose last attempt ended before its window: every write
    of an attempt's end (a history entry, settling or not, one at a time or in a batch, and a gang
    member's part) must move the job's stamp, or its attempt would drop out of the report. One
    that moves no counter stamps in a write of its own, once a minute per client and job
    (`STAMP_EVERY_S`): each such write here is another client's, as each is another node's."""
    s = store.store
    s.create_items([queued(item=f"00000{n}", status="running", attempts=1) for n in range(3)], unseen=True)

    def moves(write) -> bool:
        before, began = s.job("j").last_attempt_at, time.time()
        write()
        after = s.job("j").last_attempt_at
        return after is not None and after != before and began - 1 <= after <= time.time() + 1

    assert s.job("j").last_attempt_at is None, "no attempt recorded yet"
    assert not moves(lambda: s.update_item("j", "000000", node="a", add={"attempts": 1}))
    assert not moves(lambda: s.update_items([ItemWrite("j", "000001", {"node": "b"})]))
    assert moves(lambda: store.other().update_item("j", "000000", fence=Fence(attempt=2), status="queued",
                                                   append={"history": {"outcome": "failed"}}))  # a retry: no count
    assert moves(lambda: s.update_item("j", "000000", status="succeeded", append={"history": {"outcome": "succeeded"}}))
    assert moves(lambda: s.update_items([ItemWrite("j", "000001", {"status": "failed"},
                                                   append={"history": {"outcome": "failed"}})]))  # fmt: skip
    late = store.other()
    assert moves(lambda: late.update_item("j", "000000", never_from=(), append={"history": {"outcome": "failed"}})), \
        "a late attempt of an item another node settled: only its history entry is kept"
    assert not moves(lambda: late.update_item("j", "000001", never_from=(), append={"history": {"outcome": "x"}})), \
        "the same client again within a minute: no write of its own"
    assert moves(lambda: s.update_items([ItemWrite("j", "000002", {"node": "c"}, append={"history": {"outcome": "x"}})]))
    assert moves(lambda: store.other().record_part("j", "000002", {"attempt": 1, "node": "m1", "seconds": 2.0}))
    assert [e["outcome"] for e in s.item("j", "000000").history] == ["failed", "succeeded", "failed"]
    assert s.item("j", "000001").history[-1] == {"outcome": "x"}, "the write itself lands"
    assert s.parts("j") == {"000002": [{"attempt": 1, "node": "m1", "seconds": 2.0}]}
    assert (s.job("j").n_succeeded, s.job("j").n_failed) == (1, 1)


def test_a_jobs_failed_items_are_read_alone_and_leave_that_list_once_they_go_back(store):
    """`tidefleet status` shows why items failed without reading the job's others: the failed
    items are found apart (DynamoDB: the failed-items index; Firestore: a query on status), each
    kind of write moving an item in or out, and an item put failed is found too."""
    s = store.store
    s.put_job(Job("k", "items", "elsewhere", NOW, 1, counted=True))
    s.create_items([queued(item=f"00000{n}", status="running") for n in range(4)], unseen=True)
    s.create_items([Item("k", "000000", args=["a"], status="failed", reason="other job")], unseen=True)
    assert s.failed_items("j") == []
    s.update_item("j", "000001", status="failed", reason="exit 3")
    s.update_items([ItemWrite("j", "000003", {"status": "failed", "reason": "exit 4"})])
    s.update_item("j", "000002", status="succeeded")
    assert [(i.item_id, i.reason) for i in s.failed_items("j")] == [("000001", "exit 3"), ("000003", "exit 4")]
    s.update_item("j", "000001", status="queued", only_from=("failed",), never_from=())  # retry-failed
    assert [i.item_id for i in s.failed_items("j")] == ["000003"]
    assert [(i.job_id, i.reason) for i in s.failed_items("k")] == [("k", "other job")]


def test_an_item_is_put_only_if_new_and_an_existing_one_is_left_untouched(store):
    s = store.store
    assert s.put_item_if_new(queued(args=["first"])) is True
    assert s.put_item_if_new(queued(args=["second"], status="succeeded")) is False
    assert (s.item("j", "000000").args, s.item("j", "000000").status) == (["first"], "queued")


def test_items_are_listed_in_item_id_order_and_only_the_jobs_own(store):
    for job, item in (("j", "000002"), ("j", "000000"), ("other", "000001"), ("j", "000001")):
        store.store.put_item_if_new(queued(job, item))
    assert [i.item_id for i in store.store.items("j")] == ["000000", "000001", "000002"]
    assert store.store.items("nothing") == []


# -- jobs -------------------------------------------------------------------------------------
def test_a_job_is_put_once_and_a_repeat_returns_the_stored_one(store):
    first = Job("nightly", "nightly", "work", 10.0, 2, items_digest="sha256:x")
    assert store.store.put_job(first) == first
    assert store.store.put_job(Job("nightly", "other name", "work", 20.0, 5)) == first
    assert store.store.job("nightly") == first and store.store.job("nope") is None


def test_jobs_are_listed_oldest_first_filtered_by_queue_and_items_are_never_jobs(store, job_j):
    s = store.store
    jobs = [Job("b-new", "new", "work", 20.0, 1), Job("a-old", "old", "other", 10.0, 2, items_digest="sha256:x"),
            Job("c-same-time", "same", "work", 20.0, 1)]  # fmt: skip
    for job in jobs:
        s.put_job(job)
    s.put_item_if_new(queued("b-new"))
    s.cancel_job("c-same-time")
    s.set_job_total("b-new", 3)
    assert s.jobs() == [jobs[1], Job("b-new", "new", "work", 20.0, 3), Job("c-same-time", "same", "work", 20.0, 1, cancelled=True),
                        job_j]  # fmt: skip
    assert [j.job_id for j in s.jobs("work")] == ["b-new", "c-same-time"]
    assert s.jobs("nope") == []
    assert [j.job_id for j in s.jobs(since=20.0)] == ["b-new", "c-same-time", "j"], "created at `since` or later"
    assert [j.job_id for j in s.jobs("other", since=20.0)] == []


@pytest.mark.parametrize("write", [lambda s: s.cancel_job("ghost"), lambda s: s.set_job_total("ghost", 3)])
def test_cancelling_or_sizing_a_job_that_was_never_put_raises_and_creates_nothing(store, write, job_j):
    with pytest.raises(store.errors):
        write(store.store)
    assert store.store.job("ghost") is None and store.store.jobs() == [job_j]


# -- node heartbeats ------------------------------------------------------------------------------
def beat(node: str, pool: str = "cpu", at: float = NOW, busy: int = 0, **values) -> Heartbeat:
    return Heartbeat(node, pool, at=at, slots=2, busy_slots=busy, idle_since=None if busy else at - 10, **values)


def test_heartbeats_round_trip_by_pool(store):
    s = store.store
    s.put_heartbeat(beat("n-1", at=100.5, instance_type="c6i.large", spot=False, gpus=1))
    s.put_heartbeat(beat("n-2", busy=2))
    s.put_heartbeat(beat("n-3", pool="gpu"))
    got = s.heartbeats("cpu")
    assert got == {"n-1": beat("n-1", at=100.5, instance_type="c6i.large", spot=False, gpus=1), "n-2": beat("n-2", busy=2)}
    assert s.heartbeat("cpu", "n-2") == beat("n-2", busy=2)
    assert s.heartbeat("cpu", "n-3") is None and s.heartbeats("nothing") == {}


def test_a_heartbeat_says_what_runs_per_job_and_the_next_one_replaces_it(store):
    store.store.put_heartbeat(beat("n-1", busy=2, running={"job-a": 1, "job-b": 1}))
    assert store.store.heartbeat("cpu", "n-1").running == {"job-a": 1, "job-b": 1}
    store.store.put_heartbeat(beat("n-1"))
    assert store.store.heartbeats("cpu")["n-1"].running == {}


def test_a_busy_heartbeat_clears_idle_since(store):
    store.store.put_heartbeat(beat("n-1"))
    store.store.put_heartbeat(beat("n-1", at=NOW + 5, busy=1))
    assert store.store.heartbeat("cpu", "n-1").idle_since is None


def test_draining_is_sticky_a_later_heartbeat_never_clears_it(store):
    s = store.store
    s.put_heartbeat(beat("n-1"))
    s.mark_draining("cpu", "n-1")
    s.mark_draining("cpu", "n-1")  # idempotent
    s.put_heartbeat(beat("n-1", at=NOW + 5, busy=1))
    assert s.heartbeats("cpu")["n-1"] == beat("n-1", at=NOW + 5, busy=1, draining=True)


def test_a_draining_mark_before_the_first_heartbeat_is_not_a_heartbeat_but_the_first_one_drains(store):
    s = store.store
    s.mark_draining("cpu", "n-early")  # the interruption function got there before the agent
    assert s.heartbeats("cpu") == {} and s.heartbeat("cpu", "n-early") is None
    s.put_heartbeat(beat("n-early"))
    assert s.heartbeat("cpu", "n-early").draining


def test_the_scalers_cordon_mark_survives_heartbeats_until_the_scaler_clears_it(store):
    s = store.store
    s.put_heartbeat(beat("n-1"))
    s.set_cordon("cpu", "n-1", True)
    s.put_heartbeat(beat("n-1", at=NOW + 5, busy=1))  # the agent's write never touches the mark
    assert s.heartbeat("cpu", "n-1") == beat("n-1", at=NOW + 5, busy=1, cordoned=True)
    assert s.heartbeats("cpu")["n-1"].cordoned
    s.set_cordon("cpu", "n-1", False)
    s.put_heartbeat(beat("n-1", at=NOW + 10))
    assert not s.heartbeat("cpu", "n-1").cordoned


def test_a_cordon_mark_before_the_first_heartbeat_is_not_a_heartbeat_but_the_first_one_reads_it(store):
    s = store.store
    s.set_cordon("cpu", "n-early", True)
    assert s.heartbeats("cpu") == {} and s.heartbeat("cpu", "n-early") is None
    s.put_heartbeat(beat("n-early"))
    assert s.heartbeat("cpu", "n-early").cordoned


def test_the_scalers_preempt_marks_survive_heartbeats_and_are_replaced_whole(store):
    s = store.store
    runs = [{"key": "j/000001/2", "queue": "batch", "since": NOW - 700, "slots": 1}]
    s.put_heartbeat(replace(beat("n-1"), runs=runs))
    s.set_preempt("cpu", "n-1", ["j/000001/2"])
    s.put_heartbeat(replace(beat("n-1", at=NOW + 5), runs=runs))  # the agent's write never touches the marks
    seen = s.heartbeats("cpu")["n-1"]
    assert (seen.runs, seen.preempt) == (runs, ["j/000001/2"])
    s.set_preempt("cpu", "n-1", [])
    assert s.heartbeat("cpu", "n-1").preempt == []


def test_a_heartbeat_carries_the_items_its_spot_node_left_to_on_demand_nodes_and_the_next_one_replaces_them(store):
    s = store.store
    s.put_heartbeat(beat("n-1", on_demand_wanted={"train": ["job-a/000001", "job-b/000007"]}))
    assert s.heartbeats("cpu")["n-1"].on_demand_wanted == {"train": ["job-a/000001", "job-b/000007"]}
    s.put_heartbeat(beat("n-1", at=NOW + 5))  # an on-demand node took them
    assert s.heartbeat("cpu", "n-1").on_demand_wanted == {}


def test_a_heartbeat_carries_a_gang_leads_beacon_and_a_later_one_clears_it(store):
    s = store.store
    beacon = {"queue": "train", "job": "j", "item": "000000", "attempt": 2, "since": NOW - 3.5, "forming": True}
    s.put_heartbeat(replace(beat("n-1"), gang=beacon))
    assert s.heartbeats("cpu")["n-1"].gang == beacon
    s.put_heartbeat(beat("n-1", at=NOW + 5))
    assert s.heartbeat("cpu", "n-1").gang == {}


def test_a_heartbeat_carries_the_agents_intake_rates(store):
    s = store.store
    s.put_heartbeat(replace(beat("n-1"), intake={"render": 0.25, "batch": 0.003}))
    assert s.heartbeats("cpu")["n-1"].intake == {"render": 0.25, "batch": 0.003}


def test_a_forgotten_node_has_no_heartbeat(store):
    store.store.put_heartbeat(beat("n-1"))
    store.store.put_heartbeat(beat("n-2"))
    store.store.forget_node("cpu", "n-1")
    assert set(store.store.heartbeats("cpu")) == {"n-2"}
    store.store.forget_node("cpu", "n-never")  # nothing to forget: not an error


# -- queue statistics ---------------------------------------------------------------------------
def test_queue_stats_keep_an_exponentially_weighted_mean_of_succeeded_items(store):
    s = store.store
    assert s.queue_stats(["render"]) == {}
    s.record_item_seconds("render", 20.0)
    s.record_item_seconds("render", 40.0)
    s.record_item_seconds("batch", 300.5)
    assert s.queue_stats(["render", "batch", "idle"]) == {
        "render": QueueStats(mean_item_s=20.0 + W * (40.0 - 20.0), items=2),
        "batch": QueueStats(mean_item_s=300.5, items=1),
    }


def test_a_waiting_mark_is_kept_moved_and_cleared_apart_from_the_queue_stats(store):
    s = store.store
    assert s.waiting_marks(["render", "batch"]) == {}
    s.record_item_seconds("render", 20.0)
    s.mark_waiting("render", WaitingMark(((1_800_000_000.5, 3), (1_800_000_002.25, 40)), 12))
    s.mark_waiting("batch", WaitingMark(((1_800_000_100.0, 1),), 0))
    s.mark_waiting("batch", WaitingMark(((1_800_000_200.0, 7),)))  # a new backlog's mark replaces the old one
    assert s.waiting_marks(["render", "batch", "idle"]) == {
        "render": WaitingMark(((1_800_000_000.5, 3), (1_800_000_002.25, 40)), 12),
        "batch": WaitingMark(((1_800_000_200.0, 7),))}  # fmt: skip
    s.mark_waiting("render", None)
    s.mark_waiting("idle", None)  # nothing to clear: not an error
    assert s.waiting_marks(["render", "batch", "idle"]) == {"batch": WaitingMark(((1_800_000_200.0, 7),))}
    assert s.queue_stats(["render"]) == {"render": QueueStats(mean_item_s=20.0, items=1)}  # untouched


def test_a_hold_mark_is_kept_and_released_apart_from_the_waiting_mark_and_seen_by_another_client(store):
    s = store.store
    assert s.held_since(["render", "batch"]) == {}
    s.mark_waiting("render", WaitingMark(((1_800_000_000.0, 2),), 5))
    s.mark_held("render", 1_800_000_060.0)
    s.mark_held("batch", 1_800_000_060.0)
    assert store.other().held_since(["render", "batch", "idle"]) == {"render": 1_800_000_060.0, "batch": 1_800_000_060.0}
    s.mark_held("batch", None)
    s.mark_held("idle", None)  # nothing to release: not an error
    assert store.other().held_since(["render", "batch", "idle"]) == {"render": 1_800_000_060.0}
    assert s.waiting_marks(["render"]) == {"render": WaitingMark(((1_800_000_000.0, 2),), 5)}  # untouched


def test_queue_stats_fold_many_samples_in_one_call_as_one_at_a_time(store):
    store.store.record_item_seconds("one-by-one", 20.0)
    store.store.record_item_seconds("one-by-one", 40.0)
    store.store.record_item_seconds("one-by-one", 10.0)
    store.store.record_item_seconds("at-once", 20.0, 40.0, 10.0)
    stats = store.store.queue_stats(["one-by-one", "at-once"])
    assert stats["at-once"].items == 3 and stats["at-once"].mean_item_s == pytest.approx(stats["one-by-one"].mean_item_s)


def test_queue_stats_are_compare_and_set_so_a_concurrent_sample_is_never_lost(store):
    store.store.record_item_seconds("render", 20.0)
    store.before_next_write(lambda: store.other().record_item_seconds("render", 40.0))
    store.store.record_item_seconds("render", 60.0)
    stats = store.store.queue_stats(["render"])["render"]
    second = 20.0 + W * (40.0 - 20.0)
    assert stats.items == 3 and stats.mean_item_s == pytest.approx(second + W * (60.0 - second))


def test_queue_stats_read_more_queues_than_one_batch_holds(store):
    names = [f"q{i}" for i in range(130)]
    for name in names[::10]:
        store.store.record_item_seconds(name, 5.0)
    assert set(store.store.queue_stats(names)) == set(names[::10])


# -- the watch list and dependencies ----------------------------------------------------------
def test_watched_jobs_are_a_set_listed_without_the_jobs_themselves(store):
    s = store.store
    s.put_job(Job("a", "a", "work", 10.0, 1))
    for job_id in ("w-1", "w-2", "w-1"):
        s.watch(job_id)
    assert sorted(s.watched()) == ["w-1", "w-2"]
    s.unwatch("w-1")
    s.unwatch("never-watched")  # forgetting twice is harmless: the watch retries
    assert s.watched() == ["w-2"]
    assert sorted(j.job_id for j in s.jobs()) == ["a", "j"], "a watch entry is not a job (j: the autouse fixture job)"


def test_a_waiting_job_keeps_its_dependency_and_a_timed_out_one_says_why(store):
    s = store.store
    s.put_job(Job("b", "b", "work", 10.0, 1, after="a", after_finished=True, waiting=True, deadline=99.5))
    s.end_wait("b")
    s.cancel_job("b", "timed out: past its deadline")
    assert s.job("b") == Job("b", "b", "work", 10.0, 1, after="a", after_finished=True, deadline=99.5,
                             cancelled=True, cancel_reason="timed out: past its deadline")  # fmt: skip


def test_one_continuation_at_a_time_claims_a_stalled_submit_until_its_claim_is_stale(store):
    """`claim_resume` (`jobs.scheduled.resume`): a continuation of a stopped submit claims the job
    first; a second one is refused until the claim is older than `stale_before`. A job whose submit
    finished, or that does not exist, is never claimed; a continuation that failed gives its own
    claim back (`release_resume`), never a later one's."""
    s = store.store
    s.put_job(Job("r", "r", "work", 10.0, 0, submitting=True, schedule="m"))
    assert s.job("r").resumed_at == 0.0, "a job nobody continued yet"
    assert s.claim_resume("r", NOW, stale_before=NOW - 900) is True
    assert s.job("r").resumed_at == NOW
    assert store.other().claim_resume("r", NOW + 1, stale_before=NOW + 1 - 900) is False, "the first is going"
    assert s.claim_resume("r", NOW + 900, stale_before=NOW + 1) is True, "past stale_before: that one is over"
    s.release_resume("r", NOW)  # an older continuation's release leaves the newer claim
    assert s.job("r").resumed_at == NOW + 900
    s.release_resume("r", NOW + 900)
    assert s.claim_resume("r", NOW + 901, stale_before=NOW + 1) is True, "a released claim is free at once"
    s.end_submit("r", 2)
    assert s.claim_resume("r", NOW + 5000, stale_before=NOW + 4000) is False, "its submit finished"
    assert s.claim_resume("never-put", NOW, stale_before=NOW) is False
    assert s.job("never-put") is None, "a claim creates no job"


def test_a_continuation_claim_is_taken_once_when_two_race(store):
    s = store.store
    s.put_job(Job("r", "r", "work", 10.0, 0, submitting=True, schedule="m"))
    store.before_next_write(lambda: store.other().claim_resume("r", NOW, stale_before=NOW - 900))
    assert s.claim_resume("r", NOW, stale_before=NOW - 900) is False
    assert s.job("r").resumed_at == NOW


def test_a_leave_grant_is_taken_in_units_by_one_node_at_a_time_until_it_runs_out_or_expires(store):
    s, at = store.store, 1_800_000_000.0
    idle, now = at + 5, at + 15  # went idle after the tick that granted
    assert not s.take_leave("cpu", 1, idle, now)  # never granted
    s.grant_leave("cpu", 3, at, at + 60)
    assert not s.take_leave("cpu", 1, at - 1, now)  # idle before the grant: that tick kept it
    assert s.take_leave("cpu", 2, idle, now)
    assert not store.other().take_leave("cpu", 2, idle, now)  # 1 left: another client sees the take
    assert store.other().take_leave("cpu", 1, idle, now)
    assert not s.take_leave("cpu", 1, idle, now)
    s.grant_leave("cpu", 5, at, at + 60)  # the next tick replaces the grant
    assert not s.take_leave("cpu", 1, idle, at + 60)  # lapsed
    assert s.take_leave("cpu", 1, idle, at + 59)
    s.grant_leave("cpu", 0, at + 60, at + 150)  # withdrawn
    assert not s.take_leave("cpu", 1, at + 70, at + 80)
    assert s.heartbeats("cpu") == {}  # the grant is no heartbeat


def test_the_first_nodes_going_idle_stay_before_any_leaves_and_a_cordoned_one_never_stays(store):
    s, at = store.store, 1_800_000_000.0
    idle, now = at + 5, at + 15
    s.grant_leave("cpu", 2, at, at + 60, stay=2)
    assert not s.take_leave("cpu", 1, at - 1, now)  # idle before the grant: it takes no stay either
    assert s.take_leave("cpu", 1, idle, now, cordoned=True)  # it takes no items: it leaves (1 unit left)
    assert not s.take_leave("cpu", 1, idle, now)  # stays (1 stay left)
    assert not store.other().take_leave("cpu", 1, idle, now)  # stays (none left): another client sees it
    assert store.other().take_leave("cpu", 1, idle, now)  # the next one leaves: the last unit
    assert not s.take_leave("cpu", 1, idle, now)
    s.grant_leave("cpu", 1, at, at + 60, stay=1)
    assert not s.take_leave("cpu", 1, idle, at + 60)  # lapsed: no stay taken
    assert not s.take_leave("cpu", 1, idle, now) and s.take_leave("cpu", 1, idle, now)

