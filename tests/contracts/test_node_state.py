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
