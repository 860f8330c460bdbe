"""Both cloud functions end to end on the moto server, fed the captured event payloads in
tests/events/, with the real policy deciding.

The sandbox environment is provisioned exactly as `tidefleet sandbox` does it, with one
change: no scale-out cooldown, because moto's instances are launched at test time and the
test must not sleep through a cooldown to see a scale-in.

moto 5.2 gaps: it has no CompleteLifecycleAction and never holds an instance in
Terminating:Wait, so for the terminate hook the fleet adapter is wrapped to record the
completion call instead of sending it (everything else is the real adapter on the server).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import boto3
import pytest
from botocore.exceptions import ClientError

from lambdas import FunctionFailed
from lambdas.interruption import handler as interruption
from lambdas.scaler import handler as scaler
from lambdas.schedule import handler as schedule
from tests import bad_endpoints
from tests.clock import Clock
from tidefleet import naming
from tidefleet.cloud.aws import AutoScalingFleet, SqsQueues, lambda_runtime
from tidefleet.cloud.aws.dynamodb import DynamoStore
from tidefleet.cloud.aws.provision import provision
from tidefleet.config import environments_dir
from tidefleet.emulator import FAKE_CREDENTIALS, free_port
from tidefleet.ports import Ports
from tidefleet.records import Heartbeat

EVENTS = Path(__file__).parent / "events"
GROUP = naming.group("sandbox", "cpu")
REGION = "us-east-1"


def event(name: str, instance_id: str | None = None) -> dict:
    text = (EVENTS / f"{name}.json").read_text()
    return json.loads(text.replace("i-1234567890abcdef0", instance_id) if instance_id else text)


@pytest.fixture
def deployed(aws, tmp_path, monkeypatch):
    """The sandbox environment on the moto server; returns a function to rewrite its [scaler]."""
    source = (environments_dir() / "sandbox.toml").read_text()

    def configure(extra: str = "") -> None:
        text = source.replace("scale_out_cooldown_s = 4", f"scale_out_cooldown_s = 0\n{extra}")
        (tmp_path / "sandbox.toml").write_text(text)
        lambda_runtime.cache_clear()  # a new cold start

    monkeypatch.setenv("TIDEFLEET_ENVIRONMENTS", str(tmp_path))
    monkeypatch.setenv("TIDEFLEET_ENV", "sandbox")
    configure()
    env, _ = lambda_runtime()
    provision(env, user_data={"cpu": "#!/bin/sh\n"})
    yield configure
    lambda_runtime.cache_clear()


def asg():
    return boto3.client("autoscaling", region_name=REGION)


def group() -> dict:
    return asg().describe_auto_scaling_groups(AutoScalingGroupNames=[GROUP])["AutoScalingGroups"][0]


def grow(desired: int) -> list[str]:
    asg().set_desired_capacity(AutoScalingGroupName=GROUP, DesiredCapacity=desired)
    return [i["InstanceId"] for i in group()["Instances"]]


def put_items(n: int, receive: int = 0) -> None:
    sqs = boto3.client("sqs", region_name=REGION)
    url = sqs.get_queue_url(QueueName=naming.queue("sandbox", "demo"))["QueueUrl"]
    for i in range(n):
        sqs.send_message(QueueUrl=url, MessageBody=json.dumps({"item": i}))
    if receive:
        got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=receive)["Messages"]
        assert len(got) == receive


def heartbeat(node_id: str, busy: int) -> None:
    """What the agent reports; a busy agent also protects its node from scale-in."""
    now = time.time()
    DynamoStore("sandbox", REGION).put_heartbeat(
        Heartbeat(node_id, "cpu", at=now, slots=2, busy_slots=busy, idle_since=None if busy else now - 600)
    )
    asg().set_instance_protection(
        AutoScalingGroupName=GROUP, InstanceIds=[node_id], ProtectedFromScaleIn=bool(busy)
    )


# -- scaler ---------------------------------------------------------------------------------


@pytest.mark.parametrize("trigger", ["schedule", "alarm", "kick"])
def test_every_trigger_scales_out_on_backlog_at_once(deployed, trigger):
    put_items(5)  # 5 one-slot items, 2 slots per node
    summary = scaler.handler(event(trigger), None)
    assert summary["trigger"] == trigger and summary["desired"] == {"cpu": 3}
    g = group()
    assert g["DesiredCapacity"] == 3 and len(g["Instances"]) == 3


def test_the_scaler_prints_what_it_saw_and_decided_as_emf_lines(deployed, capsys):
    from tidefleet import metrics

    put_items(5)
    scaler.handler(event("schedule"), None)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith('{"_aws"')]
    points = {(p.name, *dict(p.dimensions).values()): p.value for line in lines for p in metrics.from_emf(line)[1]}
    assert points[("DesiredUnits", "sandbox", "cpu", "spot")] == 3
    assert points[("QueueVisible", "sandbox", "demo")] == 5
    assert points[("DemandSlots", "sandbox", "cpu")] == 5


def test_idle_nodes_are_terminated_with_decrement_and_busy_or_booting_ones_kept(deployed):
    idle_a, busy, idle_b, booting = grow(4)
    heartbeat(idle_a, busy=0)
    heartbeat(busy, busy=1)
    heartbeat(idle_b, busy=0)  # `booting` has not reported yet
    put_items(1, receive=1)  # the busy node's item, in flight
    summary = scaler.handler(event("schedule"), None)
    assert summary["terminated"] == 2
    g = group()
    assert sorted(i["InstanceId"] for i in g["Instances"]) == sorted([busy, booting])
    assert g["DesiredCapacity"] == 2  # decremented with each termination: no replacement launched
    states = boto3.client("ec2", region_name=REGION).describe_instances(InstanceIds=[idle_a, idle_b])
    assert {i["State"]["Name"] for r in states["Reservations"] for i in r["Instances"]} == {"terminated"}


def test_a_second_tick_on_the_same_world_changes_nothing(deployed):
    idle, busy = grow(2)
    heartbeat(idle, busy=0)
    heartbeat(busy, busy=1)
    put_items(3, receive=1)
    scaler.handler(event("schedule"), None)
    first = group()
    scaler.handler(event("kick"), None)
    second = group()
    assert second["DesiredCapacity"] == first["DesiredCapacity"]
    assert {i["InstanceId"] for i in second["Instances"]} == {i["InstanceId"] for i in first["Instances"]}


def test_dry_run_decides_and_logs_but_changes_nothing(deployed, caplog):
    deployed("dry_run = true")
    idle, busy = grow(2)
    heartbeat(idle, busy=0)
    heartbeat(busy, busy=1)
    put_items(9, receive=1)
    with caplog.at_level(logging.INFO, "tidefleet"):
        summary = scaler.handler(event("schedule"), None)
    assert summary["desired"]["cpu"] > 2 and summary["dry_run"] is True  # it did decide to grow ...
    g = group()
    assert g["DesiredCapacity"] == 2 and len(g["Instances"]) == 2  # ... and changed nothing
    line = json.loads(next(r.getMessage() for r in caplog.records if r.name == "tidefleet.control"))
    assert line["dry_run"] is True and line["reasons"]


def test_the_summary_says_what_desired_was_set_to_when_the_groups_max_size_caps_it(deployed, caplog, capsys):
    from tidefleet import metrics

    asg().update_auto_scaling_group(AutoScalingGroupName=GROUP, MaxSize=2)  # a console edit, or a partial apply
    put_items(5)  # the policy asks for 3 nodes
    with caplog.at_level(logging.INFO, "tidefleet"):
        summary = scaler.handler(event("schedule"), None)
    assert summary["desired"] == {"cpu": 2} and group()["DesiredCapacity"] == 2
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith('{"_aws"')]
    points = {(p.name, *dict(p.dimensions).values()): p.value for line in lines for p in metrics.from_emf(line)[1]}
    assert points[("DesiredUnits", "sandbox", "cpu", "spot")] == 2, "the metric says what was set, as the summary"
    assert summary["held"] == {
        "cpu": "desired capped at the group's MaxSize 2 (config max 6), not 3: deploy the environment to apply it"
    }
    assert [json.loads(r.getMessage()) for r in caplog.records if r.name == "tidefleet.scaler"] == [summary]


@pytest.fixture
def looping(deployed, tmp_path, monkeypatch):
    """A minute's schedule with re-ticks every 10 s; returns (the clock, a Lambda context whose
    invocation has `timeout_s` in all)."""
    from tidefleet import triggers

    path = tmp_path / "sandbox.toml"
    path.write_text(path.read_text().replace("tick_s = 2", "tick_s = 60\nwaiting_tick_s = 10", 1))
    lambda_runtime.cache_clear()
    clock = Clock()
    monkeypatch.setattr(triggers, "time", clock)

    def context(timeout_s: float) -> SimpleNamespace:
        deadline = clock.now + timeout_s
        return SimpleNamespace(get_remaining_time_in_millis=lambda: (deadline - clock.now) * 1000)

    return clock, context


def test_a_run_ticks_again_while_items_wait_for_up_to_a_minute(looping):
    clock, context = looping
    put_items(5)
    summary = scaler.handler(event("kick"), context(120))
    # Ticks at 0, 10, ... 50 s: one more would start within a wait of the next scheduled tick.
    assert summary["ticks"] == 6 and clock.slept == [10.0] * 5
    assert group()["DesiredCapacity"] == 3  # the same absolute target each time


def test_a_tick_s_under_a_minute_runs_as_the_minute_its_schedule_fires_at(looping, tmp_path):
    """EventBridge fires at most once a minute: with tick_s = 30 a run still ticks again for the
    minute, and the leave grant lasts until the scheduled tick after next, not 45 s."""
    clock, context = looping
    path = tmp_path / "sandbox.toml"
    path.write_text(path.read_text().replace("tick_s = 60", "tick_s = 30", 1))
    lambda_runtime.cache_clear()
    put_items(5)
    started = clock.now
    assert scaler.handler(event("kick"), context(120))["ticks"] == 6
    grant = DynamoStore("sandbox", REGION).table.get_item(Key={"pk": "POOL#cpu", "sk": "LEAVE"})["Item"]
    assert float(grant["until"]) - float(grant["at"]) == 1.5 * 60 and float(grant["at"]) >= started


def test_a_run_stops_ticking_before_its_time_runs_out(looping):
    _, context = looping
    put_items(5)
    assert scaler.handler(event("schedule"), context(20))["ticks"] == 2  # 10 s left: not a wait + 5 s


def test_a_run_with_nothing_waiting_or_no_context_ticks_once(looping):
    clock, context = looping
    assert scaler.handler(event("schedule"), context(120))["ticks"] == 1
    put_items(5)
    assert scaler.handler(event("schedule"), None)["ticks"] == 1  # called directly: no time known
    assert clock.slept == []


BAD_SCALER_EVENTS = [
    event("malformed"),
    event("unknown"),
    {"tidefleet": "kick"},
    {"tidefleet": "kick", "env": "prod", "reason": "wrong function"},
    "garbage",
    [],
    None,
]


@pytest.mark.parametrize("bad", BAD_SCALER_EVENTS, ids=lambda e: json.dumps(e)[:40])
def test_the_scaler_logs_and_ignores_unknown_or_malformed_events(deployed, bad, caplog):
    put_items(4)  # backlog: a tick would scale out
    with caplog.at_level(logging.WARNING, "tidefleet"):
        result = scaler.handler(bad, None)
    assert set(result) == {"ignored"} and "ignored" in caplog.text
    assert group()["DesiredCapacity"] == 0


class RefusingFleet(AutoScalingFleet):
    """The real adapter, except that IAM refuses SetDesiredCapacity."""

    def set_desired(self, pool, desired):
        raise ClientError({"Error": {"Code": "AccessDenied", "Message": "User: arn:aws:sts::123456789012:assumed-role/"
                                     "tidefleet-sandbox-scaler/x is not authorized to perform: "
                                     "autoscaling:SetDesiredCapacity"}}, "SetDesiredCapacity")  # fmt: skip


@pytest.mark.parametrize("in_function", [True, False], ids=["in-a-function", "outside"])
def test_a_refused_action_fails_the_scalers_invocation_in_one_line_that_names_and_explains_it(
    deployed, monkeypatch, caplog, in_function
):
    """The action's error in the cloud's words, as a failed observe's: in a function, its role's fix."""
    if in_function:
        monkeypatch.setenv("AWS_LAMBDA_FUNCTION_NAME", FUNCTION)
    env, ports = lambda_runtime()
    monkeypatch.setattr(scaler, "lambda_runtime", lambda: (env, dataclasses.replace(ports, fleet=RefusingFleet(env))))
    put_items(3)
    with caplog.at_level(logging.INFO, "tidefleet"), pytest.raises(FunctionFailed) as failed:
        scaler.handler(event("schedule"), None)
    line = str(failed.value)
    denied = ("AccessDenied: User: arn:aws:sts::123456789012:assumed-role/tidefleet-sandbox-scaler/x is not "
              f"authorized to perform: autoscaling:SetDesiredCapacity (region {REGION})")  # fmt: skip
    fix = (f": function {FUNCTION}'s role may not make this call; deploy the environment again (invoke deploy --env sandbox)"
           if in_function else ': this AWS identity may not call autoscaling:SetDesiredCapacity; use one that may '
           '(AWS_PROFILE) or have it allowed (README "What each identity may do")')  # fmt: skip
    assert line == f"some actions failed, the next tick tries them again: cpu: set_desired: {denied}{fix}"
    (error,) = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert error.name == "tidefleet.scaler" and json.loads(error.getMessage()) == {"failed": line}
    assert failed.value.__cause__ is None and failed.value.__suppress_context__


def test_the_tick_command_says_a_refused_action_in_the_clouds_words(deployed, monkeypatch):
    from click.testing import CliRunner

    from tidefleet.cli import main
    from tidefleet.cloud.aws import AwsCloud, aws_ports

    monkeypatch.setattr(AwsCloud, "control_ports", lambda self: dataclasses.replace(aws_ports(self.env),
                                                                                    fleet=RefusingFleet(self.env)))
    put_items(3)
    done = CliRunner().invoke(main, ["tick", "--env", "sandbox"])
    assert done.exit_code == 1 and "Traceback" not in done.output, done.output
    assert ("cpu: set_desired: AccessDenied: User: arn:aws:sts::123456789012:assumed-role/tidefleet-sandbox-scaler/x "
            f"is not authorized to perform: autoscaling:SetDesiredCapacity (region {REGION})") in done.output, done.output


def test_a_kick_with_a_huge_or_non_string_reason_ticks_and_logs_a_short_line(deployed, caplog):
    with caplog.at_level(logging.INFO, "tidefleet.scaler"):
        huge = scaler.handler({"tidefleet": "kick", "env": "sandbox", "reason": "x" * 200_000}, None)
        nested = scaler.handler({"tidefleet": "kick", "env": "sandbox", "reason": {"nested": [1, 2]}}, None)
    assert huge["trigger"] == "kick" and huge["detail"] == f"{'x' * 100}... (200000 characters)"
    assert nested["trigger"] == "kick" and nested["detail"] == "kick (its reason is a dict, not a string)"
    assert max(len(r.getMessage()) for r in caplog.records) < 500


@pytest.mark.parametrize("raw, detail", [
    ({"source": "aws.cloudwatch", "alarmData": {"alarmName": "x" * 1_000_000, "state": {"value": "ALARM"}}},
     f"{'x' * 100}... (1000000 characters) -> ALARM"),
    ({"source": "aws.cloudwatch", "alarmData": {"alarmName": "depth", "state": {"value": "A" * 5000}}},
     f"depth -> {'A' * 100}... (5000 characters)"),
    ({"source": "aws.events", "detail-type": "Scheduled Event", "resources": ["r" * 100_000] * 20},
     f"{'r' * 100}... (2000019 characters)"),
    ({"tidefleet": "fire", "schedule": "n" * 100_000}, f"{'n' * 100}... (100000 characters)"),
], ids=["alarm-name", "alarm-state", "schedule-resources", "fire-name"])  # fmt: skip
def test_an_event_with_huge_text_ticks_and_logs_it_cut_as_a_kicks_reason(deployed, caplog, raw, detail):
    with caplog.at_level(logging.INFO, "tidefleet.scaler"):
        summary = scaler.handler(raw, None)
    assert summary["detail"] == detail
    assert max(len(r.getMessage()) for r in caplog.records) < 500


# -- interruption ---------------------------------------------------------------------------


@pytest.fixture
def kicks(monkeypatch):
    """Where the interruption function's kick lands: the SDK posts to TIDEFLEET_KICK_URL when
    set (as in the sandbox) instead of invoking the scaler function."""
    received: list[dict] = []

    class Receiver(BaseHTTPRequestHandler):
        def do_POST(self):
            received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("TIDEFLEET_KICK_URL", f"http://127.0.0.1:{server.server_address[1]}/kick")
    yield received
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("notice", ["spot_warning", "rebalance"])
def test_a_spot_notice_marks_the_node_draining_and_kicks_the_scaler_for_a_replacement(
    deployed, kicks, notice
):
    (node,) = grow(1)
    heartbeat(node, busy=2)
    put_items(4, receive=2)  # two running on the node, two waiting
    line = interruption.handler(event(notice, node), None)
    assert line["pool"] == "cpu" and line["backlog"] == 4 and line["replacement"].startswith("kicked")
    assert DynamoStore("sandbox", REGION).heartbeats("cpu")[node].draining
    (kick,) = kicks
    assert kick["tidefleet"] == "kick" and kick["env"] == "sandbox" and kick["reason"].startswith("cpu: ")

    scaler.handler(kick, None)  # what the kicked scaler function does
    g = group()
    assert node in {i["InstanceId"] for i in g["Instances"]}  # busy: handed back by its agent, not killed
    assert g["DesiredCapacity"] > 1 and len(g["Instances"]) == g["DesiredCapacity"]


def test_a_notice_without_backlog_kicks_nothing(deployed, kicks):
    (node,) = grow(1)
    heartbeat(node, busy=0)
    line = interruption.handler(event("spot_warning", node), None)
    assert line["backlog"] == 0 and "replacement" not in line and kicks == []


class RecordingFleet(AutoScalingFleet):
    """The real adapter, except CompleteLifecycleAction (moto has none) is recorded."""

    def __init__(self, env):
        super().__init__(env)
        self.completed: list[tuple] = []

    def complete_lifecycle_action(self, pool, instance_id, hook, token):
        self.completed.append((pool, instance_id, hook, token))


@pytest.fixture
def recording(deployed, monkeypatch):
    env, ports = lambda_runtime()
    fleet = RecordingFleet(env)
    monkeypatch.setattr(
        interruption, "lambda_runtime", lambda: (env, Ports(SqsQueues(env), fleet, ports.nodes))
    )
    return fleet


@pytest.mark.parametrize(("busy", "released"), [(0, True), (1, False)])
def test_the_terminate_hook_is_released_only_for_an_idle_node(recording, busy, released):
    (node,) = grow(1)
    heartbeat(node, busy=busy)
    line = interruption.handler(event("lifecycle_terminate", node), None)
    assert DynamoStore("sandbox", REGION).heartbeats("cpu")[node].draining
    expected = [("cpu", node, "tidefleet-sandbox-cpu-drain", "87654321-4321-4321-4321-210987654321")]
    assert recording.completed == (expected if released else [])
    assert ("released" in line) is released and ("held" in line) is not released


def test_the_terminate_hook_is_released_for_a_node_that_never_reported(recording):
    (node,) = grow(1)
    line = interruption.handler(event("lifecycle_terminate", node), None)
    assert line["released"] == "never reported" and len(recording.completed) == 1


@pytest.mark.parametrize(
    "bad",
    [event("malformed"), event("unknown"), event("schedule"), event("kick"), "garbage", None],
    ids=lambda e: json.dumps(e)[:40],
)
def test_the_interruption_function_logs_and_ignores_unknown_or_malformed_events(deployed, bad, caplog):
    grow(1)
    with caplog.at_level(logging.WARNING, "tidefleet"):
        result = interruption.handler(bad, None)
    assert set(result) == {"ignored"} and "ignored" in caplog.text
    assert DynamoStore("sandbox", REGION).heartbeats("cpu") == {} and group()["DesiredCapacity"] == 1


HOOK = "EC2 Instance-terminate Lifecycle Action: "
SPOT = "EC2 Spot Instance Interruption Warning: "


@pytest.mark.parametrize("name, detail, reason", [
    # Fields the function would send to AWS, not as AWS sends them: botocore refused the call after the
    # node was marked draining, and the invocation failed ("cannot reach AWS") and was retried.
    ("lifecycle_terminate", {"LifecycleHookName": {"a": 1}},
     HOOK + "detail.LifecycleHookName is not a hook name (got a dict)"),
    ("lifecycle_terminate", {"LifecycleHookName": "no spaces, please"},
     HOOK + "detail.LifecycleHookName is not a hook name (got 'no spaces, please')"),
    ("lifecycle_terminate", {"LifecycleActionToken": 5},
     HOOK + "detail.LifecycleActionToken is not a lifecycle action token (got an int)"),
    ("lifecycle_terminate", {"LifecycleActionToken": "short"},
     HOOK + "detail.LifecycleActionToken is not a lifecycle action token (got 'short')"),
    # Not an instance id: a DynamoDB key too large (ValidationException), or one the API answers with a 500.
    ("lifecycle_terminate", {"EC2InstanceId": "i-" + "b" * 5000},
     HOOK + f"detail.EC2InstanceId is not an instance id (got 'i-{'b' * 98}... (5002 characters)')"),
    ("lifecycle_terminate", {"EC2InstanceId": "not-an-instance"},
     HOOK + "detail.EC2InstanceId is not an instance id (got 'not-an-instance')"),
    ("spot_warning", {"instance-id": "i-" + "a" * 100_000},
     SPOT + f"detail.instance-id missing or not an instance id (got 'i-{'a' * 98}... (100002 characters)')"),
    ("spot_warning", {"instance-id": "i-'; DROP"}, SPOT + "detail.instance-id missing or not an instance id (got \"i-'; DROP\")"),
    ("lifecycle_terminate", {"AutoScalingGroupName": "g" * 100_000},
     HOOK + f"group '{'g' * 100}... (100000 characters)' is not a pool of environment 'sandbox'"),
], ids=["hook-dict", "hook-pattern", "token-int", "token-short", "hook-id-huge", "hook-id-word", "spot-id-huge",
        "spot-id-chars", "group-huge"])  # fmt: skip
def test_an_interruption_event_with_a_malformed_field_is_one_ignored_line_and_nothing_is_done(
    deployed, caplog, name, detail, reason
):
    (node,) = grow(1)
    raw = event(name, node)
    raw["detail"].update(detail)
    with caplog.at_level(logging.INFO, "tidefleet"):
        result = interruption.handler(raw, None)  # returns: EventBridge does not retry it
    assert result == {"ignored": reason}
    assert [json.loads(r.getMessage()) for r in caplog.records if r.name.startswith("tidefleet")] == [result]
    assert DynamoStore("sandbox", REGION).heartbeats("cpu") == {} and group()["DesiredCapacity"] == 1


@pytest.mark.parametrize("action, reason", [
    ({"x": 1}, "the instance goes in 120s (its instance-action is a dict, not a string)"),
    ("z" * 10_000, f"the instance will {'z' * 100}... (10000 characters) in 120s"),
    ("stop", "the instance will stop in 120s"),
], ids=["dict", "huge", "stop"])  # fmt: skip
def test_a_spot_warnings_instance_action_is_said_checked_and_cut(deployed, caplog, action, reason):
    (node,) = grow(1)
    heartbeat(node, busy=1)
    raw = event("spot_warning", node)
    raw["detail"]["instance-action"] = action
    with caplog.at_level(logging.INFO, "tidefleet"):
        line = interruption.handler(raw, None)
    assert line["reason"] == f"spot interruption warning: {reason}"
    assert DynamoStore("sandbox", REGION).heartbeats("cpu")[node].draining  # a warning still: the node goes
    assert max(len(r.getMessage()) for r in caplog.records) < 500


def test_a_notice_for_an_instance_of_no_tidefleet_group_is_ignored(deployed):
    line = interruption.handler(event("spot_warning", "i-0aaaaaaaaaaaaaaaa"), None)
    assert "no group" in line["ignored"]


def test_a_failed_kick_for_a_replacement_says_when_the_scaler_ticks_anyway(deployed, monkeypatch):
    monkeypatch.setenv("TIDEFLEET_KICK_URL", f"http://127.0.0.1:{free_port()}/kick")  # nothing listens
    (node,) = grow(1)
    heartbeat(node, busy=2)
    put_items(4, receive=2)
    replacement = interruption.handler(event("spot_warning", node), None)["replacement"]
    assert replacement.startswith("warning: could not kick the scaler at TIDEFLEET_KICK_URL=http://127.0.0.1:")
    assert replacement.endswith("its next scheduled tick comes within 2s") and "job" not in replacement


# -- schedule -------------------------------------------------------------------------------


@pytest.fixture
def scheduled(deployed, tmp_path):
    """The sandbox with an hourly schedule; the schedule function's cold start."""
    path = tmp_path / "sandbox.toml"
    path.write_text(path.read_text() + '\n[schedules.hourly]\nrate = "1 hour"\nqueue = "demo"\nitems = ["a"]\n')
    schedule.runtime.cache_clear()
    yield
    schedule.runtime.cache_clear()


@pytest.mark.parametrize("at", ["9999-12-31T23:59:59-14:00", "0001-01-01T00:00:00+14:00", "9998-06-01T00:00:00+00:00",
                                "not a time", None])  # fmt: skip
def test_a_fire_time_the_schedule_function_cannot_use_is_replaced_by_the_time_it_runs(scheduled, at):
    hours = {time.strftime("%Y%m%dt%H00", time.gmtime())}
    fired = schedule.handler({"tidefleet": "fire", "schedule": "hourly"} | ({"at": at} if at else {}), None)
    hours.add(time.strftime("%Y%m%dt%H00", time.gmtime()))  # the run may start as an hour ends
    assert fired["decision"] in {f"submit hourly-{hour}" for hour in hours}


def test_the_schedule_function_says_a_huge_schedule_name_it_ignores_cut(scheduled, caplog):
    with caplog.at_level(logging.WARNING, "tidefleet"):
        ignored = schedule.handler({"tidefleet": "fire", "schedule": "n" * 100_000}, None)
    reason = f"fire for schedule '{'n' * 100}... (100000 characters)', which environment 'sandbox' does not have"
    assert ignored == {"ignored": reason}
    assert [json.loads(r.getMessage()) for r in caplog.records] == [ignored]


def test_the_schedule_function_logs_what_it_ignores_under_its_own_logger(scheduled, caplog):
    with caplog.at_level(logging.WARNING, "tidefleet"):
        assert "ignored" in schedule.handler({"tidefleet": "fire", "schedule": "nope"}, None)
        assert "ignored" in schedule.handler({"tidefleet": "kick", "env": "sandbox"}, None)
    assert [r.name for r in caplog.records] == ["tidefleet.schedules", "tidefleet.schedules"]


# -- clients inside a function --------------------------------------------------------------

FUNCTION = naming.function("sandbox", "scaler")


@pytest.fixture
def cold_start(monkeypatch):
    """A function's cold start as Lambda makes it: AWS_LAMBDA_FUNCTION_NAME set, no boto3
    session yet (this test process's default session is the CLI's)."""
    from tidefleet.cloud import aws as aws_cloud

    def forget() -> None:
        aws_cloud._fail_fast.cache_clear()
        lambda_runtime.cache_clear()
        schedule.runtime.cache_clear()

    monkeypatch.setenv("AWS_LAMBDA_FUNCTION_NAME", FUNCTION)
    monkeypatch.setenv("TIDEFLEET_ENV", "sandbox")
    monkeypatch.delenv("TIDEFLEET_ENVIRONMENTS", raising=False)
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)
    forget()
    yield
    forget()


def test_every_functions_clients_fail_fast_not_with_botocores_defaults(cold_start):
    _, ports = lambda_runtime()  # the scaler's and the interruption function's
    _, cloud = schedule.runtime()
    clients = [ports.fleet.asg, ports.fleet.ec2, ports.queues.sqs, ports.nodes.table.meta.client,
               cloud.store.table.meta.client, cloud.queues.sqs]  # fmt: skip
    for client in clients:
        config = client.meta.config
        assert (config.connect_timeout, config.read_timeout, config.retries) == (
            3, 5, {"mode": "standard", "total_max_attempts": 3}
        ), client.meta.service_model.service_name


def test_a_silent_endpoint_fails_the_scaler_in_one_line_well_within_the_functions_timeout(cold_start, monkeypatch):
    """botocore's defaults (60 s per read, legacy retries: five tries) let one silent call outlast
    the function's timeout, and Lambda would end the tick with no line of ours."""
    failed: list[str] = []

    def invoke() -> None:
        with pytest.raises(FunctionFailed) as caught:
            scaler.handler(event("schedule"), None)
        failed.append(str(caught.value))

    with bad_endpoints.silent() as url:
        for key, value in {**FAKE_CREDENTIALS, "AWS_ENDPOINT_URL": url, "AWS_DEFAULT_REGION": REGION}.items():
            monkeypatch.setenv(key, value)
        started = time.monotonic()
        thread = threading.Thread(target=invoke, daemon=True)
        thread.start()
        thread.join(timeout=40)
        took = time.monotonic() - started
    assert not thread.is_alive(), "still waiting on the silent endpoint after 40 s"
    # The shortest function timeout is the interruption function's 30 s (stacks/aws/functions.py):
    # its cold start and its other calls need the rest.
    assert took < 25, f"took {took:.0f}s"
    (line,) = failed
    assert line == (f"the endpoint {url}/ took the connection but did not answer function {FUNCTION} within 5 s "
                    f"(3 tries); if it persists, see the AWS Health Dashboard for {REGION}")  # fmt: skip


# -- the same tick from a laptop ------------------------------------------------------------


def test_the_tick_command_prints_each_decision_with_its_reasons_and_dry_run_changes_nothing(deployed):
    from click.testing import CliRunner

    from tidefleet.cli import main

    put_items(5)
    result = CliRunner().invoke(main, ["tick", "--env", "sandbox", "--dry-run"])
    assert result.exit_code == 0, result.output
    first, *reasons = result.output.splitlines()
    assert first == "cpu: desired 3 (dry run: nothing changed)"
    assert reasons and all(r.startswith("  - ") for r in reasons) and "demand 5 slots" in result.output
    assert group()["DesiredCapacity"] == 0

    result = CliRunner().invoke(main, ["tick", "--env", "sandbox", "--dry-run", "--json"])
    tick = json.loads(result.output)
    assert result.exit_code == 0 and tick["schema"] == "tidefleet.tick/1" and tick["dry_run"] is True
    (cpu,) = tick["decisions"]
    assert (cpu["pool"], cpu["desired"], cpu["terminate"], cpu["on_demand_base"]) == ("cpu", 3, [], None)
    assert cpu["reasons"] == [r.removeprefix("  - ") for r in reasons], "the same decision as the text"
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith("| `tick --json` |"))
    assert set(cpu) == set(re.findall(r"`(\w+)`", row.split("`decisions` [{")[1].split("}]")[0])), "the README's fields"
    assert tick["failures"] == [] and group()["DesiredCapacity"] == 0

    result = CliRunner().invoke(main, ["tick", "--env", "sandbox", "--pool", "gpu"])
    assert result.exit_code == 2 and "unknown pool(s) gpu; known: cpu" in result.output

    # The environment from $TIDEFLEET_ENV, as every job command takes it (the sandbox's exports set it).
    result = CliRunner().invoke(main, ["tick", "--dry-run"], env={"TIDEFLEET_ENV": "sandbox"})
    assert result.exit_code == 0 and result.output.startswith("cpu: desired 3 (dry run"), result.output
