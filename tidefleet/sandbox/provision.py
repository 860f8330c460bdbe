"""Create an environment's cloud resources on the emulator through boto3.

What `stacks/` declares for a real account, made here with plain API calls so the sandbox
needs no Terraform: per queue an SQS queue and its dead-letter queue, the job table, the
item log group, and per pool a launch template (user-data = the pool's rendered template
in local mode), an Auto Scaling group in a VPC created for it, and the drain lifecycle hook.
Every name comes from `tidefleet.naming`.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass

import boto3

from tidefleet import naming
from tidefleet.cloud.aws.dynamodb import create_table
from tidefleet.config import Environment, Pool

# moto's (and an unconfigured boto3 client's) account: the artifacts bucket name needs one.
EMULATOR_ACCOUNT = "123456789012"
SANDBOX_IMAGE = "ami-12c6146b"  # moto ships this AMI; a real pool resolves `Pool.image`


@dataclass(frozen=True)
class Provisioned:
    queue_urls: dict[str, str]  # queue name -> url
    dead_letter_urls: dict[str, str]
    groups: dict[str, str]  # pool name -> group name


def provision(env: Environment, *, user_data: dict[str, str]) -> Provisioned:
    """Create every resource of `env`; `user_data` maps pool name -> rendered script."""
    queue_urls, dead_letter_urls = create_queues(env)
    create_table(env.name, env.region)
    boto3.client("logs", region_name=env.region).create_log_group(
        logGroupName=naming.item_log_group(env.name)
    )
    boto3.client("s3", region_name=env.region).create_bucket(
        Bucket=naming.artifacts_bucket(env.name, EMULATOR_ACCOUNT)
    )

    subnet_id = _network(env)
    for pool_name, pool in env.pools.items():
        _group(env, pool_name, pool, subnet_id, user_data[pool_name])
    return Provisioned(
        queue_urls, dead_letter_urls, {pool: naming.group(env.name, pool) for pool in env.pools}
    )


def create_queues(env: Environment) -> tuple[dict[str, str], dict[str, str]]:
    """Each queue of `env` and its dead-letter queue, with the stack's redrive policy; their urls by name."""
    sqs = boto3.client("sqs", region_name=env.region)
    queue_urls, dead_letter_urls = {}, {}
    for name, queue in env.queues.items():
        dlq_url = sqs.create_queue(QueueName=naming.dead_letter_queue(env.name, name))["QueueUrl"]
        dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])["Attributes"][
            "QueueArn"
        ]
        redrive = {
            "deadLetterTargetArn": dlq_arn,
            "maxReceiveCount": str(queue.max_receive_count),
        }
        queue_urls[name] = sqs.create_queue(
            QueueName=naming.queue(env.name, name),
            Attributes={
                "VisibilityTimeout": str(queue.visibility_timeout_s),
                "RedrivePolicy": json.dumps(redrive),
            },
        )["QueueUrl"]
        dead_letter_urls[name] = dlq_url
    return queue_urls, dead_letter_urls


def _network(env: Environment) -> str:
    ec2 = boto3.client("ec2", region_name=env.region)
    vpc_id = ec2.create_vpc(CidrBlock=env.network.vpc_cidr)["Vpc"]["VpcId"]
    # One subnet is enough on one machine: the first /24 of the VPC.
    first = env.network.vpc_cidr.split("/")[0].rsplit(".", 2)[0] + ".0.0/24"
    return ec2.create_subnet(VpcId=vpc_id, CidrBlock=first, AvailabilityZone=f"{env.region}a")["Subnet"][
        "SubnetId"
    ]


def _group(env: Environment, pool_name: str, pool: Pool, subnet_id: str, user_data: str) -> None:
    """Launch template, mixed-instances group (moto accepts the policy) and drain hook of one pool."""
    ec2 = boto3.client("ec2", region_name=env.region)
    autoscaling = boto3.client("autoscaling", region_name=env.region)
    template_name = naming.launch_template(env.name, pool_name)
    ec2.create_launch_template(
        LaunchTemplateName=template_name,
        LaunchTemplateData={
            "ImageId": SANDBOX_IMAGE,
            "InstanceType": pool.instance_types[0].type,
            "UserData": base64.b64encode(user_data.encode()).decode(),
        },
    )
    template = {"LaunchTemplateName": template_name, "Version": "$Latest"}
    common = {
        "AutoScalingGroupName": naming.group(env.name, pool_name),
        "MinSize": 0,
        "MaxSize": pool.max,
        "DesiredCapacity": 0,
        "VPCZoneIdentifier": subnet_id,
        "Tags": [
            {"Key": k, "Value": v, "PropagateAtLaunch": True}
            for k, v in {**env.tags, "tidefleet:env": env.name, "tidefleet:pool": pool_name}.items()
        ],
    }
    autoscaling.create_auto_scaling_group(
        **common,
        MixedInstancesPolicy={
            "LaunchTemplate": {
                "LaunchTemplateSpecification": template,
                "Overrides": [
                    {"InstanceType": t.type, "WeightedCapacity": str(t.weight)} for t in pool.instance_types
                ],
            },
            "InstancesDistribution": {
                "OnDemandBaseCapacity": pool.on_demand_base,
                "OnDemandPercentageAboveBaseCapacity": pool.on_demand_percent,
                "SpotAllocationStrategy": pool.spot_allocation_strategy,
            },
        },
    )
    autoscaling.put_lifecycle_hook(
        LifecycleHookName=naming.lifecycle_hook(env.name, pool_name),
        AutoScalingGroupName=naming.group(env.name, pool_name),
        LifecycleTransition="autoscaling:EC2_INSTANCE_TERMINATING",
        HeartbeatTimeout=max(q.item_timeout_s for q in env.queues_of(pool_name).values()) + 30,
        DefaultResult="CONTINUE",
    )
