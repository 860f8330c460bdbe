"""The control plane's wiring: scaler and interruption functions, and what invokes them.

Scaler: an EventBridge schedule, one queue-depth alarm per queue (its action invokes the
function directly) and asynchronous "kicks" from the job SDK. Interruption: EventBridge
rules for spot interruption warnings, rebalance recommendations and this environment's
terminate lifecycle actions. Failed asynchronous invocations land in an encrypted queue.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cdktn import Fn
from cdktn_provider_aws.cloudwatch_event_rule import CloudwatchEventRule
from cdktn_provider_aws.cloudwatch_event_target import CloudwatchEventTarget
from cdktn_provider_aws.cloudwatch_metric_alarm import CloudwatchMetricAlarm
from cdktn_provider_aws.lambda_function import LambdaFunction
from cdktn_provider_aws.lambda_function_event_invoke_config import LambdaFunctionEventInvokeConfig
from cdktn_provider_aws.lambda_permission import LambdaPermission
from constructs import Construct

from stacks.aws.iam import AwsContext, ServiceRole, Statement
from stacks.aws.storage import encrypted_queue, log_group
from tidefleet import naming
from tidefleet.config import Environment
from tidefleet.resources import EnvResources

RUNTIME = "python3.12"
HANDLERS = {"scaler": "lambdas.scaler.handler.handler", "interruption": "lambdas.interruption.handler.handler"}
# Scaler: one tick at a time (its actions are idempotent, but two would race each other).
# Interruption: notices come in bursts when a zone loses spot capacity.
RESERVED_CONCURRENCY = {"scaler": 1, "interruption": 10}
# Scaler: a run ticks again while items wait, for up to 60 s after its first tick, plus one tick.
TIMEOUT_S = {"scaler": 120, "interruption": 30}
# A failed tick is superseded by the next one; retrying it only adds load.
ASYNC_RETRIES = 1
# A kick throttled while a run loops (one at a time) is retried by Lambda for a minute (the least
# it accepts), not up to 6 hours: the running loop already ticks for the waiting items.
MAX_EVENT_AGE_S = {"scaler": 60}
INTERRUPTION_EVENTS = {
    "spot-warning": {"source": ["aws.ec2"], "detail-type": ["EC2 Spot Instance Interruption Warning"]},
    "rebalance": {"source": ["aws.ec2"], "detail-type": ["EC2 Instance Rebalance Recommendation"]},
}

# Actions without resource-level permissions: AWS only accepts resource "*" for them.
DESCRIBE_FLEET = Statement(
    "DescribeFleetUnscopable",
    ["autoscaling:DescribeAutoScalingGroups", "autoscaling:DescribeAutoScalingInstances",
     "autoscaling:DescribeScalingActivities", "ec2:DescribeInstances", "ec2:DescribeSpotInstanceRequests"],
    ["*"],
)  # fmt: skip
# What a launch from the templates creates or uses, besides the template and the image.
LAUNCHED_RESOURCES = ("instance", "volume", "network-interface", "subnet", "security-group", "spot-instances-request")
XRAY_WRITE = Statement("XRayWriteUnscopable", ["xray:PutTraceSegments", "xray:PutTelemetryRecords"], ["*"])
# The queues' URLs come from one ListQueues by the environment's prefix (SqsQueues._list_urls).
LIST_QUEUES = Statement("ListQueuesUnscopable", ["sqs:ListQueues"], ["*"])


def schedule_expression(tick_s: int) -> str:
    """EventBridge's finest rate is one minute; faster ticks come from alarms and kicks."""
    minutes = max(1, math.ceil(tick_s / 60))
    return f"rate({minutes} minute{'s' if minutes > 1 else ''})"


@dataclass(frozen=True)
class LaunchGrants:
    """What changing a group's on-demand base needs beyond autoscaling:UpdateAutoScalingGroup:
    AWS re-checks that the caller may launch from the group's launch template (RunInstances,
    CreateTags for its tag specifications, PassRole for its instance profile, and the image's
    SSM parameter), as for CreateAutoScalingGroup. Scoped to this environment's templates and
    node roles."""

    template_arns: Sequence[str]
    node_role_arns: Sequence[str]
    image_parameter_arns: Sequence[str]

    def statements(self, ctx: AwsContext) -> list[Statement]:
        from_own_templates = [{"test": "ArnEquals", "variable": "ec2:LaunchTemplate", "values": list(self.template_arns)}]
        launched = [ctx.arn("ec2", f"{kind}/*") for kind in LAUNCHED_RESOURCES]
        out = [
            Statement("LaunchFromOwnTemplates", ["ec2:RunInstances"], list(self.template_arns)),
            Statement("LaunchWithOwnTemplatesOnly", ["ec2:RunInstances"],
                      [*launched, f"arn:{ctx.partition}:ec2:{ctx.region}::image/*"], from_own_templates),
            Statement("TagAtLaunch", ["ec2:CreateTags"], [ctx.arn("ec2", "instance/*"), ctx.arn("ec2", "volume/*")],
                      [{"test": "StringEquals", "variable": "ec2:CreateAction", "values": ["RunInstances"]}]),
            Statement("PassNodeRoles", ["iam:PassRole"], list(self.node_role_arns),
                      [{"test": "StringEquals", "variable": "iam:PassedToService", "values": ["ec2.amazonaws.com"]}]),
        ]  # fmt: skip
        if self.image_parameter_arns:
            out.append(Statement("ResolveImages", ["ssm:GetParameters"], sorted(set(self.image_parameter_arns))))
        return out


@dataclass(frozen=True)
class QueueRef:
    name: str  # the SQS queue name (the alarm's dimension)
    arn: str


class ControlFunctions(Construct):
    """Exposes `functions` (role -> aws_lambda_function) and `failures` (the failure queue)."""

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        env: Environment,
        spec: EnvResources,
        ctx: AwsContext,
        archive_path: str,
        queues: Mapping[str, QueueRef],
        group_names: Sequence[str],
        group_arns: Sequence[str],
        launch: LaunchGrants,
        table_arn: str,
        key_arn: str,
    ) -> None:
        super().__init__(scope, id)
        failures = spec.function_failures
        self.failures = encrypted_queue(self, "failures", name=failures.name, retention_s=failures.retention_s)
        scaler_arn = ctx.arn("lambda", f"function:{naming.function(env.name, 'scaler')}")
        common = [
            DESCRIBE_FLEET,
            XRAY_WRITE,
            Statement("ReadSettings", ["kms:Decrypt"], [key_arn]),
            Statement("ReportFailures", ["sqs:SendMessage"], [self.failures.arn]),
            Statement("QueueDepth", ["sqs:GetQueueUrl", "sqs:GetQueueAttributes"], [q.arn for q in queues.values()]),
            LIST_QUEUES,
        ]
        statements = {
            "scaler": [
                *common,
                Statement("ActOnOwnGroups", ["autoscaling:SetDesiredCapacity", "autoscaling:TerminateInstanceInAutoScalingGroup",
                                             "autoscaling:SetInstanceProtection", "autoscaling:UpdateAutoScalingGroup",
                                             "autoscaling:CompleteLifecycleAction"], list(group_arns)),
                # BatchGetItem: the queues' recorded mean item times (store.queue_stats).
                Statement("NodeState", ["dynamodb:Query", "dynamodb:GetItem", "dynamodb:BatchGetItem",
                                        "dynamodb:UpdateItem", "dynamodb:DeleteItem"], [table_arn]),
                *launch.statements(ctx),
            ],
            "interruption": [
                *common,
                Statement("ActOnOwnGroups", ["autoscaling:SetDesiredCapacity", "autoscaling:CompleteLifecycleAction",
                                             "autoscaling:RecordLifecycleActionHeartbeat"], list(group_arns)),
                Statement("MarkDraining", ["dynamodb:Query", "dynamodb:GetItem", "dynamodb:UpdateItem"], [table_arn]),
                Statement("KickScaler", ["lambda:InvokeFunction"], [scaler_arn]),
            ],
        }  # fmt: skip
        self.functions = {
            role: self._function(env, ctx, role, archive_path, statements[role], key_arn, spec.log_retention_days)
            for role in HANDLERS
        }
        scaler, interruption = self.functions["scaler"], self.functions["interruption"]

        tick = CloudwatchEventRule(
            self, "tick", name=naming.stack_resource(env.name, "scaler-tick"),
            schedule_expression=schedule_expression(env.scaler.tick_s), description="scheduled control tick",
        )  # fmt: skip
        self._invoke_on_event(scaler, "tick", tick)
        for queue_name, queue in sorted(queues.items()):
            alarm = CloudwatchMetricAlarm(
                self, f"backlog-{queue_name}", alarm_name=naming.stack_resource(env.name, f"{queue_name}-backlog"),
                alarm_description=f"items waiting in {queue.name}: tick the scaler now",
                namespace="AWS/SQS", metric_name="ApproximateNumberOfMessagesVisible",
                dimensions={"QueueName": queue.name}, statistic="Maximum", period=60, evaluation_periods=1,
                threshold=0, comparison_operator="GreaterThanThreshold", treat_missing_data="notBreaching",
                actions_enabled=True, alarm_actions=[scaler.arn],
            )  # fmt: skip
            LambdaPermission(
                self, f"backlog-{queue_name}-invokes-scaler", function_name=scaler.function_name,
                action="lambda:InvokeFunction", principal="lambda.alarms.cloudwatch.amazonaws.com",
                source_arn=alarm.arn, source_account=ctx.account_id,
            )  # fmt: skip

        patterns = {
            **INTERRUPTION_EVENTS,
            "terminate-hook": {
                "source": ["aws.autoscaling"],
                "detail-type": ["EC2 Instance-terminate Lifecycle Action"],
                "detail": {"AutoScalingGroupName": sorted(group_names)},
            },
        }
        for kind, pattern in patterns.items():
            rule = CloudwatchEventRule(
                self, kind, name=naming.stack_resource(env.name, kind), event_pattern=json.dumps(pattern),
                description=f"{kind} -> interruption function",
            )  # fmt: skip
            self._invoke_on_event(interruption, kind, rule)

    def _function(
        self, env: Environment, ctx: AwsContext, role: str, archive_path: str, statements: list[Statement], key_arn: str,
        log_retention_days: int,
    ) -> LambdaFunction:
        name = naming.function(env.name, role)
        logs = log_group(self, f"{role}-logs", name=naming.function_log_group(env.name, role),
                         retention_days=log_retention_days, key_arn=key_arn)  # fmt: skip
        execution = ServiceRole(
            self, f"{role}-role", name=name, service="lambda.amazonaws.com",
            statements=[*statements, Statement("OwnLogs", ["logs:CreateLogStream", "logs:PutLogEvents"],
                                                [logs.arn, f"{logs.arn}:log-stream:*"])],
        )  # fmt: skip
        function = LambdaFunction(
            self, role, function_name=name, role=execution.arn, handler=HANDLERS[role], runtime=RUNTIME,
            architectures=["x86_64"], filename=archive_path, source_code_hash=Fn.filebase64sha256(archive_path),
            timeout=TIMEOUT_S[role], memory_size=256, reserved_concurrent_executions=RESERVED_CONCURRENCY[role],
            environment={"variables": {"TIDEFLEET_ENV": env.name}}, kms_key_arn=key_arn,
            tracing_config={"mode": "Active"}, logging_config={"log_format": "JSON", "log_group": logs.name},
            depends_on=[logs],
        )  # fmt: skip
        LambdaFunctionEventInvokeConfig(
            self, f"{role}-async", function_name=function.function_name, maximum_retry_attempts=ASYNC_RETRIES,
            maximum_event_age_in_seconds=MAX_EVENT_AGE_S.get(role),
            destination_config={"on_failure": {"destination": self.failures.arn}},
        )  # fmt: skip
        return function

    def _invoke_on_event(self, function: LambdaFunction, kind: str, rule: CloudwatchEventRule) -> None:
        CloudwatchEventTarget(self, f"{kind}-target", rule=rule.name, arn=function.arn)
        LambdaPermission(
            self, f"{kind}-invokes", function_name=function.function_name, action="lambda:InvokeFunction",
            principal="events.amazonaws.com", source_arn=rule.arn,
        )  # fmt: skip
