"""Team quotas, fair share, borrowing and escalation (policy/quota.py, scaling rules 10 and 11),
one table: each case asserts the pool's decision, the holds and the reason text."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest

from tidefleet.config import parse_environment
from tidefleet.policy import decide, quota
from tidefleet.policy.model import FleetView, NodeView, PoolView, QueueView
from tidefleet.policy.quota import Share, TeamDemand, share

NOW = 100_000.0
# One GPU per node and per slot: a slot is a GPU, so quotas in GPUs read as slots.
BASE = {
    "region": "us-east-1",
    "pools": {"gpu": {"max": 12, "container": "train:1", "instance_types": [{"type": "g5.xlarge", "gpus": 1}]}},
    "queues": {
        "vision-train": {"pool": "gpu", "team": "vision"},
        "nlp-train": {"pool": "gpu", "team": "nlp"},
    },
    "teams": {"vision": {"quota": {"gpus": 4}}, "nlp": {"quota": {"gpus": 4}}},
}


def environment(**changes):
    data = copy.deepcopy(BASE)
    for dotted, value in changes.items():
        *parents, leaf = dotted.split(".")
        at = data
        for key in parents:
            at = at.setdefault(key, {})
        if value is None:
            at.pop(leaf)
        else:
            at[leaf] = value
    return parse_environment(data, name="test")


def busy(n: int) -> list[NodeView]:
    return [
        NodeView(f"i-{i}", "g5.xlarge", 1, 1, True, "running", NOW - 3600, busy_slots=1, last_heartbeat=NOW - 5)
        for i in range(n)
    ]


def fleet(env, depth: dict, held=(), age: dict | None = None) -> FleetView:
    """depth: queue -> (visible, in flight); one busy node per item in flight."""
    queues = tuple(
        QueueView(name, q.pool, q.priority, q.slots_per_item, *depth.get(name, (0, 0)), team=env.team_of(name),
                  held=name in held, max_wait_s=q.max_wait_s, oldest_age_s=(age or {}).get(name))
        for name, q in env.queues.items()
    )  # fmt: skip
    nodes = busy(sum(f for _, f in depth.values()))
    return FleetView((PoolView("gpu", tuple(nodes), len(nodes), 0),), queues)


# fmt: off
CASES = [
    # (case, env changes, depth, held before, desired, hold, release, reason)
    ("a team under its quota gets all it asks for", {}, {"vision-train": (3, 0)}, (), 3, (), (),
     None),
    ("a team borrows the quota another team leaves idle", {}, {"vision-train": (7, 0)}, (), 7, (), (),
     "team vision borrows 3 slots of idle quota (quota 4 GPUs = 4 slots; 7 slots wanted)"),
    ("borrowing stops at the idle quota, below the pool's max", {}, {"vision-train": (10, 0)}, (), 8, (), (),
     "team vision borrows 4 slots of idle quota (quota 4 GPUs = 4 slots; 10 slots wanted)"),
    ("borrowed capacity goes back the tick the owner needs it", {}, {"vision-train": (2, 7), "nlp-train": (4, 0)},
     (), 11, ("vision-train",), (), "team vision at quota 4 GPUs; 2 items wait (held: vision-train)"),
    ("a team running at its full quota is held though nothing of it waits", {}, {"vision-train": (0, 4), "nlp-train": (4, 0)},
     (), 8, ("vision-train",), (), "team vision at quota 4 GPUs; 0 items wait (held: vision-train)"),
    ("a held queue is released once its team is under its share again", {}, {"vision-train": (2, 1)},
     ("vision-train",), 3, (), ("vision-train",), None),
    ("a capped pool is shared by weight among teams owed more than it holds",
     {"pools.gpu.max": 6, "teams.vision.weight": 2, "teams.vision.quota.gpus": 8, "teams.nlp.quota.gpus": 8},
     {"vision-train": (6, 0), "nlp-train": (6, 0)}, (), 6, (), (),
     "team nlp gets 2 of 6 slots: pool gpu holds 6 slots, shared by weight (1)"),
    ("a team without a quota is limited by the pool and its weight only", {"teams.nlp": None},
     {"vision-train": (2, 0), "nlp-train": (9, 0)}, (), 11, (), (), None),
    ("a cost cap limits the pool's slots like max does",
     {"pools.gpu.cost_cap_usd_per_hour": 2.0, "teams.vision.quota.gpus": 8, "teams.nlp.quota.gpus": 8},
     {"vision-train": (6, 0), "nlp-train": (6, 0)}, (), 5, (), (),
     "team vision gets 2 of 6 slots: pool gpu holds 5 slots, shared by weight (1)"),
    ("an environment without teams releases every held queue", {"teams": None}, {"vision-train": (9, 0)},
     ("vision-train",), 9, (), ("vision-train",), None),
]
# fmt: on


@pytest.mark.parametrize(
    ("case", "changes", "depth", "held", "desired", "hold", "release", "reason"), CASES, ids=[c[0] for c in CASES]
)
def test_teams_share_a_pool_by_quota_borrow_idle_quota_and_give_it_back(
    case, changes, depth, held, desired, hold, release, reason
):
    env = environment(**changes)
    (d,) = decide(env, fleet(env, depth, held), NOW)
    assert (d.desired, d.hold, d.release) == (desired, hold, release), d.reasons
    if reason is None:
        assert not [r for r in d.reasons if r.startswith("team ")], d.reasons
    else:
        assert reason in d.reasons


def test_waiting_items_beyond_a_teams_share_launch_no_node():
    env = environment(**{"pools.gpu.max": 20})
    (d,) = decide(env, fleet(env, {"vision-train": (15, 0), "nlp-train": (1, 0)}), NOW)
    assert d.desired == 8  # vision: its 4 and nlp's 3 idle; nlp: 1
    assert d.reasons[0].startswith("scale out 0 -> 8 units: demand 8 slots")


def test_an_overdue_queue_is_served_first_in_the_fair_share():
    env = environment(**{"pools.gpu.max": 6, "teams.vision.quota.gpus": 8, "teams.nlp.quota.gpus": 8})
    view = fleet(env, {"vision-train": (6, 0), "nlp-train": (6, 0)}, age={"vision-train": 2000.0})
    (d,) = decide(env, view, NOW)
    assert d.desired == 6 and d.on_demand_base is None  # overdue alone buys nothing on demand
    assert "queue vision-train waited 2000s > max_wait_s 1800s: team vision served first" in d.reasons
    assert "team nlp gets 0 of 6 slots: pool gpu holds 6 slots, shared by weight (1)" in d.reasons


@pytest.mark.parametrize(
    ("case", "age", "base", "line"),
    [
        ("a spot node booting past a typical boot is a shortage for an overdue queue", 2000.0, 3,
         ("spot short (i-slow spot without heartbeat 100s > 60s; queue vision-train waited past max_wait_s: escalated): "
         "on-demand base 0 -> 3 units so 3 unit(s) to launch come on demand")),
        ("the same node is not one for a queue within its max wait", 1000.0, None, None),
    ],
)  # fmt: skip
def test_an_overdue_queue_falls_back_to_on_demand_after_a_typical_boot(case, age, base, line):
    env = environment()
    slow = NodeView("i-slow", "g5.xlarge", 1, 1, True, "pending", NOW - 100)
    view = fleet(env, {"vision-train": (4, 0)}, age={"vision-train": age})
    view = FleetView((PoolView("gpu", (slow,), 1, 0),), view.queues)
    (d,) = decide(env, view, NOW)
    assert d.on_demand_base == base, d.reasons
    assert line is None or line in d.reasons


def test_an_environment_wide_quota_counts_what_the_team_runs_in_other_pools():
    env = environment(**{
        "pools.gpu4": {"max": 4, "container": "train:1", "instance_types": [{"type": "g5.12xlarge", "gpus": 4, "weight": 4}]},
        "queues.vision-big": {"pool": "gpu4", "team": "vision", "slots_per_item": 4},
        "teams.vision.quota.gpus": 6,
    })  # fmt: skip
    base = fleet(env, {"vision-train": (5, 0), "vision-big": (0, 1)})
    view = FleetView((*base.pools, PoolView("gpu4", (), 4, 0)), base.queues)
    decisions = {d.pool: d for d in decide(env, view, NOW)}
    # 4 of its 6 GPUs run in gpu4: 2 left in gpu, and nlp lends its 4 idle ones.
    assert decisions["gpu"].desired == 5 and "team vision borrows 3 slots of idle quota (quota 6 GPUs = 2 slots; 5 slots wanted)" in decisions["gpu"].reasons


# fmt: off
SHARES = [
    # (case, capacity, teams as (name, quota, weight, demand, urgent), expected (allowed, borrowed) per team)
    ("weights split what is left after quotas", 10, [("a", 2, 1, 9, False), ("b", 2, 3, 9, False), ("c", 6, 1, 0, False)],
     {"a": (4, 2), "b": (6, 4), "c": (0, 0)}),
    ("less than a slot each goes to the least served for its weight", 3, [("a", 4, 1, 4, False), ("b", 4, 1, 4, False)],
     {"a": (2, 0), "b": (1, 0)}),
    ("an urgent team is filled before the others", 4, [("a", 4, 1, 4, False), ("b", 4, 1, 4, True)],
     {"a": (0, 0), "b": (4, 0)}),
    ("a last slot goes to the heavier team on a tie", 1, [("a", None, 1, 9, False), ("b", None, 100, 9, False)],
     {"a": (0, 0), "b": (1, 0)}),
    ("leftovers go where they leave the split nearest the weights", 5, [("a", None, 1, 9, False), ("b", None, 3, 9, False)],
     {"a": (1, 0), "b": (4, 0)}),
    ("a team short of its guarantee borrows nothing", 5, [("a", 4, 1, 9, False), ("b", 4, 1, 9, False), ("c", 4, 1, 0, False)],
     {"a": (3, 0), "b": (2, 0), "c": (0, 0)}),
]
# fmt: on


@pytest.mark.parametrize(("case", "capacity", "teams", "expected"), SHARES, ids=[c[0] for c in SHARES])
def test_share_by_quota_then_weight(case, capacity, teams, expected):
    demands = [TeamDemand(n, q, w, d, 0, u) for n, q, w, d, u in teams]
    assert share(capacity, demands) == {n: Share(*v) for n, v in expected.items()}


def test_a_held_teams_items_in_flight_on_no_node_launch_nothing():
    """In flight yet on no node (finished items not yet deleted, a lost node's items not yet back):
    a held team cannot use a node they would launch, so the pool stays within the quotas' sum."""
    env = environment()
    view = fleet(env, {"vision-train": (12, 16)})
    view = FleetView((replace(view.pools[0], nodes=busy(8), desired=8),), view.queues)  # 8 of the 16 run
    (d,) = decide(env, view, NOW)
    assert d.desired == 8, d.reasons  # vision's 4 and nlp's 4 idle: not 16
    assert d.hold == ("vision-train",)
    assert "team vision: 8 of its 16 slots in flight are on no node (finished or lost): they launch nothing" in d.reasons


def test_a_held_teams_items_running_on_nodes_still_count():
    """The borrower's items that run keep their nodes, and the owner's items get new ones beside them."""
    env = environment()
    view = fleet(env, {"vision-train": (2, 7), "nlp-train": (4, 0)})
    view = FleetView((replace(view.pools[0], nodes=busy(5), desired=5),), view.queues)  # 2 of vision's 7 on no node
    (d,) = decide(env, view, NOW)
    assert d.desired == 9, d.reasons  # vision's 5 on nodes, nlp's 4


def test_a_held_teams_items_left_for_on_demand_nodes_launch_none():
    """Spot agents hide them (in flight, on no node); on-demand nodes could take none of them while held."""
    env = environment()
    view = fleet(env, {"vision-train": (2, 6), "nlp-train": (4, 0)})
    queues = tuple(replace(q, on_demand_wanted=2) if q.name == "vision-train" else q for q in view.queues)
    view = FleetView((replace(view.pools[0], nodes=busy(4), desired=4),), queues)  # vision's 4 that run
    (d,) = decide(env, view, NOW)
    assert (d.desired, d.on_demand_base, d.hold) == (8, None, ("vision-train",)), d.reasons


@pytest.mark.parametrize(("forming", "kept"), [(0, 4), (3, 4), (5, 5), (6, 6)])
def test_members_gangs_still_form_are_never_left_out(forming, kept):
    """They are in flight on no node because they wait for nodes: leaving them out would stall the gang."""
    env = environment()
    view = fleet(env, {"vision-train": (2, 6), "nlp-train": (4, 0)})
    queues = tuple(replace(q, forming_short=forming) if q.name == "vision-train" else q for q in view.queues)
    got = quota.apply(env, FleetView((replace(view.pools[0], nodes=()),), queues))["gpu"]
    assert {q.name: q.in_flight for q in got.queues}["vision-train"] == kept, got.reasons


def test_an_environment_wide_quota_is_granted_once_across_pools_in_one_tick():
    """The teams audit: quota 8 GPUs, 8 items waiting in each of two pools: each pool granted the
    whole quota in the same tick, 16 GPUs launched, and the team ran 16."""
    env = parse_environment({
        "region": "us-east-1",
        "pools": {"gpu1": {"max": 16, "container": "t:1", "instance_types": [{"type": "g5.xlarge", "gpus": 1}]},
                  "gpu2": {"max": 16, "container": "t:1", "instance_types": [{"type": "g5.2xlarge", "gpus": 1}]}},
        "queues": {"a1": {"pool": "gpu1", "team": "a"}, "a2": {"pool": "gpu2", "team": "a"}},
        "teams": {"a": {"quota": {"gpus": 8}}},
    }, name="t")  # fmt: skip
    queues = (QueueView("a1", "gpu1", 0, 1, visible=8, in_flight=0, team="a"),
              QueueView("a2", "gpu2", 0, 1, visible=8, in_flight=0, team="a"))  # fmt: skip
    decisions = decide(env, FleetView((PoolView("gpu1", (), 0, 0), PoolView("gpu2", (), 0, 0)), queues), NOW)
    assert sum(d.desired for d in decisions) == 8, [(d.pool, d.desired, d.reasons) for d in decisions]
    assert {q for d in decisions for q in d.hold} == {"a2"}, "the second pool's agents take none of its items meanwhile"


@pytest.mark.parametrize(("gang", "quota", "launched"), [
    ({"nodes_per_item": 4}, 16, 0),  # room for 2 of a 4-node gang: it cannot form, no node launches
    ({"nodes_per_item": 4}, 32, 32),  # one whole gang
    ({"nodes_per_item": {"min": 2, "max": 4}}, 16, 16),  # an elastic gang starts with its min
])
def test_a_teams_share_keeps_whole_gangs_or_none(gang, quota, launched):
    """The teams audit: room for half a 4-node gang launched two 8-GPU nodes whose lead waited for
    members the share never let come, handed the item back after boot_timeout_s, and again."""
    env = parse_environment({
        "region": "us-east-1",
        "pools": {"gpu8": {"max": 64, "capacity_unit": "gpus", "container": "t:1",
                           "instance_types": [{"type": "g5.48xlarge", "gpus": 8, "weight": 8}]}},
        "queues": {"a-gang": {"pool": "gpu8", "team": "a", "slots_per_item": 8, **gang},
                   "b": {"pool": "gpu8", "team": "b", "slots_per_item": 8}},
        "teams": {"a": {"quota": {"gpus": quota}}, "b": {"quota": {"gpus": 64 - quota}}},
    }, name="t")  # fmt: skip
    b_nodes = tuple(NodeView(f"b{i}", "g5.48xlarge", 8, 8, True, "running", NOW - 7200, busy_slots=8,
                             last_heartbeat=NOW - 2) for i in range((64 - quota) // 8))  # fmt: skip
    queues = (QueueView("a-gang", "gpu8", 0, 8, visible=4, in_flight=0, team="a", gang=True, oldest_age_s=300),
              QueueView("b", "gpu8", 0, 8, visible=2, in_flight=len(b_nodes), team="b", mean_item_s=36000))  # fmt: skip
    (decision,) = decide(env, FleetView((PoolView("gpu8", b_nodes, len(b_nodes) * 8, 0),), queues), NOW)
    assert decision.desired - len(b_nodes) * 8 == launched, decision.reasons


def test_a_team_is_held_once_its_smallest_waiting_item_would_take_it_past_its_share():
    """The teams audit: quota 5 GPUs, 2-GPU items, 4 running: not held (4 < 5), an agent took one
    and the team ran 6, a slot of another team's guarantee."""
    env = parse_environment({
        "region": "us-east-1",
        "pools": {"gpu": {"max": 16, "capacity_unit": "gpus", "container": "t:1",
                          "instance_types": [{"type": "g5.12xlarge", "gpus": 4, "weight": 4}]}},
        "queues": {"a2": {"pool": "gpu", "team": "a", "slots_per_item": 2}, "b": {"pool": "gpu", "team": "b"}},
        "teams": {"a": {"quota": {"gpus": 5}}, "b": {"quota": {"gpus": 11}}},
    }, name="t")  # fmt: skip
    queues = (QueueView("a2", "gpu", 0, 2, visible=3, in_flight=2, team="a"),
              QueueView("b", "gpu", 0, 1, visible=11, in_flight=0, team="b"))  # fmt: skip
    nodes = (NodeView("n0", "g5.12xlarge", 4, 4, True, "running", NOW - 7200, busy_slots=4, last_heartbeat=NOW - 2),)
    shared = quota.apply(env, FleetView((PoolView("gpu", nodes, 4, 0),), queues))["gpu"]
    assert "a2" in shared.hold


def test_validate_warns_of_a_team_with_no_table_and_a_preemptible_queue_nothing_outranks():
    """The teams audit: `team = "visoin"` validated and quietly became a team with no quota, owed its
    whole demand; a preemptible queue that no queue of its pool outranks is never preempted."""
    from tidefleet.config import environment_warnings

    assert environment_warnings(environment()) == []
    typo = environment_warnings(environment(**{"queues.vision-eval": {"pool": "gpu", "team": "visoin"}}))
    assert typo == [("queues.vision-eval.team: team 'visoin' has no [teams.visoin] table, so its items count to no quota "
                    "and are owed their whole demand; did you mean 'vision'? add the table or name a team that has one")]
    lone = environment_warnings(environment(**{"queues.nlp-train.preemptible": True}))
    assert lone == [("queues.nlp-train.preemptible: no queue of pool gpu has a priority above 0, so nothing ever "
                    "preempts it; give the queue that should a higher priority")]
    assert environment_warnings(environment(**{"queues.nlp-train.preemptible": True, "queues.vision-train.priority": 5})) == []
