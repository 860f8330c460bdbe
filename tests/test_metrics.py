"""The metrics a tick and an agent emit (`tidefleet.metrics`): what each point counts, that every
gauge is written each tick, and that the EMF lines CloudWatch reads carry exactly those points."""

from __future__ import annotations

import json

import pytest

from tidefleet import metrics
from tidefleet.config import parse_environment
from tidefleet.policy import faults
from tidefleet.policy.model import FleetView, NodeFault, NodeView, PoolDecision, PoolView, QueueView

NOW = 10_000.0
ENV = parse_environment({
    "region": "us-east-1", "scaler": {"cost_cap_usd_per_hour": 5.0},
    "pools": {"cpu": {"max": 20, "on_demand_percent": 50, "slots_per_unit": 2, "boot_timeout_s": 600, "command": "run",
                      "instance_types": [{"type": "c6i.large", "on_demand_price": 0.1, "spot_price": 0.04}]}},
    "queues": {"render": {"pool": "cpu", "slots_per_item": 1}, "merge": {"pool": "cpu", "slots_per_item": 2}},
}, name="m")  # fmt: skip


def node(id, *, spot=True, state="running", busy=0, launched=NOW - 60, beat=NOW - 5) -> NodeView:
    return NodeView(id, "c6i.large", 1, 2, spot, state, launched, busy, beat if state != "pending" else None)


FLEET = FleetView(
    pools=(PoolView("cpu", (
        node("busy-spot", busy=1),
        node("idle-spot"),
        node("idle-od", spot=False),
        node("booting-spot", state="pending"),
        node("stuck-spot", state="pending", launched=NOW - 601),
        node("silent-spot", busy=1, beat=NOW - metrics.SILENT_AFTER_S - 1),
        node("draining-od", spot=False, state="draining", busy=1),
        node("gone-spot", state="terminating"),
    ), desired=7, on_demand_base=0, spot_failures=(NOW - 30, NOW - 20)),),
    queues=(QueueView("render", "cpu", 0, 1, visible=4, in_flight=3), QueueView("merge", "cpu", 0, 2, visible=1, in_flight=0)),
)  # fmt: skip
DECISION = PoolDecision("cpu", desired=8, terminate=("idle-spot",), on_demand_base=2, reasons=("x",),
                        starved_queues=("merge",), leave=3)  # fmt: skip


def values(points) -> dict:
    return {(p.name, *[v for k, v in p.dimensions if k != "Environment"]): p.value for p in points}


@pytest.fixture(scope="module")
def emitted() -> dict:
    return values(metrics.tick_points(ENV, FLEET, [DECISION], NOW))


@pytest.mark.parametrize("key,expected", [
    # desired 8 with base 2 and 50 % above it on demand: 2 + ceil(6 * 0.5) = 5 on demand, 3 spot
    (("DesiredUnits", "cpu", "on-demand"), 5),
    (("DesiredUnits", "cpu", "spot"), 3),
    # running or draining nodes count as in service; booting and terminating ones do not
    (("InServiceUnits", "cpu", "spot"), 3),
    (("InServiceUnits", "cpu", "on-demand"), 2),
    (("Nodes", "cpu", "spot", "busy"), 2),
    (("Nodes", "cpu", "spot", "idle"), 1),
    (("Nodes", "cpu", "spot", "booting"), 2),
    (("Nodes", "cpu", "spot", "draining"), 0),  # the terminating one is gone already
    (("Nodes", "cpu", "on-demand", "idle"), 1),
    (("Nodes", "cpu", "on-demand", "draining"), 1),
    (("Nodes", "cpu", "on-demand", "busy"), 0),
    (("DemandSlots", "cpu"), 4 + 3 + 1 * 2),
    (("StarvedQueues", "cpu"), 1),
    (("TerminatedNodes", "cpu"), 1),
    (("LeaveGrantUnits", "cpu"), 3),
    (("SpotLaunchFailures", "cpu"), 2),
    (("OnDemandFallbackUnits", "cpu"), 2),
    (("NodesStuckBooting", "cpu"), 1),
    (("NodesSilent", "cpu"), 1),
    # 5 spot nodes at 0.04 and 2 on-demand at 0.1 (the terminating one costs nothing more)
    (("PoolCostPerHour", "cpu"), 0.4),
    (("CostPerHour",), 0.4),
    (("QueueVisible", "render"), 4),
    (("QueueInFlight", "render"), 3),
])  # fmt: skip
def test_each_tick_point_counts_what_its_metric_says(emitted, key, expected):
    assert emitted[key] == pytest.approx(expected)


def test_every_gauge_is_written_every_tick_even_at_zero():
    empty = FleetView(pools=(PoolView("cpu", (), desired=0, on_demand_base=0),), queues=(QueueView("render", "cpu", 0, 1, 0, 0),))
    points = metrics.tick_points(ENV, empty, [], NOW)
    written = {p.name for p in points}
    assert written == {m.name for m in metrics.METRICS.values() if m.source == "scaler"}
    nodes = [p for p in points if p.name == "Nodes"]
    assert len(nodes) == len(metrics.LIFECYCLES) * len(metrics.ACTIVITIES) and not any(p.value for p in nodes)


@pytest.mark.parametrize("outcome,counted", [
    ("succeeded", "AttemptsSucceeded"), ("failed", "AttemptsFailed"),
    ("handed back", "AttemptsInterrupted"), ("cancelled", "AttemptsCancelled"), ("dropped", None),
])  # fmt: skip
def test_an_attempt_counts_one_for_its_outcome_and_zero_for_the_others(outcome, counted):
    points = metrics.attempt_points("m", "render", outcome)
    assert {p.name: p.value for p in points} == {n: float(n == counted) for n in metrics.OUTCOME_METRICS.values()}
    assert all(dict(p.dimensions) == {"Environment": "m", "Queue": "render"} for p in points)


def test_emf_lines_carry_exactly_the_points_and_declare_every_metric():
    points = metrics.tick_points(ENV, FLEET, [DECISION], NOW) + metrics.attempt_points("m", "render", "failed")
    lines = metrics.emf(points, 1_700_000_000_000)
    decoded = [p for line in lines for p in metrics.from_emf(line)[1]]
    assert sorted(decoded, key=repr) == sorted(points, key=repr)
    for line in lines:
        doc = json.loads(line)
        (directive,) = doc["_aws"]["CloudWatchMetrics"]
        assert directive["Namespace"] == metrics.NAMESPACE and doc["_aws"]["Timestamp"] == 1_700_000_000_000
        assert all(m["Name"] in doc and m["Unit"] == metrics.METRICS[m["Name"]].unit for m in directive["Metrics"])


def test_a_point_with_the_wrong_dimensions_is_refused():
    with pytest.raises(ValueError, match="Nodes: dimensions"):
        metrics.point("Nodes", 1, Environment="m", Pool="cpu")


@pytest.mark.parametrize("line", ['{"x": 1}', "[]", '{"_aws": "no"}'])
def test_a_line_that_is_not_emf_is_refused(line):
    with pytest.raises(ValueError, match="not an EMF document"):
        metrics.from_emf(line)


@pytest.mark.parametrize("done,expected", [
    # The group's MaxSize (6) below the decision's 8: 6 units set, base 2 + ceil(4 * 0.5) = 4 on demand.
    ({"terminated": ["idle-spot"], "desired_after": 6, "base_after": 2, "held": "desired capped at the group's MaxSize 6"},
     {"spot": 2, "on-demand": 4, "terminated": 1, "fallback": 2}),
    # The idle node was already gone: nothing terminated, desired as decided.
    ({"terminated": [], "desired_after": 8, "base_after": 2}, {"spot": 3, "on-demand": 5, "terminated": 0, "fallback": 2}),
    # Both sets refused: the group keeps its own 7 and its base 0 (ceil(7 * 0.5) = 4 on demand).
    ({"terminated": ["idle-spot"], "desired_after": 7, "base_after": 0,
      "failed": ["set_on_demand_base: PermissionError: no", "set_desired: PermissionError: no"]},
     {"spot": 3, "on-demand": 4, "terminated": 1, "fallback": 0}),
    # act itself failed: the group as observed (7, base 0), nothing known terminated.
    ({"error": "RuntimeError: boom"}, {"spot": 3, "on-demand": 4, "terminated": 0, "fallback": 0}),
], ids=["capped", "already-gone", "refused", "act-failed"])  # fmt: skip
def test_what_act_did_is_reported_not_what_the_policy_decided(done, expected):
    emitted = values(metrics.tick_points(ENV, FLEET, [DECISION], NOW, acted={"cpu": done}))
    assert {
        "spot": emitted[("DesiredUnits", "cpu", "spot")],
        "on-demand": emitted[("DesiredUnits", "cpu", "on-demand")],
        "terminated": emitted[("TerminatedNodes", "cpu")],
        "fallback": emitted[("OnDemandFallbackUnits", "cpu")],
    } == expected


def test_a_dry_run_reports_what_was_decided():
    """Nothing is set in a dry run: `control.tick` tells `acted` nothing, and the points are the decision's."""
    assert metrics.tick_points(ENV, FLEET, [DECISION], NOW, acted={}) == metrics.tick_points(ENV, FLEET, [DECISION], NOW)


# Three nodes said at start they cannot run items; the first is still in the group (draining), the
# others are gone and only their remembered heartbeats say so (`control.FAULT_MEMORY_S`).
FAULTS = (NodeFault("bad-1", NOW - 900, "its GPUs are not usable: no driver"),
          NodeFault("bad-2", NOW - 600, "docker does not answer"), NodeFault("bad-3", NOW - 300, "no user 'item'"))  # fmt: skip


def faulted(*nodes: NodeView, faults: tuple[NodeFault, ...] = FAULTS) -> float:
    fleet = FleetView(pools=(PoolView("cpu", nodes, desired=1, on_demand_base=0, faults=faults),), queues=())
    return values(metrics.tick_points(ENV, fleet, [], NOW))[("NodesFaulted", "cpu")]


def test_nodes_faulted_counts_the_faults_in_a_row_that_hold_the_pools_launches():
    """Rule 14's count (`faults.in_a_row`): the alarm `launches-held` fires on it."""
    bad = node("bad-1", state="draining", launched=NOW - 1000, beat=NOW - 900)
    assert faulted() == faulted(bad) == 3
    # A healthy node launched before the faults, or one still booting, does not end the row.
    assert faulted(bad, node("old", busy=1, launched=NOW - 5000), node("new", state="pending", launched=NOW - 60)) == 3
    # A node launched after them that reports without a fault does: nothing in a row.
    assert faulted(bad, node("fixed", launched=NOW - 200)) == 0
    # Faults since that healthy node count again, from one.
    later = (*FAULTS, NodeFault("bad-4", NOW - 100, "no user 'item'"))
    assert faulted(bad, node("fixed", launched=NOW - 200), faults=later) == 1
    assert faulted(faults=FAULTS[:2]) == 2
    assert faulted(faults=()) == 0
    assert metrics.METRICS["NodesFaulted"].dimensions == metrics.POOL


@pytest.mark.parametrize("count", range(6))
def test_nodes_faulted_reaches_faults_in_a_row_exactly_when_rule_14_holds_launches(count):
    row = tuple(NodeFault(f"bad-{i}", NOW - 100 * (6 - i), "docker does not answer") for i in range(count))
    held = faults.hold("cpu", row, (), NOW) is not None
    assert held == (faulted(faults=row) >= faults.FAULTS_IN_A_ROW)
