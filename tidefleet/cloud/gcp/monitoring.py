"""Writing `tidefleet.metrics` points on GCP: Cloud Monitoring custom metrics (timeSeries.create),
through a google-auth session. The stack declares each metric's descriptor, so alert policies
and the dashboard can name them before the first tick writes one."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from google.auth.transport.requests import AuthorizedSession

from tidefleet import metrics
from tidefleet.config import Environment

MONITORING = "https://monitoring.googleapis.com/v3"
SCOPES = ["https://www.googleapis.com/auth/monitoring.write"]
SERIES_PER_REQUEST = 200  # timeSeries.create's limit


class MonitoringMetrics:
    """The GCP scaler function's emitter: `write(env, points)` (the triggers' `emit`)."""

    def __init__(self, env: Environment, *, session: AuthorizedSession | None = None, credentials=None):
        self.project = env.project
        if session is None:
            import google.auth

            session = AuthorizedSession(credentials or google.auth.default(scopes=SCOPES)[0])
        self.session = session

    def series(self, env: Environment, points: list[metrics.Point], now: float) -> list[dict]:
        end = datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        return [{
            "metric": {"type": metrics.gcp_metric_type(p.name, env.name),
                       "labels": metrics.gcp_labels(p.name, dict(p.dimensions))},
            "resource": {"type": "global", "labels": {"project_id": self.project}},
            "metricKind": "GAUGE", "valueType": "DOUBLE",
            "points": [{"interval": {"endTime": end}, "value": {"doubleValue": p.value}}],
        } for p in points if p.metric.source == "scaler"]  # fmt: skip

    def write(self, env: Environment, points: list[metrics.Point], now: float | None = None) -> None:
        series = self.series(env, points, time.time() if now is None else now)
        for at in range(0, len(series), SERIES_PER_REQUEST):
            response = self.session.post(f"{MONITORING}/projects/{self.project}/timeSeries",
                                         json={"timeSeries": series[at : at + SERIES_PER_REQUEST]}, timeout=10)  # fmt: skip
            response.raise_for_status()
