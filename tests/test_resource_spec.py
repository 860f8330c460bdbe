"""The stacks and the sandbox build the same resources: one description (`tidefleet.resources`),
checked fact by fact against the synthesized Terraform JSON and against what boto3 describes
after the sandbox's provisioning on the moto server.

One row per fact: what the spec says, where the stack declares it, where the emulator shows it
(None where that side has no such resource, with the reason in the row's comment).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import boto3
import pytest
from conftest import SHIPPED_ENVS

from tidefleet.cloud.aws.provision import EMULATOR_ACCOUNT, provision
from tidefleet.config import Environment, load_environment, parse_environment
from tidefleet.resources import EnvResources, resources

pytestmark = pytest.mark.synth

# Everything off its default, so that a side reading a default instead of the spec shows.
UNUSUAL = {
    "region": "eu-west-1",
    "tags": {"project": "spec"},
    "pools": {
        "gpu": {
            "min": 2, "max": 9, "on_demand_base": 1, "on_demand_percent": 25, "spot_max_price": 1.5,
            "spot_allocation_strategy": "capacity-optimized", "container": "repo/img:1", "disk_gb": 80,
            "boot_timeout_s": 900, "team": "vision", "image": "ami-0123456789abcdef0", "gpu_sharing": True,
            "instance_types": [{"type": "g5.xlarge", "weight": 1, "gpus": 1}, {"type": "g5.2xlarge", "weight": 2, "gpus": 1}],
        },
        "cpu": {"max": 3, "command": "true", "instance_types": [{"type": "c6i.large"}]},
    },
    "queues": {
        "train": {"pool": "gpu", "max_retries": 7, "item_timeout_s": 200},
        "long": {"pool": "cpu", "max_retries": 0, "item_timeout_s": 90000},
    },
}  # fmt: skip
UNUSUAL_ENV = parse_environment(UNUSUAL, name="spec")
SYNTH_ENVS = ("dev", "prod", "spec")
EMULATED_ENVS = ("sandbox", "prod", "spec")


def environment(name: str) -> Environment:
    return UNUSUAL_ENV if name == "spec" else load_environment(name)


# -- the stack's side: the Terraform JSON -------------------------------------------------------
@pytest.fixture(scope="module")
def terraform(synthesized, tmp_path_factory) -> dict[str, dict]:
    """The shipped environments from the session's synth; the unusual one synthesized here."""
    from stacks.app import synth

    assert set(SYNTH_ENVS) - {"spec"} <= set(SHIPPED_ENVS)
    out = {name: synthesized[name][1] for name in SYNTH_ENVS if name != "spec"}
    stack_dir = synth(UNUSUAL_ENV, tmp_path_factory.mktemp("synth-spec"))
    out["spec"] = json.loads((stack_dir / "cdk.tf.json").read_text())
    return out


def tf(stack: dict, rtype: str, key: str) -> dict:
    return stack["resource"][rtype][key]


def tf_queue(stack: dict, q: str) -> dict:
    return tf(stack, "aws_sqs_queue", f"queue-{q}_queue")


def tf_redrive_target(stack: dict, q: str) -> str:
    """The name of the queue the redrive policy points at (the policy holds a reference to it)."""
    ref = json.loads(tf_queue(stack, q)["redrive_policy"])["deadLetterTargetArn"]
    (key,) = re.fullmatch(r"\$\{aws_sqs_queue\.(.+)\.arn\}", ref).groups()
    return tf(stack, "aws_sqs_queue", key)["name"]


def tf_group(stack: dict, p: str) -> dict:
    return tf(stack, "aws_autoscaling_group", f"pool-{p}_group")


def tf_distribution(stack: dict, p: str) -> dict:
    return tf_group(stack, p)["mixed_instances_policy"]["instances_distribution"]


def tf_template(stack: dict, p: str) -> dict:
    return tf(stack, "aws_launch_template", f"pool-{p}_launch-template")


def tf_lifecycle(stack: dict) -> dict:
    (rule,) = tf(stack, "aws_s3_bucket_lifecycle_configuration", "artifacts_lifecycle")["rule"]
    return rule


# -- the sandbox's side: what boto3 describes ---------------------------------------------------
@dataclass
class Described:
    queues: dict[str, dict]  # queue name -> attributes
    table: dict
    table_backups: dict
    table_ttl: dict
    log_groups: dict[str, dict]
    buckets: list[str]
    versioning: dict
    lifecycle: list[dict]
    groups: dict[str, dict]  # group name -> group
    hooks: dict[str, list[dict]]  # group name -> hooks
    suspended: dict[str, list[str]]
    templates: dict[str, dict]  # template name -> its latest version's data


def describe(region: str, spec: EnvResources) -> Described:
    sqs, dynamodb = boto3.client("sqs", region_name=region), boto3.client("dynamodb", region_name=region)
    autoscaling, ec2 = boto3.client("autoscaling", region_name=region), boto3.client("ec2", region_name=region)
    s3 = boto3.client("s3", region_name=region)
    queues = {
        url.rsplit("/", 1)[1]: sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
        for url in sqs.list_queues()["QueueUrls"]
    }
    groups = {g["AutoScalingGroupName"]: g for g in autoscaling.describe_auto_scaling_groups()["AutoScalingGroups"]}
    templates = {}
    for t in ec2.describe_launch_templates()["LaunchTemplates"]:
        (version,) = ec2.describe_launch_template_versions(LaunchTemplateId=t["LaunchTemplateId"], Versions=["$Latest"])[
            "LaunchTemplateVersions"
        ]
        templates[t["LaunchTemplateName"]] = version["LaunchTemplateData"]
    return Described(
        queues=queues,
        table=dynamodb.describe_table(TableName=spec.table.name)["Table"],
        table_backups=dynamodb.describe_continuous_backups(TableName=spec.table.name)["ContinuousBackupsDescription"],
        table_ttl=dynamodb.describe_time_to_live(TableName=spec.table.name)["TimeToLiveDescription"],
        log_groups={g["logGroupName"]: g for g in boto3.client("logs", region_name=region).describe_log_groups()["logGroups"]},
        buckets=[b["Name"] for b in s3.list_buckets()["Buckets"]],
        versioning=s3.get_bucket_versioning(Bucket=spec.artifacts.name),
        lifecycle=s3.get_bucket_lifecycle_configuration(Bucket=spec.artifacts.name)["Rules"],
        groups=groups,
        hooks={n: autoscaling.describe_lifecycle_hooks(AutoScalingGroupName=n)["LifecycleHooks"] for n in groups},
        suspended={n: sorted(p["ProcessName"] for p in g["SuspendedProcesses"]) for n, g in groups.items()},
        templates=templates,
    )  # fmt: skip


@pytest.fixture(scope="module")
def emulated(moto_server) -> dict[str, Described]:
    """Each environment provisioned as the sandbox does it, on a freshly reset server, then described."""
    import urllib.request

    out = {}
    with pytest.MonkeyPatch.context() as patch:
        for key, value in moto_server.env().items():
            patch.setenv(key, value)
        for name in EMULATED_ENVS:
            env = environment(name)
            reset = urllib.request.Request(f"{moto_server.url}/moto-api/reset", method="POST")
            urllib.request.urlopen(reset).close()
            provision(env, user_data=dict.fromkeys(env.pools, "#!/bin/sh\n"))
            out[name] = describe(env.region, resources(env, account=EMULATOR_ACCOUNT))
    return out


def em_group(d: Described, spec: EnvResources, p: str) -> dict:
    return d.groups[spec.pools[p].group_name]


def em_queue(d: Described, spec: EnvResources, q: str) -> dict:
    return d.queues[spec.queues[q].name]


def em_redrive(d: Described, spec: EnvResources, q: str) -> dict:
    return json.loads(em_queue(d, spec, q)["RedrivePolicy"])


def em_template(d: Described, spec: EnvResources, p: str) -> dict:
    return d.templates[spec.pools[p].launch_template.name]


# -- the facts ----------------------------------------------------------------------------------
Getter = Callable[..., Any]


@dataclass(frozen=True)
class Fact:
    """`per`: "env", "queue" or "pool"; each getter takes (source, key) with key the configured
    queue or pool name (None per environment). `emulator` gets (Described, spec, key)."""

    what: str
    per: str
    spec: Getter
    terraform: Getter | None
    emulator: Getter | None


FACTS = [
    # Queues.
    Fact("queue and dead-letter names", "env",
         lambda s, _: sorted(n for q in s.queues.values() for n in (q.name, q.dead_letter_name)),
         lambda t, _: sorted(v["name"] for k, v in t["resource"]["aws_sqs_queue"].items() if k.startswith("queue-")),
         lambda d, s, _: sorted(d.queues)),
    Fact("visibility timeout", "queue", lambda s, q: s.queues[q].visibility_timeout_s,
         lambda t, q: tf_queue(t, q)["visibility_timeout_seconds"],
         lambda d, s, q: int(em_queue(d, s, q)["VisibilityTimeout"])),
    Fact("message retention of the queue and its dead-letter queue", "queue",
         lambda s, q: [s.queues[q].retention_s] * 2,
         lambda t, q: [tf_queue(t, q)["message_retention_seconds"],
                       tf(t, "aws_sqs_queue", f"queue-{q}_dead-letter")["message_retention_seconds"]],
         lambda d, s, q: [int(d.queues[n]["MessageRetentionPeriod"])
                          for n in (s.queues[q].name, s.queues[q].dead_letter_name)]),
    Fact("redrive maxReceiveCount", "queue", lambda s, q: s.queues[q].max_receive_count,
         lambda t, q: json.loads(tf_queue(t, q)["redrive_policy"])["maxReceiveCount"],
         lambda d, s, q: int(em_redrive(d, s, q)["maxReceiveCount"])),
    Fact("redrive target", "queue", lambda s, q: s.queues[q].dead_letter_name, tf_redrive_target,
         lambda d, s, q: em_redrive(d, s, q)["deadLetterTargetArn"].rsplit(":", 1)[1]),
    Fact("queue encryption", "queue", lambda s, q: s.queues[q].encryption,
         lambda t, q: "sqs-managed" if tf_queue(t, q)["sqs_managed_sse_enabled"] else "none",
         lambda d, s, q: "sqs-managed" if em_queue(d, s, q)["SqsManagedSseEnabled"] == "true" else "none"),
    # The sandbox runs no functions, so it has no failure queue.
    Fact("function failure queue", "env", lambda s, _: (s.function_failures.name, s.function_failures.retention_s),
         lambda t, _: (tf(t, "aws_sqs_queue", "control_failures")["name"],
                       tf(t, "aws_sqs_queue", "control_failures")["message_retention_seconds"]),
         None),
    # The job table.
    Fact("table name, keys and billing", "env",
         lambda s, _: (s.table.name, s.table.hash_key, s.table.range_key, s.table.billing_mode),
         lambda t, _: tuple(tf(t, "aws_dynamodb_table", "jobs_table")[k]
                            for k in ("name", "hash_key", "range_key", "billing_mode")),
         lambda d, s, _: (d.table["TableName"], *(k["AttributeName"] for k in d.table["KeySchema"]),
                          d.table["BillingModeSummary"]["BillingMode"])),
    Fact("table key types, the indexes' too", "env", lambda s, _: s.table.key_types,
         lambda t, _: {a["name"]: a["type"] for a in tf(t, "aws_dynamodb_table", "jobs_table")["attribute"]},
         lambda d, s, _: {a["AttributeName"]: a["AttributeType"] for a in d.table["AttributeDefinitions"]}),
    Fact("table indexes (jobs, failed items): name, keys and projection", "env",
         lambda s, _: [(i.name, i.hash_key, i.range_key, i.projection) for i in s.table.indexes],
         lambda t, _: [(g["name"], g["hash_key"], g["range_key"], g["projection_type"])
                       for g in tf(t, "aws_dynamodb_table", "jobs_table")["global_secondary_index"]],
         lambda d, s, _: [(g["IndexName"], *(k["AttributeName"] for k in g["KeySchema"]), g["Projection"]["ProjectionType"])
                          for g in d.table["GlobalSecondaryIndexes"]]),
    Fact("table point-in-time recovery", "env", lambda s, _: s.table.point_in_time_recovery,
         lambda t, _: tf(t, "aws_dynamodb_table", "jobs_table")["point_in_time_recovery"]["enabled"],
         lambda d, s, _: d.table_backups["PointInTimeRecoveryDescription"]["PointInTimeRecoveryStatus"] == "ENABLED"),
    Fact("table TTL attribute", "env", lambda s, _: s.table.ttl_attribute,
         lambda t, _: tf(t, "aws_dynamodb_table", "jobs_table").get("ttl", {}).get("attribute_name"),
         lambda d, s, _: d.table_ttl.get("AttributeName") if d.table_ttl["TimeToLiveStatus"] == "ENABLED" else None),
    # Logs and artifacts.
    Fact("item log group and its retention", "env", lambda s, _: (s.item_logs.name, s.item_logs.retention_days),
         lambda t, _: (tf(t, "aws_cloudwatch_log_group", "item-logs")["name"],
                       tf(t, "aws_cloudwatch_log_group", "item-logs")["retention_in_days"]),
         lambda d, s, _: (s.item_logs.name, d.log_groups[s.item_logs.name].get("retentionInDays"))),
    # The functions' log groups exist only in the stack.
    Fact("every log group's retention", "env", lambda s, _: {s.log_retention_days},
         lambda t, _: {g["retention_in_days"] for g in t["resource"]["aws_cloudwatch_log_group"].values()},
         lambda d, s, _: {g.get("retentionInDays") for g in d.log_groups.values()}),
    Fact("artifacts bucket name", "env", lambda s, _: [s.artifacts.name],
         lambda t, _: [tf(t, "aws_s3_bucket", "artifacts_bucket")["bucket"]], lambda d, s, _: d.buckets),
    Fact("artifacts bucket versioning", "env", lambda s, _: "Enabled" if s.artifacts.versioned else "Suspended",
         lambda t, _: tf(t, "aws_s3_bucket_versioning", "artifacts_versioning")["versioning_configuration"]["status"],
         lambda d, s, _: d.versioning.get("Status")),
    Fact("artifacts lifecycle: noncurrent versions and incomplete uploads expire", "env",
         lambda s, _: (s.artifacts.noncurrent_version_expiration_days, s.artifacts.abort_incomplete_upload_days),
         lambda t, _: (tf_lifecycle(t)["noncurrent_version_expiration"][0]["noncurrent_days"],
                       tf_lifecycle(t)["abort_incomplete_multipart_upload"][0]["days_after_initiation"]),
         lambda d, s, _: (d.lifecycle[0]["NoncurrentVersionExpiration"]["NoncurrentDays"],
                          d.lifecycle[0]["AbortIncompleteMultipartUpload"]["DaysAfterInitiation"])),
    # Tags on every resource come from the provider's default_tags, which the emulator has no notion of.
    Fact("tags on every resource", "env", lambda s, _: s.tags,
         lambda t, _: t["provider"]["aws"][0]["default_tags"][0]["tags"], None),
    # Node pools.
    Fact("group name", "pool", lambda s, p: s.pools[p].group_name, lambda t, p: tf_group(t, p)["name"],
         lambda d, s, p: em_group(d, s, p)["AutoScalingGroupName"]),
    Fact("group min, max and initial desired", "pool",
         lambda s, p: (s.pools[p].min_size, s.pools[p].max_size, s.pools[p].initial_desired),
         lambda t, p: (tf_group(t, p)["min_size"], tf_group(t, p)["max_size"], tf_group(t, p)["desired_capacity"]),
         lambda d, s, p: (em_group(d, s, p)["MinSize"], em_group(d, s, p)["MaxSize"],
                          em_group(d, s, p)["DesiredCapacity"])),
    Fact("instance types and weights", "pool", lambda s, p: [(t, str(w)) for t, w in s.pools[p].instance_types],
         lambda t, p: [(o["instance_type"], o["weighted_capacity"])
                       for o in tf_group(t, p)["mixed_instances_policy"]["launch_template"]["override"]],
         lambda d, s, p: [(o["InstanceType"], o["WeightedCapacity"])
                          for o in em_group(d, s, p)["MixedInstancesPolicy"]["LaunchTemplate"]["Overrides"]]),
    Fact("on-demand base and percent above it", "pool",
         lambda s, p: (s.pools[p].on_demand_base, s.pools[p].on_demand_percent),
         lambda t, p: (tf_distribution(t, p)["on_demand_base_capacity"],
                       tf_distribution(t, p)["on_demand_percentage_above_base_capacity"]),
         lambda d, s, p: tuple(em_group(d, s, p)["MixedInstancesPolicy"]["InstancesDistribution"][k]
                               for k in ("OnDemandBaseCapacity", "OnDemandPercentageAboveBaseCapacity"))),
    Fact("spot allocation strategy and max price", "pool",
         lambda s, p: (s.pools[p].spot_allocation_strategy, s.pools[p].spot_max_price),
         lambda t, p: (tf_distribution(t, p)["spot_allocation_strategy"], tf_distribution(t, p)["spot_max_price"]),
         lambda d, s, p: tuple(em_group(d, s, p)["MixedInstancesPolicy"]["InstancesDistribution"].get(k, "")
                               for k in ("SpotAllocationStrategy", "SpotMaxPrice"))),
    Fact("capacity rebalance", "pool", lambda s, p: s.pools[p].capacity_rebalance,
         lambda t, p: tf_group(t, p)["capacity_rebalance"], lambda d, s, p: em_group(d, s, p)["CapacityRebalance"]),
    Fact("health check grace period", "pool", lambda s, p: s.pools[p].health_check_grace_period_s,
         lambda t, p: tf_group(t, p)["health_check_grace_period"],
         lambda d, s, p: em_group(d, s, p)["HealthCheckGracePeriod"]),
    Fact("suspended processes", "pool", lambda s, p: sorted(s.pools[p].suspended_processes),
         lambda t, p: sorted(tf_group(t, p)["suspended_processes"]),
         lambda d, s, p: d.suspended[s.pools[p].group_name]),
    Fact("drain lifecycle hook", "pool",
         lambda s, p: [(h.name, h.transition, h.heartbeat_timeout_s, h.default_result) for h in [s.pools[p].drain_hook]],
         lambda t, p: [(h["name"], h["lifecycle_transition"], h["heartbeat_timeout"], h["default_result"])
                       for h in tf_group(t, p)["initial_lifecycle_hook"]],
         lambda d, s, p: [(h["LifecycleHookName"], h["LifecycleTransition"], h["HeartbeatTimeout"], h["DefaultResult"])
                          for h in d.hooks[s.pools[p].group_name]]),
    Fact("node tags, propagated at launch", "pool", lambda s, p: s.pools[p].tags,
         lambda t, p: {g["key"]: g["value"] for g in tf_group(t, p)["tag"] if g["propagate_at_launch"]},
         lambda d, s, p: {g["Key"]: g["Value"] for g in em_group(d, s, p)["Tags"] if g["PropagateAtLaunch"]}),
    Fact("launch template name", "pool", lambda s, p: s.pools[p].launch_template.name,
         lambda t, p: tf_template(t, p)["name"],
         lambda d, s, p: em_group(d, s, p)["MixedInstancesPolicy"]["LaunchTemplate"]["LaunchTemplateSpecification"][
             "LaunchTemplateName"]),
    Fact("instance metadata: IMDSv2 only, hop limit", "pool",
         lambda s, p: (s.pools[p].launch_template.http_tokens, s.pools[p].launch_template.http_put_response_hop_limit),
         lambda t, p: (tf_template(t, p)["metadata_options"]["http_tokens"],
                       tf_template(t, p)["metadata_options"]["http_put_response_hop_limit"]),
         lambda d, s, p: (em_template(d, s, p)["MetadataOptions"]["HttpTokens"],
                          em_template(d, s, p)["MetadataOptions"]["HttpPutResponseHopLimit"])),
    # The emulator knows only its own AMIs: the sandbox launches `emulator_image` instead.
    Fact("image (stack)", "pool", lambda s, p: s.pools[p].launch_template.image,
         lambda t, p: tf_template(t, p)["image_id"].replace("resolve:ssm:", "ssm:"), None),
    Fact("image (sandbox)", "pool", lambda s, p: s.pools[p].launch_template.emulator_image, None,
         lambda d, s, p: em_template(d, s, p)["ImageId"]),
    # The sandbox's nodes are local processes: no volumes.
    Fact("root volume size", "pool", lambda s, p: s.pools[p].launch_template.root_volume_gb,
         lambda t, p: tf_template(t, p)["block_device_mappings"][0]["ebs"]["volume_size"], None),
]  # fmt: skip


def keys(fact: Fact, env: Environment) -> list[str | None]:
    return {"env": [None], "queue": sorted(env.queues), "pool": sorted(env.pools)}[fact.per]


@pytest.mark.parametrize("env_name", SYNTH_ENVS)
@pytest.mark.parametrize("fact", [f for f in FACTS if f.terraform], ids=lambda f: f.what)
def test_the_stack_declares_what_the_spec_says(fact, env_name, terraform):
    env, stack = environment(env_name), terraform[env_name]
    (caller,) = stack["data"]["aws_caller_identity"]  # the bucket's name carries the account Terraform sees
    spec = resources(env, account=f"${{data.aws_caller_identity.{caller}.account_id}}")
    for key in keys(fact, env):
        assert (key, fact.terraform(stack, key)) == (key, fact.spec(spec, key))


@pytest.mark.parametrize("env_name", EMULATED_ENVS)
@pytest.mark.parametrize("fact", [f for f in FACTS if f.emulator], ids=lambda f: f.what)
def test_the_sandbox_provisions_what_the_spec_says(fact, env_name, emulated):
    env = environment(env_name)
    spec = resources(env, account=EMULATOR_ACCOUNT)
    for key in keys(fact, env):
        assert (key, fact.emulator(emulated[env_name], spec, key)) == (key, fact.spec(spec, key))


@pytest.mark.parametrize(
    "env_name,queue,visibility,receives",
    [
        # A long item's queue: visibility capped at 10 minutes; no retries: 1 + 5 node losses.
        ("spec", "long", 600, 6),
        ("spec", "train", 230, 13),
        ("sandbox", "demo", 40, 8),
    ],
)
def test_queue_values_are_the_ones_users_deploy(env_name, queue, visibility, receives):
    q = resources(environment(env_name), account=EMULATOR_ACCOUNT).queues[queue]
    assert (q.visibility_timeout_s, q.max_receive_count) == (visibility, receives)


@pytest.mark.parametrize(
    "max_retries,item_timeout_s,ack_deadline,attempts",
    [(0, 1, 31, 6), (3, 200, 230, 9), (100, 90000, 600, 100)],
)
def test_on_gcp_ack_deadline_and_delivery_attempts_are_clamped_to_what_pubsub_accepts(
    max_retries, item_timeout_s, ack_deadline, attempts
):
    env = parse_environment(
        {"cloud": "gcp", "region": "europe-west4", "project": "proj-1",
         "pools": {"cpu": {"max": 2, "command": "true", "image": "projects/debian-cloud/global/images/family/debian-12",
                           "instance_types": [{"type": "n2-standard-4"}]}},
         "queues": {"q": {"pool": "cpu", "max_retries": max_retries, "item_timeout_s": item_timeout_s}}},
        name="g",
    )  # fmt: skip
    q = resources(env, account="proj-1").queues["q"]
    assert (q.visibility_timeout_s, q.max_receive_count, q.retention_s) == (ack_deadline, attempts, 7 * 24 * 3600)
