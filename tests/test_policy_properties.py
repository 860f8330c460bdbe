"""Properties of the scaling policy over generated environments, fleets and queues."""

from __future__ import annotations

import math
from dataclasses import replace

from fleet_apply import apply
from hypothesis import given, settings
from hypothesis import strategies as st

from tidefleet.config import Environment, parse_environment
from tidefleet.policy import decide
from tidefleet.policy.model import FleetView, NodeView, PoolDecision, PoolView, QueueView, rate_decay
from tidefleet.policy.quiet import actions, unchanged_until
from tidefleet.prices import default_price

NOW = 50_000.0
TYPES = ("c6i.large", "m6i.large", "c6i.xlarge")  # $0.085/0.034, $0.096/0.038, $0.17/0.068
EXAMPLES = settings(deadline=None)  # examples: the profile's (100 by default; see conftest.py)


def _min_cost(units: int, weights: list[int]) -> float:
    """What `units` cost at the cheapest unit price of TYPES under these weights (config._min_cost)."""
    return round(units * min(default_price(t, spot) / w for t, w in zip(TYPES, weights) for spot in (True, False)), 4)


@st.composite
def environments(draw, *, max_pools: int = 2, env_cap: bool = True, pool_caps: bool = True,
                 max_units: tuple[int, int] = (0, 12)) -> Environment:  # fmt: skip
    pools, queues, floors = {}, {}, 0.0
    for p in range(draw(st.integers(1, max_pools))):
        weights = draw(st.lists(st.integers(1, 3), min_size=1, max_size=len(TYPES)))
        spu = draw(st.integers(1, 3))
        high = draw(st.integers(*max_units))
        low = draw(st.integers(0, min(high, 3)))
        name = f"p{p}"
        boot_timeout_s = draw(st.sampled_from([60, 600]))
        pools[name] = {
            "command": "work",
            "min": low,
            "max": high,
            "slots_per_unit": spu,
            "on_demand_base": draw(st.integers(0, min(high, 2))),
            "on_demand_percent": draw(st.sampled_from([0, 0, 10, 50, 100])),
            "boot_timeout_s": boot_timeout_s,
            # Validation refuses an estimate above the timeout.
            "boot_estimate_s": draw(st.sampled_from([e for e in (0, 60, 300) if e <= boot_timeout_s])),
            "idle_timeout_s": draw(st.sampled_from([None, 0, 300])),
            # Validation refuses a cap below what min costs at the cheapest prices.
            "cost_cap_usd_per_hour": draw(st.none() | st.floats(max(0.05, _min_cost(low, weights)), 3.0)) if pool_caps else None,
            "instance_types": [{"type": t, "weight": w} for t, w in zip(TYPES, weights)],
        }
        floors += _min_cost(low, weights)
        for q in range(draw(st.integers(0, 3)) if high else 0):  # validation refuses a queue no node can run
            queues[f"{name}-q{q}"] = {
                "pool": name,
                "priority": draw(st.integers(0, 3)),
                "slots_per_item": draw(st.integers(1, min(weights) * spu)),
                "target_wait_s": draw(st.sampled_from([0, 60, 120, 600])),
                "on_demand_after_interruptions": draw(st.none() | st.integers(1, 3)),
            }
    if not queues:  # the config requires at least one queue, on a pool that may launch a node
        pools["p0"]["max"] = max(1, pools["p0"]["max"])
        queues["p0-q0"] = {"pool": "p0"}
    scaler = {
        "scale_in_delay_s": draw(st.sampled_from([None, None, 0, 120, 300])),
        "scale_out_cooldown_s": draw(st.sampled_from([0, 120])),
        "spot_fallback_after_s": draw(st.sampled_from([60, 240])),
        "spot_failure_window_s": 600,
        "cost_cap_usd_per_hour": draw(st.none() | st.floats(max(0.1, round(floors, 4)), 5.0)) if env_cap else None,
    }
    return parse_environment(
        {"region": "us-east-1", "scaler": scaler, "pools": pools, "queues": queues}, name="prop"
    )


@st.composite
def nodes(draw, env: Environment, pool: str, index: int) -> NodeView:
    spec = env.pools[pool]
    itype = draw(st.sampled_from(spec.instance_types))
    launched_at = NOW - draw(st.floats(0, 5000))
    booted = draw(st.booleans())
    slots = spec.slots(itype)
    busy = draw(st.just(0) | st.integers(0, slots)) if booted else 0
    # Not tied to busy on purpose: a stale idle_since on a busy node must not make it a victim.
    idle_since = draw(st.none() | st.floats(launched_at, NOW)) if booted else None
    return NodeView(
        id=f"{pool}-i{index}",
        instance_type=itype.type,
        weight=itype.weight,
        slots=slots,
        spot=draw(st.booleans()),
        state=draw(st.sampled_from(["running", "running", "draining", "terminating"]))
        if booted
        else "pending",
        launched_at=launched_at,
        busy_slots=busy,
        # Mostly fresh (a live agent beats every few seconds), sometimes silent past the boot timeout.
        last_heartbeat=draw(st.floats(max(launched_at, NOW - 30), NOW) | st.floats(launched_at, NOW))
        if booted
        else None,
        idle_since=idle_since,
        protected=busy > 0 and draw(st.booleans()),
        cordoned=booted and draw(st.booleans()),
    )


@st.composite
def fleets(draw, env: Environment) -> FleetView:
    pools = []
    for name, spec in env.pools.items():
        members = draw(st.lists(nodes(env, name, 0), max_size=8))
        members = [replace(n, id=f"{name}-i{i}") for i, n in enumerate(members)]
        failures = draw(st.lists(st.floats(NOW - 1200, NOW), max_size=2))
        pools.append(
            PoolView(
                name,
                tuple(members),
                desired=draw(st.integers(spec.min, spec.max)),
                on_demand_base=draw(st.integers(0, spec.max)),
                spot_failures=tuple(failures),
            )
        )
    # Often empty or shallow, so surplus and scale-in are exercised as much as growth.
    depth = (
        st.just((0, 0))
        | st.tuples(st.integers(0, 4), st.integers(0, 4))
        | st.tuples(st.integers(0, 30), st.integers(0, 10))
    )
    # Observed mean item time: unknown, shorter than the boot estimate (turnover), or longer.
    mean = st.none() | st.floats(1, 400)
    queues = []
    for name, q in env.queues.items():
        visible, in_flight = draw(depth)
        # Items spot agents left to on-demand nodes: some of the queue's, visible or hidden.
        deferred = draw(st.just(0) | st.integers(0, visible + in_flight)) if q.on_demand_after_interruptions else 0
        oldest = draw(st.none() | st.floats(0, 900))
        # The tick's cohorts, when it knows them: younger ones after the oldest, holding about the
        # waiting items (more or fewer: the policy reads the difference as young or gone).
        younger = draw(st.lists(st.tuples(st.floats(0, 1), st.integers(1, 12)), max_size=4)) if oldest else []
        ages = tuple((oldest * f, n) for f, n in [(1.0, draw(st.integers(1, 12))), *sorted(younger, reverse=True)]
                     ) if oldest else ()  # fmt: skip
        queues.append(QueueView(name, q.pool, q.priority, q.slots_per_item, visible, in_flight, mean_item_s=draw(mean),
                                oldest_age_s=oldest, target_wait_s=q.target_wait_s,
                                intake_per_s=draw(st.just(0.0) | st.floats(0, 2)), on_demand_wanted=deferred,
                                forming_short=draw(st.just(0) | st.integers(0, in_flight)),
                                waiting_ages=ages if oldest and visible and draw(st.booleans()) else ()))  # fmt: skip
    return FleetView(tuple(pools), tuple(queues))


@st.composite
def cases(draw, **env_options):
    env = draw(environments(**env_options))
    return env, draw(fleets(env))


@st.composite
def quiet_cases(draw):
    """A settled pool: old nodes, mostly idle for long, shallow queues: where scale-in happens."""
    env = draw(environments(max_pools=1))
    fleet = draw(fleets(env))
    (pool,) = fleet.pools
    settled = []
    for n in pool.nodes:
        age = draw(st.floats(600, 5000))
        idle = draw(st.booleans())
        # A busy node sometimes still carries an old idle_since, unprotected: only its busy
        # slots keep it from being a scale-in victim.
        stale = not idle and draw(st.booleans())
        settled.append(
            replace(
                n,
                state="running",
                launched_at=NOW - age,
                last_heartbeat=NOW - 1,
                busy_slots=0 if idle else n.slots,
                idle_since=NOW - draw(st.floats(0, age)) if idle or stale else None,
                protected=False,
            )
        )
    pool = replace(pool, nodes=tuple(settled), desired=sum(n.weight for n in settled))
    shallow = tuple(
        replace(q, visible=draw(st.integers(0, 3)), in_flight=draw(st.integers(0, 3))) for q in fleet.queues
    )
    return env, FleetView((pool,), shallow)


@st.composite
def steady_cases(draw):
    """A busy pool with nothing waiting: every node running at least one item, its agent beating,
    items in flight, intake rates of any size, launches and spot failures recent or not."""
    env, fleet = draw(cases(max_pools=1))
    if draw(st.booleans()):  # rule 4's break-even, where the intake rate and the cooldown count
        env = env.model_copy(update={
            "scaler": env.scaler.model_copy(update={"scale_in_delay_s": None, "scale_out_cooldown_s": 120}),
            "pools": {k: p.model_copy(update={"idle_timeout_s": None}) for k, p in env.pools.items()},
        })  # fmt: skip
    (pool,) = fleet.pools
    busy = [replace(n, state="running", last_heartbeat=NOW - draw(st.floats(0, 30)),
                    busy_slots=draw(st.integers(1, n.slots)),
                    launched_at=NOW - draw(st.floats(0, 150) | st.floats(0, 5000)))  # in a cooldown or not
            for n in pool.nodes]  # fmt: skip
    waiting_none = tuple(replace(q, visible=0, oldest_age_s=None, waiting_ages=(), on_demand_wanted=0,
                                 intake_per_s=draw(st.just(0.0) | st.floats(0, 0.01) | st.floats(0, 2)))
                         for q in fleet.queues)  # fmt: skip
    failures = draw(st.just(()) | st.lists(st.floats(NOW - 600, NOW), max_size=3).map(tuple))  # some about to leave
    return env, FleetView((replace(pool, nodes=tuple(busy), spot_failures=failures),), waiting_none)


def by_pool(decisions: tuple[PoolDecision, ...]) -> dict[str, PoolDecision]:
    return {d.pool: d for d in decisions}


# --- properties ------------------------------------------------------------------------------------


@EXAMPLES
@given(cases() | quiet_cases())
def test_desired_stays_within_min_and_max(case):
    env, fleet = case
    for d in decide(env, fleet, NOW):
        assert env.pools[d.pool].min <= d.desired <= env.pools[d.pool].max, d.reasons


@EXAMPLES
@given(cases() | quiet_cases())
def test_never_terminates_a_busy_protected_booting_or_working_draining_node_whose_heartbeat_is_fresh(case):
    env, fleet = case
    for pool, d in zip(fleet.pools, decide(env, fleet, NOW), strict=True):
        nodes = {n.id: n for n in pool.nodes}
        timeout = env.pools[pool.name].boot_timeout_s
        for node_id in d.terminate:
            n = nodes[node_id]
            assert n.state != "terminating"
            if silent(n, timeout):
                continue  # its agent is dead or hung: replaced whatever its last heartbeat said
            assert n.busy_slots == 0 and not n.protected, d.reasons
            if n.last_heartbeat is None:  # booting: only the boot-timeout rule may remove it
                assert NOW - n.launched_at > timeout, d.reasons
            else:
                assert n.idle_since is not None, d.reasons


@EXAMPLES
@given(cases() | quiet_cases())
def test_a_node_silent_past_the_boot_timeout_is_always_replaced(case):
    env, fleet = case
    for pool, d in zip(fleet.pools, decide(env, fleet, NOW), strict=True):
        timeout = env.pools[pool.name].boot_timeout_s
        for n in pool.nodes:
            if n.state != "terminating" and silent(n, timeout):
                assert n.id in d.terminate, d.reasons
                assert f"replace {n.id}: last heartbeat" in "\n".join(d.reasons)


@EXAMPLES
@given(cases() | quiet_cases())
def test_every_decision_explains_itself(case):
    env, fleet = case
    for d in decide(env, fleet, NOW):
        assert d.reasons and all(r and "\n" not in r for r in d.reasons)
        for node_id in d.terminate:
            assert any(node_id in r and r.split()[0] in ("terminate", "replace") for r in d.reasons)


@EXAMPLES
@given(cases(max_pools=1) | quiet_cases(), st.data())
def test_more_waiting_items_never_lower_desired(case, data):
    env, fleet = case
    grown_queue = data.draw(st.sampled_from(fleet.queues))
    extra = data.draw(st.integers(1, 20))
    more = replace(
        fleet,
        queues=tuple(replace(q, visible=q.visible + extra) if q is grown_queue else q for q in fleet.queues),
    )
    before = by_pool(decide(env, fleet, NOW))[grown_queue.pool]
    after = by_pool(decide(env, more, NOW))[grown_queue.pool]
    assert after.desired >= before.desired, (before.reasons, after.reasons)


@EXAMPLES
@given(cases() | quiet_cases())
def test_applying_a_decision_twice_equals_applying_it_once(case):
    env, fleet = case
    decisions = decide(env, fleet, NOW)
    once = apply(env, fleet, decisions)
    assert apply(env, once, decisions) == once


@EXAMPLES
@given(cases() | quiet_cases())
def test_deciding_again_after_applying_changes_nothing(case):
    env, fleet = case
    once = apply(env, fleet, decide(env, fleet, NOW))
    for pool, again in zip(once.pools, decide(env, once, NOW), strict=True):
        assert (again.desired, again.terminate, again.on_demand_base, again.cordon, again.uncordon) == (
            pool.desired, (), None, (), ()
        ), again.reasons


@EXAMPLES
@given(cases() | quiet_cases())
def test_idle_scale_in_keeps_min_demand_and_cooldown_and_never_scales_out_too(case):
    env, fleet = case
    demand = {p.name: 0 for p in fleet.pools}
    for q in fleet.queues:
        demand[q.pool] += (q.visible + q.in_flight) * q.slots_per_item
    for pool, d in zip(fleet.pools, decide(env, fleet, NOW), strict=True):
        timeout = env.pools[pool.name].boot_timeout_s
        idle_removed = [
            n
            for n in pool.nodes
            if n.id in d.terminate
            and n.state == "running"
            and n.last_heartbeat is not None
            and not silent(n, timeout)
        ]
        if not idle_removed:
            continue
        serving_left = sum(
            n.slots for n in pool.nodes if n.state in ("running", "pending") and n.id not in d.terminate
        )
        assert d.desired <= staying_units(pool, d), d.reasons  # nothing launched
        assert staying_units(pool, d) >= env.pools[pool.name].min, d.reasons
        assert serving_left >= demand[pool.name], d.reasons
        # The cooldown runs from the newest node that stays (not one this decision releases).
        staying = [n for n in pool.nodes if n.id not in d.terminate or n in idle_removed]
        assert NOW - max(n.launched_at for n in staying) >= env.scaler.scale_out_cooldown_s, d.reasons


@EXAMPLES
@given(cases() | quiet_cases())
def test_the_cost_caps_are_never_exceeded_by_launches(case):
    """Launches beyond what pool min forces never take a pool or the environment over its cap.

    The group is assumed to launch the worst it may: every unit at the dearest $/unit of its
    lifecycle, on demand for the base (as decided) plus the on-demand percentage rounded up.
    """
    env, fleet = case
    decisions = decide(env, fleet, NOW)
    costs, grew = {}, False
    for pool, d in zip(fleet.pools, decisions, strict=True):
        spec = env.pools[pool.name]
        launched = d.desired - staying_units(pool, d)
        pool_grew = launched > max(0, spec.min - staying_units(pool, d))
        costs[pool.name] = worst_case_cost(env, pool, d)
        if pool_grew and spec.cost_cap_usd_per_hour is not None:
            assert costs[pool.name] <= spec.cost_cap_usd_per_hour + 1e-9, d.reasons
        grew |= pool_grew
    if grew and env.scaler.cost_cap_usd_per_hour is not None:
        assert sum(costs.values()) <= env.scaler.cost_cap_usd_per_hour + 1e-9, [d.reasons for d in decisions]


@EXAMPLES
@given(cases(env_cap=False, pool_caps=False, max_units=(0, 40)))
def test_items_left_to_on_demand_nodes_are_never_counted_as_served_by_spot_capacity(case):
    """Their slots fit the free slots of on-demand nodes that take items and stay, plus the on-demand
    units the group launches as decided; or the pool is at its max. (Without cost caps: with them
    the only promise is the caps', tested above.)"""
    env, fleet = case
    # The base as configured, as it mostly is: a base raised before may already cover them.
    fleet = replace(fleet, pools=tuple(replace(p, on_demand_base=env.pools[p.name].on_demand_base) for p in fleet.pools))
    for pool, d in zip(fleet.pools, decide(env, fleet, NOW), strict=True):
        spec = env.pools[pool.name]
        wanted = sum(q.on_demand_wanted * q.slots_per_item for q in fleet.queues if q.pool == pool.name)
        if not wanted:
            continue
        free = sum(
            n.slots - (n.busy_slots if n.state == "running" else 0) for n in pool.nodes
            if not n.spot and n.state in ("running", "pending") and n.id not in d.terminate
            and (not n.cordoned or n.id in d.uncordon)
        )  # fmt: skip
        in_group = [n for n in pool.nodes if n.state != "terminating" and n.id not in d.terminate]
        units = sum(n.weight for n in in_group)
        launched = max(0, d.desired - units)
        base = pool.on_demand_base if d.on_demand_base is None else d.on_demand_base
        total = units + launched
        target = min(total, base) + math.ceil(max(0, total - base) * spec.on_demand_percent / 100)
        on_demand_new = min(launched, max(0, target - sum(n.weight for n in in_group if not n.spot)))
        if free + on_demand_new * spec.slots_per_unit < wanted:
            assert any(r.startswith("at max") for r in d.reasons), d.reasons


def silent(n: NodeView, boot_timeout_s: int) -> bool:
    """The agent reported once and has been quiet longer than the boot timeout."""
    return n.last_heartbeat is not None and NOW - n.last_heartbeat > boot_timeout_s


# --- an independent model of what the group costs after a decision ------------------------------


def staying_units(pool: PoolView, d: PoolDecision) -> int:
    return sum(n.weight for n in pool.nodes if n.state != "terminating" and n.id not in d.terminate)


def worst_case_cost(env: Environment, pool: PoolView, d: PoolDecision) -> float:
    spec = env.pools[pool.name]
    price = {(t.type, spot): t.price(spot) for t in spec.instance_types for spot in (False, True)}
    staying = [n for n in pool.nodes if n.id not in d.terminate]
    existing = sum(price[n.instance_type, n.spot] for n in staying)
    in_group = [n for n in staying if n.state != "terminating"]
    units = sum(n.weight for n in in_group)
    launched = max(0, d.desired - units)
    base = pool.on_demand_base if d.on_demand_base is None else d.on_demand_base
    total = units + launched
    on_demand_target = min(total, base) + math.ceil(max(0, total - base) * spec.on_demand_percent / 100)
    on_demand_new = min(launched, max(0, on_demand_target - sum(n.weight for n in in_group if not n.spot)))
    dearest = {
        spot: max(price[t.type, spot] / t.weight for t in spec.instance_types) for spot in (False, True)
    }
    return existing + on_demand_new * dearest[False] + (launched - on_demand_new) * dearest[True]


# --- consolidation and the wait target ---------------------------------------------------------


@EXAMPLES
@given(cases() | quiet_cases())
def test_never_cordons_so_much_that_demand_does_not_fit(case):
    env, fleet = case
    demand = {p.name: 0 for p in fleet.pools}
    for q in fleet.queues:
        demand[q.pool] += (q.visible + q.in_flight) * q.slots_per_item
    for pool, d in zip(fleet.pools, decide(env, fleet, NOW), strict=True):
        if not d.cordon:
            continue
        cordoned = {n.id for n in pool.nodes if n.cordoned and n.id not in d.uncordon} | set(d.cordon)
        serving = sum(
            n.slots for n in pool.nodes
            if n.state in ("running", "pending") and n.id not in cordoned and n.id not in d.terminate
        )  # fmt: skip
        assert serving >= demand[pool.name], d.reasons
        assert d.desired <= staying_units(pool, d), d.reasons  # never cordons while launching


@EXAMPLES
@given(cases() | quiet_cases())
def test_a_cordoned_busy_node_is_never_terminated_while_its_heartbeat_is_fresh(case):
    env, fleet = case
    for pool, d in zip(fleet.pools, decide(env, fleet, NOW), strict=True):
        timeout = env.pools[pool.name].boot_timeout_s
        for n in pool.nodes:
            if n.cordoned and n.busy_slots and not silent(n, timeout):
                assert n.id not in d.terminate, d.reasons
        assert not set(d.cordon) & set(d.terminate), d.reasons
        assert not set(d.cordon) & set(d.uncordon), d.reasons


@EXAMPLES
@given(cases(max_pools=1) | quiet_cases())
def test_a_wait_target_never_launches_more_than_launching_at_once(case):
    env, fleet = case
    at_once = replace(fleet, queues=tuple(replace(q, target_wait_s=None) for q in fleet.queues))
    for waited, plain in zip(decide(env, fleet, NOW), decide(env, at_once, NOW), strict=True):
        assert waited.desired <= plain.desired, (waited.reasons, plain.reasons)


@EXAMPLES
@given(cases(max_pools=1) | quiet_cases())
def test_once_the_oldest_item_would_miss_its_target_nodes_launch_as_without_a_target(case):
    """Waiting is allowed only while the oldest item can still make its target after a boot."""
    env, fleet = case
    late = []
    for q in fleet.queues:
        boot = env.pools[q.pool].boot_estimate_s
        # Every waiting item that old (no younger cohorts): each has only a boot left.
        late.append(replace(q, oldest_age_s=max(q.oldest_age_s or 0.0, (q.target_wait_s or 0) - boot), waiting_ages=()))
    due = replace(fleet, queues=tuple(late))
    at_once = replace(due, queues=tuple(replace(q, target_wait_s=None) for q in due.queues))
    for pool, waited, plain in zip(fleet.pools, decide(env, due, NOW), decide(env, at_once, NOW), strict=True):
        # Launches alike; which idle nodes stay may differ: with a target a relaunch costs only
        # its boot (the wait is within the target), so rule 4 keeps fewer.
        launched = [max(0, d.desired - staying_units(pool, d)) for d in (waited, plain)]
        assert launched[0] == launched[1], (waited.reasons, plain.reasons)


@EXAMPLES
@given(cases() | quiet_cases())
def test_idle_nodes_may_leave_on_their_own_only_above_min_and_never_while_the_pool_launches(case):
    env, fleet = case
    for view, d in zip(fleet.pools, decide(env, fleet, NOW), strict=True):
        staying = sum(n.weight for n in view.nodes if n.id not in d.terminate and n.state != "terminating")
        floor = env.pools[view.name].min if view.name in env.pools else staying
        assert 0 <= d.leave <= max(0, staying - floor), d.reasons
        if d.desired > staying:
            assert d.leave == 0, d.reasons
        # Only busy nodes going idle stay first, and only under a grant that lets later ones go.
        busy = sum(n.weight for n in view.nodes if n.busy_slots and n.id not in d.terminate)
        assert 0 <= d.stay_first <= (busy if d.leave else 0), d.reasons


@EXAMPLES
@given(steady_cases() | cases(max_pools=1), st.floats(0, 1), st.sampled_from([60.0, 600.0, 7200.0]))
def test_a_decision_promised_unchanged_is_what_deciding_again_gives_while_only_the_clock_moves(case, share, cap_s):
    """`unchanged_until` (the simulator skips the ticks it covers): at any time before it, the same
    fleet with only the clock moved on (intake decayed as no item is taken, heartbeats kept fresh
    by agents that beat on) is decided as it was."""
    env, fleet = case
    decisions = decide(env, fleet, NOW)
    until = unchanged_until(env, fleet, decisions, NOW)
    assert until >= NOW
    if until == NOW:  # nothing promised
        return
    later = NOW + share * (min(until, NOW + cap_s) - NOW)
    decay = rate_decay(NOW, later)
    moved = FleetView(
        tuple(replace(p, nodes=tuple(replace(n, last_heartbeat=later) if n.last_heartbeat is not None else n
                                     for n in p.nodes)) for p in fleet.pools),
        tuple(replace(q, intake_per_s=q.intake_per_s * decay) for q in fleet.queues),
    )  # fmt: skip
    assert list(map(actions, decide(env, moved, later))) == list(map(actions, decisions)), (later - NOW, until - NOW)


def test_a_promise_ends_where_the_cooldown_or_the_spot_failure_window_changes_the_decision():
    """The two clock deadlines, each at its boundary: idle nodes may leave once the scale-out
    cooldown is over; the on-demand base returns to the configured one once the last spot
    failure leaves its window. Just before, the decision holds; just after, it changes."""
    env = parse_environment({
        "region": "us-east-1",
        "scaler": {"scale_in_delay_s": None, "scale_out_cooldown_s": 120, "spot_failure_window_s": 600},
        "pools": {"p": {"command": "work", "max": 4, "boot_estimate_s": 60, "instance_types": [{"type": "c6i.large"}]}},
        "queues": {"q": {"pool": "p"}},
    }, name="quiet")  # fmt: skip

    def fleet(launched_at: float, failures: tuple[float, ...], at: float) -> FleetView:
        nodes = tuple(NodeView(id=f"i{i}", instance_type="c6i.large", weight=1, slots=1, spot=True, state="running",
                               launched_at=launched_at, busy_slots=1, last_heartbeat=at, idle_since=None,
                               protected=True, cordoned=False) for i in range(2))  # fmt: skip
        return FleetView((PoolView("p", nodes, desired=2, on_demand_base=4, spot_failures=failures),),
                         (QueueView("q", "p", 0, 1, 0, 2, mean_item_s=100.0, oldest_age_s=None, target_wait_s=0,
                                    intake_per_s=0.0),))  # fmt: skip

    for launched_at, failures, deadline in [(NOW - 30, (), NOW + 90), (NOW - 5000, (NOW - 590,), NOW + 10)]:
        decisions = decide(env, fleet(launched_at, failures, NOW), NOW)
        assert deadline - 0.01 < unchanged_until(env, fleet(launched_at, failures, NOW), decisions, NOW) < deadline
        before, after = (decide(env, fleet(launched_at, failures, t), t) for t in (deadline - 1, deadline + 1))
        assert list(map(actions, before)) == list(map(actions, decisions))
        assert list(map(actions, after)) != list(map(actions, decisions))
