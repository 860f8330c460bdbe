"""Alarms that reach a person, and the environment's dashboard.

Every alarm of `stacks.alarms.RUNBOOKS` that AWS has a signal for, with its runbook line as the
description, notifies one KMS-encrypted SNS topic (`tidefleet-<env>-alerts`) when it fires and
when it clears. `[alerts]` subscribes email addresses and HTTPS endpoints to it; AWS Chatbot
(Slack, Teams) subscribes to the same topic from its own console. No `[alerts]`: the alarms and
the topic exist, subscribed by no one.

The tidefleet metrics come from `tidefleet.metrics` (the scaler's EMF lines, the agents' outcome
events); queue ages and the functions' health are AWS's own (`tidefleet.metrics.CLOUD_METRICS`).
"""

from __future__ import annotations

from collections.abc import Mapping

from cdktn_provider_aws.cloudwatch_metric_alarm import (
    CloudwatchMetricAlarm,
    CloudwatchMetricAlarmMetricQuery,
    CloudwatchMetricAlarmMetricQueryMetric,
)
from cdktn_provider_aws.sns_topic import SnsTopic
from cdktn_provider_aws.sns_topic_policy import SnsTopicPolicy
from cdktn_provider_aws.sns_topic_subscription import SnsTopicSubscription
from constructs import Construct

from stacks.alarms import FAILURE_RATE_PERCENT, MIN_ATTEMPTS, RUNBOOKS, SLOW_TICK_SHARE, UNSERVED_MINUTES
from stacks.aws.functions import TIMEOUT_S
from stacks.aws.iam import AwsContext, policy_document
from tidefleet import metrics, naming
from tidefleet.config import Environment
from tidefleet.policy.faults import FAULTS_IN_A_ROW

# Standard SQS queues publish to CloudWatch every 5 minutes; the scaler every tick; Lambda every minute.
SQS_PERIOD_S = 300
TICK_PERIOD_S = 60
LAMBDA_PERIOD_S = 60


def _attempts(env_name: str, queue: str, name: str, id: str) -> CloudwatchMetricAlarmMetricQuery:
    """One query of the failure-rate math: the queue's attempts of one outcome in 15 minutes."""
    return CloudwatchMetricAlarmMetricQuery(id=id, metric=CloudwatchMetricAlarmMetricQueryMetric(
        namespace=metrics.NAMESPACE, metric_name=name, period=900, stat="Sum",
        dimensions={"Environment": env_name, "Queue": queue}))  # fmt: skip


def _lambda_sum(function: str, name: str, id: str) -> CloudwatchMetricAlarmMetricQuery:
    """One query of the throttles math: the function's count of one kind of request per minute."""
    return CloudwatchMetricAlarmMetricQuery(id=id, metric=CloudwatchMetricAlarmMetricQueryMetric(
        namespace="AWS/Lambda", metric_name=name, period=LAMBDA_PERIOD_S, stat="Sum",
        dimensions={"FunctionName": function}))  # fmt: skip


def alerts_topic_name(env_name: str) -> str:
    return naming.stack_resource(env_name, "alerts")


class Alarms(Construct):
    """Exposes `topic` and `alarms` (alarm name -> aws_cloudwatch_metric_alarm)."""

    def __init__(self, scope: Construct, id: str, *, env: Environment, ctx: AwsContext, key_arn: str,
                 dead_letter_queues: Mapping[str, str], queues: Mapping[str, str]) -> None:  # fmt: skip
        """dead_letter_queues, queues: config queue name -> SQS queue name."""
        super().__init__(scope, id)
        self.env, e = env, env.name
        self.topic = SnsTopic(self, "topic", name=alerts_topic_name(e), kms_master_key_id=key_arn,
                              display_name=f"tidefleet {e} alarms")  # fmt: skip
        alarm_arns = ctx.arn("cloudwatch", f"alarm:{naming.stack_resource(e, '*')}")
        publish = policy_document(self, "topic-policy-doc", [{
            "sid": "OwnAlarmsPublish", "effect": "Allow", "actions": ["sns:Publish"], "resources": [self.topic.arn],
            "principals": [{"type": "Service", "identifiers": ["cloudwatch.amazonaws.com"]}],
            "condition": [{"test": "ArnLike", "variable": "aws:SourceArn", "values": [alarm_arns]}],
        }])  # fmt: skip
        SnsTopicPolicy(self, "topic-policy", arn=self.topic.arn, policy=publish.json)
        for i, address in enumerate(env.alerts.email):
            SnsTopicSubscription(self, f"email-{i}", topic_arn=self.topic.arn, protocol="email", endpoint=address)
        for i, url in enumerate(env.alerts.webhooks):
            SnsTopicSubscription(self, f"webhook-{i}", topic_arn=self.topic.arn, protocol="https", endpoint=url,
                                 endpoint_auto_confirms=False)  # fmt: skip

        self.alarms: dict[str, CloudwatchMetricAlarm] = {}
        for q in sorted(env.queues):
            self._alarm("dead-letters", q, namespace="AWS/SQS", metric_name="ApproximateNumberOfMessagesVisible",
                        dimensions={"QueueName": dead_letter_queues[q]}, statistic="Maximum", period=SQS_PERIOD_S,
                        threshold=0)  # fmt: skip
            self._alarm("oldest-item", q, namespace="AWS/SQS", metric_name="ApproximateAgeOfOldestMessage",
                        dimensions={"QueueName": queues[q]}, statistic="Maximum", period=SQS_PERIOD_S,
                        threshold=env.queues[q].max_wait_s)  # fmt: skip
            self._alarm("failure-rate", q, threshold=FAILURE_RATE_PERCENT, evaluation_periods=1, metric_query=[
                _attempts(e, q, "AttemptsFailed", "failed"), _attempts(e, q, "AttemptsSucceeded", "succeeded"),
                CloudwatchMetricAlarmMetricQuery(
                    id="rate", return_data=True, label="failed attempts, %",
                    expression=f"IF(failed + succeeded >= {MIN_ATTEMPTS}, 100 * failed / (failed + succeeded), 0)"),
            ])  # fmt: skip
        scaler, interruption = naming.function(e, "scaler"), naming.function(e, "interruption")
        for key, function, metric_name, statistic, threshold, periods in (
            ("scaler-errors", scaler, "Errors", "Sum", 0, 2),
            ("scaler-duration", scaler, "Duration", "Maximum", SLOW_TICK_SHARE * TIMEOUT_S["scaler"] * 1000, 2),
            ("interruption-errors", interruption, "Errors", "Sum", 0, 1),
        ):
            self._alarm(key, None, namespace="AWS/Lambda", metric_name=metric_name, dimensions={"FunctionName": function},
                        statistic=statistic, period=300, threshold=threshold, evaluation_periods=periods)  # fmt: skip
        # Kicks sent while a run loops are throttled routinely (one run at a time); throttles in a
        # minute that started no run are not. Lambda publishes Invocations only when non-zero: FILL.
        self._alarm("scaler-throttles", None, threshold=0, evaluation_periods=UNSERVED_MINUTES,
                    datapoints_to_alarm=UNSERVED_MINUTES, metric_query=[
            _lambda_sum(scaler, "Invocations", "invocations"), _lambda_sum(scaler, "Throttles", "throttles"),
            CloudwatchMetricAlarmMetricQuery(
                id="unserved", return_data=True, label="throttles in a minute that started no run",
                expression="IF(FILL(invocations, 0) == 0, throttles, 0)"),
        ])  # fmt: skip
        for p in sorted(env.pools):
            for key, name, periods in (("spot-launch-failures", "SpotLaunchFailures", 3),
                                       ("on-demand-fallback", "OnDemandFallbackUnits", 5),
                                       ("stuck-booting", "NodesStuckBooting", 2),
                                       ("silent-nodes", "NodesSilent", 3)):  # fmt: skip
                self._ours(key, p, name, {"Pool": p}, 0, periods)
            # Rule 14 holds the pool's launches from the first tick with FAULTS_IN_A_ROW faults in a row
            # (a whole count: over one fewer), and they stay until a healthy node or an hour: one tick.
            self._ours("launches-held", p, "NodesFaulted", {"Pool": p}, FAULTS_IN_A_ROW - 1, 1)
            if env.pools[p].cost_cap_usd_per_hour is not None:
                self._ours("cost-over-cap", p, "PoolCostPerHour", {"Pool": p}, env.pools[p].cost_cap_usd_per_hour, 5)
        if env.scaler.cost_cap_usd_per_hour is not None:
            self._ours("cost-over-cap", None, "CostPerHour", {}, env.scaler.cost_cap_usd_per_hour, 5)

    def _ours(self, key: str, subject: str | None, name: str, dimensions: dict, threshold: float, periods: int) -> None:
        """A tidefleet gauge above the threshold for `periods` ticks in a row."""
        self._alarm(key, subject, namespace=metrics.NAMESPACE, metric_name=name, statistic="Maximum",
                    dimensions={"Environment": self.env.name, **dimensions}, period=TICK_PERIOD_S,
                    threshold=threshold, evaluation_periods=periods)  # fmt: skip

    def _alarm(self, key: str, subject: str | None, *, threshold: float, evaluation_periods: int = 1, **metric) -> None:
        name = naming.stack_resource(self.env.name, f"{subject}-{key}" if subject else key)
        topic = [self.topic.arn]
        where = f"{subject}: " if subject else ""
        self.alarms[name] = CloudwatchMetricAlarm(
            self, name.removeprefix(naming.stack_resource(self.env.name, "")), alarm_name=name,
            alarm_description=f"{where}{RUNBOOKS[key].text()}"[:1024],
            comparison_operator="GreaterThanThreshold", threshold=threshold, evaluation_periods=evaluation_periods,
            # Missing data is no news: the scaler's own errors have their alarm.
            treat_missing_data="notBreaching", actions_enabled=True, alarm_actions=topic, ok_actions=topic, **metric,
        )  # fmt: skip


def dashboard(env: Environment) -> dict:
    """The environment's CloudWatch dashboard: a row per pool (its queues, capacity, nodes,
    demand and decisions), then cost, attempts and the scaler function."""
    e, widgets = env.name, []

    def ours(name: str, **dims: str) -> list:
        m = metrics.METRICS[name]
        values = {"Environment": e, **dims}
        return [metrics.NAMESPACE, name, *[x for d in m.dimensions for x in (d, values[d])]]

    def add(title: str, series: list, *, width: int = 8, stat: str = "Maximum", stacked: bool = False,
            annotations: list | None = None) -> None:  # fmt: skip
        x = sum(w["width"] for w in widgets if w["y"] == row) % 24
        props = {"title": title, "region": env.region, "stat": stat, "period": 60, "view": "timeSeries",
                 "stacked": stacked, "metrics": series}  # fmt: skip
        if annotations:
            props["annotations"] = {"horizontal": annotations}
        widgets.append({"type": "metric", "x": x, "y": row, "width": width, "height": 6, "properties": props})

    row = 0
    for p in sorted(env.pools):
        queues = sorted(env.queues_of(p))
        add(f"{p}: items waiting / in flight",
            [ours(n, Queue=q) for q in queues for n in ("QueueVisible", "QueueInFlight")])
        add(f"{p}: oldest waiting item (s)",
            [["AWS/SQS", "ApproximateAgeOfOldestMessage", "QueueName", naming.queue(e, q)] for q in queues],
            annotations=[{"label": f"{q} max wait", "value": env.queues[q].max_wait_s} for q in queues])
        add(f"{p}: capacity units, desired vs in service",
            [ours(n, Pool=p, Lifecycle=lc) for n in ("DesiredUnits", "InServiceUnits") for lc in metrics.LIFECYCLES])
        row += 6
        add(f"{p}: nodes by lifecycle x activity", stacked=True, series=[
            ours("Nodes", Pool=p, Lifecycle=lc, Activity=a) for lc in metrics.LIFECYCLES for a in metrics.ACTIVITIES])
        add(f"{p}: demand (slots) and starved queues", [ours("DemandSlots", Pool=p), ours("StarvedQueues", Pool=p)])
        add(f"{p}: decisions and trouble", [ours(n, Pool=p) for n in (
            "TerminatedNodes", "LeaveGrantUnits", "OnDemandFallbackUnits", "SpotLaunchFailures", "NodesStuckBooting",
            "NodesSilent", "NodesFaulted")])
        row += 6
    caps = [{"label": "cap", "value": env.scaler.cost_cap_usd_per_hour}] if env.scaler.cost_cap_usd_per_hour else []
    add("$/hour (configured prices)", [ours("CostPerHour"), *[ours("PoolCostPerHour", Pool=p) for p in sorted(env.pools)]],
        annotations=caps)
    add("attempts: succeeded, failed, interrupted", stat="Sum", series=[
        ours(n, Queue=q) for q in sorted(env.queues) for n in ("AttemptsSucceeded", "AttemptsFailed", "AttemptsInterrupted")])
    scaler = naming.function(e, "scaler")
    add("scaler function: errors, throttles, slowest tick (ms)", stat="Sum", series=[
        *[["AWS/Lambda", n, "FunctionName", scaler] for n in ("Errors", "Throttles")],
        ["AWS/Lambda", "Duration", "FunctionName", scaler, {"stat": "Maximum", "yAxis": "right"}]])
    return {"widgets": widgets}
