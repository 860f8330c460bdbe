"""A tick whose job-store reads fail (DynamoDB still throttling a batch read after its retries)
still scales: it decides without what it could not read (`control.WITHOUT`), writes back no mark
decided on a guess, says so in one line per read, and ends in a TickError, never a clean tick.

The real AWS ports against the moto server; moto never throttles, so the store's BatchGetItem of
one kind of queue mark (STATS, WAITING, HELD) is answered at the client's `before-call` hook as
DynamoDB answers a throttled read: every key unprocessed, round after round."""

from __future__ import annotations

import json
import logging
import tomllib
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import boto3
import pytest
from botocore.awsrequest import AWSResponse
from click.testing import CliRunner

from tests import test_control as at_tick
from tests.test_handlers import RefusingFleet
from tidefleet import control, naming
from tidefleet.cli import main
from tidefleet.cloud.aws import AwsCloud, aws_ports, dynamodb
from tidefleet.cloud.aws.provision import provision
from tidefleet.cloud.gcp import firestore
from tidefleet.cloud.memory import MemoryQueues
from tidefleet.config import load_environment, parse_environment
from tidefleet.ports import Backlog
from tidefleet.records import Heartbeat, WaitingMark
from tidefleet.triggers import function_failure_line

ENV = load_environment("sandbox")
GROUP = naming.group(ENV.name, "cpu")
SANDBOX_TOML = Path(__file__).parents[1] / "environments" / "sandbox.toml"
SANDBOX = tomllib.loads(SANDBOX_TOML.read_text())
# The sandbox with its team's quota one node (2 slots): 2 items running and 3 waiting hold its queue.
TEAMS = parse_environment(SANDBOX | {"teams": {"demo": {"quota": {"nodes": 1}}}}, name="sandbox")
# The sandbox at its max (one node) with a preemptible queue below demo's priority (10): a demo
# item waiting while the node is full of a batch attempt has that attempt preempted.
BATCH = {"pool": "cpu", "priority": 1, "preemptible": True, "min_runtime_s": 0, "slots_per_item": 2}
PREEMPTING = parse_environment(
    SANDBOX
    | {
        "pools": {"cpu": SANDBOX["pools"]["cpu"] | {"max": 1}},
        "queues": SANDBOX["queues"] | {"batch": BATCH},
    },
    name="sandbox",
)
# What each read of `observe` asks the table for: the sort key of its records.
MARK = {"mean item times": "STATS", "waiting marks": "WAITING", "hold marks": "HELD"}


@pytest.fixture
def deployed(aws, monkeypatch, request):
    """The sandbox deployed (its cpu group empty; `PREEMPTING` where a test names it), its ports,
    and the sort keys of the records whose batch reads come back unread, every round, without
    sleeping; the unread answers given."""
    env = getattr(request, "param", ENV)
    provision(env, user_data={"cpu": "#!/bin/sh\n"})
    monkeypatch.setattr(dynamodb.time, "sleep", lambda s: None)
    ports = aws_ports(env)
    throttled: set[str] = set()
    unread_answers: list[str] = []

    def answer(params, **_):  # params: the serialized request
        keys = json.loads(params["body"])["RequestItems"][ports.stats.table.name]["Keys"]
        if not any(k["sk"]["S"] in throttled for k in keys):
            return None  # to the moto server
        unread = {ports.stats.table.name: {"Keys": keys, "ConsistentRead": True}}
        unread_answers.append(keys[0]["sk"]["S"])
        return AWSResponse("", 200, {}, None), {"Responses": {}, "UnprocessedKeys": unread}

    ports.stats.table.meta.client.meta.events.register("before-call.dynamodb.BatchGetItem", answer)
    return ports, throttled, unread_answers


def send(items: int, running: int = 0, queue: str = "demo") -> None:
    """`items` waiting in the queue, of which `running` are received (in flight)."""
    sqs = boto3.client("sqs", region_name=ENV.region)
    url = sqs.get_queue_url(QueueName=naming.queue(ENV.name, queue))["QueueUrl"]
    for n in range(items):
        sqs.send_message(QueueUrl=url, MessageBody=str(n))
    if running:
        sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=running, VisibilityTimeout=600)


def desired() -> int:
    asg = boto3.client("autoscaling", region_name=ENV.region)
    (group,) = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[GROUP])["AutoScalingGroups"]
    return group["DesiredCapacity"]


def degraded_tick(env, ports, now: float, caplog) -> tuple[control.TickError, list[str], list]:
    """One tick of the cpu pool that must end in a TickError: (it, the tick's job-store lines,
    the queue views the policy saw)."""
    seen = []
    with caplog.at_level(logging.INFO, logger=control.log.name), pytest.raises(control.TickError) as raised:
        control.tick(env, ports, now, pools=["cpu"], report=lambda fleet, _: seen.extend(fleet.queues))
    lines = [r.getMessage() for r in caplog.records if '"job_store"' in r.getMessage()]
    return raised.value, lines, seen


@pytest.mark.parametrize("read", list(MARK))
def test_a_job_store_read_that_gave_up_degrades_the_tick_which_still_scales_out_and_says_so(
    deployed, caplog, read
):
    ports, throttled, unread_answers = deployed
    throttled.add(MARK[read])
    send(5)
    err, lines, _ = degraded_tick(ENV, ports, datetime.now(UTC).timestamp(), caplog)
    assert desired() == 3  # 5 items, 2 slots a node: the queues and the group were read
    # The reads after one that gave up are not tried (each would spend the store's retries again).
    skipped = list(MARK)[list(MARK).index(read) + 1:]
    assert [where for where, _ in err.failures] == [f"job store: {r} not read, the tick went on without them"
                                                    for r in [read, *skipped]]  # fmt: skip
    cause = err.failures[0][1]
    calls = len(unread_answers)  # the message counts what was done: the first call and its retries
    assert set(unread_answers) == {MARK[read]}  # the store was asked for that read alone
    assert isinstance(cause, dynamodb.Unprocessed)
    assert [str(e) for _, e in err.failures[1:]] == [f"not tried: the store refused the {read} read first this tick"
                                                     for _ in skipped]  # fmt: skip
    assert f"after {calls} BatchGetItem calls ({calls - 1} retries)" in str(cause)
    # One line per read gone without, naming it and what the tick did instead.
    said = [json.loads(x)["job_store"] for x in lines]
    assert said[0].startswith(f"{read} not read: Unprocessed: ")
    assert said[1:] == [f"{r} not read: not tried: the store refused the {read} read first this tick" for r in skipped]
    assert [json.loads(x)["went_on"] for x in lines] == [control.WITHOUT[r] for r in [read, *skipped]]


def test_without_the_waiting_marks_the_tick_ages_nothing_itself_and_leaves_the_marks_as_they_are(
    deployed, caplog
):
    ports, throttled, _ = deployed
    now = datetime.now(UTC).timestamp()
    ports.stats.mark_waiting("demo", WaitingMark(((now - 300, 3),), 0))  # 3 items first seen 5 minutes ago
    send(5)  # 2 more since
    throttled.add("WAITING")
    _, _, (queue,) = degraded_tick(ENV, ports, now, caplog)
    assert (queue.waiting_ages, queue.oldest_age_s) == ((), None)  # SQS says no age: none assumed
    assert desired() == 3
    throttled.clear()
    # Not rewritten with this tick's time: the next tick still sees the 3 as 5 minutes old.
    assert ports.stats.waiting_marks(["demo"]) == {"demo": WaitingMark(((now - 300, 3),), 0)}
    control.tick(ENV, ports, now + 60, pools=["cpu"])
    assert ports.stats.waiting_marks(["demo"]) == {"demo": WaitingMark(((now - 300, 3), (now + 60, 2)), 0)}


@pytest.mark.parametrize(
    ("env", "held_before", "units", "held_once_read"),
    [
        # Its team at its quota (2 running, 3 waiting): a tick that reads the marks holds the queue,
        # and sizes the pool for the running items only.
        (TEAMS, None, 1, "now"),
        # No [teams] (quotas removed) and a hold left: a tick that reads the marks releases it.
        (ENV, 60.0, 3, None),
    ],
    ids=["no hold written", "no release written"],
)
def test_without_the_hold_marks_the_tick_holds_and_releases_nothing_and_still_scales(
    deployed, caplog, env, held_before, units, held_once_read
):
    ports, throttled, _ = deployed
    now = datetime.now(UTC).timestamp()
    if held_before is not None:
        ports.stats.mark_held("demo", now - held_before)
    marks = {} if held_before is None else {"demo": now - held_before}
    send(5, running=2)
    throttled.add("HELD")
    err, _, _ = degraded_tick(env, ports, now, caplog)
    assert desired() == units
    assert all(not d.hold and not d.release for d in err.decisions)
    throttled.clear()
    assert ports.stats.held_since(["demo"]) == marks
    control.tick(env, ports, now + 60, pools=["cpu"])  # the marks read: what the degraded tick held back
    assert ports.stats.held_since(["demo"]) == ({"demo": now + 60} if held_once_read else {})


@pytest.mark.parametrize("deployed", [PREEMPTING], indirect=True)
@pytest.mark.parametrize(
    ("running", "marked", "marked_once_read"),
    [
        # A demo item waits and the node is full of a batch attempt: a tick that reads the hold
        # marks preempts it (demo is not held); one that guesses "nothing held" must not.
        ("j/000000/1", [], ["j/000000/1"]),
        # The marked attempt is gone: a tick that reads the hold marks clears the node's mark.
        (None, ["j/000000/1"], []),
    ],
    ids=["no preempt written", "no mark cleared"],
)
def test_without_the_hold_marks_the_tick_leaves_every_preemption_mark_as_it_is(
    deployed, caplog, running, marked, marked_once_read
):
    ports, throttled, _ = deployed
    now = datetime.now(UTC).timestamp()
    asg = boto3.client("autoscaling", region_name=ENV.region)
    asg.set_desired_capacity(AutoScalingGroupName=GROUP, DesiredCapacity=1)
    (node,) = [i["InstanceId"] for i in asg.describe_auto_scaling_groups(AutoScalingGroupNames=[GROUP])
               ["AutoScalingGroups"][0]["Instances"]]  # fmt: skip
    runs = [{"key": running, "queue": "batch", "since": now - 100, "slots": 2}] if running else []
    ports.nodes.put_heartbeat(Heartbeat(node, "cpu", at=now - 5, slots=2, busy_slots=2 if running else 0,
                                        idle_since=None if running else now - 60, runs=runs))  # fmt: skip
    ports.nodes.set_preempt("cpu", node, marked)
    if running:
        send(1, running=1, queue="batch")
    send(1)
    throttled.add("HELD")
    err, (line,), _ = degraded_tick(PREEMPTING, ports, now, caplog)
    assert all(not d.preempt for d in err.decisions)
    # The policy's own lines still say what it would preempt or clear: one more says none of it was done.
    (decision,) = err.decisions
    assert decision.reasons[-1].startswith("hold marks not read: no hold, release or preemption written this tick")
    assert ports.nodes.heartbeat("cpu", node).preempt == marked
    assert "preemption marks left as they are" in json.loads(line)["went_on"]
    throttled.clear()
    control.tick(PREEMPTING, ports, now + 1, pools=["cpu"])  # the marks read: what the degraded tick left
    assert ports.nodes.heartbeat("cpu", node).preempt == marked_once_read


@pytest.mark.parametrize(
    ("reads", "refused", "head"),
    [
        (True, False, "some job-store reads failed"),  # every pool acted on, without the hold marks
        (False, True, "some actions failed"),
        (True, True, "some actions and job-store reads failed"),
    ],
    ids=["reads", "actions", "both"],
)
def test_a_failed_tick_is_headed_by_what_failed_reads_actions_or_both(
    deployed, monkeypatch, reads, refused, head
):
    """At the CLI (`tidefleet tick`) and in the function's failure line."""
    ports, throttled, _ = deployed
    if reads:
        throttled.add("HELD")
    if refused:
        ports = replace(ports, fleet=RefusingFleet(ENV))
    monkeypatch.setattr(AwsCloud, "control_ports", lambda self: ports)
    monkeypatch.setenv("TIDEFLEET_ENV", ENV.name)
    send(5)
    done = CliRunner().invoke(main, ["tick", "--env", ENV.name])
    assert done.exit_code == 1 and f"Error: {head}:\n" in done.output, done.output
    assert desired() == (0 if refused else 3)
    with pytest.raises(control.TickError) as raised:
        control.tick(ENV, ports, datetime.now(UTC).timestamp(), pools=["cpu"])
    assert function_failure_line(raised.value).startswith(f"{head}, the next tick tries them again: ")


@pytest.mark.parametrize("in_function", [False, True], ids=["outside", "in-a-function"])
def test_a_read_dynamodb_still_throttled_is_said_once_in_its_own_count_of_calls(
    deployed, caplog, monkeypatch, in_function
):
    ports, throttled, unread_answers = deployed
    throttled.add("HELD")
    send(5)
    err, _, _ = degraded_tick(ENV, ports, datetime.now(UTC).timestamp(), caplog)
    monkeypatch.setenv("TIDEFLEET_ENV", ENV.name)
    if in_function:
        monkeypatch.setenv("AWS_LAMBDA_FUNCTION_NAME", naming.function(ENV.name, "scaler"))
    ((_, cause),) = err.failures
    said = cause.response["Error"]["Message"]
    assert f"after {len(unread_answers)} BatchGetItem calls" in said
    assert function_failure_line(err) == (
        "some job-store reads failed, the next tick tries them again: job store: hold marks not read, the "
        f"tick went on without them: ProvisionedThroughputExceededException: {said} (region {ENV.region})"
    )


def test_a_firestore_read_that_gave_up_degrades_the_tick_as_well(caplog):
    """The in-memory store of tests/test_control.py, whose hold read raises Firestore's own
    give-up (the store port is ours): the tick does not depend on which cloud's error a read raises."""

    class GivingUp(MemoryQueues):
        def held_since(self, queues):
            raise firestore.GaveUp("Firestore gave up on the hold marks")

    ports = at_tick.ports(at_tick.group("cpu", 1), backlogs={"demo": Backlog(4, 0)})
    ports = replace(ports, stats=GivingUp())
    err, lines, _ = degraded_tick(at_tick.ENV, ports, at_tick.NOW, caplog)
    assert ("set_desired", "cpu", 2) in ports.fleet.calls
    ((where, _),) = err.failures
    assert where == "job store: hold marks not read, the tick went on without them"
    assert len(lines) == 1 and "GaveUp: Firestore gave up on the hold marks" in lines[0]


def test_a_bad_record_fails_its_own_read_alone_and_the_store_is_still_asked_the_others(caplog):
    """A malformed waiting mark (a ValueError in the adapter's parsing) is no refusal of the store:
    the hold marks are still read, so holds and preemption still work, tick after tick."""

    asked = []

    class BadMark(MemoryQueues):
        def waiting_marks(self, queues):
            raise ValueError("waiting mark of demo: not a number")

        def held_since(self, queues):
            asked.append("held")
            return super().held_since(queues)

    ports = at_tick.ports(at_tick.group("cpu", 1), backlogs={"demo": Backlog(4, 0)})
    ports = replace(ports, stats=BadMark())
    err, lines, _ = degraded_tick(at_tick.ENV, ports, at_tick.NOW, caplog)
    assert [where for where, _ in err.failures] == ["job store: waiting marks not read, the tick went on without them"]
    assert asked == ["held"] and len(lines) == 1
