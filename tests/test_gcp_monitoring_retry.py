"""Cloud Monitoring's backlog read is tried again on what passes (429, 5xx, silence, a lost
connection), as every other GCP call is (the audit's s4_monitoring_503.py: one 503 aborted the
whole tick for every pool), and what it raises names the host, not the URL-encoded query. The
metrics write is made again only when refused (429, 503), for a few seconds."""

from __future__ import annotations

import time

import google.auth
import pytest
import requests
import responses
from google.api_core import exceptions as gexc
from google.auth.credentials import AnonymousCredentials
from google.auth.transport.requests import AuthorizedSession

from tests.gcp_fake import FakeGcp
from tidefleet.cloud import for_env
from tidefleet.cloud.gcp import monitoring
from tidefleet.cloud.gcp.firestore import FirestoreNodes
from tidefleet.cloud.gcp.mig import MigFleet
from tidefleet.cloud.gcp.monitoring import MonitoringQueues
from tidefleet.config import load_environment
from tidefleet.control import tick
from tidefleet.ports import Ports

ENV = load_environment("gcp-dev")
SUB = "tidefleet-gcp-dev-default"


@pytest.fixture
def gcp(monkeypatch):
    monkeypatch.setattr(google.auth, "default", lambda *a, **k: (AnonymousCredentials(), ENV.project))
    fake = FakeGcp(ENV.project, ENV.region)
    fake.failures = []  # what the next reads of the series meet, in turn: (status, reason) or an exception
    fake.reads = 0
    answer = fake._series

    def series(request):
        fake.reads += 1
        if fake.failures:
            failure = fake.failures.pop(0)
            if isinstance(failure, Exception):
                raise failure
            return fake._error(*failure, f"{failure[1]} for a test")
        return answer(request)

    fake._series = series
    fake.groups |= {"tidefleet-gcp-dev-cpu": 0, "tidefleet-gcp-dev-cpu-od": 0}
    fake.undelivered[SUB] = 7
    with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
        fake.install(mock)
        yield fake


def queues() -> MonitoringQueues:
    return MonitoringQueues(ENV, session=AuthorizedSession(AnonymousCredentials()))


def ports() -> Ports:
    creds = AnonymousCredentials()
    return Ports(queues=queues(), fleet=MigFleet(ENV, credentials=creds), nodes=FirestoreNodes(ENV, credentials=creds))


@pytest.mark.parametrize("failure", [(503, "UNAVAILABLE"), (429, "RESOURCE_EXHAUSTED"), (500, "INTERNAL"),
                                     (502, "BAD_GATEWAY"), requests.ConnectionError("connection reset by peer"),
                                     requests.ReadTimeout("read timed out")])  # fmt: skip
def test_a_passing_failure_of_the_backlog_read_is_tried_again_and_the_tick_scales_out(gcp, failure):
    gcp.failures = [failure]
    (decision,) = tick(ENV, ports(), time.time(), pools=["cpu"])
    assert decision.desired > 0 and gcp.reads == 2
    assert gcp.groups["tidefleet-gcp-dev-cpu"] > 0


def test_a_refusal_that_is_not_passing_is_not_tried_again_and_names_the_host_only(gcp):
    gcp.failures = [(403, "PERMISSION_DENIED")]
    with pytest.raises(gexc.Forbidden) as raised:
        queues().backlog("default")
    assert gcp.reads == 1
    assert str(raised.value.message).startswith("monitoring.googleapis.com answered 403: PERMISSION_DENIED for a test")
    line = for_env(ENV).explain(raised.value)
    assert "monitoring.googleapis.com" in line and "filter" not in line and "%3D" not in line, line


@pytest.mark.parametrize("failure", [(503, "UNAVAILABLE"), (429, "RESOURCE_EXHAUSTED"),
                                     requests.ConnectionError("connection refused")])  # fmt: skip
def test_a_failure_that_lasts_gives_up_within_the_bound_and_its_line_names_the_host_not_the_query(gcp, failure, monkeypatch):
    monkeypatch.setattr(monitoring, "BACKLOG_RETRY", monitoring.BACKLOG_RETRY.with_timeout(1.0).with_delay(0.05, 0.1))
    gcp.failures = [failure] * 1000
    began = time.monotonic()
    with pytest.raises(gexc.RetryError) as raised:
        queues().backlog("default")
    assert time.monotonic() - began < 5 and gcp.reads >= 2
    line = for_env(ENV).explain(raised.value)
    assert "monitoring.googleapis.com" in line and "filter" not in line and "%3D" not in line and len(line) < 400, line


def test_the_backlog_retry_is_the_other_calls_bound():
    from tidefleet.cloud.gcp.calls import RETRY_FOR_S

    assert monitoring.BACKLOG_RETRY._timeout == RETRY_FOR_S
    assert monitoring.BACKLOG_RETRY._predicate(gexc.ServiceUnavailable("x"))
    assert not monitoring.BACKLOG_RETRY._predicate(gexc.Forbidden("x"))


# -- the metrics write: timeSeries.create is no read; made again only when the server refused it
@pytest.fixture
def writes(gcp):
    gcp.write_failures, gcp.writes = [], 0  # what the next writes meet, in turn: (status, reason)
    create = gcp._create_series

    def create_series(request):
        gcp.writes += 1
        if gcp.write_failures:
            failure = gcp.write_failures.pop(0)
            return gcp._error(*failure, f"{failure[1]} for a test")
        return create(request)

    gcp._create_series = create_series
    with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
        gcp.install(mock)
        yield gcp


def write() -> None:
    from tidefleet import metrics

    point = metrics.point("DemandSlots", 3.0, Environment=ENV.name, Pool="cpu")
    monitoring.MonitoringMetrics(ENV, session=AuthorizedSession(AnonymousCredentials())).write(ENV, [point], now=time.time())


@pytest.mark.parametrize("failure", [(503, "UNAVAILABLE"), (429, "RESOURCE_EXHAUSTED")])
def test_a_refused_metrics_write_is_made_again_and_lands_once(writes, failure):
    writes.write_failures = [failure]
    write()
    assert writes.writes == 2 and len(writes.time_series) == 1


@pytest.mark.parametrize("failure, raised", [((500, "INTERNAL"), gexc.InternalServerError),
                                             ((400, "INVALID_ARGUMENT"), gexc.BadRequest)])  # fmt: skip
def test_a_metrics_write_that_may_have_landed_or_is_wrong_is_not_made_again_and_names_the_host(writes, failure, raised):
    # A 500 may have written the point: sent again, it would be refused as out of order.
    writes.write_failures = [failure]
    with pytest.raises(raised) as err:
        write()
    assert writes.writes == 1 and writes.time_series == []
    assert str(err.value.message).startswith(f"monitoring.googleapis.com answered {failure[0]}: {failure[1]}")


def test_a_refusal_that_lasts_gives_the_metrics_write_up_within_seconds(writes):
    writes.write_failures = [(429, "RESOURCE_EXHAUSTED")] * 1000
    began = time.monotonic()
    with pytest.raises(gexc.RetryError):
        write()
    assert monitoring.WRITE_RETRY._timeout == 5.0 and time.monotonic() - began < 8 and writes.writes >= 2
