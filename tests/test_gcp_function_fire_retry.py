"""The Cloud Function and a schedule's fire that fails: where Google itself failed for now, the
function raises, so the trigger's retry policy delivers the fire again (a fire has no next tick: an
answered failure was a night's run missed); a refusal is answered, as every failed tick is."""

from __future__ import annotations

import base64
import json
import time
from datetime import UTC, datetime
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
from tidefleet.schedules import run_id

SCHEDULE = ('\n[schedules.nightly]\ncron = "0 2 * * *"\nqueue = "default"\nitems = ["gs://b/x"]\n'
            '\n[schedules.often]\nrate = "5 minutes"\nqueue = "default"\nitems = ["gs://b/y"]\nadmission = "queue"\n')


def event(body: dict, published: float | None = None) -> SimpleNamespace:
    message = {"data": base64.b64encode(json.dumps(body).encode()).decode()}
    if published is not None:  # Pub/Sub's own stamp: RFC 3339, nanoseconds, Z
        message["publishTime"] = datetime.fromtimestamp(published, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f000Z")
    return SimpleNamespace(data={"message": message})


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


def test_a_fire_delivered_late_is_the_run_of_the_slot_it_was_published_for(gcp):
    """Cloud Scheduler's message says no time; Pub/Sub's publishTime does. The function busy with a
    tick, the 10:00 fire of a 5-minute rate ran at 10:05:20 beside the 10:05 one: both were named
    for 10:05, and the 10:00 run never was."""
    now = time.time()
    slot = now - now % 300
    for published in (slot - 300 + 0.4, slot + 0.4):
        main.on_kick(event({"tidefleet": "fire", "schedule": "often"}, published))
    assert sorted(jobs(gcp)) == [run_id("often", slot - 300), run_id("often", slot)]
    main.on_kick(event({"tidefleet": "fire", "schedule": "often"}, slot - 300 + 0.4))  # redelivered: nothing twice
    assert len(jobs(gcp)) == 2


def test_a_fire_sent_before_the_schedule_changed_submits_nothing(gcp):
    """The audit: the old 03:00 job's fire came while a deploy moved the run to 02:00 (here: the
    nightly's cron), and submitted a run named for a past 02:00, already past its deadline."""
    from tidefleet.schedules import fire_time

    now = time.time()
    slot = fire_time("0 2 * * *", None, now)
    sent = slot + 3600 if slot + 3600 <= now else slot + 3600 - 86400  # an 03:00 the schedule no longer has
    answer = main.on_kick(event({"tidefleet": "fire", "schedule": "nightly"}, sent))
    assert answer["decision"].startswith("ignored: fired at ") and "before the schedule changed" in answer["decision"]
    assert jobs(gcp) == []
    main.on_kick(event({"tidefleet": "fire", "schedule": "nightly"}, slot + 25))  # its own fire, seconds late
    assert jobs(gcp) == [run_id("nightly", slot)]
