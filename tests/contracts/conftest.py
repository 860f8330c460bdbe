"""Every adapter of every port, as one fixture per port parametrized by adapter: a contract test
is written once against the port and runs on each. A new adapter (a new cloud, the in-memory
fleet) is one more entry in that port's table below, and it is done when the suite passes.

AWS adapters run against the moto server (tests/conftest.py), provisioned as the sandbox does;
GCP adapters through the real google-cloud clients against tests/gcp_fake.py. Where an adapter
genuinely differs, its entry says so in a capability field, and the test branches on that field,
never on the adapter's name.

moto gaps met here, both answered at the fleet's boto3 client `before-call` hook, for that one
call only (every other call goes to the moto server): DescribeScalingActivities always answers
an empty list, so a failed spot launch is answered in AWS's documented shape; and
CompleteLifecycleAction is not implemented, so its request is recorded and answered empty.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import boto3
import google.auth
import pytest
import responses
from botocore.awsrequest import AWSResponse
from google.auth.credentials import AnonymousCredentials

from tests.gcp_fake import FakeGcp, FakeVm
from tidefleet import naming
from tidefleet.cloud import for_env
from tidefleet.cloud.aws.dynamodb import create_table
from tidefleet.cloud.aws.provision import create_queues, provision
from tidefleet.cloud.memory import MemoryNodes
from tidefleet.config import Environment, load_environment
from tidefleet.ports import FleetPort, ItemLogs, JobStore, NodeStatePort, QueuePort, WorkQueues
from tidefleet.records import Heartbeat
from tidefleet.resources import redrive_receives

AWS_ENV = load_environment("sandbox")
GCP_ENV = load_environment("gcp-dev")


# -- the clouds under the adapters ----------------------------------------------------------
@pytest.fixture
def moto_env(aws):
    """The sandbox environment's resources on a clean moto account (the fleet needs them all)."""
    provision(AWS_ENV, user_data={pool: "#!/bin/sh\n" for pool in AWS_ENV.pools})
    return AWS_ENV


ENV_NAMES = itertools.count()


@pytest.fixture
def moto_fresh_env(moto_server, monkeypatch) -> Environment:
    """The sandbox environment under a name of its own on the shared moto account: a store, a
    queue or a log group needs nothing else, and a reset plus a whole provisioning would cost
    more than those tests themselves."""
    for key, value in moto_server.env().items():
        monkeypatch.setenv(key, value)
    return AWS_ENV.model_copy(update={"name": f"contract-{next(ENV_NAMES)}"})


@pytest.fixture
def gcp(monkeypatch):
    """The gcp-dev environment on the fake: its queues' topics and subscriptions, empty groups."""
    # Application default credentials are the only thing not real: no Google account here.
    monkeypatch.setattr(google.auth, "default", lambda *a, **k: (AnonymousCredentials(), GCP_ENV.project))
    fake = FakeGcp(GCP_ENV.project, GCP_ENV.region)
    for name, queue in GCP_ENV.queues.items():
        fake.add_queue(naming.queue(GCP_ENV.name, name), ack_deadline_s=queue.visibility_timeout_s,
                       max_delivery_attempts=redrive_receives("gcp", queue))  # fmt: skip
    with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
        fake.install(mock)
        yield fake


def adapter(name: str, table: dict[str, Callable]):
    """The fixture `name` over `table` (adapter name -> builder(request)): one param per adapter."""

    @pytest.fixture(name=name, params=sorted(table))
    def fixture(request):
        return table[request.param](request)

    return fixture


def rfc3339(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# -- JobStore -------------------------------------------------------------------------------
@dataclass
class StoreUnderTest:
    store: JobStore
    other: Callable[[], JobStore]  # another client of the same store: another node, another tick
    before_next_write: Callable[[Callable[[], None]], None]  # run this between the adapter's read and its write
    errors: tuple[type[BaseException], ...]


def _dynamodb(request) -> StoreUnderTest:
    env = request.getfixturevalue("moto_fresh_env")
    create_table(env.name, env.region)
    cloud = for_env(env)
    client = cloud.store.table.meta.client

    def before_next_write(fn):
        def once(**_):
            for write in ("UpdateItem", "TransactWriteItems"):  # a settling write is a transaction
                client.meta.events.unregister(f"before-call.dynamodb.{write}", once)
            fn()

        for write in ("UpdateItem", "TransactWriteItems"):
            client.meta.events.register(f"before-call.dynamodb.{write}", once)

    return StoreUnderTest(cloud.store, lambda: for_env(env).store, before_next_write, cloud.errors)


def _firestore(request) -> StoreUnderTest:
    fake = request.getfixturevalue("gcp")
    cloud = for_env(GCP_ENV)
    return StoreUnderTest(cloud.store, lambda: for_env(GCP_ENV).store, fake.before_write.append, cloud.errors)


STORES = {"dynamodb": _dynamodb, "firestore": _firestore}
store = adapter("store", STORES)


# -- NodeStatePort ------------------------------------------------------------------------------
@dataclass
class NodesUnderTest:
    nodes: NodeStatePort
    beat: Callable[[Heartbeat], None]  # the agent's heartbeat write
    env: Environment  # the environment the store serves, whose pools a tick reads


def _dynamodb_nodes(request) -> NodesUnderTest:
    s = _dynamodb(request).store
    return NodesUnderTest(s, s.put_heartbeat, request.getfixturevalue("moto_fresh_env"))


def _firestore_nodes(request) -> NodesUnderTest:
    s = _firestore(request).store
    return NodesUnderTest(s, s.put_heartbeat, GCP_ENV)


def _memory_nodes(request) -> NodesUnderTest:
    nodes = MemoryNodes()
    return NodesUnderTest(nodes, nodes.record, AWS_ENV)


NODE_STATES = {"dynamodb": _dynamodb_nodes, "firestore": _firestore_nodes, "memory": _memory_nodes}
node_state = adapter("node_state", NODE_STATES)


# -- WorkQueues -----------------------------------------------------------------------------
@dataclass
class QueuesUnderTest:
    queues: WorkQueues
    queue: str  # a deployed queue (its config name)
    lease_s: int  # the queue's own lease, as deployed
    redrive_receives: int  # deliveries after which the queue itself dead-letters a message
    # Pub/Sub sets a delivery attempt only on a subscription with a dead-letter policy, which the
    # dead-letter subscription has not: every delivery from it reads as a first one.
    counts_dead_letter_deliveries: bool
    pass_time: Callable[[float], None]
    errors: tuple[type[BaseException], ...]
    # The queue's next send answers, but takes the last body of its batch only in part or not at
    # all (SQS: a Failed entry of SendMessageBatch, a transient InternalError; Pub/Sub: fewer ids).
    refuse_in_part: Callable[[], None]


def _sqs(request) -> QueuesUnderTest:
    env = request.getfixturevalue("moto_fresh_env")
    create_queues(env)
    cloud, (name, queue) = for_env(env), next(iter(env.queues.items()))
    sqs = cloud.queues.sqs

    def refuse_in_part() -> None:
        real = sqs.send_message_batch

        def send_message_batch(*, Entries, **request):
            sqs.send_message_batch = real
            answer = real(Entries=Entries[:-1], **request) if len(Entries) > 1 else {}
            refused = {"Id": Entries[-1]["Id"], "SenderFault": False, "Code": "InternalError",
                       "Message": "We encountered an internal error. Please try again."}  # fmt: skip
            return {**answer, "Failed": [*answer.get("Failed", []), refused]}

        sqs.send_message_batch = send_message_batch

    return QueuesUnderTest(cloud.queues, name, queue.visibility_timeout_s, redrive_receives(cloud.name, queue),
                           counts_dead_letter_deliveries=True, pass_time=time.sleep, errors=cloud.errors,
                           refuse_in_part=refuse_in_part)  # fmt: skip


def _pubsub(request) -> QueuesUnderTest:
    fake = request.getfixturevalue("gcp")
    cloud, (name, queue) = for_env(GCP_ENV), next(iter(GCP_ENV.queues.items()))

    def pass_time(seconds: float) -> None:
        fake.clock_offset += seconds

    def refuse_in_part() -> None:
        fake.short_publishes += 1

    return QueuesUnderTest(cloud.queues, name, queue.visibility_timeout_s, redrive_receives(cloud.name, queue),
                           counts_dead_letter_deliveries=False, pass_time=pass_time, errors=cloud.errors,
                           refuse_in_part=refuse_in_part)  # fmt: skip


QUEUES = {"sqs": _sqs, "pubsub": _pubsub}
work_queues = adapter("work_queues", QUEUES)


# -- ItemLogs -------------------------------------------------------------------------------
def _cloudwatch(request) -> ItemLogs:
    env = request.getfixturevalue("moto_fresh_env")
    boto3.client("logs", region_name=env.region).create_log_group(logGroupName=naming.item_log_group(env.name))
    return for_env(env).logs


def _cloud_logging(request) -> ItemLogs:
    fake = request.getfixturevalue("gcp")
    fake.log_page = 2  # reading back crosses pages
    return for_env(GCP_ENV).logs


LOGS = {"cloudwatch": _cloudwatch, "cloud-logging": _cloud_logging}
item_logs = adapter("item_logs", LOGS)


# -- FleetPort and QueuePort ------------------------------------------------------------------
@dataclass
class FleetUnderTest:
    fleet: FleetPort
    backlog: QueuePort
    pool: str
    queue: str  # a queue of the pool
    group: str  # what GroupState.name and group_of say for the pool's (spot) group
    min: int
    max: int
    instance_types: tuple[str, ...]
    launch: Callable[[int], list[str]]  # n more instances in service; their ids
    settle: Callable[[], list[str]]  # the group brings up what its sizes say; the ids in service
    wait: Callable[[int], None]  # n messages waiting in the queue
    spot_launch_failed: Callable[[float], None]  # the cloud reports a failed spot launch started then
    # The drain hook releases sent to the cloud, or None where there are no hooks (GCE): there
    # complete_lifecycle_action has nothing to release.
    hook_releases: list[dict] | None


def _auto_scaling(request) -> FleetUnderTest:
    request.getfixturevalue("moto_env")
    env, pool = AWS_ENV, "cpu"
    group = naming.group(env.name, pool)
    ports = for_env(env).control_ports()
    autoscaling = boto3.client("autoscaling", region_name=env.region)
    sqs = boto3.client("sqs", region_name=env.region)
    queue = next(name for name, q in env.queues.items() if q.pool == pool)
    failures: list[dict] = []

    def launch(n: int) -> list[str]:
        before = {i.id for i in ports.fleet.groups([pool], 0)[pool].instances}
        desired = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[group])["AutoScalingGroups"][0]
        autoscaling.set_desired_capacity(AutoScalingGroupName=group, DesiredCapacity=desired["DesiredCapacity"] + n)
        return sorted({i.id for i in ports.fleet.groups([pool], 0)[pool].instances} - before)

    def settle() -> list[str]:  # moto launches at once
        return sorted(i.id for i in ports.fleet.groups([pool], 0)[pool].instances if i.lifecycle_state == "InService")

    def wait(n: int) -> None:
        url = sqs.get_queue_url(QueueName=naming.queue(env.name, queue))["QueueUrl"]
        for k in range(n):
            sqs.send_message(QueueUrl=url, MessageBody=str(k))

    def spot_launch_failed(at: float) -> None:
        message = "Could not launch Spot Instances. InsufficientInstanceCapacity - There is no Spot capacity available."
        failures.insert(0, {"ActivityId": f"a-{len(failures)}", "AutoScalingGroupName": group, "Cause": "c",
                            "Progress": 100, "StartTime": datetime.fromtimestamp(at, UTC), "StatusCode": "Failed",
                            "StatusMessage": message, "Description": f"Launching a new EC2 instance. Status Reason: {message}"})  # fmt: skip

    def activities(**_):  # moto answers none: AWS's answer, newest first
        return AWSResponse("", 200, {}, None), {"Activities": list(failures)}

    releases: list[dict] = []

    def release(params, **_):  # moto has no CompleteLifecycleAction: AWS's empty answer
        releases.append(params["body"])
        return AWSResponse("", 200, {}, None), {}

    ports.fleet.asg.meta.events.register("before-call.autoscaling.DescribeScalingActivities", activities)
    ports.fleet.asg.meta.events.register("before-call.autoscaling.CompleteLifecycleAction", release)
    pool_config = env.pools[pool]
    return FleetUnderTest(ports.fleet, ports.queues, pool, queue, group, pool_config.min, pool_config.max,
                          tuple(t.type for t in pool_config.instance_types), launch, settle, wait, spot_launch_failed,
                          hook_releases=releases)  # fmt: skip


def _managed_instance_groups(request) -> FleetUnderTest:
    fake = request.getfixturevalue("gcp")
    env, pool = GCP_ENV, "cpu"
    spot, on_demand = naming.group(env.name, pool), naming.on_demand_group(env.name, pool)
    fake.groups |= {spot: 0, on_demand: 0}
    ports = for_env(env).control_ports()
    queue = next(name for name, q in env.queues.items() if q.pool == pool)
    launched = iter(range(10_000))

    def launch(n: int) -> list[str]:  # what the group does after a resize: its VMs come up
        vms = [FakeVm(f"{spot}-{next(launched):04x}") for _ in range(n)]
        fake.vms.setdefault(spot, []).extend(vms)
        fake.groups[spot] += n
        return sorted(vm.name for vm in vms)

    def settle() -> list[str]:
        for name in (spot, on_demand):
            vms = fake.vms.setdefault(name, [])
            live = [vm for vm in vms if vm.action != "DELETING"]
            vms += [FakeVm(f"{name}-{next(launched):04x}") for _ in range(fake.groups[name] - len(live))]
        return sorted(vm.name for name in (spot, on_demand) for vm in fake.vms[name] if vm.action == "NONE")

    def wait(n: int) -> None:
        fake.undelivered[naming.queue(env.name, queue)] = n

    def spot_launch_failed(at: float) -> None:
        fake.errors.setdefault(spot, []).append(
            {"timestamp": rfc3339(at), "error": {"code": "ZONE_RESOURCE_POOL_EXHAUSTED", "message": "no Spot capacity"}})

    pool_config = env.pools[pool]
    return FleetUnderTest(ports.fleet, ports.queues, pool, queue, spot, pool_config.min, pool_config.max,
                          tuple(t.type for t in pool_config.instance_types), launch, settle, wait, spot_launch_failed,
                          hook_releases=None)  # fmt: skip


FLEETS = {"auto-scaling": _auto_scaling, "managed-instance-groups": _managed_instance_groups}
fleet = adapter("fleet", FLEETS)
