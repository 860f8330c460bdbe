"""The scaling policy, one table per rule; each case asserts the decision and its reason text."""

from __future__ import annotations

import copy
import math
import random
from dataclasses import replace

import pytest
from fleet_apply import apply

from tidefleet.config import Environment, parse_environment
from tidefleet.policy import decide
from tidefleet.policy.model import FleetView, NodeView, PoolDecision, PoolView, QueueView

NOW = 100_000.0
BASE = {
    "region": "us-east-1",
    "scaler": {
        "scale_in_delay_s": 300,
        "scale_out_cooldown_s": 120,
        "spot_fallback_after_s": 240,
        "spot_failure_window_s": 600,
    },
    # c6i.large $0.085 on demand / $0.034 spot; m6i.large $0.096 / $0.038 (tidefleet.prices)
    "pools": {
        "cpu": {
            "max": 10,
            "slots_per_unit": 2,
            "command": "work",
            "instance_types": [{"type": "c6i.large"}, {"type": "m6i.large"}],
        }
    },
    "queues": {"render": {"pool": "cpu", "priority": 20}, "batch": {"pool": "cpu", "priority": 5}},
}
GPU_POOL = {
    "max": 8,
    "container": "train:1",
    "instance_types": [{"type": "g5.xlarge", "gpus": 1}],
}  # $0.40 spot


def environment(**changes) -> Environment:
    """BASE with dotted changes: environment(**{"pools.cpu.min": 1})."""
    data = copy.deepcopy(BASE)
    for dotted, value in changes.items():
        *parents, leaf = dotted.split(".")
        at = data
        for key in parents:
            at = at.setdefault(key, {})
        at[leaf] = value
    return parse_environment(data, name="test")


def node(
    id: str,
    *,
    busy: int = 0,
    idle: float | None = None,
    age: float = 3600,
    booted: bool = True,
    state: str | None = None,
    spot: bool = True,
    weight: int = 1,
    protected: bool = False,
    type: str = "c6i.large",
    silent: float = 5,
) -> NodeView:
    """A cpu-pool node; `idle`, `age` and `silent` (since its last heartbeat) are seconds before NOW."""
    return NodeView(
        id=id,
        instance_type=type,
        weight=weight,
        slots=weight * 2,
        spot=spot,
        state=state or ("running" if booted else "pending"),
        launched_at=NOW - age,
        busy_slots=busy,
        last_heartbeat=NOW - silent if booted else None,
        idle_since=None if idle is None else NOW - idle,
        protected=protected,
    )


def fleet(env: Environment, nodes=(), *, desired=None, base=0, failures=(), pool="cpu", **depth) -> FleetView:
    """One pool's fleet; every queue of the environment, depth given as name=(visible, in_flight)."""
    live = [n for n in nodes if n.state != "terminating"]
    views = [
        PoolView(
            pool,
            tuple(nodes),
            sum(n.weight for n in live) if desired is None else desired,
            base,
            tuple(failures),
        )
    ]
    views += [PoolView(name, (), 0, 0) for name in env.pools if name != pool]
    return FleetView(tuple(views), queues(env, **depth))


def queues(env: Environment, **depth) -> tuple[QueueView, ...]:
    return tuple(
        QueueView(name, q.pool, q.priority, q.slots_per_item, *depth.get(name, (0, 0)))
        for name, q in env.queues.items()
    )


def decide_pool(env: Environment, fleet_view: FleetView, pool: str = "cpu") -> PoolDecision:
    decisions = {d.pool: d for d in decide(env, fleet_view, NOW)}
    assert set(decisions) == {p.name for p in fleet_view.pools}, "one decision per pool"
    return decisions[pool]


def assert_settled(env: Environment, fleet_view: FleetView) -> None:
    """Idempotence: after applying a decision, deciding again changes nothing."""
    after = apply(env, fleet_view, decide(env, fleet_view, NOW))
    for again, pool in zip(decide(env, after, NOW), after.pools, strict=True):
        assert (again.desired, again.terminate, again.on_demand_base) == (pool.desired, (), None), (
            again.reasons
        )


# --- demand and capacity: scale out, hold, cancel ---------------------------------------------

# fmt: off
SCALE_OUT = [
    # (case, nodes, desired before, depth, desired after, reason)
    ("empty pool scales out at once", [], 0, {"render": (7, 2)}, 5,
     "scale out 0 -> 5 units: demand 9 slots (queue render: 7 visible + 2 in flight) > capacity 0 slots; 5 unit(s) to launch"),
    ("running nodes count as capacity", [node("i-a", busy=2), node("i-b", busy=2)], 2, {"render": (7, 2)}, 5,
     "scale out 2 -> 5 units: demand 9 slots (queue render: 7 visible + 2 in flight) > capacity 4 slots; 3 unit(s) to launch"),
    ("booting nodes count as capacity", [node("i-a", booted=False, age=60), node("i-b", booted=False, age=60)], 2,
     {"render": (4, 0)}, 2, "keep 2 units: demand 4 slots (queue render: 4 visible + 0 in flight) <= capacity 4 slots"),
    ("launches in progress are not launched twice", [], 5, {"render": (9, 0)}, 5,
     "keep 5 units: demand 9 slots (queue render: 9 visible + 0 in flight) <= capacity 10 slots; 5 unit(s) to launch"),
    ("in-flight items count", [node("i-a", busy=2)], 1, {"render": (0, 4)}, 2,
     "scale out 1 -> 2 units: demand 4 slots (queue render: 0 visible + 4 in flight) > capacity 2 slots; 1 unit(s) to launch"),
    ("a weighted node is its weight in slots", [node("i-a", weight=3, busy=6)], 3, {"render": (2, 6)}, 4,
     "scale out 3 -> 4 units: demand 8 slots (queue render: 2 visible + 6 in flight) > capacity 6 slots; 1 unit(s) to launch"),
    ("a draining node is not capacity but stays in the group", [node("i-a", state="draining", busy=1)], 1,
     {"render": (2, 1)}, 3,
     "scale out 1 -> 3 units: demand 3 slots (queue render: 2 visible + 1 in flight) > capacity 0 slots; 2 unit(s) to launch"),
    ("unlaunched units demand no longer needs are cancelled", [node("i-a", busy=2)], 5, {"render": (0, 2)}, 1,
     "scale in 5 -> 1 units: demand 2 slots (queue render: 0 visible + 2 in flight) <= capacity 10 slots"),
    ("queues listed by priority", [], 0, {"render": (1, 0), "batch": (2, 0)}, 2,
     "scale out 0 -> 2 units: demand 3 slots (queue render: 1 visible + 0 in flight; queue batch: 2 visible + 0 in flight)"),
]
# fmt: on


@pytest.mark.parametrize(
    "case, nodes, before, depth, after, reason", SCALE_OUT, ids=[c[0] for c in SCALE_OUT]
)
def test_desired_covers_demand_in_slots(case, nodes, before, depth, after, reason):
    env = environment()
    view = fleet(env, nodes, desired=before, **depth)
    decision = decide_pool(env, view)
    assert decision.desired == after
    assert decision.terminate == ()
    assert decision.reasons[0].startswith(reason)
    assert_settled(env, view)


def test_items_needing_several_slots_count_all_their_slots():
    env = environment(**{"queues.render.slots_per_item": 2})
    decision = decide_pool(env, fleet(env, render=(3, 0)))
    assert decision.desired == 3
    assert decision.reasons[0].startswith(
        "scale out 0 -> 3 units: demand 6 slots (queue render: 3 visible + 0 in flight x 2 slots)"
    )


# --- boot horizon: work serving slots start before a new node boots launches nothing ----------

BUSY_SIX = [node(f"i-{i}", busy=2) for i in range(6)]  # 12 serving slots, all busy
FOUR_BUSY_TWO_BOOTING = [node(f"i-{i}", busy=2) for i in range(4)] + [
    node(f"i-b{i}", booted=False, age=20) for i in range(2)
]

# fmt: off
HORIZON = [
    # (case, nodes, render depth (visible, in flight, mean item s), desired after, horizon line or None)
    ("an unknown mean counts slots only", BUSY_SIX, (40, 12, None), 26, None),
    ("a mean longer than the boot counts slots only", BUSY_SIX, (40, 12, 90.0), 26, None),
    ("each busy slot starts 1 + floor(60 / 23) items before a new node is ready", BUSY_SIX, (40, 12, 23.0), 14,
     ("boot horizon: 40 queued items of ~23s; 12 serving slots start ~24 of them within the 60s a new node needs; "
     "16 more slots")),
    ("short items are all started by the serving slots", BUSY_SIX, (40, 12, 10.0), 6,
     ("boot horizon: 40 queued items of ~10s; 12 serving slots start ~40 of them within the 60s a new node needs; "
     "0 more slots")),
    ("booting slots count once: they are not turning over yet", FOUR_BUSY_TWO_BOOTING, (40, 12, 23.0), 18,
     ("boot horizon: 40 queued items of ~23s; 12 serving slots start ~16 of them within the 60s a new node needs; "
     "24 more slots")),
]
# fmt: on


@pytest.mark.parametrize("case, nodes, depth, after, line", HORIZON, ids=[c[0] for c in HORIZON])
def test_waiting_work_serving_slots_start_within_the_boot_estimate_launches_no_node(
    case, nodes, depth, after, line
):
    env = environment(**{"pools.cpu.max": 50, "pools.cpu.boot_estimate_s": 60})
    view = fleet(env, nodes, render=depth)
    decision = decide_pool(env, view)
    assert decision.desired == after, decision.reasons
    horizon = [r for r in decision.reasons if r.startswith("boot horizon")]
    assert horizon == ([line] if line else []), decision.reasons
    assert_settled(env, view)


def test_the_boot_horizon_serves_higher_priority_queues_first():
    """render (priority 20) takes the turning-over slots it needs; batch gets the rest."""
    env = environment(**{"pools.cpu.max": 50})
    view = fleet(env, BUSY_SIX, render=(12, 6, 20.0), batch=(10, 6, 20.0))
    decision = decide_pool(env, view)
    # A slot starts 1 + 60 // 20 = 4 items: render's 18 take 5 slots, the 7 left start 28 >= batch's 16.
    assert decision.desired == 6, decision.reasons
    more = decide_pool(env, fleet(env, BUSY_SIX, render=(12, 6, 20.0), batch=(30, 6, 20.0)))
    # batch's 36 items: 28 started by its 7 slots, 8 more slots = 4 units.
    assert more.desired == 6 + 4, more.reasons
    assert (
        "boot horizon: 42 queued items of ~20s; 12 serving slots start ~34 of them within the 60s a new node needs; "
        "8 more slots"
    ) in more.reasons, more.reasons  # both queues counted: 12 + 30 waiting, 12 + (30 - 8) started
    assert_settled(env, view)


def test_booting_slots_are_shared_by_the_queues_and_used_once():
    """4 booting slots: render's 1 item takes one, batch's 4 items the other 3 and 1 new slot."""
    env = environment()
    booting = [node("i-b0", booted=False, age=20), node("i-b1", booted=False, age=20)]
    decision = decide_pool(env, fleet(env, booting, render=(1, 0), batch=(4, 0)))
    assert decision.desired == 3, decision.reasons


# --- packing: an item of several slots needs them free on one node ---------------------------

PACKED = {  # nodes of 8 slots (4 units of 2 slots); render items take a whole node
    "pools.cpu.max": 40,
    "pools.cpu.instance_types": [{"type": "c6i.xlarge", "weight": 4}],
    "queues.render.slots_per_item": 8,
}


def test_an_item_fitting_no_nodes_free_slots_launches_a_node_although_free_slots_add_up():
    env = environment(**PACKED)
    half_busy = [node(f"i-{i}", weight=4, busy=4, type="c6i.xlarge") for i in range(3)]  # 3 x 4 free slots
    view = fleet(env, half_busy, render=(1, 0), batch=(0, 12))
    decision = decide_pool(env, view)
    assert decision.desired == 12 + 4, decision.reasons
    assert decision.reasons[0].startswith(
        "scale out 12 -> 16 units: demand 20 slots (queue render: 1 visible + 0 in flight x 8 slots; "
        "queue batch: 0 visible + 12 in flight) <= capacity 24 slots; 4 unit(s) to launch"
    )
    assert (
        "packing: 1 item(s) of 8 slots (queue render) fit no node's free slots; 1 node(s) of 8 slots needed"
        in (decision.reasons)
    )
    assert_settled(env, view)


def test_items_that_fit_free_slots_launch_nothing_and_keep_their_idle_node():
    """The longest idle node would go first; the waiting 8-slot item was placed on it instead."""
    env = environment(**PACKED)
    nodes = [
        node("i-a", weight=4, busy=8, type="c6i.xlarge"),
        node("i-b", weight=4, idle=1000, type="c6i.xlarge"),
        node("i-c", weight=4, idle=2000, type="c6i.xlarge"),
    ]
    view = fleet(env, nodes, render=(1, 0), batch=(0, 8))
    decision = decide_pool(env, view)
    assert decision.terminate == ("i-b",), decision.reasons
    assert decision.desired == 8
    assert "keep i-c: idle but needed, a waiting multi-slot item fits its free slots" in decision.reasons
    assert not any(r.startswith("packing") for r in decision.reasons)
    assert_settled(env, view)


def forming(view: FleetView, queue: str, short: int) -> FleetView:
    """The view with `short` members the queue's forming gangs still wait for (their leads' beacons)."""
    return replace(view, queues=tuple(replace(q, forming_short=short) if q.name == queue else q for q in view.queues))


def test_a_forming_gangs_missing_member_launches_a_node_although_free_slots_add_up():
    """A gang member takes a whole node: 12 slots free over three busy nodes hold none of it."""
    env = environment(**PACKED, **{"queues.render.nodes_per_item": 2})
    lead = node("i-lead", weight=4, busy=8, type="c6i.xlarge")
    half_busy = [node(f"i-{i}", weight=4, busy=4, type="c6i.xlarge") for i in range(3)]
    view = fleet(env, [lead, *half_busy], render=(0, 2), batch=(0, 12))  # the gang's 2 members in flight
    assert decide_pool(env, view).desired == 16  # before the beacon: the free slots look like enough
    decision = decide_pool(env, forming(view, "render", 1))
    assert decision.desired == 16 + 4, decision.reasons
    assert (
        "packing: 1 item(s) of 8 slots (queue render) fit no node's free slots; 1 node(s) of 8 slots needed"
        in decision.reasons
    )
    assert not decision.cordon
    assert_settled(env, forming(view, "render", 1))


def test_a_wholly_free_node_is_kept_for_a_forming_gangs_member_and_launches_nothing():
    env = environment(**PACKED, **{"queues.render.nodes_per_item": 2})
    nodes = [
        node("i-lead", weight=4, busy=8, type="c6i.xlarge"),
        node("i-a", weight=4, busy=4, type="c6i.xlarge"),
        node("i-free", weight=4, idle=2000, type="c6i.xlarge"),
    ]
    view = forming(fleet(env, nodes, render=(0, 2), batch=(0, 4)), "render", 1)
    decision = decide_pool(env, view)
    assert (decision.desired, decision.terminate, decision.cordon) == (12, (), ()), decision.reasons
    assert "keep i-free: idle but needed, a waiting multi-slot item fits its free slots" in decision.reasons


def test_multi_slot_items_within_their_wait_target_wait_for_the_slots_items_in_flight_free():
    """Three 8-slot items run on three full nodes, done every ~600 s. Two more may wait an hour:
    turnover serves them (the three in flight free their slots 6 times each in it), no node
    launches. Once their wait is down to a boot, or when turnover is slower than their wait, they
    launch at once, as without a target. With none in flight, one new node runs both in turn
    within the hour (a new node's turnover, as rule 1a's new slots), the mean known or not yet
    (two boots assumed until an item finishes)."""
    env = environment(**PACKED)
    boot = env.pools["cpu"].boot_estimate_s
    full = [node(f"i-{i}", weight=4, busy=8, type="c6i.xlarge") for i in range(3)]

    def view(*, mean=600.0, age=0.0, in_flight=3, target=3600):
        v = fleet(env, full, render=(2, in_flight), batch=(0, 3 * 8 - in_flight * 8))
        return replace(v, queues=tuple(
            replace(q, mean_item_s=mean, oldest_age_s=age, target_wait_s=target) for q in v.queues))

    waiting = decide_pool(env, view())
    assert waiting.desired == 12, waiting.reasons
    assert ("packing: 2 item(s) of 8 slots (queue render) fit no node's free slots; 0 node(s) of 8 slots needed "
            "(2 wait within target_wait_s for the slots its 3 item(s) in flight free)") in waiting.reasons
    assert_settled(env, view())
    for case, launching in [("due", view(age=3600 - boot)), ("turnover slower than the wait", view(mean=7200.0)),
                            ("no target", view(target=None))]:
        decision = decide_pool(env, launching)
        assert decision.desired == 12 + 8, (case, decision.reasons)
        assert ("packing: 2 item(s) of 8 slots (queue render) fit no node's free slots; 2 node(s) of 8 slots "
                "needed") in decision.reasons, case
    for one in (decide_pool(env, view(in_flight=0)), decide_pool(env, view(in_flight=0, mean=None))):
        assert one.desired == 12 + 4, one.reasons
        assert ("packing: 2 item(s) of 8 slots (queue render) fit no node's free slots; 1 node(s) of 8 slots "
                "needed") in one.reasons


def test_a_burst_of_multi_slot_items_gets_a_node_per_few_items_within_its_wait_target():
    """Rule 1b credits new nodes with turnover as rule 1a does new slots: 12 items of 4 slots of
    ~30 s may wait 150 s, so each new node's two slot groups start 1 + (150 - boot) // 30 items
    each; items already placed on free slots free them for more in turn. Without a known mean,
    a node per two items, as before."""
    env = environment(**{**PACKED, "queues.render.slots_per_item": 4})
    rounds = 1 + (150 - env.pools["cpu"].boot_estimate_s) // 30

    def view(mean):
        v = fleet(env, [], render=(12, 0), batch=(0, 0))
        return replace(v, queues=tuple(replace(q, mean_item_s=mean, oldest_age_s=0.0, target_wait_s=150)
                                       for q in v.queues))  # fmt: skip

    assert rounds == 4
    turnover = decide_pool(env, view(30.0))
    assert turnover.desired == 4 * math.ceil(12 / (2 * rounds)), turnover.reasons
    assert decide_pool(env, view(None)).desired == 4 * 6


def test_pool_min_is_kept_without_demand():
    env = environment(**{"pools.cpu.min": 2})
    decision = decide_pool(env, fleet(env))
    assert decision.desired == 2
    assert (
        decision.reasons[0]
        == "scale out 0 -> 2 units: demand 0 slots <= capacity 0 slots; 2 unit(s) to launch; pool min 2 units"
    )


def test_a_pool_without_queues_still_gets_a_decision():
    env = environment(**{"pools.gpu": GPU_POOL})
    decision = decide_pool(env, fleet(env, render=(1, 0)), pool="gpu")
    assert (decision.desired, decision.terminate) == (0, ())
    assert decision.reasons == ("keep 0 units: demand 0 slots <= capacity 0 slots",)


def test_a_pool_the_environment_does_not_know_is_left_unchanged():
    env = environment()
    view = FleetView((PoolView("old", (node("i-a"),), 1, 0),), ())
    (decision,) = decide(env, view, NOW)
    assert (decision.desired, decision.terminate, decision.on_demand_base) == (1, (), None)
    assert decision.reasons == ("leave pool old unchanged: not in environment test (known pools: cpu)",)


# --- scale-in: only specific idle nodes ---------------------------------------------------------

# fmt: off
SCALE_IN = [
    # (case, env changes, nodes, depth, terminated, desired, reason lines expected among the reasons)
    ("an idle node past the delay goes", {}, [node("i-a", idle=412)], {}, ("i-a",), 0,
     ["scale in 1 -> 0 units: demand 0 slots <= capacity 2 slots", "terminate i-a: idle 412s > 300s (spot, longest idle first)"]),
    ("an idle node within the delay stays", {}, [node("i-a", idle=100)], {}, (), 1,
     ["keep 1 node(s): 1 idle <= 300s (longest 100s)"]),
    ("the pool's own idle timeout wins", {"pools.cpu.idle_timeout_s": 60}, [node("i-a", idle=100)], {}, ("i-a",), 0,
     ["terminate i-a: idle 100s > 60s (spot, longest idle first)"]),
    ("a busy node is never terminated", {}, [node("i-a", busy=1)], {}, (), 1,
     ["keep 1 node(s): 1 busy"]),
    ("a busy node is never terminated, even with a stale idle_since", {}, [node("i-a", busy=1, idle=900)], {}, (), 1,
     ["keep 1 node(s): 1 busy"]),
    ("a protected node is never terminated", {}, [node("i-a", idle=900, protected=True)], {}, (), 1,
     ["keep 1 node(s): 1 scale-in protected"]),
    ("a booting node is never terminated", {}, [node("i-a", booted=False, age=60)], {}, (), 1,
     ["keep 1 node(s): 1 booting (no heartbeat yet, oldest 60s after launch)"]),
    ("a draining node with work is never terminated", {}, [node("i-a", state="draining", busy=1)], {}, (), 1,
     ["keep i-a: draining with 1 busy slot(s)"]),
    ("an idle draining node is released at once", {}, [node("i-a", state="draining", idle=5)], {}, ("i-a",), 0,
     ["terminate i-a: draining and idle"]),
    ("a draining node that has not reported idle stays", {}, [node("i-a", state="draining")], {}, (), 1,
     ["keep i-a: draining, not reported idle yet"]),
    ("not within the cooldown after a scale-out", {}, [node("i-a", idle=900), node("i-b", busy=1, age=45)], {}, (), 2,
     ["hold scale-in: 45s since scale-out < cooldown 120s"]),
    ("a just-launched node released by its spot notice holds no cooldown", {},
     [node("i-a", idle=900), node("i-b", state="draining", idle=5, age=5)], {}, ("i-b", "i-a"), 0,
     ["terminate i-b: draining and idle", "terminate i-a: idle 900s > 300s (spot, longest idle first)"]),
    ("never below min", {"pools.cpu.min": 1}, [node("i-a", idle=900), node("i-b", idle=800)], {}, ("i-a",), 1,
     ["terminate i-a: idle 900s > 300s (spot, longest idle first)", "keep i-b: idle but pool min is 1 units"]),
    ("only the surplus goes", {}, [node("i-a", idle=900), node("i-b", idle=800)], {"render": (2, 0)}, ("i-a",), 1,
     ["keep i-b: idle but needed, demand 2 slots leaves 0 spare < its 2"]),
    ("no surplus, no scale-in", {}, [node("i-a", idle=900), node("i-b", busy=2)], {"render": (2, 2)}, (), 2,
     ["no scale-in: demand 4 slots needs all 4 serving slots"]),
    ("on-demand goes before spot", {}, [node("i-s", idle=900), node("i-o", idle=400, spot=False)], {"render": (2, 0)},
     ("i-o",), 1, ["terminate i-o: idle 400s > 300s (on-demand first)"]),
    ("the longest idle goes first", {}, [node("i-a", idle=400), node("i-b", idle=900)], {"render": (2, 0)}, ("i-b",), 1,
     ["terminate i-b: idle 900s > 300s (spot, longest idle first)"]),
    ("the nodes kept are counted by why, in one line", {},
     [node("i-a", busy=2), node("i-p", idle=900, protected=True), node("i-b", booted=False, age=200),
      node("i-y", idle=100), node("i-z", idle=50), node("i-o", idle=900)], {}, ("i-o",), 5,
     [("keep 5 node(s): 1 busy, 1 scale-in protected, 1 booting (no heartbeat yet, oldest 200s after launch), "
       "2 idle <= 300s (longest 100s)"), "terminate i-o: idle 900s > 300s (spot, longest idle first)"]),
    ("a heavier idle node goes only if the surplus covers it", {},
     [node("i-big", weight=2, idle=900), node("i-a", idle=400)], {"render": (3, 0)}, ("i-a",), 2,
     ["keep i-big: idle but needed, demand 3 slots leaves 3 spare < its 4"]),
]
# fmt: on


@pytest.mark.parametrize(
    "case, changes, nodes, depth, terminated, desired, lines", SCALE_IN, ids=[c[0] for c in SCALE_IN]
)
def test_scale_in_only_terminates_specific_idle_nodes(
    case, changes, nodes, depth, terminated, desired, lines
):
    env = environment(**changes)
    view = fleet(env, nodes, **depth)
    decision = decide_pool(env, view)
    assert decision.terminate == terminated
    assert decision.desired == desired
    for line in lines:
        assert line in decision.reasons
    assert_settled(env, view)


def test_a_scale_in_decision_never_also_scales_out():
    env = environment()
    view = fleet(env, [node("i-a", idle=900), node("i-b", idle=900), node("i-c", busy=2)], render=(2, 1))
    decision = decide_pool(env, view)
    assert decision.terminate == ("i-a",)
    assert decision.desired == 2  # 3 units minus the one terminated, nothing launched
    assert decision.reasons[0].startswith("scale in 3 -> 2 units")


# --- boot timeout --------------------------------------------------------------------------------

# fmt: off
BOOT = [
    # (case, node age, terminated, reason)
    ("no heartbeat past the boot timeout: replaced", 640, ("i-x",), "replace i-x: no heartbeat 640s after launch > boot timeout 600s"),
    ("still within the boot timeout: kept", 500, (), "keep 1 units: demand 2 slots (queue render: 2 visible + 0 in flight) <= capacity 2 slots"),
]
# fmt: on


@pytest.mark.parametrize("case, age, terminated, reason", BOOT, ids=[c[0] for c in BOOT])
def test_a_node_that_never_reports_is_replaced(case, age, terminated, reason):
    env = environment(**{"scaler.spot_fallback_after_s": 3600})
    view = fleet(env, [node("i-x", booted=False, age=age)], render=(2, 0))
    decision = decide_pool(env, view)
    assert decision.terminate == terminated
    assert decision.desired == 1  # still covers demand: a replacement is launched
    assert reason in decision.reasons
    assert_settled(env, view)


def test_a_node_silent_for_exactly_the_boot_timeout_is_not_replaced_yet():
    env = environment()
    decision = decide_pool(env, fleet(env, [node("i-x", busy=2, silent=600)], render=(0, 2)))
    assert decision.terminate == (), decision.reasons


def test_a_node_never_heard_from_but_protected_by_its_group_is_not_a_dead_boot():
    env = environment(**{"scaler.spot_fallback_after_s": 3600})
    decision = decide_pool(env, fleet(env, [node("i-x", booted=False, age=640, protected=True)], render=(2, 0)))
    assert decision.terminate == (), decision.reasons


# fmt: off
SILENT = [
    # (case, the silent node, depth (i-ok runs 2 of the in-flight items), reason)
    ("an idle node silent past the boot timeout", node("i-x", idle=900, silent=700), {"render": (2, 2)},
     "replace i-x: last heartbeat 700s ago > boot timeout 600s (agent silent)"),
    ("a node whose last heartbeat said busy", node("i-x", busy=2, silent=700), {"render": (0, 4)},
     "replace i-x: last heartbeat 700s ago > boot timeout 600s (agent silent)"),
    ("a node whose last heartbeat said protected", node("i-x", busy=1, protected=True, silent=601), {"render": (0, 3)},
     "replace i-x: last heartbeat 601s ago > boot timeout 600s (agent silent)"),
    ("a draining node with work whose agent went silent", node("i-x", state="draining", busy=2, silent=700),
     {"render": (0, 4)}, "replace i-x: last heartbeat 700s ago > boot timeout 600s (agent silent)"),
]
# fmt: on


@pytest.mark.parametrize("case, silent, depth, reason", SILENT, ids=[c[0] for c in SILENT])
def test_a_node_whose_agent_went_silent_is_replaced_and_not_counted(case, silent, depth, reason):
    env = environment()
    view = fleet(env, [silent, node("i-ok", busy=2, silent=590)], **depth)
    decision = decide_pool(env, view)
    assert decision.terminate == ("i-x",)
    assert reason in decision.reasons
    assert decision.desired == 2  # i-ok stays; a replacement covers the 2 slots i-x no longer does
    assert decision.reasons[0].endswith("> capacity 2 slots; 1 unit(s) to launch, 1 of them short in the group already "
                                         "(replacements, launches under way)")
    assert_settled(env, view)


def test_a_replacement_is_launched_for_a_timed_out_node():
    env = environment(**{"scaler.spot_fallback_after_s": 3600})
    decision = decide_pool(env, fleet(env, [node("i-x", booted=False, age=640)], render=(2, 0)))
    assert (
        decision.reasons[0]
        == "keep 1 units: demand 2 slots (queue render: 2 visible + 0 in flight) > capacity 0 slots; 1 unit(s) to "
        "launch, 1 of them short in the group already (replacements, launches under way)"
    )


# --- spot shortage ------------------------------------------------------------------------------

# fmt: off
SPOT = [
    # (case, nodes, desired, base, failure ages, depth, new desired, new base, reason)
    ("launch failures raise the base to cover the units to launch", [], 3, 0, [30, 200], {"render": (6, 0)}, 3, 3,
     "spot short (2 spot launch failure(s) in the last 600s): on-demand base 0 -> 3 units so 3 unit(s) to launch come on demand"),
    ("failures older than the window are forgotten", [], 3, 0, [700], {"render": (6, 0)}, 3, None, None),
    ("a slow spot node: what is launched comes on demand",
     [node("i-s", booted=False, age=300), node("i-o", spot=False, busy=2)], 2, 0, [], {"render": (4, 2)}, 3, 2,
     "spot short (i-s spot without heartbeat 300s > 240s): on-demand base 0 -> 2 units so 1 unit(s) to launch come on demand"),
    ("a slow spot node still counts as capacity: no duplicate launch",
     [node("i-s", booted=False, age=300), node("i-o", spot=False, busy=2)], 2, 0, [], {"render": (2, 2)}, 2, None,
     "spot short (i-s spot without heartbeat 300s > 240s): on-demand base stays 0 units"),
    ("a replaced spot node is no signal: a failing relaunch will be", [node("i-s", booted=False, age=640)], 1, 0, [],
     {"render": (2, 0)}, 1, None, None),
    ("healthy spot returns the base to the configured one", [node("i-o", spot=False, busy=2)], 1, 3, [], {"render": (0, 2)}, 1, 0,
     "spot healthy: on-demand base 3 -> 0 units (configured)"),
    ("the raised base is bounded by max", [], 0, 0, [10], {"render": (40, 0)}, 10, 10,
     "spot short (1 spot launch failure(s) in the last 600s): on-demand base 0 -> 10 units so 10 unit(s) to launch come on demand"),
]
# fmt: on


@pytest.mark.parametrize(
    "case, nodes, desired, base, failures, depth, new_desired, new_base, reason",
    SPOT,
    ids=[c[0] for c in SPOT],
)
def test_spot_shortage_shifts_to_on_demand_and_back(
    case, nodes, desired, base, failures, depth, new_desired, new_base, reason
):
    env = environment()
    view = fleet(env, nodes, desired=desired, base=base, failures=[NOW - a for a in failures], **depth)
    decision = decide_pool(env, view)
    assert decision.desired == new_desired
    assert decision.on_demand_base == new_base
    assert [r for r in decision.reasons if r.startswith("spot")] == ([reason] if reason else [])
    assert_settled(env, view)


# --- caps and priorities --------------------------------------------------------------------------

# fmt: off
CAPS = [
    # (case, env changes, nodes, depth, desired, starved, reason)
    ("max caps the pool; the lowest priority waits", {}, [], {"render": (12, 0), "batch": (10, 0)}, 10, ("batch",),
     "at max: pool cpu capped at 10 units, demand needs 11 units; waiting: batch (priority 5)"),
    ("a queue the capped capacity covers exactly is not starved", {}, [], {"render": (20, 0), "batch": (2, 0)}, 10,
     ("batch",), "at max: pool cpu capped at 10 units, demand needs 11 units; waiting: batch (priority 5)"),
    ("pool cost cap: new units at the dearest spot unit price", {"pools.cpu.cost_cap_usd_per_hour": 0.2}, [],
     {"render": (20, 0)}, 5, ("render",),
     "cost cap: pool cpu capped at 5 units ($0.19/h of $0.20/h), demand needs 10 units; waiting: render (priority 20)"),
    ("existing nodes count at their own price", {"pools.cpu.cost_cap_usd_per_hour": 0.2},
     [node("i-o", spot=False, type="m6i.large", busy=2)], {"render": (20, 0)}, 3, ("render",),
     "cost cap: pool cpu capped at 3 units ($0.17/h of $0.20/h), demand needs 10 units; waiting: render (priority 20)"),
    ("a node of a cheaper type counts at its own price, not the dearest", {"pools.cpu.cost_cap_usd_per_hour": 0.2},
     [node("i-o", spot=False, type="c6i.large", busy=2)], {"render": (20, 0)}, 4, ("render",),
     "cost cap: pool cpu capped at 4 units ($0.20/h of $0.20/h), demand needs 10 units; waiting: render (priority 20)"),
    ("a node of a type gone from the config counts at the dearest unit price of its lifecycle",
     {"pools.cpu.cost_cap_usd_per_hour": 0.2},
     [node("i-o", spot=False, type="c5.large", busy=2), node("i-s", type="c5.large", busy=2)], {"render": (20, 0)}, 3,
     ("render",),
     "cost cap: pool cpu capped at 3 units ($0.17/h of $0.20/h), demand needs 10 units; waiting: render (priority 20)"),
    ("a weighted type is priced per unit", {"pools.cpu.cost_cap_usd_per_hour": 0.2,
     "pools.cpu.instance_types": [{"type": "c6i.xlarge", "weight": 2}]}, [], {"render": (20, 0)}, 5, ("render",),
     "cost cap: pool cpu capped at 5 units ($0.17/h of $0.20/h), demand needs 10 units; waiting: render (priority 20)"),
    # The base's 1 unit, then 50 % of the rest rounded up: 3 units = 2 on demand + 1 spot.
    ("the on-demand base first, then the percentage of the rest",
     {"pools.cpu.cost_cap_usd_per_hour": 0.3, "pools.cpu.on_demand_base": 1, "pools.cpu.on_demand_percent": 50}, [],
     {"render": (20, 0)}, 3, ("render",),
     "cost cap: pool cpu capped at 3 units ($0.23/h of $0.30/h), demand needs 10 units; waiting: render (priority 20)"),
    ("the on-demand share is priced on demand",
     {"pools.cpu.cost_cap_usd_per_hour": 0.2, "pools.cpu.on_demand_base": 1}, [], {"render": (20, 0)}, 3, ("render",),
     "cost cap: pool cpu capped at 3 units ($0.17/h of $0.20/h), demand needs 10 units; waiting: render (priority 20)"),
    ("nodes already costing more than the cap launch nothing", {"pools.cpu.cost_cap_usd_per_hour": 0.2},
     [node(f"i-{i}", spot=False, type="m6i.large", busy=2) for i in range(3)], {"render": (20, 0)}, 3, ("render",),
     ("cost cap: pool cpu capped at 3 units ($0.29/h of $0.20/h: over the cap already, by nodes it keeps; it launches "
     "none), demand needs 10 units; waiting: render (priority 20)")),
    # (A cap below every node's price is refused at validation; on demand only, the spot price is no help.)
    ("a cap below one unit's price launches nothing", {"pools.cpu.cost_cap_usd_per_hour": 0.05,
     "pools.cpu.on_demand_percent": 100}, [], {"render": (20, 0)}, 0, ("render",),
     "cost cap: pool cpu capped at 0 units ($0.00/h of $0.05/h), demand needs 10 units; waiting: render (priority 20)"),
    # 2 units: 1 of them on demand ($0.096) + 1 spot ($0.038). A 3rd would make it 2 of 3 on demand (50 %
    # rounded up) = $0.23; rounded down it would look like $0.17 and fit, and the group would overspend.
    ("the on-demand share above the base is rounded up",
     {"pools.cpu.cost_cap_usd_per_hour": 0.2, "pools.cpu.on_demand_percent": 50}, [], {"render": (20, 0)}, 2,
     ("render",),
     "cost cap: pool cpu capped at 2 units ($0.13/h of $0.20/h), demand needs 10 units; waiting: render (priority 20)"),
    ("higher priority served first under the cap", {"pools.cpu.cost_cap_usd_per_hour": 0.2}, [],
     {"render": (6, 0), "batch": (6, 0)}, 5, ("batch",),
     "cost cap: pool cpu capped at 5 units ($0.19/h of $0.20/h), demand needs 6 units; waiting: batch (priority 5)"),
    # The busy slots run batch's items: render's waiting ones are the ones left waiting, not batch's.
    ("the queue whose items wait is named, not the one whose items run", {"pools.cpu.max": 1},
     [node("i-1", busy=2)], {"render": (1, 0), "batch": (0, 2)}, 1, ("render",),
     "at max: pool cpu capped at 1 units, demand needs 2 units; waiting: render (priority 20)"),
]
# fmt: on


@pytest.mark.parametrize(
    "case, changes, nodes, depth, desired, starved, reason", CAPS, ids=[c[0] for c in CAPS]
)
def test_caps_serve_higher_priority_first_and_name_who_waits(
    case, changes, nodes, depth, desired, starved, reason
):
    env = environment(**changes)
    view = fleet(env, nodes, **depth)
    decision = decide_pool(env, view)
    assert decision.desired == desired
    assert decision.starved_queues == starved
    assert reason in decision.reasons
    assert_settled(env, view)


# fmt: off
ENV_CAP = [
    # (case, gpu queue priority, cpu desired, gpu desired, starved pool, reason)
    ("gpu queue first: cpu gets what is left", 50, 5, 2, "cpu",
     ("cost cap: pool cpu capped at 5 units ($0.19/h) by the environment cap ($0.99/h of $1.00/h), "
      "demand needs 10 units; waiting: render (priority 20)")),
    ("cpu queue first: gpu gets what is left", 10, 10, 1, "gpu",
     ("cost cap: pool gpu capped at 1 units ($0.40/h) by the environment cap ($0.78/h of $1.00/h), "
      "demand needs 2 units; waiting: train (priority 10)")),
]
# fmt: on


@pytest.mark.parametrize(
    "case, gpu_priority, cpu_desired, gpu_desired, starved_pool, reason", ENV_CAP, ids=[c[0] for c in ENV_CAP]
)
def test_the_environment_cap_goes_to_pools_by_queue_priority(
    case, gpu_priority, cpu_desired, gpu_desired, starved_pool, reason
):
    env = environment(
        **{
            "scaler.cost_cap_usd_per_hour": 1.0,
            "pools.gpu": GPU_POOL,
            "queues.train": {"pool": "gpu", "priority": gpu_priority},
        }
    )
    view = fleet(env, render=(20, 0), train=(2, 0))
    decisions = {d.pool: d for d in decide(env, view, NOW)}
    assert (decisions["cpu"].desired, decisions["gpu"].desired) == (cpu_desired, gpu_desired)
    assert reason in decisions[starved_pool].reasons
    assert_settled(env, view)


def test_a_min_costlier_than_the_cap_is_kept_and_reported():
    """A config whose min costs more than its cap at the cheapest prices is refused (tests/test_config.py);
    at run time min may still cost more (its nodes bought on demand when spot is short): kept all the same."""
    env = environment(**{"pools.cpu.min": 2})
    env = env.model_copy(update={"pools": {**env.pools, "cpu": env.pools["cpu"].model_copy(update={"cost_cap_usd_per_hour": 0.05})}})
    decision = decide_pool(env, fleet(env))
    assert decision.desired == 2
    assert (
        "pool min 2 units costs more than the pool cost cap $0.05/h: kept anyway, lower min or raise the cap"
        in decision.reasons
    )


# --- the defaults: break-even idle, the wait target, consolidation ------------------------------

# cpu pool: boot_estimate_s 60 (the default), nodes of 2 slots; render's target 120 s >= the boot.
BREAK_EVEN = {"scaler.scale_in_delay_s": None, "scaler.scale_out_cooldown_s": 0}


def with_intake(view: FleetView, render: float, mean: float | None = None) -> FleetView:
    return replace(view, queues=tuple(
        replace(q, intake_per_s=render, mean_item_s=mean, target_wait_s=120) if q.name == "render"
        else replace(q, target_wait_s=120) for q in view.queues
    ))  # fmt: skip


# fmt: off
IDLE_BY_BREAK_EVEN = [
    # (case, render intake items/s, mean item s, nodes, terminated, reason expected)
    ("no intake: the idle node goes at once", 0.0, None, [node("i-a", idle=5)], ("i-a",),
     "terminate i-a: idle 5s, next item expected never (turnover keeps up) >= a relaunch's 60s (intake 0.000 slots/s) (spot, longest idle first)"),
    ("an item every 100 s comes later than a relaunch: it goes", 0.01, None, [node("i-a", idle=5)], ("i-a",),
     "terminate i-a: idle 5s, next item expected in ~100s >= a relaunch's 60s (intake 0.010 slots/s) (spot, longest idle first)"),
    ("an item every 20 s comes sooner than a relaunch: it stays", 0.05, None, [node("i-a", idle=5)], (),
     "keep 1 node(s): 1 idle, next item sooner than a relaunch"),
    ("busy slots that turn over as fast as items come leave no work for a spare", 0.05, 20.0,
     [node("i-b", busy=2), node("i-a", idle=5)], ("i-a",),
     "terminate i-a: idle 5s, next item expected never (turnover keeps up) >= a relaunch's 60s (intake 0.050 slots/s) (spot, longest idle first)"),
    ("of two spares the second is needed later than a relaunch", 0.05, None,
     [node("i-a", idle=5), node("i-b", idle=50)], ("i-b",),
     "terminate i-b: idle 50s, next item expected in ~60s >= a relaunch's 60s (intake 0.050 slots/s) (spot, longest idle first)"),
]
# fmt: on


@pytest.mark.parametrize(("case", "rate", "mean", "nodes", "terminated", "reason"), IDLE_BY_BREAK_EVEN,
                         ids=[c[0] for c in IDLE_BY_BREAK_EVEN])  # fmt: skip
def test_by_default_an_idle_node_stays_only_while_its_next_item_comes_sooner_than_a_relaunch(
    case, rate, mean, nodes, terminated, reason
):
    env = environment(**BREAK_EVEN)
    decision = decide_pool(env, with_intake(fleet(env, nodes), rate, mean))
    assert decision.terminate == terminated, decision.reasons
    assert reason in decision.reasons


# fmt: off
LEAVE_BETWEEN_TICKS = [
    # (case, env changes, render intake items/s, mean item s, nodes, depth, units that may leave)
    ("busy nodes whose next item would come later than a relaunch may leave when idle", {}, 0.0, 30.0,
     [node("i-a", busy=2), node("i-b", busy=1, weight=2)], {"render": (0, 3)}, 3),
    ("never below min", {"pools.cpu.min": 2}, 0.0, 30.0, [node("i-a", busy=2), node("i-b", busy=1, weight=2)],
     {"render": (0, 3)}, 1),
    ("an item every 10 s comes sooner than a relaunch, even behind the busy node gone idle: none", {}, 0.1, None,
     [node("i-a", busy=2)], {"render": (0, 2)}, 0),
    ("waiting items that launch a node: none", {}, 0.0, 30.0, [node("i-a", busy=2)], {"render": (9, 2)}, 0),
    ("within the cooldown after a scale-out: none", {"scaler.scale_out_cooldown_s": 120}, 0.0, 30.0,
     [node("i-a", busy=2, age=45)], {"render": (0, 2)}, 0),
    ("a fixed idle delay is the scaler's alone: none", {"scaler.scale_in_delay_s": 300}, 0.0, 30.0,
     [node("i-a", busy=2)], {"render": (0, 2)}, 0),
]
# fmt: on


@pytest.mark.parametrize(("case", "changes", "rate", "mean", "nodes", "depth", "units"), LEAVE_BETWEEN_TICKS,
                         ids=[c[0] for c in LEAVE_BETWEEN_TICKS])  # fmt: skip
def test_nodes_that_go_idle_between_ticks_may_leave_on_their_own_by_the_same_break_even(
    case, changes, rate, mean, nodes, depth, units
):
    env = environment(**(BREAK_EVEN | changes))
    decision = decide_pool(env, with_intake(fleet(env, nodes, **depth), rate, mean))
    assert decision.leave == units, decision.reasons
    said = [r for r in decision.reasons if r.startswith("idle nodes may leave on their own")]
    line = (f"idle nodes may leave on their own until the next tick, up to {units} unit(s): "
            "next item expected never (turnover keeps up) >= a relaunch's 60s (intake 0.000 slots/s)")
    assert said == ([line] if units else []), decision.reasons


# fmt: off
STAY_FIRST = [
    # (case, render intake items/s, units that may leave, units of the first going idle that stay, the line)
    ("an item every 33 s: the first busy node to go idle stays, the next would wait 100 s", 0.03, 2, 1,
     ("idle nodes may leave on their own until the next tick, up to 2 unit(s), once the first 1 unit(s) going "
      "idle stayed: next item expected in ~100s >= a relaunch's 60s (intake 0.030 slots/s)")),
    ("an item every 17 s: both stay first", 0.06, 2, 2,
     ("idle nodes may leave on their own until the next tick, up to 2 unit(s), once the first 2 unit(s) going "
      "idle stayed: next item expected in ~83s >= a relaunch's 60s (intake 0.060 slots/s)")),
    ("an item every 10 s: every node going idle is needed, no grant", 0.1, 0, 0, None),
]
# fmt: on


@pytest.mark.parametrize(("case", "rate", "units", "stay", "line"), STAY_FIRST, ids=[c[0] for c in STAY_FIRST])
def test_busy_nodes_going_idle_between_ticks_stay_first_while_the_next_item_comes_sooner_than_a_relaunch(
    case, rate, units, stay, line
):
    """Two full 2-slot nodes, nothing waiting, no mean known (no turnover): one more idle node
    would get an item in 1 / rate; each busy node that goes idle and stays adds 2 free slots ahead."""
    env = environment(**BREAK_EVEN)
    decision = decide_pool(env, with_intake(fleet(env, [node("i-a", busy=2), node("i-b", busy=2)]), rate))
    assert (decision.leave, decision.stay_first) == (units, stay), decision.reasons
    said = [r for r in decision.reasons if r.startswith("idle nodes may leave on their own")]
    assert said == ([line] if line else []), decision.reasons


def test_the_next_item_of_a_multi_slot_queue_comes_once_per_item_not_once_per_slot_of_intake():
    """An 8-GPU item every 300 s on an idle 8-GPU node: its next item comes in ~300 s, past a
    relaunch. Counted in slots, the break-even expected it in 300 / 8 = 37.5 s and kept the node."""
    from tidefleet.policy.scaling import BreakEven

    whole = QueueView("train-8", "gpu", 0, 8, 0, 0, intake_per_s=1 / 300, mean_item_s=600.0)
    one = QueueView("eval-1", "gpu", 0, 1, 0, 0, intake_per_s=7 / 300, mean_item_s=600.0)
    be = BreakEven.of([whole], [], relaunch_s=45.0)
    assert (be.intake, be.item_slots) == (pytest.approx(8 / 300), pytest.approx(8.0))
    assert be.next_item_s(0, 0) == pytest.approx(300.0)
    assert be.next_item_s(8, 0) == pytest.approx(600.0), "8 free slots ahead fill first"
    mixed = BreakEven.of([whole, one], [], relaunch_s=45.0)  # 8 items in 300 s, 15 slots: 1.875 a next item
    assert mixed.item_slots == pytest.approx(15 / 8) and mixed.next_item_s(0, 0) == pytest.approx(1.875 / (15 / 300))
    assert BreakEven.of([replace(one, intake_per_s=0.0)], [], relaunch_s=45.0).item_slots == 1.0  # no intake


def test_the_stay_first_shortcuts_give_what_judging_each_node_going_idle_gives():
    """`_leave_units` decides without the sort when it can; the reference judges one node after
    another (least busy first), whatever the intake, turnover, waiting items and relaunch."""
    from tidefleet.policy.scaling import BreakEven, _free_and_busy, _leave_units

    def one_by_one(be, staying, above_min):
        free, busy = _free_and_busy(staying)
        going = sorted((n for n in staying if n.state == "running" and not n.cordoned and n.busy_slots),
                       key=lambda n: (n.busy_slots, n.id))  # fmt: skip
        stay = 0
        for n in [None, *going]:
            if n is not None:
                free, busy, stay = free + n.busy_slots, busy - n.busy_slots, stay + n.weight
            if be.next_item_s(free, busy) >= be.relaunch_s:
                return above_min, stay
        return 0, 0

    rng, granted_with_stays = random.Random(1), 0
    for _ in range(8000):
        staying = []
        for j in range(rng.randint(0, 6)):
            slots = rng.choice([1, 2, 4, 8])
            staying.append(replace(node(f"i-{j}", busy=rng.randint(0, slots)), slots=slots, weight=rng.choice([1, 2]),
                                   cordoned=rng.random() < 0.1, state=rng.choice(["running"] * 5 + ["pending"])))  # fmt: skip
        be = BreakEven(intake=rng.choice([0.0, rng.random() * 0.3]), mean_item_s=rng.choice([None, rng.uniform(5, 200)]),
                       relaunch_s=rng.choice([45.0, 60.0, 90.0]), waiting=rng.randint(0, 6),
                       item_slots=rng.choice([1.0, 1.0, 1.5, 2.0, 8.0]))  # fmt: skip
        expected = one_by_one(be, staying, 3)
        assert _leave_units(be, staying, 3)[:2] == expected, (be, staying)
        granted_with_stays += expected[1] > 0
    assert granted_with_stays > 500  # the cases reach the ladder, not only its ends (~700 of 8000)


def test_waiting_items_that_turnover_starts_within_the_wait_target_launch_no_node():
    env = environment(**BREAK_EVEN)
    busy = [node("i-a", busy=2)]
    view = with_intake(fleet(env, busy, render=(4, 2)), 2 / 30.0, mean=30.0)  # its 2 slots take one each per 30 s
    young = replace(view, queues=tuple(replace(q, oldest_age_s=10.0, target_wait_s=120) for q in view.queues))
    due = replace(view, queues=tuple(replace(q, oldest_age_s=70.0, target_wait_s=120) for q in view.queues))
    # 110 s left: each of the 2 slots starts 1 + 110 // 30 = 4 items, covering the 4 waiting ones.
    assert decide_pool(env, young).desired == 1
    # 50 s left, less than the 60 s boot: as without a target (1 + 60 // 30 = 3 per slot, 6 >= 6).
    assert decide_pool(env, due).desired == decide_pool(env, view).desired == 1
    deeper = replace(due, queues=tuple(replace(q, visible=9) if q.name == "render" else q for q in due.queues))
    assert decide_pool(env, deeper).desired > 1


def test_items_left_to_turnover_are_launched_for_on_the_last_tick_that_still_makes_their_target():
    """Leaving an item to turnover counts on a later tick to launch for it if turnover does not
    come. Once the next tick (`next_tick_s` away) would launch too late for the target, this tick
    is the last that can: the horizon is a boot. Without it, an unseen shape's items left at 71 s
    of a 120-s target were launched for at 81 s, ready at 126 s (its p95)."""
    env = environment(**BREAK_EVEN)  # boot 60 s, 2 slots a node
    view = with_intake(fleet(env, [node("i-a", busy=2)], render=(6, 2)), 2 / 30.0, mean=30.0)

    def aged(next_tick_s: float) -> FleetView:
        return replace(view, queues=tuple(replace(q, oldest_age_s=20.0, next_tick_s=next_tick_s) for q in view.queues))

    # 100 s left: each of the 2 slots starts 1 + 100 // 30 = 4 items, the 2 in flight and the 6 waiting.
    assert decide_pool(env, aged(0.0)).desired == 1
    assert decide_pool(env, aged(40.0)).desired == 1  # 60 s left at the next tick: a node launched then is in time
    # 40 s left at the next tick, under a boot: launch now for what a boot's turnover (3 a slot) leaves.
    assert decide_pool(env, aged(41.0)).desired == 2


def test_nodes_launched_for_waiting_items_count_their_turnover_within_the_wait_target():
    env = environment(**BREAK_EVEN)  # boot 60 s, 2 slots a node
    fresh = with_intake(fleet(env, [], render=(12, 0)), 0.0, mean=30.0)
    fresh = replace(fresh, queues=tuple(replace(q, oldest_age_s=0.0) for q in fresh.queues))
    # 120 s to wait: a new slot is ready at 60 s and starts 1 + 60 // 30 = 3 items: 4 slots, 2 nodes.
    assert decide_pool(env, fresh).desired == 2
    due = replace(fresh, queues=tuple(replace(q, oldest_age_s=60.0) for q in fresh.queues))
    assert decide_pool(env, due).desired == 6  # a boot left: a slot per item, as without a target


def test_before_any_item_finished_a_first_batch_with_a_long_wait_target_starts_on_a_few_nodes():
    """No item of the queue finished yet (no mean). With a wait target, its items are taken to run
    two boots until one finishes: a first batch of 12 with an hour to wait starts on 1 node (each
    slot ready at 60 s, then 1 item per 120 s: 1 + 3540 // 120 = 30 items), not 6 kept alive by
    their longest item. The guess promises no turnover within two boots: once the oldest has
    less than that left, a slot per item, as without a target, and a node launched then still
    starts them within it."""
    env = environment(**BREAK_EVEN)  # boot 60 s, 2 slots a node
    view = fleet(env, [], render=(12, 0))

    def aged(age: float, target: int | None = 3600, mean: float | None = None) -> FleetView:
        return replace(view, queues=tuple(replace(q, oldest_age_s=age, target_wait_s=target, mean_item_s=mean)
                                          if q.name == "render" else q for q in view.queues))  # fmt: skip

    first = decide_pool(env, aged(0.0))
    assert first.desired == 1, first.reasons
    assert any("queued items of ~120s (two boots, a guess: no item of render finished yet)" in r
               for r in first.reasons), first.reasons
    assert decide_pool(env, aged(3600.0 - 119)).desired == 6
    assert decide_pool(env, aged(0.0, target=None)).desired == 6
    known = aged(0.0, mean=3600.0)  # an item finished: its mean, not the guess
    assert decide_pool(env, known).desired == 6, decide_pool(env, known).reasons
    gang = replace(aged(0.0), queues=tuple(replace(q, gang=True) for q in aged(0.0).queues))
    assert decide_pool(env, gang).desired == 6, "a gang's members wait for whole nodes: no guessed turnover"


def test_younger_waiting_items_may_wait_longer_than_the_oldest():
    env = environment(**BREAK_EVEN)  # boot 60 s, 2 slots a node
    view = with_intake(fleet(env, [], render=(12, 0)), 0.0, mean=30.0)
    all_old = replace(view, queues=tuple(replace(q, oldest_age_s=60.0) for q in view.queues))
    assert decide_pool(env, all_old).desired == 6  # every item has only a boot left: a slot each
    # 2 items 60 s old, 10 just in: 2 slots must start by 60 s, and 12 items by 120 s (3 a slot).
    cohorts = replace(all_old, queues=tuple(replace(q, waiting_ages=((60.0, 2), (0.0, 10))) if q.name == "render"
                                            else q for q in all_old.queues))  # fmt: skip
    assert decide_pool(env, cohorts).desired == 2, decide_pool(env, cohorts).reasons


def test_a_booting_node_nearly_ready_starts_more_of_the_waiting_items_than_one_just_launched():
    env = environment(**BREAK_EVEN)
    view = with_intake(fleet(env, [], render=(8, 0)), 0.0, mean=30.0)
    view = replace(view, queues=tuple(replace(q, oldest_age_s=0.0) for q in view.queues))
    # Ready in 10 s: each of its 2 slots starts 1 + 110 // 30 = 4 items, all 8: no launch.
    nearly = replace(view, pools=tuple(replace(p, nodes=(node("i-a", booted=False, age=50),), desired=1)
                                       for p in view.pools))  # fmt: skip
    assert decide_pool(env, nearly).desired == 1, decide_pool(env, nearly).reasons
    # Just launched: 1 + 60 // 30 = 3 each, 6 of 8; the other 2 take one more new slot.
    just = replace(view, pools=tuple(replace(p, nodes=(node("i-a", booted=False, age=0),), desired=1)
                                     for p in view.pools))  # fmt: skip
    assert decide_pool(env, just).desired == 2, decide_pool(env, just).reasons


def test_a_half_empty_node_is_cordoned_when_demand_fits_on_the_others_and_uncordoned_when_it_returns():
    env = environment(**BREAK_EVEN, **{"pools.cpu.slots_per_unit": 4})
    nodes = [node("i-a", busy=1, weight=2), node("i-b", busy=6, weight=2)]  # 8 slots each
    nodes = [replace(n, slots=8) for n in nodes]
    decision = decide_pool(env, fleet(env, nodes, render=(0, 7)))
    assert decision.cordon == ("i-a",) and decision.terminate == (), decision.reasons
    assert "cordon i-a: 1 of 8 slots busy; demand 7 slots fits the other 8 serving slots (its items finish, then it is idle)" in decision.reasons
    cordoned = [replace(nodes[0], cordoned=True), nodes[1]]
    assert decide_pool(env, fleet(env, cordoned, render=(0, 7))).cordon == ()
    back = decide_pool(env, fleet(env, cordoned, render=(5, 7)))
    assert back.uncordon == ("i-a",) and back.desired == 4, back.reasons
    drained = [replace(nodes[0], cordoned=True, busy_slots=0, idle_since=NOW - 5), nodes[1]]
    gone = decide_pool(env, fleet(env, drained, render=(0, 6)))
    assert gone.terminate == ("i-a",), gone.reasons


def test_items_that_would_miss_their_wait_target_get_a_node_when_turnover_does_not_reach_them():
    """The mean comes from items that finished; the busy slots may run far longer ones (a heavy
    tail): an item that waited a boot and would now miss its target, while its queue's agents
    took fewer items over the last rate window (5 minutes) than are late, is given a node,
    whatever turnover promises."""
    env = environment(**BREAK_EVEN)  # boot 60 s, 2 slots a node
    view = with_intake(fleet(env, [node("i-a", busy=2)], render=(1, 2)), 0.0, mean=30.0)

    def aged(v, age):
        return replace(v, queues=tuple(replace(q, oldest_age_s=age, target_wait_s=120) for q in v.queues))

    assert decide_pool(env, aged(view, 50.0)).desired == 1, "it can still make its target: turnover counted"
    late = decide_pool(env, aged(view, 70.0))
    assert late.desired == 2, late.reasons
    assert any("1 item(s) waited a boot and would miss target_wait_s" in r for r in late.reasons), late.reasons
    taking = with_intake(aged(view, 70.0), 0.01, mean=30.0)  # 0.01/s x 300 s = 3 items >= 1 late
    assert decide_pool(env, taking).desired == 1, "its agents take items: turnover reaches it"
    booting = replace(aged(view, 70.0), pools=tuple(
        replace(p, nodes=(*p.nodes, node("i-b", booted=False, age=30)), desired=2) for p in view.pools))
    assert decide_pool(env, booting).desired == 2, "a booting node's slots are its slots: no more launched"
    no_target = replace(view, queues=tuple(replace(q, oldest_age_s=70.0, target_wait_s=None) for q in view.queues))
    assert decide_pool(env, no_target).desired == 2, "without a target: after a boot"


def test_busy_slots_of_a_queue_whose_agents_turn_every_slot_over_pool_their_turnover():
    """Twelve busy slots of 100-s items start none within a 60-s boot counted slot by slot. Once the
    agents took at least as many items over the last rate window as are in flight, the slots finish
    at spread-out times: together they start 12 x 60 / 100 = 7 more, at the mean the intake shows
    if longer (12 in flight / 0.05 per s = 240 s: 3 more)."""
    env = environment(**BREAK_EVEN, **{"pools.cpu.max": 20})  # boot 60 s, 2 slots a node
    busy = [node(f"i-{i}", busy=2) for i in range(6)]

    def desired(visible: int, intake: float) -> int:
        return decide_pool(env, with_intake(fleet(env, busy, render=(visible, 12)), intake, mean=100.0)).desired

    assert desired(3, 0.03) == 8, "9 taken in 5 min < 12 in flight: counted per slot, a slot per waiting item"
    assert desired(7, 0.12) == 6, "36 taken: 19 starts cover 12 in flight and 7 waiting"
    assert desired(8, 0.12) == 7
    assert desired(3, 0.05) == 6, "15 taken: a 240-s mean, 15 starts"
    assert desired(4, 0.05) == 7


def test_within_a_wait_target_longer_than_a_boot_busy_slots_pool_their_turnover_whatever_the_intake():
    """Twelve busy slots of 200-s items whose agents took 9 items in 5 minutes (fewer than the 12 in
    flight: not every slot turned over). Per slot, none starts another within 120 s. Items with
    120 s to wait may wait for the slots to finish at spread-out times, at the mean the intake shows
    (12 / 0.03 per s = 400 s): 12 + 12 x 120 / 400 = 15 starts, 3 waiting items covered. With only
    a boot left they are counted per slot again (none covered): a node launched then still starts
    them within the target."""
    env = environment(**BREAK_EVEN, **{"pools.cpu.max": 20})  # boot 60 s, 2 slots a node
    busy = [node(f"i-{i}", busy=2) for i in range(6)]

    def desired(visible: int, age: float, intake: float = 0.03) -> int:
        view = with_intake(fleet(env, busy, render=(visible, 12)), intake, mean=200.0)
        view = replace(view, queues=tuple(replace(q, oldest_age_s=age) if q.name == "render" else q for q in view.queues))
        return decide_pool(env, view).desired

    assert desired(3, 0.0) == 6, "15 starts within 120 s cover the 3 waiting"
    assert desired(4, 0.0) == 7
    assert desired(3, 60.0) == 8, "a boot left: per slot, a slot per waiting item"
    assert desired(3, 0.0, intake=0.0) == 8, "agents that take nothing: no turnover to pool"


def test_while_a_multi_slot_item_waits_for_turnover_the_least_loaded_node_drains_and_then_takes_it():
    """An 8-slot item waits (within its target) for the slots of the render item in flight; the
    free slots add up to more than it needs, spread over nodes. The least-loaded node is cordoned
    (not uncordoned the next tick: it is busy), drains, and is then uncordoned for the item, which
    fits it whole: no node launched at any step."""
    env = environment(**PACKED)

    def view(last_busy: int, cordoned: bool) -> FleetView:
        nodes = [node("i-r", weight=4, busy=8, type="c6i.xlarge")]
        nodes += [node(f"i-{i}", weight=4, busy=b, type="c6i.xlarge") for i, b in enumerate([5, 5, 2])]
        nodes.append(replace(node("i-3", weight=4, busy=last_busy, idle=None if last_busy else 30, type="c6i.xlarge"),
                             cordoned=cordoned))
        v = fleet(env, nodes, render=(1, 1), batch=(0, 12 + last_busy))
        return replace(v, queues=tuple(
            replace(q, mean_item_s=600.0, oldest_age_s=0.0, target_wait_s=3600) for q in v.queues))

    first = decide_pool(env, view(1, cordoned=False))
    assert (first.desired, first.cordon) == (20, ("i-3",)), first.reasons
    busy = decide_pool(env, view(1, cordoned=True))
    assert (busy.desired, busy.uncordon) == (20, ()), busy.reasons
    drained = decide_pool(env, view(0, cordoned=True))
    assert (drained.desired, drained.terminate, drained.uncordon) == (20, (), ("i-3",)), drained.reasons
    assert "uncordon i-3: a waiting multi-slot item fits no other node" in drained.reasons


def test_the_readmes_sample_reasons_are_what_the_policy_says():
    """README "How it works": each line comes from one of these fleets, word for word."""
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    sample = re.search(r"Every decision carries a reason:\n\n```\n(.*?)```", readme, re.DOTALL)[1].splitlines()
    env, by_break_even = environment(), environment(**BREAK_EVEN)
    consolidating = environment(**BREAK_EVEN, **{"pools.cpu.slots_per_unit": 4})
    eights = [replace(n, slots=8) for n in (node("i-0e3f", busy=2, weight=2), node("i-b", busy=6, weight=2),
                                            node("i-c", busy=8, weight=2))]  # fmt: skip
    said = [
        *decide_pool(env, fleet(env, [node("i-0a1b", busy=2, silent=900)], desired=1, render=(4, 2))).reasons,
        *decide_pool(by_break_even, with_intake(fleet(by_break_even, [node("i-0c2d", idle=62)]), 0.0024)).reasons,
        *decide_pool(consolidating, fleet(consolidating, eights, render=(0, 14))).reasons,
        *decide_pool(env, fleet(env, [node("i-a", idle=900), node("i-b", busy=1, age=100)])).reasons,
    ]
    assert len(sample) == 5 and [line for line in sample if line not in said] == [], said
