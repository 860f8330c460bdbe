"""The boto3 adapters against the moto server, and what moto lacks (worked around honestly).

moto 5.2 gaps met here:
- DescribeScalingActivities always answers an empty list, so a failed spot launch cannot be
  produced on the server: its parsing is tested on a Stubber-fed client with the shape AWS
  documents.
- Instances launch on demand (no InstanceLifecycle) and all of the first override's type.
- TerminateInstanceInAutoScalingGroup on an unknown instance is a server error (AWS answers
  a ValidationError): the adapter re-reads membership first, which is what makes a repeat a
  no-op on both.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

import boto3
import pytest
from botocore.awsrequest import AWSResponse
from botocore.exceptions import ClientError
from botocore.stub import Stubber

from tidefleet import control, naming
from tidefleet.cloud.aws import AutoScalingFleet, QueueMissing, SqsQueues, aws_ports, dynamodb
from tidefleet.cloud.aws.dynamodb import DynamoStore
from tidefleet.cloud.aws.provision import provision
from tidefleet.config import load_environment
from tidefleet.ports import Backlog
from tidefleet.records import Item, ItemWrite, Job

ENV = load_environment("sandbox")
GROUP = naming.group("sandbox", "cpu")


LISTED = {
    "AutoScalingInstances": [
        {
            "InstanceId": "i-0aaaaaaaaaaaaaaaa",
            "InstanceType": "c6i.large",
            "AutoScalingGroupName": GROUP,
            "AvailabilityZone": "us-east-1a",
            "LifecycleState": "InService",
            "HealthStatus": "Healthy",
            "ProtectedFromScaleIn": False,
        }
    ]
}


def offline_client():
    """For answers moto cannot give: a client fed by botocore's Stubber, never on the network."""
    return boto3.client(
        "autoscaling", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x"
    )


@pytest.fixture
def cloud(aws):
    provision(ENV, user_data={"cpu": "#!/bin/sh\n"})
    return aws


def grow(desired: int) -> list[str]:
    asg = boto3.client("autoscaling", region_name=ENV.region)
    asg.set_desired_capacity(AutoScalingGroupName=GROUP, DesiredCapacity=desired)
    return [
        i["InstanceId"]
        for i in asg.describe_auto_scaling_groups(AutoScalingGroupNames=[GROUP])["AutoScalingGroups"][0][
            "Instances"
        ]
    ]


def test_backlog_counts_visible_and_in_flight_items_from_the_queue_itself(cloud):
    sqs = boto3.client("sqs", region_name=ENV.region)
    url = sqs.get_queue_url(QueueName=naming.queue("sandbox", "demo"))["QueueUrl"]
    for n in range(5):
        sqs.send_message(QueueUrl=url, MessageBody=str(n))
    sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=2)
    assert SqsQueues(ENV).backlog("demo") == Backlog(visible=3, in_flight=2)


def test_a_missing_queue_names_the_queue_and_the_fix(aws):
    with pytest.raises(
        QueueMissing,
        match=r"queues.demo: SQS queue 'tidefleet-sandbox-demo' does not exist.*invoke deploy --env sandbox",
    ):
        SqsQueues(ENV).backlog("demo")


def test_groups_report_desired_base_instances_launch_time_and_protection(cloud):
    ids = grow(2)
    boto3.client("autoscaling", region_name=ENV.region).set_instance_protection(
        AutoScalingGroupName=GROUP, InstanceIds=ids[:1], ProtectedFromScaleIn=True
    )
    state = AutoScalingFleet(ENV).groups(["cpu", "absent"], since=0)
    assert set(state) == {"cpu"}
    g = state["cpu"]
    assert (g.name, g.desired, g.min, g.max, g.on_demand_base) == (GROUP, 2, 0, 6, 0)
    by_id = {i.id: i for i in g.instances}
    assert set(by_id) == set(ids)
    assert by_id[ids[0]].protected and not by_id[ids[1]].protected
    assert all(i.lifecycle_state == "InService" and i.instance_type == "c6i.large" for i in g.instances)
    assert all(abs(i.launched_at - datetime.now(UTC).timestamp()) < 300 for i in g.instances)


def test_the_on_demand_base_changes_and_the_rest_of_the_policy_stays(cloud):
    fleet = AutoScalingFleet(ENV)
    fleet.set_on_demand_base("cpu", 2)
    policy = boto3.client("autoscaling", region_name=ENV.region).describe_auto_scaling_groups(
        AutoScalingGroupNames=[GROUP]
    )["AutoScalingGroups"][0]["MixedInstancesPolicy"]
    assert fleet.groups(["cpu"], since=0)["cpu"].on_demand_base == 2
    assert [o["InstanceType"] for o in policy["LaunchTemplate"]["Overrides"]] == ["c6i.large", "m6i.large"]
    assert policy["InstancesDistribution"]["SpotAllocationStrategy"] == "price-capacity-optimized"


def test_only_recent_failed_spot_launches_count_as_spot_failures():
    # moto never reports scaling activities: the AWS shape of a failed spot launch, stubbed.
    client = offline_client()
    at = lambda minute: datetime(2026, 11, 21, 12, minute, tzinfo=UTC)
    activity = {"ActivityId": "a", "AutoScalingGroupName": GROUP, "Cause": "c", "Progress": 100}
    activities = [
        activity
        | {
            "StartTime": at(9),
            "StatusCode": "Failed",
            "Description": "Launching a new EC2 instance.  Status Reason: Could not launch Spot Instances. UnfulfillableCapacity - Unable to fulfill capacity due to your request configuration. Launching EC2 instance failed.",
            "StatusMessage": "Could not launch Spot Instances. UnfulfillableCapacity - Unable to fulfill capacity due to your request configuration. Launching EC2 instance failed.",
        },
        activity
        | {
            "StartTime": at(8),
            "StatusCode": "Successful",
            "Description": "Launching a new EC2 instance: i-1",
        },
        activity
        | {
            "StartTime": at(7),
            "StatusCode": "Failed",
            "Description": "Launching a new EC2 instance.  Status Reason: The requested configuration is currently not supported.",
            "StatusMessage": "The requested configuration is currently not supported.",
        },
        activity
        | {
            "StartTime": at(1),
            "StatusCode": "Failed",
            "Description": "Launching a new EC2 instance.  Status Reason: Could not launch Spot Instances. InsufficientInstanceCapacity",
            "StatusMessage": "Could not launch Spot Instances. InsufficientInstanceCapacity",
        },
    ]
    with Stubber(client) as stub:
        stub.add_response(
            "describe_scaling_activities",
            {"Activities": activities},
            {"AutoScalingGroupName": GROUP, "MaxRecords": 50},
        )
        failures = AutoScalingFleet(ENV, autoscaling=client, ec2=object())._spot_failures(
            GROUP, since=at(5).timestamp()
        )
    assert failures == (at(9).timestamp(),)


@pytest.mark.parametrize(
    "refusal",
    [
        "Instance Id not found - No managed instance found for instance ID: i-0aaaaaaaaaaaaaaaa",
        "The instance i-0aaaaaaaaaaaaaaaa is not in InService or Standby.",
    ],
)
def test_a_terminate_that_lost_the_race_to_another_tick_is_a_no_op(refusal):
    # AWS's refusals when the instance left between our re-read and our call (moto answers a
    # server error instead), stubbed with the messages AWS sends.
    client = offline_client()
    with Stubber(client) as stub:
        stub.add_response("describe_auto_scaling_instances", LISTED)
        stub.add_client_error("terminate_instance_in_auto_scaling_group", "ValidationError", refusal)
        assert (
            AutoScalingFleet(ENV, autoscaling=client, ec2=object()).terminate("cpu", ("i-0aaaaaaaaaaaaaaaa",))
            == ()
        )


def test_any_other_terminate_refusal_is_raised():
    client = offline_client()
    with Stubber(client) as stub:
        stub.add_response("describe_auto_scaling_instances", LISTED)
        stub.add_client_error("terminate_instance_in_auto_scaling_group", "AccessDenied", "not authorized")
        with pytest.raises(ClientError, match="AccessDenied"):
            AutoScalingFleet(ENV, autoscaling=client, ec2=object()).terminate("cpu", ("i-0aaaaaaaaaaaaaaaa",))


def test_a_scale_in_of_more_than_fifty_nodes_reads_them_back_fifty_at_a_time(cloud):
    """AWS takes at most 50 instance ids a DescribeAutoScalingInstances (moto takes any number):
    one call for 60 idle nodes failed every tick, and the pool kept all 60."""
    asg = boto3.client("autoscaling", region_name=ENV.region)
    asg.update_auto_scaling_group(AutoScalingGroupName=GROUP, MaxSize=60)
    ids = grow(60)
    fleet = AutoScalingFleet(ENV)
    sent = []

    def at_most_fifty(params, **_):
        sent.append(ids_given := [v for k, v in params["body"].items() if k.startswith("InstanceIds.member")])
        if len(ids_given) > 50:
            return AWSResponse("", 400, {}, None), {"Error": {"Code": "ValidationError", "Message": "at most 50"}}
        return None

    fleet.asg.meta.events.register("before-call.autoscaling.DescribeAutoScalingInstances", at_most_fifty)
    assert sorted(fleet.terminate("cpu", tuple(ids))) == sorted(ids)
    assert [len(chunk) for chunk in sent] == [50, 10]


def test_the_tick_observes_each_queues_mean_item_time_recorded_in_the_job_store(cloud):
    DynamoStore(ENV.name, ENV.region).record_item_seconds("demo", 30.0)
    seen = control.observe(ENV, aws_ports(ENV), datetime.now(UTC).timestamp(), ["cpu"])
    assert {q.name: q.mean_item_s for q in seen.fleet.queues}["demo"] == 30.0


def calls_of(client, operation: str) -> list[dict]:
    """The parameters of every call of `operation` this client makes from now on."""
    seen: list[dict] = []
    service = client.meta.service_model.service_name
    client.meta.events.register(f"provide-client-params.{service}.{operation}", lambda params, **_: seen.append(params))
    return seen


def test_a_warm_fleet_describes_only_the_instances_it_has_not_seen_before(cloud):
    first = grow(2)
    fleet = AutoScalingFleet(ENV)
    described = calls_of(fleet.ec2, "DescribeInstances")
    fleet.groups(["cpu"], since=0)
    assert sorted(described[0]["Filters"][0]["Values"]) == sorted(first)
    later = fleet.groups(["cpu"], since=0)  # launch time and spot-ness never change: not asked again
    assert len(described) == 1 and all(i.launched_at is not None for i in later["cpu"].instances)
    new = set(grow(3)) - set(first)
    fleet.groups(["cpu"], since=0)
    assert [set(call["Filters"][0]["Values"]) for call in described[1:]] == [new]


def test_the_queue_urls_come_from_one_listing_of_the_environments_queues(cloud):
    queues = SqsQueues(ENV)
    listed, asked = calls_of(queues.sqs, "ListQueues"), calls_of(queues.sqs, "GetQueueUrl")
    for _ in range(2):
        assert all(queues.backlog(q) == Backlog(0, 0) for q in ENV.queues)
    assert (len(listed), len(asked)) == (1, 0)


def _cancelled(*codes: str):
    """TransactWriteItems refused as DynamoDB refuses it, one cancellation reason per action."""
    return AWSResponse("", 400, {}, None), {
        "Error": {"Code": "TransactionCanceledException", "Message": "Transaction cancelled"},
        "CancellationReasons": [{"Code": c} for c in codes],
    }


@pytest.fixture
def settling(cloud, monkeypatch):
    """A store with three running items of a counted job, whose TransactWriteItems calls answer
    from `answers` first (each a canned refusal or None: to the moto server), without sleeping."""
    store = DynamoStore(ENV.name, ENV.region)
    store.put_job(Job("j", "items", "demo", 0.0, 3, counted=True))
    store.create_items([Item("j", f"{n:06d}", args=[], status="running") for n in range(3)], unseen=True)
    monkeypatch.setattr(dynamodb.time, "sleep", lambda s: None)
    answers: list = []
    calls: list[int] = []

    def answer(params, **_):  # params: the serialized request
        calls.append(len(json.loads(params["body"])["TransactItems"]))
        return answers.pop(0) if answers else None

    store.table.meta.client.meta.events.register("before-call.dynamodb.TransactWriteItems", answer)
    writes = [ItemWrite("j", f"{n:06d}", {"status": "succeeded"}) for n in range(3)]
    return store, writes, answers, calls


def test_recording_items_retries_a_transaction_that_conflicted_with_another_writer(settling):
    """Agents counting on one job's record at once: DynamoDB cancels one transaction with
    TransactionConflict, and the write is only late."""
    store, writes, answers, calls = settling
    answers += [_cancelled("TransactionConflict", "None", "None", "None")] * 2
    assert store.update_items(writes) == [True] * 3
    assert calls == [4, 4, 4] and store.job("j").n_succeeded == 3


def test_recording_items_gives_up_on_endless_conflicts_with_the_error_and_lands_nothing(settling):
    store, writes, answers, calls = settling
    answers += [_cancelled("None", "TransactionConflict", "None", "None")] * (dynamodb.TRANSACT_RETRIES + 1)
    with pytest.raises(ClientError, match="TransactionCanceledException"):
        store.update_items(writes)
    assert len(calls) == dynamodb.TRANSACT_RETRIES + 1
    assert store.job("j").n_succeeded == 0 and {i.status for i in store.items("j")} == {"running"}


def test_recording_items_drops_the_writes_whose_condition_failed_and_lands_the_others(settling):
    store, writes, answers, calls = settling
    answers.append(_cancelled("None", "ConditionalCheckFailed", "None", "None"))
    assert store.update_items(writes) == [True, False, True]
    assert calls == [4, 3], "sent again without it: 2 writes and their job's count"
    assert store.job("j").n_succeeded == 2 and store.item("j", "000001").status == "running"


def test_recording_items_refused_for_another_reason_raises_it(settling):
    store, writes, answers, _ = settling
    answers.append(_cancelled("ValidationError", "None", "None", "None"))
    with pytest.raises(ClientError):
        store.update_items(writes)
    assert store.job("j").n_succeeded == 0


def query_pages(store: DynamoStore) -> list[int]:
    """The item count of each Query page the store's client gets from now on."""
    pages: list[int] = []
    store.table.meta.client.meta.events.register(
        "after-call.dynamodb.Query", lambda parsed, **_: pages.append(len(parsed["Items"]))
    )
    return pages


def test_a_jobs_items_are_listed_whole_and_in_order_in_pages_of_at_most_query_page(cloud):
    """A page of thousands of items took moto longer than the clients' read timeout (`QUERY_PAGE`)."""
    store = DynamoStore(ENV.name, ENV.region)
    n = dynamodb.QUERY_PAGE + 1
    store.create_items([Item("j", f"{i:06d}", args=[str(i)]) for i in range(n)], unseen=True)
    pages = query_pages(store)
    assert [i.item_id for i in store.items("j")] == [f"{i:06d}" for i in range(n)]
    assert pages == [dynamodb.QUERY_PAGE, 1]


def test_every_query_of_the_store_reads_all_its_pages(cloud, monkeypatch):
    store = DynamoStore(ENV.name, ENV.region)
    monkeypatch.setattr(dynamodb, "QUERY_PAGE", 2)
    pages = query_pages(store)
    for n in range(5):
        store.mark_sent("j", n, 10 + n)
        store.watch(f"job{n}")
        store.mark_draining("cpu", f"i-{n}")
    assert store.sent_chunks("j") == {n: 10 + n for n in range(5)}
    assert store.watched() == [f"job{n}" for n in range(5)]
    assert store.node_rows("cpu") == ({}, frozenset(f"i-{n}" for n in range(5)))
    assert pages == [2, 2, 1] * 3


def wait(items: int) -> None:
    sqs = boto3.client("sqs", region_name=ENV.region)
    url = sqs.get_queue_url(QueueName=naming.queue("sandbox", "demo"))["QueueUrl"]
    for n in range(items):
        sqs.send_message(QueueUrl=url, MessageBody=str(n))


def tick_line(ports, caplog) -> dict:
    """One tick of the cpu pool; its decision line."""
    with caplog.at_level(logging.INFO, "tidefleet.control"):
        try:
            control.tick(ENV, ports, datetime.now(UTC).timestamp(), pools=["cpu"])
        except control.TickError:
            pass  # the line says what failed
    return next(json.loads(r.getMessage()) for r in caplog.records if '"desired_before"' in r.getMessage())


def test_a_group_whose_max_size_is_below_the_configs_says_desired_is_capped_and_how_to_fix_it(cloud, caplog):
    asg = boto3.client("autoscaling", region_name=ENV.region)
    asg.update_auto_scaling_group(AutoScalingGroupName=GROUP, MaxSize=1)  # a console edit, or a partial apply
    wait(3)
    line = tick_line(aws_ports(ENV), caplog)
    assert (line["desired"], line["desired_after"]) == (2, 1)
    assert line["held"] == "desired capped at the group's MaxSize 1 (config max 6), not 2: deploy the environment to apply it"
    assert asg.describe_auto_scaling_groups(AutoScalingGroupNames=[GROUP])["AutoScalingGroups"][0]["DesiredCapacity"] == 1


def test_a_refused_set_desired_reports_the_groups_own_desired_after(cloud, caplog):
    ports = aws_ports(ENV)
    # moto enforces no IAM: the refusal as IAM answers it, at the fleet client's before-call hook.
    denied = {"Error": {"Code": "AccessDenied", "Message": "not authorized to perform: autoscaling:SetDesiredCapacity"}}
    ports.fleet.asg.meta.events.register(
        "before-call.autoscaling.SetDesiredCapacity", lambda **_: (AWSResponse("", 403, {}, None), denied)
    )
    wait(3)
    line = tick_line(ports, caplog)
    assert (line["desired"], line["desired_after"]) == (2, 0) and "held" not in line
    (failed,) = line["failed"]
    assert failed.startswith("set_desired: ClientError: An error occurred (AccessDenied)")


def test_a_history_entry_kept_without_a_status_condition_lands_on_a_final_item(cloud):
    """What an attempt keeps once a newer attempt holds its item (`Agent._record`): the entry alone.
    Sent with a #status name no expression used, DynamoDB refused the write (ValidationException)
    and the entry was lost with a "could not record" line."""
    store = DynamoStore(ENV.name, ENV.region)
    store.put_job(Job("j", "j", "demo", created_at=0.0, total=1))
    store.create_items([Item("j", "000000", args=["x"])], unseen=True)
    assert store.update_item("j", "000000", status="succeeded") is not None
    assert store.update_item("j", "000000", never_from=(), append={"history": {"outcome": "lost"}}) is not None
    item = store.item("j", "000000")
    assert (item.status, [e["outcome"] for e in item.history]) == ("succeeded", ["lost"])


def test_a_gang_members_parts_are_kept_beside_the_item_by_attempt_and_node(cloud):
    """Beside the item, not on it: a big gang interrupted often would outgrow the item's 400 KB."""
    store = DynamoStore(ENV.name, ENV.region)
    store.create_items([Item("j", "i.1", args=["x"])], unseen=True)
    part = {"attempt": 1, "node": "i-0b", "rank": 1, "seconds": 12.5, "spot": True, "gpu_util_pct": None}
    store.record_part("j", "i.1", part)
    store.record_part("j", "i.1", {**part, "seconds": 13.0})  # the same attempt and node again: replaced
    store.record_part("j", "i.1", {**part, "attempt": 2})
    unknown = {k: v for k, v in part.items() if v is not None}  # an unknown reading is left out, as on items
    assert store.parts("j") == {"i.1": [{**unknown, "seconds": 13.0}, {**unknown, "attempt": 2}]}
    assert store.item("j", "i.1").history == [] and [i.item_id for i in store.items("j")] == ["i.1"]
    assert store.parts("other") == {}
