"""Scheduled jobs on AWS: the schedule function, one EventBridge Scheduler schedule per
`[schedules.NAME]` (its input carries the fire time), and the one-minute watch that releases
jobs submitted --after another and cancels scheduled runs past their timeout
(tidefleet.jobs.scheduled). Least privilege: the function may send to this environment's
queues, write its job store and kick the scaler; the scheduler's role may only invoke it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from cdktn import Fn
from cdktn_provider_aws.lambda_function import LambdaFunction
from cdktn_provider_aws.lambda_function_event_invoke_config import LambdaFunctionEventInvokeConfig
from cdktn_provider_aws.scheduler_schedule import SchedulerSchedule
from constructs import Construct

from stacks.aws.functions import ASYNC_RETRIES, RUNTIME, XRAY_WRITE
from stacks.aws.iam import AwsContext, ServiceRole, Statement
from stacks.aws.storage import log_group
from tidefleet import naming
from tidefleet.config import Environment
from tidefleet.resources import EnvResources
from tidefleet.schedules import CRON_FIELDS, Cron
from tidefleet.triggers import WATCH_EVENT, fire_event

ROLE = "schedule"
HANDLER = "lambdas.schedule.handler.handler"
TIMEOUT_S = 300  # a fire submits its items: a few thousand in seconds, and a re-run continues a cut one
WATCH_EVERY = "rate(1 minute)"
AWS_FIRE_TIME = "<aws.scheduler.scheduled-time>"  # EventBridge Scheduler puts the fire time here


def expression(cron: str | None, rate: str | None) -> str:
    """EventBridge Scheduler's form: cron(min hour dom month dow year), one of dom/dow '?'."""
    if rate is not None:
        count, unit = rate.split()
        return f"rate({count} {unit.rstrip('s')}{'s' if int(count) > 1 else ''})"  # AWS wants "1 hour", "2 hours"
    # AWS writes a step from the field's first value ("0/15"), not "*/15".
    minute, hour, dom, month, dow = (f.replace("*/", f"{low}/") for f, (_, low, _) in zip(cron.split(), CRON_FIELDS))
    dow = "?" if dow == "*" else _aws_weekdays(Cron.parse(cron).weekdays)
    dom = "?" if dow != "?" and dom == "*" else dom
    return f"cron({minute} {hour} {dom} {month} {dow} *)"


def _aws_weekdays(days: frozenset[int]) -> str:
    """The days tidefleet's cron reads (0-6 from Sunday, 7 read as Sunday too) in AWS's numbering, 1-7
    from Sunday, as ranges and a list: EventBridge's day-of-week field takes , - * ? L # but no '/'
    step, so "*/2" is written "1,3,5,7" and "1-5" stays a range, "2-6"."""
    runs: list[list[int]] = []
    for day in sorted(d + 1 for d in days):
        if runs and day == runs[-1][-1] + 1:
            runs[-1].append(day)
        else:
            runs.append([day])
    return ",".join(f"{run[0]}-{run[-1]}" if len(run) > 2 else ",".join(map(str, run)) for run in runs)


class ScheduledJobs(Construct):
    """Exposes `function`, `schedules` (name -> aws_scheduler_schedule) and `watch` (the minute watch's)."""

    def __init__(
        self, scope: Construct, id: str, *, env: Environment, spec: EnvResources, ctx: AwsContext, archive_path: str,
        queue_arns: Sequence[str], table_arn: str, key_arn: str, failures_arn: str,
    ) -> None:  # fmt: skip
        super().__init__(scope, id)
        name = naming.function(env.name, ROLE)
        logs = log_group(self, "logs", name=naming.function_log_group(env.name, ROLE),
                         retention_days=spec.log_retention_days, key_arn=key_arn)  # fmt: skip
        execution = ServiceRole(
            self, "role", name=name, service="lambda.amazonaws.com",
            statements=[
                XRAY_WRITE,
                Statement("ReadSettings", ["kms:Decrypt"], [key_arn]),
                Statement("ReportFailures", ["sqs:SendMessage"], [failures_arn]),
                # GetQueueAttributes: a submit reads the queue's visibility timeout (SqsWorkQueues.lease_s).
                Statement("SubmitToOwnQueues", ["sqs:SendMessage", "sqs:GetQueueUrl", "sqs:GetQueueAttributes"],
                          list(queue_arns)),
                # Jobs, items, submit marks and the watch list; never heartbeats or queue statistics.
                Statement("JobStore", ["dynamodb:GetItem", "dynamodb:BatchGetItem", "dynamodb:PutItem",
                                       "dynamodb:BatchWriteItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem",
                                       "dynamodb:Query"], [table_arn],
                          [{"test": "ForAllValues:StringLike", "variable": "dynamodb:LeadingKeys",
                            "values": ["JOB#*", "WATCH"]}]),
                Statement("KickScaler", ["lambda:InvokeFunction"],
                          [ctx.arn("lambda", f"function:{naming.function(env.name, 'scaler')}")]),
                Statement("OwnLogs", ["logs:CreateLogStream", "logs:PutLogEvents"], [logs.arn, f"{logs.arn}:log-stream:*"]),
            ],
        )  # fmt: skip
        self.function = LambdaFunction(
            self, "function", function_name=name, role=execution.arn, handler=HANDLER, runtime=RUNTIME,
            architectures=["x86_64"], filename=archive_path, source_code_hash=Fn.filebase64sha256(archive_path),
            timeout=TIMEOUT_S, memory_size=256, reserved_concurrent_executions=2,
            environment={"variables": {"TIDEFLEET_ENV": env.name}}, kms_key_arn=key_arn,
            tracing_config={"mode": "Active"}, logging_config={"log_format": "JSON", "log_group": logs.name},
            depends_on=[logs],
        )  # fmt: skip
        LambdaFunctionEventInvokeConfig(
            self, "async", function_name=self.function.function_name, maximum_retry_attempts=ASYNC_RETRIES,
            destination_config={"on_failure": {"destination": failures_arn}},
        )  # fmt: skip
        # The schedules' target input is encrypted with the environment's key: Scheduler decrypts it as this role.
        invoker = ServiceRole(self, "scheduler-role", name=f"{name}-invoke", service="scheduler.amazonaws.com",
                              statements=[Statement("InvokeScheduleFunction", ["lambda:InvokeFunction"], [self.function.arn]),
                                          Statement("DecryptInput", ["kms:Decrypt"], [key_arn])])  # fmt: skip
        schedule = lambda id, name, when, payload: SchedulerSchedule(
            self, id, name=name, schedule_expression=when, schedule_expression_timezone="UTC",
            flexible_time_window={"mode": "OFF"}, kms_key_arn=key_arn,
            target={"arn": self.function.arn, "role_arn": invoker.arn, "input": json.dumps(payload),
                    "retry_policy": {"maximum_retry_attempts": 2}},
        )  # fmt: skip
        self.watch = schedule("watch", naming.watch_schedule(env.name), WATCH_EVERY, WATCH_EVENT)
        self.schedules = {
            schedule_name: schedule(f"fire-{schedule_name}", naming.schedule(env.name, schedule_name),
                                    expression(s.cron, s.rate), fire_event(schedule_name, AWS_FIRE_TIME))
            for schedule_name, s in sorted(env.schedules.items())
        }  # fmt: skip
