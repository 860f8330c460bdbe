"""The GCP scaler function's entry point: CloudEvents from the kick topic, on GCP ports faked
at the HTTP level (tests/gcp_fake.py), with the same parse, tick and policy as AWS."""

from __future__ import annotations

import base64
import json
from types import SimpleNamespace

import pytest
import responses
from google.auth.credentials import AnonymousCredentials
from google.auth.transport.requests import AuthorizedSession

from lambdas.gcp_scaler import main
from tests.gcp_fake import FakeGcp
from tidefleet.cloud import Ports
from tidefleet.cloud.firestore import FirestoreNodes
from tidefleet.cloud.gcp import MigFleet, MonitoringQueues
from tidefleet.config import load_environment

ENV = load_environment("gcp-dev")


def event(payload) -> SimpleNamespace:
    data = payload if isinstance(payload, str) else base64.b64encode(json.dumps(payload).encode()).decode()
    return SimpleNamespace(data={"message": {"data": data, "messageId": "1"}, "subscription": "x"})


@pytest.fixture
def gcp(monkeypatch):
    fake = FakeGcp(ENV.project, ENV.region)
    creds = AnonymousCredentials()
    ports = Ports(MonitoringQueues(ENV, session=AuthorizedSession(creds)), MigFleet(ENV, credentials=creds),
                  FirestoreNodes(ENV, credentials=creds))  # fmt: skip
    monkeypatch.setattr(main, "function_runtime", lambda: (ENV, ports))
    with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
        fake.install(mock)
        fake.groups |= {"tidefleet-gcp-dev-cpu": 0, "tidefleet-gcp-dev-cpu-od": 0}
        yield fake


@pytest.mark.parametrize("payload,kind", [
    ({"tidefleet": "schedule"}, "schedule"),
    ({"tidefleet": "kick", "env": "gcp-dev", "reason": "submit job-1"}, "kick"),
])  # fmt: skip
def test_schedule_and_kick_messages_run_one_tick(gcp, payload, kind):
    gcp.undelivered["tidefleet-gcp-dev-default"] = 3
    summary = main.on_kick(event(payload))
    assert summary["trigger"] == kind and summary["desired"] == {"cpu": 2}
    assert gcp.groups["tidefleet-gcp-dev-cpu"] == 2


@pytest.mark.parametrize("cloud_event,reason", [
    (event("not base64 !"), "not base64 JSON"),
    (event({"hello": "world"}), "unknown event"),
    (event({"tidefleet": "kick", "env": "prod"}), "reached the function of 'gcp-dev'"),
    (SimpleNamespace(data=None), "not a Pub/Sub message event"),
])  # fmt: skip
def test_malformed_or_foreign_messages_are_logged_and_ignored_without_acting(gcp, cloud_event, reason):
    result = main.on_kick(cloud_event)
    assert reason in result["ignored"]
    assert not [c for m, _, c in gcp.calls if m != "GET"]
