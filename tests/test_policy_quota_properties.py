"""Properties of team quotas and fair share (policy/quota.py) over generated teams and demand."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tidefleet.config import Environment, parse_environment
from tidefleet.policy import decide, quota
from tidefleet.policy.model import FleetView, NodeView, PoolView, QueueView
from tidefleet.policy.quota import TeamDemand, share

NOW = 50_000.0
EXAMPLES = settings(deadline=None)


@st.composite
def team_demands(draw) -> tuple[int, list[TeamDemand]]:
    capacity = draw(st.integers(0, 40))
    teams = [
        TeamDemand(f"t{i}", draw(st.none() | st.integers(0, 20)), draw(st.integers(1, 4)), draw(st.integers(0, 30)), 0,
                   draw(st.booleans()))
        for i in range(draw(st.integers(1, 5)))
    ]  # fmt: skip
    return capacity, teams


@EXAMPLES
@given(team_demands())
def test_properties_no_team_exceeds_its_quota_unless_it_borrows_idle_quota(case):
    capacity, teams = case
    shares = share(capacity, teams)
    idle = sum(max(0, t.quota - t.demand) for t in teams if t.quota is not None)
    assert sum(s.allowed for s in shares.values()) <= capacity
    assert sum(s.borrowed for s in shares.values()) <= idle
    for t in teams:
        s = shares[t.team]
        assert 0 <= s.borrowed <= s.allowed <= t.demand
        if t.quota is not None:
            assert s.allowed <= t.quota + s.borrowed


@EXAMPLES
@given(team_demands())
def test_properties_a_team_gets_less_than_its_quota_only_when_the_pool_is_full(case):
    capacity, teams = case
    shares = share(capacity, teams)
    short = [t for t in teams if shares[t.team].allowed < (t.demand if t.quota is None else min(t.demand, t.quota))]
    if short:
        assert sum(s.allowed for s in shares.values()) == capacity, short


def environment(quotas: list[int], weights: list[int], max_slots: int) -> Environment:
    teams = {f"t{i}": {"quota": {"gpus": q}, "weight": w} for i, (q, w) in enumerate(zip(quotas, weights, strict=True))}
    return parse_environment({
        "region": "us-east-1",
        "pools": {"gpu": {"max": max_slots, "container": "c", "instance_types": [{"type": "g5.xlarge", "gpus": 1}]}},
        "queues": {f"q{i}": {"pool": "gpu", "team": f"t{i}"} for i in range(len(quotas))},
        "teams": teams,
    }, name="prop")  # fmt: skip


def view(env: Environment, depth: dict[str, tuple[int, int]], held: set[str]) -> FleetView:
    running = sum(f for _, f in depth.values())
    nodes = tuple(
        NodeView(f"i-{i}", "g5.xlarge", 1, 1, True, "running", NOW - 3600, busy_slots=1, last_heartbeat=NOW - 5)
        for i in range(running)
    )
    queues = tuple(QueueView(q, "gpu", 0, 1, *depth[q], team=env.team_of(q), held=q in held) for q in env.queues)
    return FleetView((PoolView("gpu", nodes, running, 0),), queues)


@st.composite
def borrowing(draw):
    """A borrower running past its quota on idle quota of the others; then an owner's demand arrives."""
    n = draw(st.integers(2, 4))
    quotas = [draw(st.integers(1, 6)) for _ in range(n)]
    weights = [draw(st.integers(1, 3)) for _ in range(n)]
    env = environment(quotas, weights, max_slots=sum(quotas) + draw(st.integers(0, 6)))
    borrowed = draw(st.integers(1, sum(quotas[1:])))
    depth = {q: (0, 0) for q in env.queues}
    depth["q0"] = (draw(st.integers(0, 10)), quotas[0] + borrowed)  # t0 borrows `borrowed` slots
    owner = draw(st.integers(1, n - 1))
    depth[f"q{owner}"] = (draw(st.integers(1, quotas[owner] + 5)), 0)
    return env, depth, owner, quotas


@EXAMPLES
@given(borrowing())
def test_properties_borrowed_capacity_is_returned_within_one_tick_of_the_owners_demand(case):
    env, depth, owner, quotas = case
    before = {q: (0, f) for q, (_, f) in depth.items() if q != f"q{owner}"} | {f"q{owner}": (0, 0)}
    (first,) = decide(env, view(env, before, set()), NOW)  # no owner demand: the borrower is not pushed back
    (d,) = decide(env, view(env, depth, set(first.hold)), NOW)  # the tick that sees the owner's demand
    owner_wants = min(depth[f"q{owner}"][0], quotas[owner])
    # The borrower takes no new items unless idle quota is left for it, and the owner is never held...
    idle = sum(max(0, quotas[i] - depth[f"q{i}"][0] - depth[f"q{i}"][1]) for i in range(1, len(quotas)))
    running = depth["q0"][1]
    if running >= quotas[0] + idle:
        assert "q0" in d.hold or "q0" in first.hold and "q0" not in d.release, d.reasons
    assert f"q{owner}" not in d.hold
    # ...and the capacity asked covers the owner's items within its quota, next to what runs.
    assert d.desired >= min(env.pools["gpu"].max, sum(f for _, f in depth.values()) + owner_wants), d.reasons


@st.composite
def lone_team(draw):
    """A CPU pool whose queues are all team solo's, beside a GPU pool two teams with quotas share;
    solo has no table, a weight only, or a GPU quota (which binds no CPU pool), or else a node quota."""
    own = draw(st.sampled_from([None, {"weight": 3}, {"quota": {"gpus": 2}}, {"quota": {"nodes": 1}},
                                {"pools": {"cpu": {"nodes": 2}}}]))  # fmt: skip
    max_nodes, slots_per_unit = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    env = parse_environment({
        "region": "us-east-1",
        "pools": {"gpu": {"max": 8, "container": "c", "instance_types": [{"type": "g5.xlarge", "gpus": 1}]},
                  "cpu": {"max": max_nodes, "slots_per_unit": slots_per_unit, "command": "run",
                          "instance_types": [{"type": "c6i.large"}]}},
        "queues": {"q0": {"pool": "gpu", "team": "t0"}, "q1": {"pool": "gpu", "team": "t1"},
                   "low": {"pool": "cpu", "team": "solo"}, "high": {"pool": "cpu", "team": "solo", "priority": 5}},
        "teams": {"t0": {"quota": {"gpus": 2}}, "t1": {"quota": {"gpus": 2}}} | ({"solo": own} if own else {}),
    }, name="prop")  # fmt: skip
    capacity = max_nodes * slots_per_unit
    running = draw(st.integers(0, capacity))
    high = draw(st.integers(0, running))
    queues = tuple(
        QueueView(name, "cpu", env.queues[name].priority, 1, draw(st.integers(0, 20)), in_flight,
                  team="solo", held=draw(st.booleans()))
        for name, in_flight in (("low", running - high), ("high", high))
    )  # fmt: skip
    own = own or {}
    nodes = own.get("quota", {}).get("nodes") or own.get("pools", {}).get("cpu", {}).get("nodes")
    return env, queues, None if nodes is None else nodes * slots_per_unit  # slots its quota owes it, if any


@EXAMPLES
@given(lone_team())
def test_properties_a_pool_with_one_team_and_no_quota_is_never_held(case):
    """Nobody shares the pool: its max bounds the team as without [teams], every hand-over goes on at
    once (a hold would make it wait for a tick), and no waiting item is left out of its demand."""
    env, queues, owed = case
    got = quota.apply(env, FleetView((), queues))["cpu"]
    if owed is None:
        assert got.hold == () and got.release == tuple(q.name for q in queues if q.held), got.reasons
        assert set(got.queues) == set(queues)  # none trimmed
    else:  # ...unless it has a quota of its own there, which holds it once it runs all of it
        at_quota = sum(q.in_flight for q in queues) >= owed
        assert set(got.hold) == ({q.name for q in queues if not q.held} if at_quota else set()), got.reasons


@st.composite
def lost_in_flight(draw):
    """Team t0 has items in flight on fewer busy nodes than it has items (finished items not yet
    deleted, a lost node's items not yet back); the other teams have only waiting items."""
    n = draw(st.integers(2, 4))
    quotas = [draw(st.integers(1, 6)) for _ in range(n)]
    env = environment(quotas, [draw(st.integers(1, 3)) for _ in range(n)], max_slots=60)
    in_flight = draw(st.integers(0, 30))
    depth = {f"q{i}": (draw(st.integers(0, 8)), 0) for i in range(1, n)}
    depth["q0"] = (draw(st.integers(0, 10)), in_flight)
    return env, depth, draw(st.integers(0, in_flight)), quotas


@EXAMPLES
@given(lost_in_flight())
def test_properties_items_in_flight_on_no_node_launch_nothing_beyond_the_quotas(case):
    env, depth, on_nodes, quotas = case
    base = view(env, depth, set())
    nodes = base.pools[0].nodes[:on_nodes]
    (d,) = decide(env, FleetView((PoolView("gpu", nodes, on_nodes, 0),), base.queues), NOW)
    assert d.desired <= on_nodes + sum(quotas), d.reasons
    if not any(v for q, (v, _) in depth.items() if q != "q0"):
        assert d.desired <= max(on_nodes, sum(quotas)), d.reasons
