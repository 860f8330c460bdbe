"""Cloud Monitoring on GCP, through a google-auth session.

- Metrics (`MonitoringMetrics`): `tidefleet.metrics` points written as custom metrics
  (timeSeries.create). The stack declares each metric's descriptor, so alert policies and the
  dashboard can name them before the first tick writes one.
- Backlog (`MonitoringQueues`, the control tick's queue port): Pub/Sub has no API that counts a subscription's messages; Cloud Monitoring's
  `subscription/num_undelivered_messages` is the count (delivered-but-unacked included). It is
  sampled every minute and visible up to ~2 minutes later, so a scale-out from zero can trail a
  submit by that much on GCP (AWS reads SQS attributes directly). A pull-based estimate was
  rejected: pulling to count, then nacking, raises each message's delivery attempt and walks
  items toward the dead-letter topic. Undelivered messages include those leased to running
  items, so they are reported as `visible` with `counts_leased` (in-flight 0): the control tick
  moves the messages the agents' heartbeats say they hold (`Heartbeat.leased`) to in flight
  before it ages the waiting ones, so running items never read as waiting demand. The count is
  given with its sample's time (`Backlog.as_of`): an idle node's later word that it found nothing
  to receive wins over it (`control._seen_empty`). The read is
  tried again for 20 s on a 429, a 5xx, silence or a lost connection (`BACKLOG_RETRY`), and its
  errors name the host, not the URL-encoded query.

A metrics write is made again only when refused (`WRITE_RETRY`), and for a few seconds only.
"""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime

import requests
from google.api_core import exceptions as gexc
from google.api_core.retry import Retry, if_exception_type
from google.auth.transport.requests import AuthorizedSession

from tidefleet import metrics, naming
from tidefleet.cloud.gcp.calls import RETRY_FOR_S, RETRY_REFUSED, TRY_S
from tidefleet.config import Environment
from tidefleet.ports import Backlog

HOST = "monitoring.googleapis.com"
MONITORING = f"https://{HOST}/v3"
UNDELIVERED = "pubsub.googleapis.com/subscription/num_undelivered_messages"
BACKLOG_WINDOW_S = 300  # newest point within the last five minutes; none = an empty, quiet subscription
# The backlog read, tried again for the other calls' RETRY_FOR_S on what passes: a refusal (429), an
# error on Google's side (5xx), silence, a lost connection. A read changes nothing, so all of them.
BACKLOG_RETRY = Retry(if_exception_type(gexc.TooManyRequests, gexc.ServerError, requests.Timeout, requests.ConnectionError),
                      initial=0.5, maximum=4.0, multiplier=2.0, timeout=RETRY_FOR_S)  # fmt: skip
# A metrics write, made again only when refused (429, 503: the server did not do it; a write that
# landed and was sent again would be refused as out of order), and briefly: the scaler's next tick
# in the run waits on it, and a point lost is one gap in the dashboard, said in one line by the tick.
WRITE_RETRY = RETRY_REFUSED.with_timeout(5.0)
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
        """timeSeries.create, SERIES_PER_REQUEST at a time, each tried again when refused (`WRITE_RETRY`)."""
        series = self.series(env, points, time.time() if now is None else now)
        for at in range(0, len(series), SERIES_PER_REQUEST):
            WRITE_RETRY(_request)(self.session, "POST", f"{MONITORING}/projects/{self.project}/timeSeries",
                                  json={"timeSeries": series[at : at + SERIES_PER_REQUEST]})  # fmt: skip


class MonitoringQueues:
    """QueuePort: a subscription's undelivered messages from Cloud Monitoring."""

    def __init__(self, env: Environment, *, session: AuthorizedSession | None = None, credentials=None):
        self.env = env
        if session is None:
            import google.auth

            creds = credentials or google.auth.default(scopes=["https://www.googleapis.com/auth/monitoring.read"])[0]
            session = AuthorizedSession(creds)
        self.session = session

    def backlog(self, queue: str) -> Backlog:
        """Tried again on a refusal, an error on Google's side or a lost connection (`BACKLOG_RETRY`,
        the other calls' 20 s): a read changes nothing. Its errors name the host, not the query."""
        body = BACKLOG_RETRY(self._read)(naming.queue(self.env.name, queue))
        newest = [p for series in body.get("timeSeries", []) for p in series.get("points", [])[:1]]
        # Points come newest first; a subscription has one series (several only while labels change).
        point = max(newest, key=lambda p: int(p["value"].get("int64Value", 0)), default=None)
        if point is None:
            return Backlog(visible=0, in_flight=0, counts_leased=True)
        # leased ones included (see the module doc), as of the sample's time: the tick may know newer
        return Backlog(visible=int(point["value"].get("int64Value", 0)), in_flight=0, counts_leased=True,
                       as_of=_epoch(point.get("interval", {}).get("endTime")))  # fmt: skip

    def _read(self, subscription: str) -> dict:
        """One try: the subscription's points of the last BACKLOG_WINDOW_S, as of now."""
        now = time.time()
        stamp = lambda t: datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return _request(self.session, "GET", f"{MONITORING}/projects/{self.env.project}/timeSeries", params={
            "filter": f'metric.type = "{UNDELIVERED}" AND resource.labels.subscription_id = "{subscription}"',
            "interval.startTime": stamp(now - BACKLOG_WINDOW_S),
            "interval.endTime": stamp(now),
            "view": "FULL",
        })  # fmt: skip


def _epoch(stamp: str | None) -> float | None:
    """A point's RFC 3339 time ("2026-11-28T14:01:00Z", fractions of a second or not) in epoch
    seconds; None when missing or not a time (the count is then taken as of now)."""
    try:
        return datetime.fromisoformat(stamp).timestamp() if stamp else None
    except ValueError:
        return None


def _request(session: AuthorizedSession, method: str, url: str, **kwargs) -> dict:
    """One try of a Cloud Monitoring call, its answer's JSON. What it raises names the host, not
    the URL (a read's URL-encoded query): an error answer as the clients raise it
    (ServiceUnavailable, ...), silence as requests.Timeout, a failed connection as ConnectionError."""
    try:
        response = session.request(method, url, timeout=TRY_S, **kwargs)
    except requests.Timeout as err:  # the same type (explained as silence), without the URL's query
        raise type(err)(f"{HOST} did not answer within {TRY_S:g} s", request=err.request) from err
    except requests.ConnectionError as err:
        raise requests.ConnectionError(f"could not connect to {HOST} ({_reason(err)})", request=err.request) from err
    if response.status_code >= 400:
        raise gexc.from_http_status(response.status_code, f"{HOST} answered {response.status_code}: "
                                    f"{_message(response)}", response=response)  # fmt: skip
    return response.json() if response.content else {}


def _message(response: requests.Response) -> str:
    """Google's message in an error answer, else its HTTP reason."""
    try:
        return str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return response.reason or "no message"


def _reason(err: requests.ConnectionError) -> str:
    """Why a connection failed, without urllib3's URL and object names: 'Connection refused'."""
    reason = err.args[0] if err.args else err
    reason = getattr(reason, "reason", None) or reason  # urllib3's MaxRetryError names the URL; its reason does not
    return re.sub(r"^<[^>]*>: ", "", " ".join(str(reason).split()))[:200]
