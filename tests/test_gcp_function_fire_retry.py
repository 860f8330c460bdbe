"""The Cloud Function and a schedule's fire that fails: where Google itself failed for now, the
function raises, so the trigger's retry policy delivers the fire again (a fire has no next tick: an
answered failure was a night's run missed); a refusal is answered, as every failed tick is."""

from __future__ import annotations

import base64
import json
from types import SimpleNamespace

import google.auth
import pytest
import responses
from google.api_core.exceptions import RetryError, ServiceUnavailable
from google.auth.credentials import AnonymousCredentials

from lambdas.gcp_scaler import main
from tests.gcp_fake import FakeGcp
from tidefleet.cloud.gcp import firestore, function_runtime
from tidefleet.config import environment_path

SCHEDULE = '\n[schedules.nightly]\ncron = "0 2 * * *"\nqueue = "default"\nitems = ["gs://b/x"]\n'


def event(body: dict) -> SimpleNamespace:
    return SimpleNamespace(data={"message": {"data": base64.b64encode(json.dumps(body).encode()).decode()}})


@pytest.fixture
def gcp(monkeypatch, tmp_path):
    """gcp-dev with a nightly schedule, its Firestore answering `gcp.answer(request)` while set."""
    (tmp_path / "gcp-dev.toml").write_text(environment_path("gcp-dev").read_text() + SCHEDULE)
    monkeypatch.setenv("TIDEFLEET_ENVIRONMENTS", str(tmp_path))
    monkeypatch.setenv("TIDEFLEET_ENV", "gcp-dev")
    monkeypatch.setenv("FUNCTION_TARGET", "on_kick")
    monkeypatch.setattr(google.auth, "default", lambda *a, **k: (AnonymousCredentials(), "acme-ml-dev"))
    monkeypatch.setattr(firestore, "RETRY", firestore.RETRY.with_timeout(1.0))  # its 20 s of retries, shortened
    function_runtime.cache_clear()
    with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
        fake = FakeGcp("acme-ml-dev", "us-central1")
        fake.add_queue("tidefleet-gcp-dev-default")
        fake.add_topic("tidefleet-gcp-dev-kick")
        real, fake.answer = fake._firestore, None
        fake._firestore = lambda request: fake.answer(request) if fake.answer else real(request)
        fake.install(mock)
        yield fake
    function_runtime.cache_clear()


def jobs(fake: FakeGcp) -> list[str]:
    return [k.rsplit("/", 1)[1] for k in fake.docs if "/jobs/" in k and "/items/" not in k and "/sent/" not in k]


def test_a_fire_google_failed_is_raised_for_the_trigger_to_deliver_again_and_then_submits_once(gcp):
    gcp.answer = lambda request: gcp._error(503, "UNAVAILABLE", "outage")
    with pytest.raises((ServiceUnavailable, RetryError)):  # past the client's retries
        main.on_kick(event({"tidefleet": "fire", "schedule": "nightly"}))
    assert jobs(gcp) == []
    gcp.answer = None  # Google is back: the trigger's retry
    assert main.on_kick(event({"tidefleet": "fire", "schedule": "nightly"}))["decision"].startswith("submit nightly-")
    main.on_kick(event({"tidefleet": "fire", "schedule": "nightly"}))  # delivered once more: nothing twice
    assert len(jobs(gcp)) == 1


def test_a_fire_refused_is_answered_not_retried(gcp):
    """A refusal would fail every delivery: one line, as for a failed tick."""
    gcp.answer = lambda request: gcp._error(403, "PERMISSION_DENIED", "denied")
    answered = main.on_kick(event({"tidefleet": "fire", "schedule": "nightly"}))
    assert answered["severity"] == "ERROR" and "lacks a role for this call" in answered["failed"]
