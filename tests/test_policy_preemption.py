"""Preemption (scaling rule 12, `policy/preemption.py`): when a pool cannot grow, a higher-priority
queue's waiting items take the slots of lower-priority attempts of queues that opted in; each
such attempt checkpoints and goes back to its queue. One table of cases, then a property."""

from __future__ import annotations

import re
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidefleet.config import parse_environment
from tidefleet.policy import decide, preemption
from tidefleet.policy.model import FleetView, NodeView, PoolView, QueueView, RunView

NOW = 100_000.0


def env(*, preemptible=True, min_runtime_s=600, max_nodes=2, move=False):
    return parse_environment({
        "region": "us-east-1",
        "pools": {"cpu": {"max": max_nodes, "slots_per_unit": 2, "command": "work", "instance_types": [{"type": "c6i.large"}],
                          "checkpoint_and_move": move}},
        "queues": {
            "urgent": {"pool": "cpu", "priority": 50, "slots_per_item": 2},
            "batch": {"pool": "cpu", "priority": 5, "preemptible": preemptible, "min_runtime_s": min_runtime_s},
            "other": {"pool": "cpu", "priority": 1},
            "vip": {"pool": "cpu", "priority": 90, "preemptible": True, "min_runtime_s": 0},
        },
    }, name="t")  # fmt: skip


def run(key, queue="batch", ran=3600.0, slots=1):
    return RunView(key, queue, NOW - ran, slots)


def full(id_, *runs, preempting=(), busy=None, state="running", cordoned=False):
    return NodeView(id=id_, instance_type="c6i.large", weight=1, slots=2, spot=True, state=state, launched_at=NOW - 7200,
                    busy_slots=2 if busy is None else busy, last_heartbeat=NOW - 2, runs=tuple(runs),
                    preempting=tuple(preempting), cordoned=cordoned)  # fmt: skip


# A full node whose work may not be preempted: with it, one more node puts the pool at its max.
BLOCKER = NodeView(id="nx", instance_type="c6i.large", weight=1, slots=2, spot=True, state="running",
                   launched_at=NOW - 7200, busy_slots=2, last_heartbeat=NOW - 2,
                   runs=(RunView("o/8/1", "other", NOW - 9000, 1), RunView("o/9/1", "other", NOW - 9000, 1)))  # fmt: skip


def fleet(*nodes, urgent=1, batch_in_flight=4):
    queues = (QueueView("urgent", "cpu", 50, 2, visible=urgent, in_flight=0),
              QueueView("batch", "cpu", 5, 1, visible=0, in_flight=batch_in_flight))  # fmt: skip
    return FleetView((PoolView("cpu", tuple(nodes), desired=len(nodes), on_demand_base=0),), queues)


def preempted(environment, view) -> dict:
    (decision,) = decide(environment, view, NOW)
    return {node: set(keys) for node, keys in decision.preempt}, decision.reasons


CASES = [
    ("the node whose stopped attempts ran least makes room for the waiting item",
     env(), fleet(full("n1", run("a/1/1", ran=4000), run("a/2/1", ran=900)), full("n2", run("a/3/1", ran=800), run("a/4/1", ran=700))),
     {"n2": {"a/3/1", "a/4/1"}}),
    ("a node whose other slots hold work that may not be preempted is no place for the item",
     env(), fleet(full("n1", run("o/1/1", queue="other"), run("a/1/1")), BLOCKER), {}),
    ("a queue that did not opt in is never preempted",
     env(preemptible=False), fleet(full("n1", run("a/1/1"), run("a/2/1")), BLOCKER), {}),
    ("an attempt younger than min_runtime_s is not preempted",
     env(min_runtime_s=600), fleet(full("n1", run("a/1/1", ran=599), run("a/2/1", ran=599)), BLOCKER), {}),
    ("an attempt of a higher-priority queue is not preempted",
     env(), fleet(full("n1", run("v/1/1", queue="vip"), run("v/2/1", queue="vip")), BLOCKER), {}),
    ("a pool that can grow preempts nothing: the waiting item gets a new node",
     env(max_nodes=5), fleet(full("n1", run("a/1/1"), run("a/2/1")), BLOCKER), {}),
    ("free slots on a node are used before any attempt is stopped",
     env(), fleet(full("n1", run("a/1/1"), busy=1), full("n2", run("a/2/1"), run("a/3/1"))), {"n1": {"a/1/1"}}),
    ("attempts already preempted count as room: a waiting item never preempts twice",
     env(), fleet(full("n1", run("a/1/1"), run("a/2/1"), preempting=("a/1/1", "a/2/1")), full("n2", run("a/3/1"), run("a/4/1"))),
     {}),
    ("a mark whose attempt ended is cleared",
     env(), fleet(full("n1", run("a/2/1"), preempting=("a/1/1",), busy=1), full("n2", run("a/3/1"), run("a/4/1")), urgent=0),
     {"n1": set()}),
    ("a draining or cordoned node is not a place to make room",
     env(), fleet(full("n1", run("a/1/1"), run("a/2/1"), state="draining"), full("n2", run("a/3/1"), run("a/4/1"), cordoned=True)), {}),
]  # fmt: skip


@pytest.mark.parametrize(("case", "environment", "view", "expected"), CASES, ids=[c[0] for c in CASES])
def test_preemption(case, environment, view, expected):
    marks, _ = preempted(environment, view)
    assert marks == expected


def test_the_reason_names_the_attempt_its_queue_and_the_queue_it_makes_room_for():
    _, reasons = preempted(env(), fleet(full("n1", run("a/1/1"), run("a/2/1", ran=700)), BLOCKER))
    assert ("preempt a/2/1 on n1 (queue batch, priority 5, ran 700s >= min_runtime_s 600): queue urgent (priority 50) "
            "has items waiting and the pool cannot grow; it checkpoints and goes back to its queue, not a failed attempt"
            ) in reasons  # fmt: skip


QUEUES = ["batch", "other", "vip"]
runs_st = st.lists(st.tuples(st.sampled_from(QUEUES), st.floats(0, 5000), st.integers(1, 2)), max_size=3)


@settings(max_examples=200, deadline=None)
@given(
    nodes=st.lists(st.tuples(runs_st, st.booleans(), st.sampled_from(["running", "draining", "pending"])), min_size=1, max_size=4),
    waiting=st.integers(0, 4),
    min_runtime=st.integers(0, 3000),
)  # fmt: skip
def test_preemption_never_takes_more_than_waiting_items_need_nor_anything_not_preemptible(nodes, waiting, min_runtime):
    environment = env(min_runtime_s=min_runtime)
    views = []
    for i, (runs, cordoned, state) in enumerate(nodes):
        fitting, used = [], 0
        for j, (queue, ran, slots) in enumerate(runs):
            if used + slots <= 2:
                fitting.append(run(f"j/{i}-{j}/1", queue=queue, ran=ran, slots=slots))
                used += slots
        views.append(full(f"n{i}", *fitting, busy=used, state=state, cordoned=cordoned))
    view = fleet(*views, urgent=waiting)
    view = replace(view, pools=(replace(view.pools[0], desired=2),))
    marks, _ = preempted(environment, view)
    by_key = {r.key: (n, r) for n in views for r in n.runs}
    taken = 0
    for node_id, keys in marks.items():
        for key in keys:
            node, attempt = by_key[key]
            own = environment.queues[attempt.queue]
            assert node.id == node_id and node.state == "running" and not node.cordoned
            assert own.preemptible and own.priority < 50 and NOW - attempt.since >= own.min_runtime_s
            taken += attempt.slots
    # Never more than the waiting items' slots plus what one item may overshoot per node.
    assert taken <= waiting * 2 + len(views)


def test_the_readme_preemption_line_is_what_the_policy_says_for_that_fleet():
    section = (Path(__file__).resolve().parent.parent / "README.md").read_text().split("\n### Preemption\n", 1)[1]
    line = re.search(r"```text\n(.*?)\n```", section, re.DOTALL).group(1)
    key, node_id, queue, priority, ran, minimum, waiting, over = re.fullmatch(
        r"preempt (\S+) on (\S+) \(queue (\S+), priority (\d+), ran (\d+)s >= min_runtime_s (\d+)\): "
        r"queue (\S+) \(priority (\d+)\) has items waiting .*", line).groups()  # fmt: skip
    environment = parse_environment({
        "region": "us-east-1",
        "pools": {"cpu": {"max": 1, "command": "work", "instance_types": [{"type": "c6i.large"}]}},
        "queues": {queue: {"pool": "cpu", "priority": int(priority), "preemptible": True, "min_runtime_s": int(minimum)},
                   waiting: {"pool": "cpu", "priority": int(over)}},
    }, name="t")  # fmt: skip
    busy = NodeView(id=node_id, instance_type="c6i.large", weight=1, slots=1, spot=True, state="running",
                    launched_at=NOW - 7200, busy_slots=1, last_heartbeat=NOW - 2,
                    runs=(RunView(key, queue, NOW - int(ran), 1),))  # fmt: skip
    view = FleetView((PoolView("cpu", (busy,), desired=1, on_demand_base=0),),
                     (QueueView(waiting, "cpu", int(over), 1, visible=1, in_flight=0),
                      QueueView(queue, "cpu", int(priority), 1, visible=0, in_flight=1)))  # fmt: skip
    (decision,) = decide(environment, view, NOW)
    assert decision.preempt == ((node_id, (key,)),)
    assert line in decision.reasons


# Checkpoint-and-move (scaling rule 9b): the pool grows freely (max 10) and nothing waits, so any
# mark is a move off a cordoned node, never a preemption for waiting work.
def moved(*nodes, move=True, min_runtime_s=600, waiting=0, held=False):
    busy = sum(n.busy_slots for n in nodes)
    view = FleetView((PoolView("cpu", tuple(nodes), desired=len(nodes), on_demand_base=0),),
                     (QueueView("batch", "cpu", 5, 1, visible=waiting, in_flight=busy, held=held),))  # fmt: skip
    return preempted(env(max_nodes=10, move=move, min_runtime_s=min_runtime_s), view)


ROOM = full("n2", run("b/1/1"), busy=1)  # takes items, one slot free
MOVE_CASES = [  # (case, nodes, other arguments of `moved`, marks)
    ("a cordoned node whose every busy slot may move, with room elsewhere, moves them all",
     (full("n1", run("a/1/1"), busy=1, cordoned=True), ROOM), {}, {"n1": {"a/1/1"}}),
    ("a pool that did not opt in never moves anything",
     (full("n1", run("a/1/1"), busy=1, cordoned=True), ROOM), {"move": False}, {}),
    ("an attempt younger than min_runtime_s keeps the node where it is",
     (full("n1", run("a/1/1", ran=599), busy=1, cordoned=True), ROOM), {}, {}),
    ("a busy slot that is no preemptible attempt (another queue's item) keeps the node: nothing moves",
     (full("n1", run("a/1/1"), busy=2, cordoned=True), full("n2"), full("n3", busy=0)), {}, {}),
    ("items waiting for the free slots: the cordoned node takes items again instead, nothing moves",
     (full("n1", run("a/1/1"), busy=1, cordoned=True), ROOM), {"waiting": 1}, {}),
    ("a two-slot attempt needs two free slots on one node, not one here and one there",
     (full("n1", run("a/1/1", slots=2), cordoned=True), ROOM, full("n3", run("b/2/1"), busy=1)), {}, {}),
    ("an attempt of a held queue (its team at its share) stays: back in its queue, nothing would take it",
     (full("n1", run("a/1/1"), busy=1, cordoned=True), ROOM), {"held": True}, {}),
    ("a node not cordoned is not moved",
     (full("n1", run("a/1/1"), busy=1), full("n2", busy=0)), {}, {}),
    ("least busy first, while the room lasts (one free slot on each of three nodes)",
     (full("n1", run("a/1/1", slots=2), cordoned=True), full("n3", run("a/3/1"), busy=1, cordoned=True),
      ROOM, full("n5", run("b/2/1"), busy=1), full("n6", run("b/3/1"), busy=1)), {}, {"n3": {"a/3/1"}}),
]  # fmt: skip


@pytest.mark.parametrize(("case", "nodes", "kw", "expected"), MOVE_CASES, ids=[c[0] for c in MOVE_CASES])
def test_checkpoint_and_move(case, nodes, kw, expected):
    marks, _ = moved(*nodes, **kw)
    assert marks == expected


def test_a_node_already_moving_counts_as_waiting_so_the_next_one_does_not_take_the_same_room():
    """(The pure rule: in a whole decision the uncordon rule already keeps room for every cordoned
    node's busy slots by count, so this guards what it does not: the time between ticks.)"""
    moving = full("n1", run("a/1/1"), busy=1, cordoned=True, preempting=("a/1/1",))
    cordoned = full("n3", run("a/3/1"), busy=1, cordoned=True)
    assert preemption.moves(env(move=True).queues, [moving, cordoned], [1], 0, NOW).marks == {}
    assert preemption.moves(env(move=True).queues, [moving, cordoned], [1, 1], 0, NOW).marks == {"n3": ("a/3/1",)}
    assert preemption.moves(env(move=True).queues, [cordoned], [1], 1, NOW).marks == {}  # a waiting item first


def test_a_move_says_what_moves_where_from_and_why():
    _, reasons = moved(full("n1", run("a/1/1"), busy=1, cordoned=True), ROOM)
    assert ("move a/1/1 off n1: cordoned, every busy slot an attempt of a preemptible queue past its min_runtime_s, "
            "with room on the other nodes; they checkpoint and resume there, and n1 is idle now, not when its longest "
            "item ends") in reasons  # fmt: skip


def test_a_moving_node_keeps_its_marks_until_its_attempts_are_gone():
    """The next tick sees the marked attempt still listed (it is checkpointing): no change, no second move."""
    marks, _ = moved(full("n1", run("a/1/1"), busy=1, cordoned=True, preempting=("a/1/1",)), ROOM)
    assert marks == {}


def test_the_readme_move_line_is_what_the_policy_says_for_the_readme_configuration():
    section = (Path(__file__).resolve().parent.parent / "README.md").read_text().split("\n### Checkpoint-and-move\n", 1)[1]
    config = tomllib.loads(re.search(r"```toml\n(.*?)\n```", section, re.DOTALL).group(1))
    environment = parse_environment({"region": "us-east-1", **config}, name="t")
    line = re.search(r"```text\n(.*?)\n```", section, re.DOTALL).group(1)
    keys, node_id = re.fullmatch(r"move (.+) off (\S+): cordoned, .*", line).groups()
    keys = keys.split(", ")
    queue = keys[0].split("-")[0]
    assert environment.pools["gpu8"].checkpoint_and_move and environment.queues[queue].preemptible

    def node(id_, runs, **kw):
        return NodeView(id=id_, instance_type="g5.48xlarge", weight=8, slots=8, spot=True, state="running",
                        launched_at=NOW - 7200, busy_slots=len(runs), last_heartbeat=NOW - 2, runs=runs, **kw)  # fmt: skip

    cordoned = node(node_id, tuple(RunView(k, queue, NOW - 3600, 1) for k in keys), cordoned=True)
    other = node("i-0a1b", (RunView(f"{queue}-x/000001/1", queue, NOW - 60, 1),))
    view = FleetView((PoolView("gpu8", (cordoned, other), desired=16, on_demand_base=0),),
                     (QueueView(queue, "gpu8", 0, 1, visible=0, in_flight=len(keys) + 1),))  # fmt: skip
    (decision,) = decide(environment, view, NOW)
    assert decision.preempt == ((node_id, tuple(keys)),)
    assert line in decision.reasons


@settings(max_examples=300, deadline=None)
@given(
    nodes=st.lists(st.tuples(st.lists(st.tuples(st.sampled_from(QUEUES), st.sampled_from([100.0, 700.0, 5000.0]),
                                                st.integers(1, 3)), max_size=2),
                             st.sampled_from([0, 0, 1]), st.booleans()), min_size=1, max_size=4),
    room=st.lists(st.integers(0, 3), max_size=4),
    waiting=st.integers(0, 2),
)  # fmt: skip
def test_moves_take_whole_nodes_of_movable_attempts_and_never_more_than_the_room(nodes, room, waiting):
    environment = env(move=True)
    views = []
    for i, (runs, other, moving) in enumerate(nodes):
        listed = [run(f"j/{i}-{j}/1", queue=queue, ran=ran, slots=slots) for j, (queue, ran, slots) in enumerate(runs)]
        busy = sum(r.slots for r in listed) + other  # `other`: busy slots no listed attempt explains
        views.append(full(f"n{i}", *listed, busy=busy, cordoned=True, preempting=(listed[0].key,) if moving and listed else ()))
    chosen = preemption.moves(environment.queues, views, room, waiting, NOW)
    moved = []
    for node in views:
        keys = chosen.marks.get(node.id)
        if keys is None:
            continue
        assert not node.preempting and keys == tuple(sorted(r.key for r in node.runs))
        assert sum(r.slots for r in node.runs) == node.busy_slots > 0
        for r in node.runs:
            own = environment.queues[r.queue]
            assert own.preemptible and NOW - r.since >= own.min_runtime_s
        moved += [r.slots for r in node.runs]
    already = sum(n.busy_slots for n in views if n.preempting)
    assert sum(moved) + waiting + already <= sum(room) or not moved
    assert packs(moved, room)


def packs(sizes: list[int], bins: list[int]) -> bool:
    """Whether every size fits some bin (each bin holding at most its room), by trying them all."""
    if not sizes:
        return True
    first, rest = sizes[0], sizes[1:]
    return any(free >= first and packs(rest, [*bins[:i], free - first, *bins[i + 1:]]) for i, free in enumerate(bins))


def test_a_node_cordoned_in_the_same_decision_is_no_room_for_a_move():
    """n2, the least loaded, is cordoned now: its three free slots take nothing, so the two-slot
    attempt on n1 does not move (the one free slot on each other node does not hold it)."""

    def node(id_, busy, *runs, cordoned=False):
        return NodeView(id=id_, instance_type="c6i.large", weight=1, slots=4, spot=True, state="running",
                        launched_at=NOW - 7200, busy_slots=busy, last_heartbeat=NOW - 2, runs=runs, cordoned=cordoned)  # fmt: skip

    nodes = (node("n1", 2, run("a/1/1", slots=2), cordoned=True), node("n2", 1), node("n3", 3), node("n4", 3), node("n5", 3))
    view = FleetView((PoolView("cpu", nodes, desired=5, on_demand_base=0),), (QueueView("batch", "cpu", 5, 1, visible=0, in_flight=12),))
    (decision,) = decide(env(max_nodes=10, move=True), view, NOW)
    assert decision.cordon == ("n2",)
    assert decision.preempt == ()


def test_a_mark_whose_attempt_has_ended_does_not_keep_a_cordoned_node_from_moving():
    """A mark left from a preemption made before the node was cordoned, for an attempt since ended
    (no longer in its heartbeat), is not a move under way: the node moves, and the stale key goes."""
    stale = full("n1", run("a/1/1"), busy=1, cordoned=True, preempting=("a/0/1",))
    assert preemption.moves(env(move=True).queues, [stale], [1], 0, NOW).marks == {"n1": ("a/1/1",)}
    marks, _ = moved(stale, ROOM)
    assert marks == {"n1": {"a/1/1"}}



def test_a_stale_mark_on_a_cordoned_node_neither_counts_as_moving_nor_stays():
    """n1 cannot move (its attempt is young), but its ended attempt's mark does not make its busy
    slot 'already moving', which would keep n3 from the one free slot; the decision drops the key."""
    stale = full("n1", run("a/1/1", ran=100), busy=1, cordoned=True, preempting=("a/0/1",))
    cordoned = full("n3", run("a/3/1"), busy=1, cordoned=True)
    assert preemption.moves(env(move=True).queues, [stale, cordoned], [1], 0, NOW).marks == {"n3": ("a/3/1",)}
    marks, _ = moved(stale, ROOM)
    assert marks == {"n1": set()}


def test_a_marked_attempt_checkpointing_unlisted_still_counts_as_moving():
    """Agents before `Agent._preemptible` listed marked attempts stopped listing one once asked to
    stop; while it checkpoints, its busy slot is still room already promised, so the next cordoned
    node does not take it too."""
    stopping = full("n1", busy=1, cordoned=True, preempting=("a/1/1",))
    cordoned = full("n3", run("a/3/1"), busy=1, cordoned=True)
    assert preemption.moves(env(move=True).queues, [stopping, cordoned], [1], 0, NOW).marks == {}


def test_an_attempt_of_a_gang_is_never_preempted():
    """(Config refuses `preemptible` with `nodes_per_item` > 1: stopping the lead alone would leave
    its members running on other nodes.)"""
    queues = dict(env().queues)
    queues["batch"] = queues["batch"].model_copy(update={"nodes_per_item": 2})
    urgent = QueueView("urgent", "cpu", 50, 2, visible=1, in_flight=0)
    gang_lead = full("n1", run("a/1/1", slots=2))
    assert preemption.choose(queues, [urgent], [gang_lead], NOW).marks == {}
    assert preemption.choose(env().queues, [urgent], [gang_lead], NOW).marks == {"n1": ("a/1/1",)}


def test_the_tick_that_moves_grants_no_leave_so_the_moves_room_stays():
    """n1's attempt moves to idle n2's free slots. Break-even scale-in would let idle nodes leave
    on their own until the next tick ('idle nodes may leave ... up to 2 unit(s)', intake slow),
    and n2, the move's room, could go before n1's agent hands the attempt back: the item would
    wait for a new node. A tick that moves grants no leave."""
    cordoned = full("n1", run("a/1/1"), busy=1, cordoned=True)
    room = replace(full("n2", busy=0), idle_since=NOW - 5)
    view = FleetView((PoolView("cpu", (cordoned, room), desired=2, on_demand_base=0),),
                     (QueueView("batch", "cpu", 5, 1, visible=0, in_flight=1, intake_per_s=0.001),))  # fmt: skip
    environment = env(max_nodes=10, move=True)
    assert environment.idle_timeout_s("cpu") is None  # break-even scale-in: the rule that grants leave
    (decision,) = decide(environment, view, NOW)
    assert decision.preempt == (("n1", ("a/1/1",)),)
    assert (decision.leave, decision.stay_first, decision.terminate) == (0, 0, ())
    assert not any(r.startswith("idle nodes may leave") for r in decision.reasons), decision.reasons
    # The next ticks, while the attempt checkpoints (listed and marked, or unlisted with its slot
    # still busy): no new move, and still no leave; once it is back in its queue, leave again.
    for still in (replace(cordoned, preempting=("a/1/1",)), replace(cordoned, runs=(), preempting=("a/1/1",))):
        (decision,) = decide(environment, replace(view, pools=(replace(view.pools[0], nodes=(still, room)),)), NOW)
        assert (decision.leave, decision.terminate) == (0, ()), decision.reasons
    gone = replace(cordoned, runs=(), busy_slots=0, idle_since=NOW - 1, preempting=("a/1/1",))
    (decision,) = decide(environment, replace(view, pools=(replace(view.pools[0], nodes=(gone, room)),)), NOW)
    assert decision.leave > 0 or decision.terminate, decision.reasons
    # A pool without checkpoint_and_move moves nothing: a priority preemption's mark left on a node
    # cordoned since keeps no idle node from leaving (its room is on its own node).
    marked = replace(view, pools=(replace(view.pools[0], nodes=(replace(cordoned, preempting=("a/1/1",)), room)),))
    (decision,) = decide(env(max_nodes=10), marked, NOW)
    assert decision.leave == 2, decision.reasons


def test_a_move_under_way_counts_over_consecutive_ticks_while_its_attempt_checkpoints():
    """The agent lists a marked attempt until it is handed back (`Agent._preemptible`), so every
    tick of a long checkpoint sees the move under way: the mark stays and the room it takes (n2's
    free slots, after what intake brings within a relaunch) is not given to n3 as well. Unlisted
    (agents before that), only the first such tick saw it (busy slots its listed attempts do not
    explain), and cleared the mark; the next moved n3 into the same room."""
    environment = env(max_nodes=10, move=True)
    room = replace(full("n2", run("b/1/1"), busy=1), slots=4, weight=2)  # three free slots

    def tick(n1, n3, now):
        view = FleetView((PoolView("cpu", (n1, n3, room), desired=4, on_demand_base=0),),
                         (QueueView("batch", "cpu", 5, 1, visible=0, in_flight=3, intake_per_s=0.015),))  # fmt: skip
        (decision,) = decide(environment, view, now)
        return dict(decision.preempt)

    n1 = full("n1", run("a/1/1"), busy=1, cordoned=True)
    n3 = full("n3", run("a/3/1", ran=500), busy=1, cordoned=True)  # past min_runtime_s from the next tick on
    assert tick(n1, n3, NOW) == {"n1": ("a/1/1",)}
    moving = replace(n1, preempting=("a/1/1",))  # as its heartbeat reads while the attempt checkpoints
    for later in (200, 230, 260):
        assert preemption.moving(moving)
        assert tick(moving, n3, NOW + later) == {}  # no change: the mark stays, n3 stays
    # What agents that unlisted it showed: moving on the first such tick, which dropped the mark...
    unlisted = replace(moving, runs=())
    assert preemption.moving(unlisted) and tick(unlisted, n3, NOW + 200) == {"n1": ()}
    # ... and the next tick sent n3's attempt to the same room.
    assert tick(replace(unlisted, preempting=()), n3, NOW + 230) == {"n3": ("a/3/1",)}


# -- how many: the shortfall of the queues as their teams' shares trim them (the teams audit) --------------
def _gpu_env(queues: dict, teams: dict | None = None, max_nodes: int = 8):
    return parse_environment({
        "region": "us-east-1",
        "pools": {"gpu": {"max": max_nodes, "container": "t:1", "instance_types": [{"type": "g5.xlarge", "gpus": 1}]}},
        "queues": queues, **({"teams": teams} if teams else {}),
    }, name="t")  # fmt: skip


def _gpu_node(id_, *runs, state="running"):
    return NodeView(id_, "g5.xlarge", 1, 1, True, state, NOW - 7200, busy_slots=len(runs), last_heartbeat=NOW - 2,
                    runs=tuple(runs))  # fmt: skip


def _n_preempted(environment, nodes, queues) -> int:
    (decision,) = decide(environment, FleetView((PoolView("gpu", tuple(nodes), len(nodes), 0),), tuple(queues)), NOW)
    return sum(len(keys) for _, keys in decision.preempt)


def test_a_team_preempts_only_up_to_its_share_not_for_every_waiting_item():
    """Quotas a=4, b=4 on 8 GPUs: a runs 2 with 6 waiting, b runs 6 (2 borrowed). All six of b's
    were preempted, and a then ran 8 on a quota of 4 while b, inside its quota, ran none."""
    environment = _gpu_env({"a-hi": {"pool": "gpu", "team": "a", "priority": 10},
                            "b-lo": {"pool": "gpu", "team": "b", "priority": 0, "preemptible": True}},
                           {"a": {"quota": {"gpus": 4}}, "b": {"quota": {"gpus": 4}}})  # fmt: skip
    nodes = [_gpu_node(f"a{i}") for i in range(2)]
    nodes = [replace(n, busy_slots=1) for n in nodes] + [_gpu_node(f"b{i}", run(f"j/{i}/1", "b-lo")) for i in range(6)]
    queues = [QueueView("a-hi", "gpu", 10, 1, visible=6, in_flight=2, team="a", oldest_age_s=600, mean_item_s=3600),
              QueueView("b-lo", "gpu", 0, 1, visible=0, in_flight=6, team="b", mean_item_s=36000)]  # fmt: skip
    assert _n_preempted(environment, nodes, queues) == 2


def test_items_that_pending_nodes_will_take_preempt_nothing():
    """Max 4: two nodes run low-priority work, two more are booting, three high-priority items
    wait. Two of them land on the booting nodes: one attempt is stopped, not two."""
    environment = _gpu_env({"hi": {"pool": "gpu", "priority": 10}, "lo": {"pool": "gpu", "priority": 0, "preemptible": True}},
                           max_nodes=4)  # fmt: skip
    nodes = [_gpu_node(f"r{i}", run(f"j/{i}/1", "lo")) for i in range(2)] + [
        replace(_gpu_node(f"p{i}"), state="pending", launched_at=NOW - 20) for i in range(2)]
    queues = [QueueView("hi", "gpu", 10, 1, visible=3, in_flight=0, oldest_age_s=30),
              QueueView("lo", "gpu", 0, 1, visible=0, in_flight=2, mean_item_s=36000)]  # fmt: skip
    assert _n_preempted(environment, nodes, queues) == 1


def test_an_item_waiting_for_on_demand_nodes_preempts_nothing_on_spot_ones():
    """Spot agents leave it (it was interrupted too often) and take the stopped work back: a
    preempt, relaunch, preempt loop every min_runtime_s."""
    environment = _gpu_env({"hi": {"pool": "gpu", "priority": 10, "on_demand_after_interruptions": 2},
                            "lo": {"pool": "gpu", "priority": 0, "preemptible": True}}, max_nodes=2)  # fmt: skip
    nodes = [_gpu_node(f"s{i}", run(f"j/{i}/1", "lo")) for i in range(2)]
    queues = [QueueView("hi", "gpu", 10, 1, visible=1, in_flight=0, oldest_age_s=300, on_demand_wanted=1),
              QueueView("lo", "gpu", 0, 1, visible=0, in_flight=2, mean_item_s=36000)]  # fmt: skip
    assert _n_preempted(environment, nodes, queues) == 0


def test_a_team_running_on_lent_quota_is_preempted_before_one_within_its_own():
    """Quotas a=4, b=2, c=2 on 8 GPUs: b runs its 2, c runs 4 (2 lent), a waits for 2. b's two
    attempts went (started later), and b, starved below its guarantee, could not take them back
    from c at equal priority."""
    environment = _gpu_env({"a-hi": {"pool": "gpu", "team": "a", "priority": 10},
                            "b-lo": {"pool": "gpu", "team": "b", "priority": 0, "preemptible": True},
                            "c-lo": {"pool": "gpu", "team": "c", "priority": 0, "preemptible": True}},
                           {"a": {"quota": {"gpus": 4}}, "b": {"quota": {"gpus": 2}}, "c": {"quota": {"gpus": 2}}})  # fmt: skip
    nodes = [replace(_gpu_node(f"a{i}"), busy_slots=1) for i in range(2)]
    nodes += [_gpu_node(f"b{i}", run(f"jb/{i}/1", "b-lo", ran=1000)) for i in range(2)]
    nodes += [_gpu_node(f"c{i}", run(f"jc/{i}/1", "c-lo", ran=5000)) for i in range(4)]
    queues = [QueueView("a-hi", "gpu", 10, 1, visible=2, in_flight=2, team="a", oldest_age_s=600, mean_item_s=36000),
              QueueView("b-lo", "gpu", 0, 1, visible=0, in_flight=2, team="b", mean_item_s=36000),
              QueueView("c-lo", "gpu", 0, 1, visible=0, in_flight=4, team="c", mean_item_s=36000)]  # fmt: skip
    (decision,) = decide(environment, FleetView((PoolView("gpu", tuple(nodes), 8, 0),), tuple(queues)), NOW)
    preempted = sorted(key for _, keys in decision.preempt for key in keys)
    assert len(preempted) == 2 and all(k.startswith("jc/") for k in preempted), preempted
