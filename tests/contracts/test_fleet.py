"""The FleetPort and QueuePort contract (`tidefleet.ports`), on every fleet adapter: Auto Scaling
groups and SQS on the moto server, a pool's managed instance groups and Cloud Monitoring through
the real clients on the GCP fake. What the control tick relies on: what it observes, and that
acting removes exactly the nodes it chose and never makes the group pick one itself."""

from __future__ import annotations

import time

import pytest

TOKEN = "87654321-4321-4321-4321-210987654321"  # the shape AWS gives a lifecycle action token


def group(f, since: float = 0):
    return f.fleet.groups([f.pool], since)[f.pool]


def in_service(f) -> set[str]:
    return {i.id for i in group(f).instances if i.lifecycle_state == "InService"}


def test_only_the_pools_whose_group_exists_are_reported(fleet):
    assert set(fleet.fleet.groups([fleet.pool, "not-deployed"], 0)) == {fleet.pool}
    g = group(fleet)
    assert (g.name, g.desired, g.min, g.max, g.on_demand_base, g.instances, g.spot_failures) == (
        fleet.group, 0, fleet.min, fleet.max, 0, (), ())


def test_launched_instances_are_listed_in_service_with_their_type_and_launch_time(fleet):
    ids = fleet.launch(2)
    g = group(fleet)
    assert g.desired == 2 and {i.id for i in g.instances} == set(ids)
    for i in g.instances:
        assert i.lifecycle_state == "InService" and i.instance_type in fleet.instance_types
        assert i.launched_at is not None and not i.protected


def test_set_desired_sets_the_groups_desired_capacity(fleet):
    fleet.fleet.set_desired(fleet.pool, 3)
    assert group(fleet).desired == 3
    fleet.fleet.set_desired(fleet.pool, 0)
    assert group(fleet).desired == 0


def test_terminate_removes_exactly_the_chosen_nodes_with_a_decrement_and_skips_the_rest(fleet):
    ids = fleet.launch(3)
    done = fleet.fleet.terminate(fleet.pool, (ids[0], ids[1], "someone-elses-node"))
    assert sorted(done) == ids[:2], "the ids actually terminated; an unknown one is skipped, not an error"
    g = group(fleet)
    assert g.desired == 1, "desired drops with them: the group launches no replacement"
    assert in_service(fleet) == {ids[2]}, "and picks no victim of its own"


def test_a_repeated_terminate_is_a_no_op_and_never_decrements_twice(fleet):
    ids = fleet.launch(2)
    assert fleet.fleet.terminate(fleet.pool, (ids[0],)) == (ids[0],)
    assert fleet.fleet.terminate(fleet.pool, (ids[0],)) == ()
    assert fleet.fleet.terminate(fleet.pool, ()) == ()
    assert group(fleet).desired == 1 and in_service(fleet) == {ids[1]}


def test_the_on_demand_base_then_desired_as_the_tick_applies_them(fleet):
    fleet.fleet.set_on_demand_base(fleet.pool, 2)
    fleet.fleet.set_desired(fleet.pool, 5)
    g = group(fleet)
    assert (g.on_demand_base, g.desired) == (2, 5)
    fleet.fleet.set_on_demand_base(fleet.pool, 0)
    fleet.fleet.set_desired(fleet.pool, 5)
    assert (group(fleet).on_demand_base, group(fleet).desired) == (0, 5)


def test_lowering_the_on_demand_base_never_stops_a_running_node(fleet):
    """Restoring the configured base after a Spot shortage happens with the tick's desired
    unchanged: the group must not shed on-demand nodes of its own choosing (busy ones too)."""
    fleet.fleet.set_on_demand_base(fleet.pool, 2)
    fleet.fleet.set_desired(fleet.pool, 2)
    running = fleet.settle()
    assert len(running) == 2
    fleet.fleet.set_on_demand_base(fleet.pool, 0)
    assert in_service(fleet) == set(running) and group(fleet).desired == 2


def test_group_of_names_an_instances_group_or_none(fleet):
    (instance,) = fleet.launch(1)
    assert fleet.fleet.group_of(instance) == fleet.group
    assert fleet.fleet.group_of("someone-elses-node") is None


def test_spot_launch_failures_are_reported_from_since_on_oldest_first(fleet):
    now = float(int(time.time()))
    for at in (now - 600, now - 120, now - 60):
        fleet.spot_launch_failed(at)
    assert group(fleet, since=now - 300).spot_failures == (now - 120, now - 60)
    assert group(fleet, since=now).spot_failures == ()


def test_releasing_a_node_from_the_drain_hook_lets_it_go_by_token_or_by_instance(fleet):
    (instance,) = fleet.launch(1)
    by_token = fleet.fleet.complete_lifecycle_action(fleet.pool, instance, "the-drain-hook", TOKEN)
    by_instance = fleet.fleet.complete_lifecycle_action(fleet.pool, instance, "the-drain-hook", None)
    # True: released now (the cloud accepted each here); None: no hooks, nothing was held.
    assert (by_token, by_instance) == ((None, None) if fleet.hook_releases is None else (True, True))
    if fleet.hook_releases is not None:
        common = {"AutoScalingGroupName": fleet.group, "LifecycleHookName": "the-drain-hook",
                  "LifecycleActionResult": "CONTINUE"}  # fmt: skip
        assert [{k: r.get(k) for k in (*common, "LifecycleActionToken", "InstanceId")} for r in fleet.hook_releases] == [
            {**common, "LifecycleActionToken": TOKEN, "InstanceId": None},
            {**common, "LifecycleActionToken": None, "InstanceId": instance},
        ]
    assert in_service(fleet) == {instance}, "releasing a hook never terminates a node by itself"


@pytest.mark.parametrize("waiting", [0, 7])
def test_the_backlog_is_what_waits_in_the_pools_queue(fleet, waiting):
    fleet.wait(waiting)
    backlog = fleet.backlog.backlog(fleet.queue)
    assert backlog.visible + backlog.in_flight == waiting
