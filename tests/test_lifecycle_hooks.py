"""The interruption edge on the moto server: the terminate hook's release, and the marks it leaves.

moto 5.2 has no CompleteLifecycleAction (it answers a server error). `AwsHooks` answers it at the
boto3 clients' `before-call` hook as AWS does: the first completion of an action succeeds, any
later one (by its token or its instance) is refused with `ValidationError: No active Lifecycle
Action found with ...`. Everything else goes to the moto server.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import boto3
import pytest
from botocore.awsrequest import AWSResponse
from botocore.exceptions import ClientError

from tidefleet import control, naming
from tidefleet.cloud.aws import AutoScalingFleet, AwsNode, aws_ports
from tidefleet.cloud.aws.dynamodb import DynamoStore
from tidefleet.cloud.aws.provision import provision
from tidefleet.config import load_environment
from tidefleet.policy.interruption import action_for
from tidefleet.records import Heartbeat

ENV = load_environment("sandbox")
GROUP = naming.group("sandbox", "cpu")
EVENTS = Path(__file__).parent / "events"


class AwsHooks:
    """CompleteLifecycleAction as AWS answers it, for the instances the tests hold by a token."""

    def __init__(self):
        self.held: dict[str, str] = {}  # token -> instance
        self.completed: set[str] = set()  # instances whose action is no longer active
        self.calls: list[dict] = []

    def hold(self, instance: str, token: str) -> None:
        self.held[token] = instance

    def answer(self, params, **_):
        body = params["body"]
        self.calls.append(body)
        token = body.get("LifecycleActionToken")
        instance = self.held.get(token) if token else body.get("InstanceId")
        if instance in self.completed or instance is None:
            by = f"token {token}" if token else f"instance ID {body.get('InstanceId')}"
            return AWSResponse("", 400, {}, None), {
                "Error": {"Code": "ValidationError", "Message": f"No active Lifecycle Action found with {by}"}
            }
        self.completed.add(instance)
        return AWSResponse("", 200, {}, None), {}

    def on(self, client) -> None:
        client.meta.events.register("before-call.autoscaling.CompleteLifecycleAction", self.answer)


@pytest.fixture
def provisioned(aws):
    provision(ENV, user_data={"cpu": "#!/bin/sh\n"})


@pytest.fixture
def cloud(provisioned):
    ports = aws_ports(ENV)
    hooks = AwsHooks()
    hooks.on(ports.fleet.asg)
    return ports, hooks


def grow(desired: int) -> list[str]:
    asg = boto3.client("autoscaling", region_name=ENV.region)
    asg.set_desired_capacity(AutoScalingGroupName=GROUP, DesiredCapacity=desired)
    group = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[GROUP])["AutoScalingGroups"][0]
    return [i["InstanceId"] for i in group["Instances"]]


def event(name: str, instance: str) -> dict:
    return json.loads((EVENTS / f"{name}.json").read_text().replace("i-1234567890abcdef0", instance))


def hook_event(hooks: AwsHooks, instance: str) -> dict:
    raw = event("lifecycle_terminate", instance)
    hooks.hold(instance, raw["detail"]["LifecycleActionToken"])
    return raw


def drain(ports, raw: dict) -> dict:
    return control.drain(ENV, ports, action_for(raw, ENV), time.time(), replace=lambda pool: "kicked")


def test_a_terminate_hook_event_delivered_twice_releases_the_node_once_and_the_second_is_already_done(cloud):
    ports, hooks = cloud
    (node,) = grow(1)
    raw = hook_event(hooks, node)
    assert drain(ports, raw)["released"] == "never reported"
    assert drain(ports, raw)["released"] == "already completed"  # EventBridge delivers at least once
    assert len(hooks.calls) == 2 and hooks.completed == {node}


def test_a_node_whose_agent_completed_the_action_first_is_already_done(cloud):
    ports, hooks = cloud
    (node,) = grow(1)
    raw = hook_event(hooks, node)
    agent = AwsNode(ENV)
    hooks.on(agent.autoscaling)
    agent.leave("cpu", node)  # an idle node leaving on its grant: the agent's own release, by instance id
    DynamoStore(ENV.name, ENV.region).put_heartbeat(Heartbeat(node, "cpu", at=time.time(), slots=2, busy_slots=0,
                                                              idle_since=time.time() - 60))  # fmt: skip
    assert drain(ports, raw)["released"] == "already completed"


def test_an_agent_leaving_after_the_interruption_function_released_its_node_is_already_done(cloud):
    ports, hooks = cloud
    (node,) = grow(1)
    DynamoStore(ENV.name, ENV.region).put_heartbeat(Heartbeat(node, "cpu", at=time.time(), slots=2, busy_slots=0,
                                                              idle_since=time.time() - 60))  # fmt: skip
    assert drain(ports, hook_event(hooks, node))["released"] == "idle"
    agent = AwsNode(ENV)
    hooks.on(agent.autoscaling)
    agent.leave("cpu", node)  # the agent stops after its notice: its own release comes second, and is done
    assert len(hooks.calls) == 2 and hooks.completed == {node}


def release_by_fleet(node: str) -> tuple:
    fleet = AutoScalingFleet(ENV)
    return fleet.asg, lambda: fleet.complete_lifecycle_action("cpu", node, naming.lifecycle_hook("sandbox", "cpu"), None)


def release_by_agent(node: str) -> tuple:
    agent = AwsNode(ENV)
    return agent.autoscaling, lambda: agent.leave("cpu", node)


@pytest.mark.parametrize("release", [release_by_fleet, release_by_agent])
def test_any_other_refusal_to_release_the_node_is_raised(provisioned, release):
    (node,) = grow(1)
    client, call = release(node)
    denied = {"Error": {"Code": "AccessDenied", "Message": "not authorized to perform: autoscaling:CompleteLifecycleAction"}}
    client.meta.events.register(
        "before-call.autoscaling.CompleteLifecycleAction", lambda **_: (AWSResponse("", 403, {}, None), denied)
    )
    with pytest.raises(ClientError, match="AccessDenied"):
        call()


@pytest.mark.parametrize(
    ("silent_s", "released"),
    [
        (5, None),  # its agent hands the items back, then completes the action itself
        (ENV.pools["cpu"].boot_timeout_s + 1, "agent silent"),  # no agent left to do it: the scaler replaces such a node
    ],
)
def test_a_busy_node_is_held_for_its_agent_unless_the_agent_is_silent_past_the_boot_timeout(cloud, silent_s, released):
    ports, hooks = cloud
    (node,) = grow(1)
    now = time.time()
    DynamoStore(ENV.name, ENV.region).put_heartbeat(Heartbeat(node, "cpu", at=now - silent_s, slots=2, busy_slots=2,
                                                              idle_since=None))  # fmt: skip
    line = drain(ports, hook_event(hooks, node))
    if released is None:
        assert line["held"] == "busy (2 slots): its agent completes the lifecycle action" and hooks.calls == []
    else:
        # The handler reads its own clock after the heartbeat was written: a loaded machine adds seconds.
        said = re.match(rf"agent silent: last heartbeat (\d+)s ago > boot timeout {ENV.pools['cpu'].boot_timeout_s}s",
                        line["released"])  # fmt: skip
        assert said and silent_s <= int(said.group(1)) < silent_s + 30, line["released"]
        assert "held" not in line and hooks.completed == {node}


@pytest.mark.parametrize("claimed", [True, False], ids=["took an item since", "still idle"])
def test_a_node_whose_last_heartbeat_said_idle_is_held_if_it_took_an_item_since(cloud, claimed):
    """The agent claims work on its record before it starts an item; its heartbeat says so a beat
    later. The hook released such a node on the idle heartbeat: terminated mid-item (the tick's
    scale-in already checked the claim, `let_idle_go`)."""
    ports, hooks = cloud
    (node,) = grow(1)
    store, now = DynamoStore(ENV.name, ENV.region), time.time()
    store.put_heartbeat(Heartbeat(node, "cpu", at=now - 10, slots=2, busy_slots=0, idle_since=now - 100))
    if claimed:
        assert store.claim_work("cpu", node, now - 5)
    line = drain(ports, hook_event(hooks, node))
    if claimed:
        assert line["held"] == "took work after its last heartbeat: its agent completes the lifecycle action"
        assert hooks.calls == []
    else:
        assert line["released"] == "idle" and hooks.completed == {node}
    assert not store.claim_work("cpu", node, time.time()), "marked draining either way: it starts nothing more"


def node_rows() -> set[str]:
    """The nodes the job store holds a row of, heartbeat or mark."""
    query = DynamoStore(ENV.name, ENV.region).table.query(
        KeyConditionExpression="pk = :pk AND begins_with(sk, :node)",
        ExpressionAttributeValues={":pk": "POOL#cpu", ":node": "NODE#"},
    )
    return {raw["sk"].removeprefix("NODE#") for raw in query["Items"]}


def test_the_draining_mark_of_a_node_that_never_reported_goes_once_the_node_left_the_group(cloud):
    ports, _ = cloud
    staying, leaving = grow(2)
    for node in (staying, leaving):  # spot notices while both still boot: a mark, no heartbeat
        drain(ports, event("spot_warning", node))
    assert node_rows() == {staying, leaving} and DynamoStore(ENV.name, ENV.region).heartbeats("cpu") == {}
    boto3.client("autoscaling", region_name=ENV.region).terminate_instance_in_auto_scaling_group(
        InstanceId=leaving, ShouldDecrementDesiredCapacity=True
    )  # EC2 reclaims it: the group forgets it
    control.tick(ENV, ports, time.time(), pools=["cpu"])
    assert node_rows() == {staying}  # the node still in the group keeps its mark
