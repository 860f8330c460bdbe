"""Create an environment's AWS resources through boto3, for the sandbox on the emulator.

What `stacks/aws` declares for a real account, made here with plain API calls so the sandbox
needs no Terraform, from the same description (`tidefleet.resources`): per queue an SQS queue
and its dead-letter queue, the job table, the item log group, the artifacts bucket, and per
pool a launch template (user-data = the pool's rendered template in local mode), an Auto
Scaling group and its drain lifecycle hook. Only the network is the sandbox's own: one VPC with
one subnet, which is all one machine needs. Every boto3 call of the sandbox's provisioning is
in this file (the table's through `dynamodb.create_table`).
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass

import boto3

from tidefleet.cloud.aws.dynamodb import create_table
from tidefleet.config import Environment
from tidefleet.resources import EnvResources, PoolSpec, QueueSpec, resources

# moto's (and an unconfigured boto3 client's) account: the artifacts bucket name needs one.
EMULATOR_ACCOUNT = "123456789012"


@dataclass(frozen=True)
class Provisioned:
    queue_urls: dict[str, str]  # queue name -> url
    dead_letter_urls: dict[str, str]
    groups: dict[str, str]  # pool name -> group name


def provision(
    env: Environment, *, user_data: dict[str, str], visibility_timeout_s: int | None = None
) -> Provisioned:
    """Create every resource of `env`; `user_data` maps pool name -> rendered script.
    `visibility_timeout_s` overrides every queue's (tests that wait for a lost message)."""
    spec = resources(env, account=EMULATOR_ACCOUNT)
    queue_urls, dead_letter_urls = create_queues(env, visibility_timeout_s)
    create_table(env.name, env.region)
    dynamodb = boto3.client("dynamodb", region_name=env.region)
    dynamodb.update_continuous_backups(
        TableName=spec.table.name,
        PointInTimeRecoverySpecification={"PointInTimeRecoveryEnabled": spec.table.point_in_time_recovery},
    )
    logs = boto3.client("logs", region_name=env.region)
    logs.create_log_group(logGroupName=spec.item_logs.name)
    logs.put_retention_policy(logGroupName=spec.item_logs.name, retentionInDays=spec.item_logs.retention_days)
    _bucket(env.region, spec)
    subnet_id = _network(env)
    for pool_name, pool in spec.pools.items():
        _group(env.region, pool, subnet_id, user_data[pool_name])
    return Provisioned(
        queue_urls, dead_letter_urls, {name: pool.group_name for name, pool in spec.pools.items()}
    )


def create_queues(env: Environment, visibility_timeout_s: int | None = None) -> tuple[dict[str, str], dict[str, str]]:
    """Each queue of `env` and its dead-letter queue, as the spec says; their urls by name."""
    queue_urls, dead_letter_urls = {}, {}
    for name, queue in resources(env, account=EMULATOR_ACCOUNT).queues.items():
        queue_urls[name], dead_letter_urls[name] = _queue(env.region, queue, visibility_timeout_s)
    return queue_urls, dead_letter_urls


def _queue(region: str, queue: QueueSpec, visibility_timeout_s: int | None) -> tuple[str, str]:
    sqs = boto3.client("sqs", region_name=region)
    common = {"MessageRetentionPeriod": str(queue.retention_s), "SqsManagedSseEnabled": "true"}
    dlq_url = sqs.create_queue(QueueName=queue.dead_letter_name, Attributes=common)["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    redrive = {"deadLetterTargetArn": dlq_arn, "maxReceiveCount": str(queue.max_receive_count)}
    visibility = queue.visibility_timeout_s if visibility_timeout_s is None else visibility_timeout_s
    url = sqs.create_queue(
        QueueName=queue.name,
        Attributes={**common, "VisibilityTimeout": str(visibility), "RedrivePolicy": json.dumps(redrive)},
    )["QueueUrl"]
    return url, dlq_url


def _bucket(region: str, spec: EnvResources) -> None:
    s3 = boto3.client("s3", region_name=region)
    bucket = spec.artifacts
    # Outside us-east-1, S3 wants the bucket's region named again.
    where = {} if region == "us-east-1" else {"CreateBucketConfiguration": {"LocationConstraint": region}}
    s3.create_bucket(Bucket=bucket.name, **where)
    s3.put_bucket_versioning(
        Bucket=bucket.name, VersioningConfiguration={"Status": "Enabled" if bucket.versioned else "Suspended"}
    )
    s3.put_bucket_lifecycle_configuration(
        Bucket=bucket.name,
        LifecycleConfiguration={
            "Rules": [
                {
                    "ID": "expire-old-versions-and-uploads",
                    "Status": "Enabled",
                    "Filter": {"Prefix": ""},
                    "NoncurrentVersionExpiration": {
                        "NoncurrentDays": bucket.noncurrent_version_expiration_days
                    },
                    "AbortIncompleteMultipartUpload": {
                        "DaysAfterInitiation": bucket.abort_incomplete_upload_days
                    },
                }
            ]
        },
    )


def _network(env: Environment) -> str:
    ec2 = boto3.client("ec2", region_name=env.region)
    vpc_id = ec2.create_vpc(CidrBlock=env.network.vpc_cidr)["Vpc"]["VpcId"]
    # One subnet is enough on one machine: the first /24 of the VPC.
    first = env.network.vpc_cidr.split("/")[0].rsplit(".", 2)[0] + ".0.0/24"
    return ec2.create_subnet(VpcId=vpc_id, CidrBlock=first, AvailabilityZone=f"{env.region}a")["Subnet"][
        "SubnetId"
    ]


def _group(region: str, pool: PoolSpec, subnet_id: str, user_data: str) -> None:
    """Launch template, mixed-instances group (moto accepts the policy) and drain hook of one pool."""
    ec2 = boto3.client("ec2", region_name=region)
    autoscaling = boto3.client("autoscaling", region_name=region)
    template = pool.launch_template
    ec2.create_launch_template(
        LaunchTemplateName=template.name,
        LaunchTemplateData={
            "ImageId": template.emulator_image,
            # The stack's template names no type (the group's overrides do); moto launches this one.
            "InstanceType": pool.instance_types[0][0],
            "UserData": base64.b64encode(user_data.encode()).decode(),
            "MetadataOptions": {
                "HttpEndpoint": "enabled",
                "HttpTokens": template.http_tokens,
                "HttpPutResponseHopLimit": template.http_put_response_hop_limit,
            },
        },
    )
    autoscaling.create_auto_scaling_group(
        AutoScalingGroupName=pool.group_name,
        MinSize=pool.min_size,
        MaxSize=pool.max_size,
        DesiredCapacity=pool.initial_desired,
        VPCZoneIdentifier=subnet_id,
        CapacityRebalance=pool.capacity_rebalance,
        HealthCheckGracePeriod=pool.health_check_grace_period_s,
        Tags=[{"Key": k, "Value": v, "PropagateAtLaunch": True} for k, v in sorted(pool.tags.items())],
        MixedInstancesPolicy={
            "LaunchTemplate": {
                "LaunchTemplateSpecification": {"LaunchTemplateName": template.name, "Version": "$Latest"},
                "Overrides": [
                    {"InstanceType": t, "WeightedCapacity": str(w)} for t, w in pool.instance_types
                ],
            },
            "InstancesDistribution": {
                "OnDemandBaseCapacity": pool.on_demand_base,
                "OnDemandPercentageAboveBaseCapacity": pool.on_demand_percent,
                "SpotAllocationStrategy": pool.spot_allocation_strategy,
                "SpotMaxPrice": pool.spot_max_price,
            },
        },
    )
    autoscaling.suspend_processes(
        AutoScalingGroupName=pool.group_name, ScalingProcesses=list(pool.suspended_processes)
    )
    hook = pool.drain_hook
    autoscaling.put_lifecycle_hook(
        LifecycleHookName=hook.name,
        AutoScalingGroupName=pool.group_name,
        LifecycleTransition=hook.transition,
        HeartbeatTimeout=hook.heartbeat_timeout_s,
        DefaultResult=hook.default_result,
    )
