"""The NodeStatePort contract (`tidefleet.ports.NodeStatePort`), on every adapter: the job stores
(DynamoDB on the moto server, Firestore through the real client on the GCP fake) and the
in-memory one. What the control tick relies on beyond the heartbeats themselves (see
test_job_store.py): a mark set on a node that never reported is a row of its own, listed apart
from the heartbeats, and the tick forgets it once its node left the group, since such a node
writes no heartbeat that could ever age out."""

from __future__ import annotations

import time

import pytest

from tidefleet import control
from tidefleet.cloud.memory import MemoryFleet, MemoryGroup, MemoryQueues
from tidefleet.ports import GroupInstance, Ports
from tidefleet.records import Heartbeat

NOW = 1000.0
# A mark the scaler or the interruption function sets, and the heartbeat field that reads it back.
MARKS = {
    "draining": (lambda nodes, node: nodes.mark_draining("cpu", node), "draining"),
    "cordon": (lambda nodes, node: nodes.set_cordon("cpu", node, True), "cordoned"),
}


def beat(node: str, at: float = NOW) -> Heartbeat:
    return Heartbeat(node, "cpu", at=at, slots=2, busy_slots=0, idle_since=at - 10)


@pytest.mark.parametrize("mark", sorted(MARKS))
def test_a_mark_on_a_node_that_never_reported_is_a_row_apart_from_the_heartbeats_until_its_first_beat(node_state, mark):
    nodes, (set_mark, field) = node_state.nodes, MARKS[mark]
    node_state.beat(beat("n-1"))
    set_mark(nodes, "n-early")  # before the agent's first heartbeat
    assert nodes.node_rows("cpu") == ({"n-1": beat("n-1")}, frozenset({"n-early"}))
    assert nodes.heartbeats("cpu") == {"n-1": beat("n-1")} and nodes.node_rows("gpu") == ({}, frozenset())
    node_state.beat(beat("n-early", at=NOW + 5))
    beats, marked = nodes.node_rows("cpu")
    assert set(beats) == {"n-1", "n-early"} and marked == frozenset()
    assert getattr(beats["n-early"], field), "the first heartbeat comes back with the mark"


def test_a_forgotten_mark_only_row_is_gone(node_state):
    node_state.nodes.mark_draining("cpu", "n-early")
    node_state.nodes.forget_node("cpu", "n-early")
    assert node_state.nodes.node_rows("cpu") == ({}, frozenset())


def test_a_tick_forgets_the_mark_only_rows_of_nodes_gone_from_the_group_and_keeps_the_others(node_state):
    nodes, env, now = node_state.nodes, node_state.env, time.time()
    for node in ("staying", "reclaimed"):  # spot notices while both still boot: a mark, no heartbeat
        nodes.mark_draining("cpu", node)
    nodes.set_cordon("cpu", "cordoned-then-gone", True)
    node_state.beat(beat("beating", at=now))  # gone from the group too, but heard from just now
    booting = GroupInstance("staying", env.pools["cpu"].instance_types[0].type, "InService", spot=True,
                            launched_at=now, protected=False)  # fmt: skip
    group = MemoryGroup("the-group", desired=1, max=env.pools["cpu"].max, instances=[booting])
    control.tick(env, Ports(queues=MemoryQueues(), fleet=MemoryFleet({"cpu": group}), nodes=nodes), now, pools=["cpu"])
    beats, marked = nodes.node_rows("cpu")
    assert marked == frozenset({"staying"}), "a node still in the group keeps its mark for its first heartbeat"
    assert set(beats) == {"beating"}, "a heartbeat is forgotten only once silent longer than a boot"


# -- the scaler letting an idle node go, against the node taking work (`let_idle_go`, `claim_work`) --
def test_an_idle_node_let_go_is_marked_draining_and_then_claims_no_work(node_state):
    nodes = node_state.nodes
    node_state.beat(beat("n-1"))  # idle since NOW - 10
    assert nodes.let_idle_go("cpu", "n-1", NOW - 10) is True
    assert nodes.heartbeats("cpu")["n-1"].draining
    assert nodes.claim_work("cpu", "n-1", NOW + 1) is False


def test_a_node_that_took_work_after_the_idle_time_the_tick_saw_is_not_let_go(node_state):
    nodes = node_state.nodes
    node_state.beat(beat("n-1"))
    assert nodes.claim_work("cpu", "n-1", NOW + 1) is True
    assert nodes.let_idle_go("cpu", "n-1", NOW - 10) is False
    assert not nodes.heartbeats("cpu")["n-1"].draining
    assert nodes.claim_work("cpu", "n-1", NOW + 2) is True, "a node kept goes on taking work"


def test_a_node_idle_again_since_is_let_go_only_on_its_new_idle_time(node_state):
    """Work taken before its idle time does not keep it; an idle time the tick did not see does."""
    nodes = node_state.nodes
    node_state.beat(beat("n-1"))
    assert nodes.claim_work("cpu", "n-1", NOW - 20) is True  # the work it finished before going idle at NOW - 10
    node_state.beat(beat("n-1", at=NOW + 30))  # busy and idle again: idle since NOW + 20
    assert nodes.let_idle_go("cpu", "n-1", NOW - 10) is False
    assert nodes.let_idle_go("cpu", "n-1", NOW + 20) is True


def test_a_claim_that_lands_while_the_scaler_lets_the_node_go_wins_and_the_node_is_kept(store):
    """The agent's claim written between the scaler's read (Firestore) or call (DynamoDB) and its
    write: of the two, exactly one takes effect."""
    s = store.store
    s.put_heartbeat(beat("n-1"))
    store.before_next_write(lambda: store.other().claim_work("cpu", "n-1", NOW + 1))
    assert s.let_idle_go("cpu", "n-1", NOW - 10) is False
    assert not s.heartbeats("cpu")["n-1"].draining


def test_a_node_let_go_while_it_claims_work_claims_none(store):
    s = store.store
    s.put_heartbeat(beat("n-1"))
    store.before_next_write(lambda: store.other().let_idle_go("cpu", "n-1", NOW - 10))
    assert s.claim_work("cpu", "n-1", NOW + 1) is False
    assert s.heartbeats("cpu")["n-1"].draining


def test_a_heartbeat_written_while_a_node_claims_work_never_refuses_the_claim(store):
    """False from `claim_work` means draining, and the agent stops the node for it: a write of the
    node's own heartbeat in between (Firestore: between the read and the conditional write) is
    no drain mark. Where such writes never stop, Firestore raises a refused call instead
    (tests/test_gcp_node_claim_contention.py)."""
    s = store.store
    s.put_heartbeat(beat("n-1"))
    later = Heartbeat("n-1", "cpu", at=NOW + 1, slots=2, busy_slots=0, idle_since=NOW - 10)  # still idle since then
    store.before_next_write(lambda: store.other().put_heartbeat(later))
    assert s.claim_work("cpu", "n-1", NOW + 2) is True
    assert not s.heartbeats("cpu")["n-1"].draining
    assert s.let_idle_go("cpu", "n-1", NOW - 10) is False, "the claim keeps it"
