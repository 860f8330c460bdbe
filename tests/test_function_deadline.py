"""A scaler function's run ends in its own lines before the platform's timeout, however slowly the
cloud answers: the pools its time does not hold are left to the next tick, named in one line and
in the summary, and every pool it began is acted on whole.

Before, nothing bounded a run's ticks as a whole: eight pools whose group calls each failed after
the function client's tries took 138 s on the moto server (a proxy holding Auto Scaling's writes),
past the scaler's 120 s timeout, so Lambda ended it with "Task timed out" and none of our lines.
Here a slow call takes its client's whole time on a fake clock (tests/clock.py), in front of the
real adapters (moto for AWS, tests/gcp_fake.py for GCP).
"""

from __future__ import annotations

import base64
import json
import logging
from types import SimpleNamespace

import boto3
import google.auth
import pytest
import responses
from botocore.exceptions import ReadTimeoutError
from google.auth.credentials import AnonymousCredentials

from lambdas import FunctionFailed
from lambdas.gcp_scaler import main
from lambdas.scaler import handler as scaler
from tests.clock import Clock
from tests.gcp_fake import FakeGcp
from tidefleet import control, naming, policy, triggers
from tidefleet.cloud.aws import ATTEMPTS, FUNCTION_READ_TIMEOUT_S, lambda_runtime
from tidefleet.cloud.aws.dynamodb import DynamoStore
from tidefleet.cloud.aws.provision import provision
from tidefleet.cloud.gcp import function_runtime
from tidefleet.cloud.gcp.calls import RETRY_FOR_S, TRY_S
from tidefleet.cloud.memory import MemoryFleet, MemoryGroup, MemoryNodes, MemoryQueues
from tidefleet.config import parse_environment
from tidefleet.policy.model import PoolDecision
from tidefleet.ports import GroupInstance, Ports

TIMEOUT_S = 120  # both scaler functions' (stacks/aws/functions.py, stacks/gcp/control.py)
# A call that fails after all its tries. AWS: each try's read timeout and standard mode's backoff
# (1 s, then 2 s at most), 18 s (17.2 s measured). GCP: no new try after RETRY_FOR_S, a try TRY_S.
AWS_CALL_S = ATTEMPTS * FUNCTION_READ_TIMEOUT_S + 3
GCP_CALL_S = RETRY_FOR_S + TRY_S
REGION = "us-east-1"
POOL = 'max = 6\ncommand = "work"\nslots_per_unit = 2\n'


def environment(cloud: str, pools: int) -> str:
    """An environment of `pools` pools p0, p1, ..., each with its queue q0, q1, ..."""
    head = {"aws": f'cloud = "aws"\nregion = "{REGION}"\n',
            "gcp": 'cloud = "gcp"\nregion = "us-central1"\nproject = "acme-ml-dev"\n'}[cloud]  # fmt: skip
    itype = {"aws": "c6i.large", "gcp": "n2-standard-4"}[cloud]
    image = 'image = "projects/debian-cloud/global/images/family/debian-12"\n' if cloud == "gcp" else ""
    return (
        head
        + "[scaler]\ntick_s = 60\nscale_out_cooldown_s = 0\n"
        + "".join(
            f'[pools.p{i}]\n{POOL}{image}instance_types = [{{ type = "{itype}" }}]\n[queues.q{i}]\npool = "p{i}"\n'
            for i in range(pools)
        )
    )


def slowly(clock: Clock, seconds: float, call, error: Exception | None = None):
    """`call` on a cloud that answers after `seconds` (on the clock), or then fails with `error`."""

    def answer(*args):
        clock.now += seconds
        if error is not None:
            raise error
        return call(*args)

    return answer


def recorded(calls: list, name: str, call):
    def record(*args):
        calls.append((name, *args))
        return call(*args)

    return record


@pytest.fixture(autouse=True)
def no_left_over(monkeypatch):
    """A new process: no pools an earlier tick (another test's) left to this one."""
    monkeypatch.setattr(control, "_LEFT_OVER", {})


def cut_lines(caplog) -> list[dict]:
    return [json.loads(r.getMessage()) for r in caplog.records
            if r.name == "tidefleet.control" and "out_of_time" in r.getMessage()]  # fmt: skip


# -- AWS --------------------------------------------------------------------------------------


@pytest.fixture
def aws_pools(aws, tmp_path, monkeypatch):
    """Eight pools on the moto server, three items waiting for each (two nodes); the run's clock.
    Returns (clock, the function's ports, a function that gives an invocation's Lambda context)."""
    (tmp_path / "many.toml").write_text(environment("aws", 8))
    monkeypatch.setenv("TIDEFLEET_ENVIRONMENTS", str(tmp_path))
    monkeypatch.setenv("TIDEFLEET_ENV", "many")
    lambda_runtime.cache_clear()
    env, ports = lambda_runtime()
    provision(env, user_data={p: "#!/bin/sh\n" for p in env.pools})
    sqs = boto3.client("sqs", region_name=REGION)
    for queue in env.queues:
        url = sqs.get_queue_url(QueueName=naming.queue("many", queue))["QueueUrl"]
        sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": str(n), "MessageBody": "{}"} for n in range(3)])
    clock = Clock()
    monkeypatch.setattr(triggers, "time", clock)

    def invocation() -> SimpleNamespace:  # TIMEOUT_S from now
        deadline = clock.now + TIMEOUT_S
        return SimpleNamespace(get_remaining_time_in_millis=lambda: (deadline - clock.now) * 1000)

    yield clock, ports, invocation
    lambda_runtime.cache_clear()


def desired() -> dict[str, int]:
    groups = boto3.client("autoscaling", region_name=REGION).describe_auto_scaling_groups()[
        "AutoScalingGroups"
    ]
    return {g["AutoScalingGroupName"].removeprefix("tidefleet-many-"): g["DesiredCapacity"] for g in groups}


def test_a_run_past_the_timeout_acts_on_the_pools_its_time_holds_and_names_the_rest(
    aws_pools, monkeypatch, caplog
):
    clock, ports, invocation = aws_pools
    monkeypatch.setattr(ports.fleet, "set_desired", slowly(clock, AWS_CALL_S, ports.fleet.set_desired))
    started = clock.now
    with caplog.at_level(logging.INFO, "tidefleet"):
        summary = scaler.handler({"tidefleet": "kick", "env": "many"}, invocation())
    # Eight pools of 18 s are 144 s; a pool starts while its 18 s and the 5 s margin are left.
    assert clock.now - started == 6 * AWS_CALL_S < TIMEOUT_S
    why = ("12 s left of the function's timeout: a pool's act took up to 18 s in this run, and 5 s are kept for "
           "its own lines; the next tick handles them")  # fmt: skip
    assert cut_lines(caplog) == [{"skipped": ["p6", "p7"], "out_of_time": why}]
    assert (summary["skipped"], summary["out_of_time"], summary["desired"]) == (
        ["p6", "p7"], why, {f"p{i}": 2 for i in range(6)})  # fmt: skip
    # The pools acted on, whole: their desired capacity, their decision's line, their leave grant.
    assert desired() == {f"p{i}": 2 if i < 6 else 0 for i in range(8)}
    lines = [
        json.loads(r.getMessage())["pool"] for r in caplog.records if '"desired_before"' in r.getMessage()
    ]
    assert lines == [f"p{i}" for i in range(6)]
    table = DynamoStore("many", REGION).table
    granted = [p for p in desired() if "Item" in table.get_item(Key={"pk": f"POOL#{p}", "sk": "LEAVE"})]
    assert sorted(granted) == [f"p{i}" for i in range(6)]


def test_a_run_whose_calls_fail_slowly_fails_in_its_own_line_and_the_next_begins_with_the_pools_it_skipped(
    aws_pools, monkeypatch
):
    clock, ports, invocation = aws_pools
    silent = ReadTimeoutError(endpoint_url=f"https://autoscaling.{REGION}.amazonaws.com/")
    monkeypatch.setattr(
        ports.fleet, "set_desired", slowly(clock, AWS_CALL_S, ports.fleet.set_desired, silent)
    )
    failed = []
    for _ in range(2):
        started = clock.now
        with pytest.raises(FunctionFailed) as raised:
            scaler.handler({"tidefleet": "kick", "env": "many"}, invocation())
        assert clock.now - started < TIMEOUT_S
        failed.append(str(raised.value))
    why = ("12 s left of the function's timeout: a pool's act took up to 18 s in this run, and 5 s are kept for "
           "its own lines; the next tick handles them")  # fmt: skip
    tried = [[p for p in desired() if f" {p}: set_desired: " in line] for line in failed]
    assert tried == [["p0", "p1", "p2", "p3", "p4", "p5"], ["p0", "p1", "p2", "p3", "p6", "p7"]]
    assert failed[0].startswith("some actions failed, the next tick tries them again: p0: set_desired: ")
    assert failed[0].endswith(f"; out of time, skipped pools p6, p7: {why}")
    assert failed[1].startswith("some actions failed, the next tick tries them again: p6: set_desired: ")
    assert failed[1].endswith(f"; out of time, skipped pools p4, p5: {why}")


def test_a_run_with_ample_time_acts_on_every_pool_and_ticks_again_as_before(aws_pools, caplog):
    clock, _, invocation = aws_pools
    ran = {"trigger": "kick", "detail": "kick", "env": "many", "desired": {f"p{i}": 2 for i in range(8)},
           "terminated": 0, "ms": 0}  # fmt: skip
    with caplog.at_level(logging.INFO, "tidefleet"):
        assert scaler.handler({"tidefleet": "kick", "env": "many"}, invocation()) == ran | {"ticks": 6}
        assert scaler.handler({"tidefleet": "kick", "env": "many"}, None) == ran | {"ticks": 1}  # no deadline
    assert clock.slept == [10.0] * 5 and not cut_lines(caplog)  # items wait: every 10 s for a minute


# -- GCP --------------------------------------------------------------------------------------


def gcp_event(payload: dict) -> SimpleNamespace:
    return SimpleNamespace(
        data={"message": {"data": base64.b64encode(json.dumps(payload).encode()).decode()}}
    )


@pytest.fixture
def gcp_pools(monkeypatch, tmp_path):
    """Six pools of a cold-started GCP function (its real clients on tests/gcp_fake.py), three
    items waiting for each; the function's clock. Returns (clock, the fake, the function's ports)."""
    (tmp_path / "gcp-many.toml").write_text(environment("gcp", 6))
    monkeypatch.setenv("TIDEFLEET_ENVIRONMENTS", str(tmp_path))
    monkeypatch.setenv("TIDEFLEET_ENV", "gcp-many")
    monkeypatch.setattr(google.auth, "default", lambda *a, **k: (AnonymousCredentials(), "acme-ml-dev"))
    clock = Clock()
    monkeypatch.setattr(triggers, "time", clock)
    monkeypatch.setattr(main, "time", clock)  # the request's start, which its timeout counts from
    function_runtime.cache_clear()
    with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
        fake = FakeGcp("acme-ml-dev", "us-central1")
        fake.install(mock)
        for i in range(6):
            fake.groups |= {
                naming.group("gcp-many", f"p{i}"): 0,
                naming.on_demand_group("gcp-many", f"p{i}"): 0,
            }
            fake.undelivered[naming.queue("gcp-many", f"q{i}")] = 3
        yield clock, fake, function_runtime()[1]
    function_runtime.cache_clear()


def test_the_gcp_function_acts_on_the_pools_its_timeout_holds_and_names_the_rest(
    gcp_pools, monkeypatch, caplog
):
    clock, fake, ports = gcp_pools
    monkeypatch.setenv("TIDEFLEET_TIMEOUT_S", str(TIMEOUT_S))
    monkeypatch.setattr(ports.fleet, "set_desired", slowly(clock, GCP_CALL_S, ports.fleet.set_desired))
    started = clock.now
    with caplog.at_level(logging.INFO, "tidefleet"):
        summary = main.on_kick(gcp_event({"tidefleet": "schedule"}))
    # Six pools of 28 s are 168 s; the fifth would start with 8 s left.
    assert clock.now - started == 4 * GCP_CALL_S < TIMEOUT_S
    assert summary["skipped"] == ["p4", "p5"] and summary["desired"] == {f"p{i}": 2 for i in range(4)}
    assert summary["out_of_time"] == ("8 s left of the function's timeout: a pool's act took up to 28 s in this "
                                      "run, and 5 s are kept for its own lines; the next tick handles them")  # fmt: skip
    assert [line["skipped"] for line in cut_lines(caplog)] == [["p4", "p5"]]
    assert {name: size for name, size in fake.groups.items() if not name.endswith("-od")} == {
        naming.group("gcp-many", f"p{i}"): 2 if i < 4 else 0 for i in range(6)
    }


def test_the_gcp_function_without_its_timeout_acts_on_every_pool_however_long_it_takes(
    gcp_pools, monkeypatch
):
    clock, _, ports = gcp_pools
    monkeypatch.delenv("TIDEFLEET_TIMEOUT_S", raising=False)
    monkeypatch.setattr(ports.fleet, "set_desired", slowly(clock, GCP_CALL_S, ports.fleet.set_desired))
    summary = main.on_kick(gcp_event({"tidefleet": "schedule"}))
    assert summary["desired"] == {f"p{i}": 2 for i in range(6)} and "skipped" not in summary


# -- a pool begun is acted on whole -----------------------------------------------------------

ENV = parse_environment(
    {"region": REGION, "pools": {"cpu": {"max": 6, "command": "work", "instance_types": [{"type": "c6i.large"}]},
                                 "gpu": {"max": 6, "command": "work", "instance_types": [{"type": "g5.xlarge"}]}},
     "queues": {"demo": {"pool": "cpu"}, "train": {"pool": "gpu"}}},
    name="t",
)  # fmt: skip


def test_terminations_that_use_up_the_time_are_still_followed_by_their_pools_base_and_desired(
    monkeypatch, caplog
):
    """Cut after them, the on-demand base would stay unset and desired as the decrements left it (2,
    not the replacement's 3); the deadline is only checked between two pools."""
    instances = [
        GroupInstance(f"i-{n}", "c6i.large", "InService", True, 0.0, protected=False) for n in range(3)
    ]
    fleet = MemoryFleet({"cpu": MemoryGroup("tidefleet-t-cpu", desired=3, max=6, instances=instances),
                         "gpu": MemoryGroup("tidefleet-t-gpu", desired=0, max=6)})  # fmt: skip
    clock = Clock()
    end = clock.now + TIMEOUT_S
    monkeypatch.setattr(fleet, "terminate", slowly(clock, TIMEOUT_S - 3, fleet.terminate))
    calls = []
    for name in ("set_on_demand_base", "set_desired"):
        monkeypatch.setattr(fleet, name, recorded(calls, name, getattr(fleet, name)))
    decisions = (
        PoolDecision("cpu", 3, ("i-0",), 1, ("replace i-0",)),
        PoolDecision("gpu", 2, (), None, ("scale out",)),
    )
    monkeypatch.setattr(policy, "decide", lambda env, fleet, now: decisions)
    deadline = control.Deadline(lambda: end - clock.now, margin_s=5)
    ports = Ports(queues=MemoryQueues(), fleet=fleet, nodes=MemoryNodes(), stats=MemoryQueues())
    with caplog.at_level(logging.INFO, "tidefleet"):
        acted = control.tick(ENV, ports, clock.now, deadline=deadline)
    assert [d.pool for d in acted] == ["cpu"]
    assert calls == [("set_on_demand_base", "cpu", 1), ("set_desired", "cpu", 3)]
    cpu, gpu = fleet.groups_["cpu"], fleet.groups_["gpu"]
    assert (cpu.desired, cpu.on_demand_base, gpu.desired) == (3, 1, 0)
    # The leave grants did not fit either: not begun, and named in the same line.
    why = ("3 s left of the function's timeout: a pool's act took up to 117 s in this run, and 5 s are kept for "
           "its own lines; the next tick handles them")  # fmt: skip
    assert cut_lines(caplog) == [{"skipped": ["gpu"], "out_of_time": why, "not_written": ["leave grants"]}]
    assert ports.nodes.leave == {}


def test_a_slow_observe_still_leaves_time_for_the_pools_acts(monkeypatch):
    """The observe is several rounds of calls (one at a time on GCP): taken whole as a step's
    estimate, a 58-s observe left every pool unacted, tick after tick."""
    fleet = MemoryFleet({"cpu": MemoryGroup("tidefleet-t-cpu", desired=0, max=6),
                         "gpu": MemoryGroup("tidefleet-t-gpu", desired=0, max=6)})  # fmt: skip
    clock = Clock()
    end = clock.now + TIMEOUT_S
    observe = control.observe
    monkeypatch.setattr(control, "observe", lambda *args: (setattr(clock, "now", clock.now + 58), observe(*args))[1])
    decisions = (PoolDecision("cpu", 2, (), None, ("scale out",)), PoolDecision("gpu", 1, (), None, ("scale out",)))
    monkeypatch.setattr(policy, "decide", lambda env, fleet, now: decisions)
    deadline = control.Deadline(lambda: end - clock.now, margin_s=5)
    ports = Ports(queues=MemoryQueues(), fleet=fleet, nodes=MemoryNodes(), stats=MemoryQueues())
    acted = control.tick(ENV, ports, clock.now, deadline=deadline)
    assert [d.pool for d in acted] == ["cpu", "gpu"] and deadline.cut is None
    assert (fleet.groups_["cpu"].desired, fleet.groups_["gpu"].desired) == (2, 1)


def test_a_cut_leaves_a_growing_pool_rather_than_the_terminations_the_cost_cap_counted_on(monkeypatch):
    """The environment's cost cap lets a pool grow on the money another pool's terminations free:
    those go first, so a cut never leaves the launches done and the terminations undone."""
    instances = [GroupInstance("i-0", "g5.xlarge", "InService", True, 0.0, protected=False)]
    fleet = MemoryFleet({"cpu": MemoryGroup("tidefleet-t-cpu", desired=0, max=6),
                         "gpu": MemoryGroup("tidefleet-t-gpu", desired=1, max=6, instances=instances)})  # fmt: skip
    clock = Clock()
    end = clock.now + TIMEOUT_S
    monkeypatch.setattr(fleet, "set_desired", slowly(clock, TIMEOUT_S - 10, fleet.set_desired))
    decisions = (  # the policy's order: the growing pool first
        PoolDecision("cpu", 4, (), None, ("scale out on what gpu's termination frees",)),
        PoolDecision("gpu", 0, ("i-0",), None, ("idle",)),
    )
    monkeypatch.setattr(policy, "decide", lambda env, fleet, now: decisions)
    deadline = control.Deadline(lambda: end - clock.now, margin_s=5)
    ports = Ports(queues=MemoryQueues(), fleet=fleet, nodes=MemoryNodes(), stats=MemoryQueues())
    acted = control.tick(ENV, ports, clock.now, deadline=deadline)
    assert [d.pool for d in acted] == ["gpu"] and deadline.cut["skipped"] == ["cpu"]
    assert (fleet.groups_["gpu"].desired, fleet.groups_["cpu"].desired) == (0, 0)
