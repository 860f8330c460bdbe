"""The pure rules of multi-node items (`tidefleet.agent.gang`): who joins which gang, who yields,
ranks, what a member does as the record changes, and the rendezvous environment."""

from __future__ import annotations

import pytest

from tidefleet.agent import gang
from tidefleet.records import Heartbeat, Item

NOW = 1_000.0


def _hb(node, *, at=NOW, beacon=None, draining=False):
    return Heartbeat(node, "gpu", at=at, slots=8, busy_slots=8, idle_since=None, draining=draining, gang=beacon or {})


def _beacon(job, *, since, forming=True, queue="train", attempt=1):
    return gang.Beacon(queue, job, "000000", attempt, since, forming).record()


def test_a_free_node_joins_forming_gangs_oldest_first_then_growing_ones_and_never_a_dead_or_draining_lead():
    heartbeats = {
        "a": _hb("a", beacon=_beacon("late", since=50)),
        "b": _hb("b", beacon=_beacon("early", since=10)),
        "c": _hb("c", beacon=_beacon("growing", since=1, forming=False)),
        "d": _hb("d", at=NOW - 100, beacon=_beacon("dead-lead", since=0)),
        "e": _hb("e", beacon=_beacon("draining-lead", since=0), draining=True),
        "f": _hb("f", beacon=_beacon("other-queue", since=0, queue="infer")),
        "me": _hb("me", beacon=_beacon("mine", since=0)),
        "g": _hb("g", beacon={"queue": "train", "job": "x"}),  # malformed: nobody's gang
    }
    found = gang.beacons(heartbeats, own_node="me", queues={"train"}, now=NOW, heartbeat_s=5)
    assert [b.job for b in found] == ["early", "late", "growing"]


@pytest.mark.parametrize("others,expected", [
    ([], None),
    ([gang.Beacon("train", "older", "i", 1, 5.0, True)], "older"),
    ([gang.Beacon("train", "younger", "i", 1, 50.0, True)], None),
    ([gang.Beacon("train", "older-but-running", "i", 1, 5.0, False)], None),
    ([gang.Beacon("train", "a", "i", 1, 20.0, True), gang.Beacon("train", "z", "i", 1, 20.0, True)], "a"),
])  # fmt: skip
def test_a_forming_lead_yields_only_to_an_older_forming_gang(others, expected):
    own = gang.Beacon("train", "m", "i", 1, 20.0, True)
    found = gang.yields_to(own, others)
    assert (found.job if found else None) == expected


def test_ranks_follow_join_order_without_those_that_left_and_surplus_joiners_are_off_the_roster():
    members = [{"node": n} for n in ("lead", "b", "c", "d")]
    assert [m["node"] for m in gang.roster(members, [{"node": "b"}], 2)] == ["lead", "c"]
    assert [m["node"] for m in gang.roster(members, [], 3)] == ["lead", "b", "c"]


def _item(**over):
    base = {"job_id": "j", "item_id": "000000", "status": "running", "attempts": 2, "lease_until": NOW + 30,
            "gang": gang.FORMING, "members": [{"node": "lead", "addr": "10.0.0.1", "port": 29400}, {"node": "me"}]}
    return Item(**{**base, **over})


@pytest.mark.parametrize("item,expected", [
    (None, "Leave: the item's attempt ended"),
    (_item(attempts=3), "Leave: the item's attempt ended"),
    (_item(status="succeeded"), "Leave: the item's attempt ended"),
    (_item(gang=gang.STOPPING), "Leave: the gang is stopping"),
    (_item(gang=gang.RELEASED), "Leave: the gang is released"),
    (_item(gang_failure="node x exited 1"), "Leave: a member failed: node x exited 1"),
    (_item(lease_until=NOW - 1), "Leave: the lead is gone (its lease lapsed)"),
    (_item(members=[{"node": "lead"}, {"node": "other"}, {"node": "me"}]), "Leave: the gang is full"),
    (_item(), "Wait"),
    (_item(gang=gang.RUNNING), "Start: rank 1 of 2"),
])  # fmt: skip
def test_what_a_member_does_as_the_items_record_changes(item, expected):
    verdict = gang.for_member(item, 2, "me", 2, NOW)
    text = {gang.Wait: lambda v: "Wait", gang.Leave: lambda v: f"Leave: {v.why}",
            gang.Start: lambda v: f"Start: rank {v.rank} of {len(v.members)}"}[type(verdict)](verdict)  # fmt: skip
    assert text == expected


def test_the_rendezvous_environment_follows_torchrun_conventions():
    members = ({"node": "lead", "addr": "10.0.0.1", "port": 29400}, {"node": "b"}, {"node": "c"})
    env = gang.workload_env(members, 2, slots=8, low=2, high=4, rendezvous_id="j-000000-3")
    assert env == {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29400", "WORLD_SIZE": "24", "RANK": "16",
                   "NODE_RANK": "2", "LOCAL_WORLD_SIZE": "8", "TIDEFLEET_NNODES": "2:4", "TIDEFLEET_GANG_NODES": "3",
                   "TIDEFLEET_RDZV_ID": "j-000000-3", "PET_NNODES": "2:4", "PET_NPROC_PER_NODE": "8",
                   "PET_RDZV_BACKEND": "c10d", "PET_RDZV_ENDPOINT": "10.0.0.1:29400", "PET_RDZV_ID": "j-000000-3",
                   "PET_RDZV_CONF": "is_host=0,last_call_timeout=5"}  # fmt: skip
    fixed = gang.workload_env(members[:2], 0, slots=8, low=2, high=2, rendezvous_id="r")
    assert fixed["TIDEFLEET_NNODES"] == "2" and fixed["MASTER_PORT"] == "29400"


@pytest.mark.parametrize("low,high,members,expected", [
    (2, 2, ["lead", "me"], gang.STOPPING),  # a fixed gang stops whole
    (2, 3, ["lead", "b", "me"], "left"),  # elastic, 2 remain: it goes on
    (2, 3, ["lead", "me"], gang.STOPPING),  # elastic, 1 would remain: below min
])  # fmt: skip
def test_a_stop_notice_on_a_member_stops_a_fixed_gang_and_leaves_an_elastic_one_while_min_remain(low, high, members, expected):
    item = _item(members=[{"node": n} for n in members])
    assert gang.on_member_stop(item, "me", low, high) == expected
