"""Alert policies that reach a person, and the environment's Cloud Monitoring dashboard.

One alert policy per alarm of `stacks.alarms.RUNBOOKS` that GCP has a signal for (its runbook
line is the documentation), each notifying the `[alerts]` channels: an email channel per address
and a webhook channel per URL. No `[alerts]`: the policies exist and notify no one.

The scaler's metrics are custom metrics whose descriptors are declared here, from
`tidefleet.metrics`, so the policies and the dashboard can name them before the first tick; the
agents' outcomes are the stack's `item-outcomes` log-based metric. Scaler errors are a log-based
metric over the function's ERROR lines (it never fails a request: a failed tick is one line).
"""

from __future__ import annotations

import json

from cdktn_provider_google.logging_metric import LoggingMetric
from cdktn_provider_google.monitoring_alert_policy import (
    MonitoringAlertPolicy,
    MonitoringAlertPolicyConditions,
    MonitoringAlertPolicyConditionsConditionThresholdAggregations,
    MonitoringAlertPolicyConditionsConditionThresholdDenominatorAggregations,
)
from cdktn_provider_google.monitoring_dashboard import MonitoringDashboard
from cdktn_provider_google.monitoring_metric_descriptor import (
    MonitoringMetricDescriptor,
    MonitoringMetricDescriptorLabels,
)
from cdktn_provider_google.monitoring_notification_channel import MonitoringNotificationChannel
from constructs import Construct

from stacks.alarms import FAILURE_RATE_PERCENT, RUNBOOKS, SLOW_TICK_SHARE
from stacks.gcp.control import TIMEOUT_S
from tidefleet import metrics, naming
from tidefleet.config import Environment
from tidefleet.policy.faults import FAULTS_IN_A_ROW

UNDELIVERED = "pubsub.googleapis.com/subscription/num_undelivered_messages"
OLDEST = "pubsub.googleapis.com/subscription/oldest_unacked_message_age"
LATENCIES = "run.googleapis.com/request_latencies"


def subscription_filter(metric_type: str, subscription: str) -> str:
    return (f'metric.type = "{metric_type}" AND resource.type = "pubsub_subscription" AND '
            f'resource.labels.subscription_id = "{subscription}"')  # fmt: skip


class Alerts(Construct):
    """Exposes `channels`, `descriptors` (metric name -> descriptor) and `policies` (runbook key -> policy)."""

    def __init__(self, scope: Construct, id: str, *, env: Environment, labels: dict[str, str]) -> None:
        super().__init__(scope, id)
        self.env, e = env, env.name
        self.channels = [
            MonitoringNotificationChannel(self, f"email-{i}", display_name=f"tidefleet {e}: {address}", type="email",
                                          labels={"email_address": address}, user_labels=labels)
            for i, address in enumerate(env.alerts.email)
        ] + [
            MonitoringNotificationChannel(self, f"webhook-{i}", display_name=f"tidefleet {e}: webhook {i}",
                                          type="webhook_tokenauth", labels={"url": url}, user_labels=labels)
            for i, url in enumerate(env.alerts.webhooks)
        ]  # fmt: skip
        self.descriptors = {
            m.name: MonitoringMetricDescriptor(
                self, f"metric-{m.name}", type=metrics.gcp_metric_type(m.name, e), metric_kind="GAUGE",
                value_type="DOUBLE", unit=metrics.UNITS[m.unit], description=m.help, display_name=f"tidefleet {m.name}",
                labels=[MonitoringMetricDescriptorLabels(key=d.lower(), value_type="STRING") for d in m.dimensions],
            )
            for m in metrics.METRICS.values() if m.source == "scaler"
        }  # fmt: skip
        function = naming.function(e, "scaler")
        scaler_errors = LoggingMetric(
            self, "scaler-errors-metric", name=naming.stack_resource(e, "scaler-errors"),
            filter=(f'resource.type = "cloud_run_revision" AND resource.labels.service_name = "{function}" '
                    "AND severity >= ERROR"),
            metric_descriptor={"metric_kind": "DELTA", "value_type": "INT64"},
        )  # fmt: skip
        self.policies: dict[str, MonitoringAlertPolicy] = {}

        queues = sorted(env.queues)
        self._policy("dead-letters", [
            self._condition(f"{q}: dead-lettered", subscription_filter(UNDELIVERED, naming.dead_letter_queue(e, q)), 0)
            for q in queues])  # fmt: skip
        self._policy("oldest-item", [
            self._condition(f"{q}: oldest item over {env.queues[q].max_wait_s}s",
                            subscription_filter(OLDEST, naming.queue(e, q)), env.queues[q].max_wait_s)
            for q in queues])  # fmt: skip
        self._policy("failure-rate", [
            self._condition(f"{q}: failed attempts over {FAILURE_RATE_PERCENT} %",
                            metrics.gcp_filter("AttemptsFailed", e, Queue=q), FAILURE_RATE_PERCENT / 100,
                            aligner="ALIGN_SUM", period_s=900, reducer="REDUCE_SUM",
                            denominator_filter=(f'metric.type = "{metrics.gcp_metric_type("AttemptsFailed", e)}" '
                                                f'AND metric.labels.queue = "{q}"'))
            for q in queues])  # fmt: skip
        self._policy("scaler-errors", [self._condition(
            "failed ticks", f'metric.type = "logging.googleapis.com/user/{naming.stack_resource(e, "scaler-errors")}"',
            0, aligner="ALIGN_SUM", period_s=600)], depends_on=[scaler_errors])  # fmt: skip
        self._policy("scaler-duration", [self._condition(
            "slow ticks", f'metric.type = "{LATENCIES}" AND resource.type = "cloud_run_revision" AND '
                          f'resource.labels.service_name = "{function}"',
            SLOW_TICK_SHARE * TIMEOUT_S * 1000, aligner="ALIGN_PERCENTILE_99", period_s=300)])  # fmt: skip
        pools = sorted(env.pools)
        for key, name, periods in (("spot-launch-failures", "SpotLaunchFailures", 3),
                                   ("on-demand-fallback", "OnDemandFallbackUnits", 5),
                                   ("stuck-booting", "NodesStuckBooting", 2),
                                   ("silent-nodes", "NodesSilent", 3)):  # fmt: skip
            self._policy(key, [self._ours(f"{p}: {name}", name, 0, periods, Pool=p) for p in pools])
        # Rule 14 holds launches at FAULTS_IN_A_ROW faults in a row (a whole count: over one fewer), from that tick on.
        self._policy("launches-held", [self._ours(f"{p}: NodesFaulted at {FAULTS_IN_A_ROW} or more", "NodesFaulted",
                                                  FAULTS_IN_A_ROW - 1, 1, Pool=p) for p in pools])  # fmt: skip
        caps = [self._ours(f"{p}: over {c} USD/h", "PoolCostPerHour", c, 5, Pool=p)
                for p in pools if (c := env.pools[p].cost_cap_usd_per_hour) is not None]  # fmt: skip
        if env.scaler.cost_cap_usd_per_hour is not None:
            caps.append(self._ours(f"over {env.scaler.cost_cap_usd_per_hour} USD/h", "CostPerHour",
                                   env.scaler.cost_cap_usd_per_hour, 5))  # fmt: skip
        if caps:
            self._policy("cost-over-cap", caps)

        MonitoringDashboard(self, "dashboard", dashboard_json=json.dumps(dashboard(env)))

    def _ours(self, title: str, name: str, threshold: float, periods: int, **dims: str) -> MonitoringAlertPolicyConditions:
        return self._condition(title, metrics.gcp_filter(name, self.env.name, **dims), threshold,
                               duration_s=60 * periods)  # fmt: skip

    @staticmethod
    def _condition(title: str, filter: str, threshold: float, *, aligner: str = "ALIGN_MAX", period_s: int = 60,
                   duration_s: int = 0, reducer: str | None = None,
                   denominator_filter: str | None = None) -> MonitoringAlertPolicyConditions:  # fmt: skip
        aggregation = {"alignment_period": f"{period_s}s", "per_series_aligner": aligner}
        if reducer:
            aggregation |= {"cross_series_reducer": reducer, "group_by_fields": ["metric.label.queue"]}
        threshold_spec = {"filter": filter, "comparison": "COMPARISON_GT", "threshold_value": threshold,
                          "duration": f"{duration_s}s",
                          "aggregations": [MonitoringAlertPolicyConditionsConditionThresholdAggregations(**aggregation)]}  # fmt: skip
        if denominator_filter:
            threshold_spec |= {"denominator_filter": denominator_filter, "denominator_aggregations": [
                MonitoringAlertPolicyConditionsConditionThresholdDenominatorAggregations(**aggregation)]}
        return MonitoringAlertPolicyConditions(display_name=title[:100], condition_threshold=threshold_spec)

    def _policy(self, key: str, conditions: list, depends_on: list | None = None) -> None:
        e = self.env.name
        self.policies[key] = MonitoringAlertPolicy(
            self, key, display_name=f"tidefleet {e}: {key}", combiner="OR", conditions=conditions,
            notification_channels=[c.id for c in self.channels],
            documentation={"mime_type": "text/markdown", "content": RUNBOOKS[key].text()},
            depends_on=[*self.descriptors.values(), *(depends_on or [])],
        )  # fmt: skip


def dashboard(env: Environment) -> dict:
    """The environment's Cloud Monitoring dashboard: the same charts as on AWS."""
    e, tiles = env.name, []

    def chart(title: str, filters: list[str], *, aligner: str = "ALIGN_MAX", stacked: bool = False,
              thresholds: list[float] = ()) -> None:  # fmt: skip
        kind = "STACKED_AREA" if stacked else "LINE"
        datasets = [{"plotType": kind, "timeSeriesQuery": {"timeSeriesFilter": {
            "filter": f, "aggregation": {"alignmentPeriod": "60s", "perSeriesAligner": aligner}}}} for f in filters]  # fmt: skip
        widget = {"title": title, "xyChart": {"dataSets": datasets,
                                              "thresholds": [{"value": t} for t in thresholds]}}  # fmt: skip
        n = len(tiles)
        tiles.append({"xPos": 16 * (n % 3), "yPos": 16 * (n // 3), "width": 16, "height": 16, "widget": widget})

    ours = lambda name, **dims: metrics.gcp_filter(name, e, **dims)
    for p in sorted(env.pools):
        queues = sorted(env.queues_of(p))
        chart(f"{p}: items waiting / in flight", [ours(n, Queue=q) for q in queues for n in ("QueueVisible", "QueueInFlight")])
        chart(f"{p}: oldest waiting item (s)", [subscription_filter(OLDEST, naming.queue(e, q)) for q in queues],
              thresholds=[env.queues[q].max_wait_s for q in queues])
        chart(f"{p}: capacity units, desired vs in service",
              [ours(n, Pool=p, Lifecycle=lc) for n in ("DesiredUnits", "InServiceUnits") for lc in metrics.LIFECYCLES])
        chart(f"{p}: nodes by lifecycle x activity", stacked=True, filters=[
            ours("Nodes", Pool=p, Lifecycle=lc, Activity=a) for lc in metrics.LIFECYCLES for a in metrics.ACTIVITIES])
        chart(f"{p}: demand (slots) and starved queues", [ours("DemandSlots", Pool=p), ours("StarvedQueues", Pool=p)])
        chart(f"{p}: decisions and trouble", [ours(n, Pool=p) for n in (
            "TerminatedNodes", "LeaveGrantUnits", "OnDemandFallbackUnits", "SpotLaunchFailures", "NodesStuckBooting",
            "NodesSilent", "NodesFaulted")])
    cap = [env.scaler.cost_cap_usd_per_hour] if env.scaler.cost_cap_usd_per_hour else []
    chart("$/hour (configured prices)", [ours("CostPerHour"), *[ours("PoolCostPerHour", Pool=p) for p in sorted(env.pools)]],
          thresholds=cap)
    chart("attempts: succeeded, failed, interrupted", aligner="ALIGN_SUM", filters=[
        ours(n, Queue=q) for q in sorted(env.queues) for n in ("AttemptsSucceeded", "AttemptsFailed", "AttemptsInterrupted")])
    return {"displayName": f"tidefleet {e}", "mosaicLayout": {"columns": 48, "tiles": tiles}}
