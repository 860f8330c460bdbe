"""One node pool: launch template, autoscaling group, termination hook and the node role.

The scaler owns the group's desired capacity (Terraform ignores it) and chooses which
nodes go; the group only launches the pool's types by weight, spot first.
"""

from __future__ import annotations

from cdktn import TerraformResourceLifecycle
from cdktn_provider_aws.autoscaling_group import (
    AutoscalingGroup,
    AutoscalingGroupInitialLifecycleHook,
    AutoscalingGroupMixedInstancesPolicyLaunchTemplateOverride,
    AutoscalingGroupTag,
)
from cdktn_provider_aws.iam_instance_profile import IamInstanceProfile
from cdktn_provider_aws.launch_template import (
    LaunchTemplate,
    LaunchTemplateBlockDeviceMappings,
    LaunchTemplateNetworkInterfaces,
    LaunchTemplateTagSpecifications,
)
from cdktn_provider_aws.placement_group import PlacementGroup
from constructs import Construct

from stacks.aws.data import data_statements, gang_security_group
from stacks.aws.iam import AwsContext, ServiceRole, Statement
from tidefleet import naming, registries
from tidefleet.config import Environment
from tidefleet.resources import PoolSpec

ROOT_DEVICE = "/dev/xvda"  # Amazon Linux 2023 and its Deep Learning AMIs
GROUP_METRICS = ["GroupInServiceInstances", "GroupPendingInstances", "GroupDesiredCapacity",
                 "GroupInServiceCapacity", "GroupPendingCapacity"]  # fmt: skip


def image_id(image: str) -> str:
    """An AMI id as is; `ssm:/path` becomes EC2's resolve-at-launch syntax."""
    return f"resolve:ssm:{image.removeprefix('ssm:')}" if image.startswith("ssm:") else image


def pull_statements(ctx: AwsContext, repositories: list[registries.Repository]) -> list[Statement]:
    """Pulls of the pool's private ECR images (`tidefleet.registries`): the token for docker's
    credential helper (unscopable), then the layers of the named repositories only."""
    if not repositories:
        return []
    arns = [f"arn:{ctx.partition}:ecr:{r.location}:{r.owner}:repository/{r.name}" for r in repositories]
    return [Statement("PullImagesTokenUnscopable", ["ecr:GetAuthorizationToken"], ["*"]),
            Statement("PullImages", ["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer",
                                     "ecr:BatchCheckLayerAvailability"], arns)]  # fmt: skip


def image_parameter_arn(ctx: AwsContext, image: str) -> str | None:
    """The SSM parameter an `ssm:/path` image resolves from at launch (AWS's public ones, under
    /aws/service/, have no account in their ARN); None for an AMI id."""
    if not image.startswith("ssm:"):
        return None
    path = image.removeprefix("ssm:")
    account = "" if path.startswith("/aws/service/") else ctx.account_id
    return f"arn:{ctx.partition}:ssm:{ctx.region}:{account}:parameter{path}"


class NodePool(Construct):
    """Exposes `group` (name, arn), `role`, `template_arn` and `image_parameter_arn`: what
    the scaler needs to change the group (it launches with this template and role)."""

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        env: Environment,
        pool_name: str,
        spec: PoolSpec,
        ctx: AwsContext,
        subnet_ids: list[str],
        vpc_id: str,
        security_group_id: str,
        user_data_base64: str,
        queue_arns: list[str],
        table_arn: str,
        item_log_group_arn: str,
        artifacts_bucket_arn: str,
        key_arn: str,
    ) -> None:
        super().__init__(scope, id)
        pool = env.pools[pool_name]
        group_name = spec.group_name
        # Scoped by name: the id inside a group's ARN exists only once the group does.
        group_arn = ctx.arn("autoscaling", f"autoScalingGroup:*:autoScalingGroupName/{group_name}")
        queues = sorted(env.queues_of(pool_name))
        checkpoints = [f"{artifacts_bucket_arn}/{naming.checkpoint_prefix(q)}*" for q in queues]
        streams = [f"{item_log_group_arn}:log-stream:{naming.item_log_stream_prefix(q)}*" for q in queues]
        self.role = ServiceRole(
            self,
            "node-role",
            name=naming.node_role(env.name, pool_name),
            service="ec2.amazonaws.com",
            statements=[
                Statement("WorkOwnQueues", ["sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:ChangeMessageVisibility",
                                            "sqs:SendMessage", "sqs:GetQueueAttributes", "sqs:GetQueueUrl"], queue_arns),
                # Any job's records (an item's queue is not in its key), but heartbeats and
                # queue statistics of its own pool and queues only.
                Statement("JobStore", ["dynamodb:GetItem", "dynamodb:BatchGetItem", "dynamodb:UpdateItem", "dynamodb:Query"],
                          [table_arn],
                          [{"test": "ForAllValues:StringLike", "variable": "dynamodb:LeadingKeys",
                            "values": ["JOB#*", f"POOL#{pool_name}", *(f"QUEUE#{q}" for q in queues)]}]),
                # CreateLogStream is authorized on the group only; writing, on the stream.
                Statement("ItemLogStreams", ["logs:CreateLogStream"], [item_log_group_arn, *streams]),
                Statement("ItemLogs", ["logs:PutLogEvents"], streams),
                # Terminate: an idle node leaves on the scaler's leave grant (`NodeHost.retire`).
                Statement("OwnGroup", ["autoscaling:SetInstanceProtection", "autoscaling:CompleteLifecycleAction",
                                       "autoscaling:RecordLifecycleActionHeartbeat",
                                       "autoscaling:TerminateInstanceInAutoScalingGroup"], [group_arn]),
                Statement("ReadAgent", ["s3:GetObject"], [f"{artifacts_bucket_arn}/agent/*"]),
                Statement("OwnCheckpoints", ["s3:GetObject", "s3:PutObject", "s3:DeleteObject",
                                             "s3:AbortMultipartUpload"], checkpoints),
                Statement("ListAgentAndOwnCheckpoints", ["s3:ListBucket"], [artifacts_bucket_arn],
                          [{"test": "StringLike", "variable": "s3:prefix",
                            "values": ["agent/*", *(f"{naming.checkpoint_prefix(q)}*" for q in queues)]}]),
                Statement("ArtifactsKey", ["kms:Decrypt", "kms:GenerateDataKey"], [key_arn]),
                *data_statements(ctx, pool.data),
                *pull_statements(ctx, registries.pulls(env, pool_name)),
            ],
        )  # fmt: skip
        security_groups, placement_group = [security_group_id], None
        if pool.placement == "cluster":
            # Training pools: nodes close together (one zone), all traffic among them.
            placement_group = PlacementGroup(self, "placement", name=naming.stack_resource(env.name, f"{pool_name}-cluster"),
                                             strategy="cluster").id  # fmt: skip
            security_groups.append(gang_security_group(self, "gang", env_name=env.name, pool_name=pool_name, vpc_id=vpc_id))
            subnet_ids = subnet_ids[:1]
        profile = IamInstanceProfile(self, "profile", name=naming.node_role(env.name, pool_name), role=self.role.name)
        tags, lt = spec.tags, spec.launch_template
        template = LaunchTemplate(
            self,
            "launch-template",
            name=lt.name,
            image_id=image_id(lt.image),
            iam_instance_profile={"arn": profile.arn},
            user_data=user_data_base64,
            update_default_version=True,
            ebs_optimized="true",
            monitoring={"enabled": True},
            metadata_options={
                "http_endpoint": "enabled",
                "http_tokens": lt.http_tokens,
                "http_put_response_hop_limit": lt.http_put_response_hop_limit,
            },
            block_device_mappings=[
                LaunchTemplateBlockDeviceMappings(
                    device_name=ROOT_DEVICE,
                    ebs={"volume_size": lt.root_volume_gb, "volume_type": "gp3", "encrypted": "true",
                         "delete_on_termination": "true"},
                )
            ],
            network_interfaces=[
                LaunchTemplateNetworkInterfaces(
                    device_index=0,
                    associate_public_ip_address="true" if pool.public_ip else "false",
                    security_groups=security_groups,
                    delete_on_termination="true",
                    interface_type="efa" if pool.efa else None,
                )
            ],
            tag_specifications=[LaunchTemplateTagSpecifications(resource_type="volume", tags=tags)],
        )  # fmt: skip
        self.group = AutoscalingGroup(
            self,
            "group",
            name=group_name,
            min_size=spec.min_size,
            max_size=spec.max_size,
            desired_capacity=spec.initial_desired,
            vpc_zone_identifier=subnet_ids,
            placement_group=placement_group,
            capacity_rebalance=spec.capacity_rebalance,
            health_check_grace_period=spec.health_check_grace_period_s,
            suspended_processes=list(spec.suspended_processes),
            wait_for_capacity_timeout="0",
            enabled_metrics=GROUP_METRICS,
            metrics_granularity="1Minute",
            mixed_instances_policy={
                "instances_distribution": {
                    "on_demand_base_capacity": spec.on_demand_base,
                    "on_demand_percentage_above_base_capacity": spec.on_demand_percent,
                    "spot_allocation_strategy": spec.spot_allocation_strategy,
                    "spot_max_price": spec.spot_max_price,
                },
                "launch_template": {
                    "launch_template_specification": {"launch_template_id": template.id, "version": "$Latest"},
                    "override": [
                        AutoscalingGroupMixedInstancesPolicyLaunchTemplateOverride(
                            instance_type=itype, weighted_capacity=str(weight)
                        )
                        for itype, weight in spec.instance_types
                    ],
                },
            },
            initial_lifecycle_hook=[
                AutoscalingGroupInitialLifecycleHook(
                    name=spec.drain_hook.name,
                    lifecycle_transition=spec.drain_hook.transition,
                    heartbeat_timeout=spec.drain_hook.heartbeat_timeout_s,
                    default_result=spec.drain_hook.default_result,
                )
            ],
            tag=[AutoscalingGroupTag(key=k, value=v, propagate_at_launch=True) for k, v in sorted(tags.items())],
            # The scaler owns desired capacity and, while spot is short, the on-demand base.
            lifecycle=TerraformResourceLifecycle(ignore_changes=[
                "desired_capacity",
                "mixed_instances_policy[0].instances_distribution[0].on_demand_base_capacity",
            ]),
        )
        self.group_name = group_name
        self.group_arn = group_arn
        self.template_arn = template.arn
        self.image_parameter_arn = image_parameter_arn(ctx, lt.image)
