"""A backlog that counts leased messages as waiting (Pub/Sub's num_undelivered_messages, through
`MonitoringQueues`): the control tick moves what the agents' heartbeats say they hold to in
flight before it ages the waiting items, so running items are never waiting demand. A backlog
that says in-flight itself (SQS, the simulator's) is left as it is."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.test_control import ENV, NOW, FakeQueues, beat, group, instance, ports
from tidefleet import control
from tidefleet.cloud.memory import MemoryQueues
from tidefleet.ports import Backlog


def observed(backlog: Backlog, beats: dict, *instances, now: float = NOW, marks: MemoryQueues | None = None):
    p = ports(group("cpu", len(instances), *instances), beats={"cpu": beats}, backlogs={"demo": backlog})
    if marks is not None:
        p = replace(p, stats=marks)
    (queue,) = control.observe(ENV, p, now, ["cpu"]).fleet.queues
    return queue


def leasing(id_, n, at=NOW - 5):
    return replace(beat(id_, busy=2), at=at, leased={"demo": n})


def test_running_items_leased_messages_are_in_flight_not_waiting_nor_aged():
    beats = {"i-1": leasing("i-1", 2), "i-2": leasing("i-2", 2)}
    marks = MemoryQueues()
    queue = observed(Backlog(4, 0, counts_leased=True), beats, instance("i-1"), instance("i-2"), marks=marks)
    assert (queue.visible, queue.in_flight, queue.waiting_ages) == (0, 4, ())
    # one more item waits besides them: only it is aged
    queue = observed(Backlog(5, 0, counts_leased=True), beats, instance("i-1"), instance("i-2"), now=NOW + 60, marks=marks)
    assert (queue.visible, queue.in_flight, queue.waiting_ages) == (1, 4, ((0.0, 1),))


def test_the_policy_no_longer_launches_for_running_items_after_a_boot():
    """The audit's s9: two busy nodes run 4 items, nothing waits; 31 minutes later the tick wanted
    twice the nodes ("4 item(s) waited a boot and would miss target_wait_s")."""
    marks = MemoryQueues()
    for dt in (0, 600, 1860, 2400):
        beats = {n: leasing(n, 2, at=NOW + dt - 5) for n in ("i-1", "i-2")}
        p = replace(ports(group("cpu", 2, instance("i-1"), instance("i-2")), beats={"cpu": beats},
                          backlogs={"demo": Backlog(4, 0, counts_leased=True)}), stats=marks)  # fmt: skip
        (decision,) = control.tick(ENV, p, NOW + dt, pools=["cpu"])
        assert decision.desired <= 2, (dt, decision.reasons)
    assert marks.waiting == {}


def test_only_nodes_the_group_lists_with_a_heartbeat_younger_than_the_visibility_timeout_hold():
    stale = NOW - ENV.queues["demo"].visibility_timeout_s - 10
    beats = {"i-1": leasing("i-1", 1), "i-2": leasing("i-2", 2, at=stale), "i-gone": leasing("i-gone", 3)}
    queue = observed(Backlog(9, 0, counts_leased=True), beats, instance("i-1"), instance("i-2"))
    assert (queue.visible, queue.in_flight) == (8, 1)


def test_more_held_than_the_lagging_count_says_leaves_none_waiting_never_fewer():
    queue = observed(Backlog(1, 0, counts_leased=True), {"i-1": leasing("i-1", 3)}, instance("i-1"))
    assert (queue.visible, queue.in_flight) == (0, 1)


def test_a_backlog_that_says_in_flight_itself_is_left_as_it_is():
    queue = observed(Backlog(4, 2), {"i-1": leasing("i-1", 2)}, instance("i-1"))
    assert (queue.visible, queue.in_flight) == (4, 2)


def test_a_gang_item_held_by_its_lead_is_in_flight_for_each_of_its_nodes():
    env = ENV.model_copy(update={"queues": {**ENV.queues, "demo": ENV.queues["demo"].model_copy(update={"nodes_per_item": 2})}})
    beats = {"i-1": leasing("i-1", 1), "i-2": beat("i-2", busy=2)}  # the lead holds the message, the member none
    p = ports(group("cpu", 2, instance("i-1"), instance("i-2")), beats={"cpu": beats},
              backlogs={"demo": Backlog(3, 0, counts_leased=True)})  # fmt: skip
    (queue,) = control.observe(env, p, NOW, ["cpu"]).fleet.queues
    assert (queue.visible, queue.in_flight) == (4, 2)


def test_fake_queues_keep_the_flag_unset():  # the simulator's and SQS's backlogs
    assert not FakeQueues().backlog("demo").counts_leased and not MemoryQueues().backlog("demo").counts_leased


# Cloud Monitoring's count trails by one to three minutes (`Backlog.as_of`): after a job's last items
# are acked it still shows them. A node of the pool that said since that it had been idle, its
# receives finding nothing, is the newer word: nothing waits (`control._seen_empty`).
def idle(id_, since=NOW - 60, at=NOW - 5, **fields):
    return replace(beat(id_), at=at, idle_since=since, **fields)


def test_a_count_older_than_an_idle_nodes_word_is_finished_work_not_waiting():
    beats = {"i-1": idle("i-1"), "i-2": leasing("i-2", 1)}
    queue = observed(Backlog(5, 0, counts_leased=True, as_of=NOW - 120), beats, instance("i-1"), instance("i-2"))
    assert (queue.visible, queue.in_flight, queue.waiting_ages) == (0, 1, ())


def test_finished_work_in_a_trailing_count_launches_no_node_and_lets_the_idle_ones_go():
    """Two nodes went idle a minute ago with the job done; the count of two minutes ago still says
    40: the tick wanted the pool's max for them."""
    beats = {n: idle(n, since=NOW - 600) for n in ("i-1", "i-2")}
    p = ports(group("cpu", 2, instance("i-1"), instance("i-2")), beats={"cpu": beats},
              backlogs={"demo": Backlog(40, 0, counts_leased=True, as_of=NOW - 120)})  # fmt: skip
    (decision,) = control.tick(ENV, p, NOW, pools=["cpu"])
    assert decision.desired < 2, decision.reasons


@pytest.mark.parametrize(
    "why, node, as_of",
    [
        ("counted after the node's word", idle("i-1"), NOW - 2),
        ("idle too briefly to have polled", idle("i-1", since=NOW - 5 - control.IDLE_PROOF_S + 1), NOW - 120),
        ("cordoned: takes nothing", idle("i-1", cordoned=True), NOW - 120),
        ("draining: takes nothing", idle("i-1", draining=True), NOW - 120),
        ("faulted: takes nothing", idle("i-1", fault="no GPU"), NOW - 120),
        ("too few slots for one item", idle("i-1", slots=1), NOW - 120),
        ("busy", leasing("i-1", 1), NOW - 120),
        ("no time given: the count is of now", idle("i-1"), None),
    ],
)
def test_the_count_stands_unless_a_node_that_would_take_an_item_said_later_it_found_none(why, node, as_of):
    env = ENV.model_copy(update={"queues": {**ENV.queues, "demo": ENV.queues["demo"].model_copy(update={"slots_per_item": 2})}})
    p = ports(group("cpu", 1, instance("i-1")), beats={"cpu": {"i-1": node}},
              backlogs={"demo": Backlog(5, 0, counts_leased=True, as_of=as_of)})  # fmt: skip
    (queue,) = control.observe(env, p, NOW, ["cpu"]).fleet.queues
    assert queue.visible == 5 - node.leased.get("demo", 0), why  # less only what the node holds


def test_a_node_the_group_no_longer_lists_says_nothing():
    queue = observed(Backlog(5, 0, counts_leased=True, as_of=NOW - 120), {"i-gone": idle("i-gone")}, instance("i-1"))
    assert queue.visible == 5


def test_a_held_queue_and_one_whose_items_wait_for_on_demand_nodes_keep_their_count():
    marks = MemoryQueues()
    marks.mark_held("demo", NOW - 300)
    queue = observed(Backlog(5, 0, counts_leased=True, as_of=NOW - 120), {"i-1": idle("i-1")}, instance("i-1"), marks=marks)
    assert queue.visible == 5, "a held queue's items are not received: an idle node says nothing of them"
    env = ENV.model_copy(update={"queues": {**ENV.queues, "demo": ENV.queues["demo"].model_copy(
        update={"on_demand_after_interruptions": 2})}})  # fmt: skip
    wanted = idle("i-1", on_demand_wanted={"demo": ["j/000001"]})
    p = ports(group("cpu", 1, instance("i-1")), beats={"cpu": {"i-1": wanted}},
              backlogs={"demo": Backlog(5, 0, counts_leased=True, as_of=NOW - 120)})  # fmt: skip
    (queue,) = control.observe(env, p, NOW, ["cpu"]).fleet.queues
    assert queue.visible == 5, "spot nodes leave such items to on-demand ones"
