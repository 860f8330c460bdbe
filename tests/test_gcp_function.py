"""The GCP scaler function's entry point: CloudEvents from the kick topic, on the function's own
runtime wiring (`function_runtime`: the real clients, faked at the HTTP level by tests/gcp_fake.py),
with the same parse, tick and policy as AWS."""

from __future__ import annotations

import base64
import json
import logging
import time
from datetime import UTC, datetime
from types import SimpleNamespace

import google.auth
import pytest
import responses
from google.auth.credentials import AnonymousCredentials

from lambdas.gcp_scaler import main
from tests.clock import Clock
from tests.gcp_fake import FakeGcp, FakeVm
from tidefleet.cloud.gcp import function_runtime
from tidefleet.cloud.gcp.firestore import FirestoreStore
from tidefleet.config import load_environment
from tidefleet.records import Heartbeat

ENV = load_environment("gcp-dev")


def event(payload) -> SimpleNamespace:
    data = payload if isinstance(payload, str) else base64.b64encode(json.dumps(payload).encode()).decode()
    return SimpleNamespace(data={"message": {"data": data, "messageId": "1"}, "subscription": "x"})


@pytest.fixture
def gcp(monkeypatch):
    # A cold start of the deployed function; application default credentials are the only thing not real.
    monkeypatch.setattr(google.auth, "default", lambda *a, **k: (AnonymousCredentials(), ENV.project))
    monkeypatch.setenv("TIDEFLEET_ENV", ENV.name)
    function_runtime.cache_clear()
    with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
        fake = FakeGcp(ENV.project, ENV.region)
        fake.install(mock)
        fake.groups |= {"tidefleet-gcp-dev-cpu": 0, "tidefleet-gcp-dev-cpu-od": 0}
        yield fake
    function_runtime.cache_clear()


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
    (event("kické"), "not base64 JSON"),
    (event(base64.b64encode(b"[" * 1500 + b"]" * 1500).decode()), "nests deeper"),
    (event({"hello": "world"}), "unknown event"),
    (event({"tidefleet": "kick", "env": "prod"}), "reached the function of 'gcp-dev'"),
    (SimpleNamespace(data=None), "not a Pub/Sub message event"),
    # data.message not an object: ignored with its reason, not an AttributeError (a 500 Pub/Sub redelivers)
    (SimpleNamespace(data="hello"), "not a Pub/Sub message event (data is a str, not an object)"),
    (SimpleNamespace(data={"message": "abc"}), "data.message is a str, not an object"),
    (SimpleNamespace(data={"message": [1]}), "data.message is a list, not an object"),
    (SimpleNamespace(data={"message": 5}), "data.message is a int, not an object"),
    (SimpleNamespace(data={"message": {"data": {"x": 1}}}), "data.message.data is a dict, not a string"),
])  # fmt: skip
def test_malformed_or_foreign_messages_are_logged_and_ignored_without_acting(gcp, cloud_event, reason):
    result = main.on_kick(cloud_event)
    assert reason in result["ignored"]
    assert not [c for m, _, c in gcp.calls if m != "GET"]


@pytest.mark.parametrize("mean_item_s, desired", [
    # No completed item yet: at first sight (age 0, 120 s to wait) the 4 busy slots are guessed to
    # start the 4 waiting items within it (items of two boots: `demand.item_mean`); a tick later
    # less than two boots are left and the guess promises nothing: 8 items, 2 slots a node.
    (None, (2, 4)),
    (10.0, (2, 2)),  # the 4 busy slots start them all within the 60 s a new node needs: nothing launched
])  # fmt: skip
def test_the_queue_stats_the_agents_record_reach_the_policy(gcp, mean_item_s, desired):
    if mean_item_s is not None:
        FirestoreStore(ENV).record_item_seconds("default", mean_item_s)  # what an agent records per item
    created = datetime.fromtimestamp(time.time() - 3600, UTC).strftime("%Y-%m-%dT%H:%M:%S.000-00:00")
    names = ["tidefleet-gcp-dev-cpu-aaaa", "tidefleet-gcp-dev-cpu-bbbb"]
    gcp.vms["tidefleet-gcp-dev-cpu"] = [FakeVm(name, created=created) for name in names]
    gcp.groups["tidefleet-gcp-dev-cpu"] = 2
    for name in names:
        FirestoreStore(ENV).put_heartbeat(Heartbeat(name, "cpu", at=time.time(), slots=2, busy_slots=2, idle_since=None))
    gcp.undelivered["tidefleet-gcp-dev-default"] = 8
    ticks = [main.on_kick(event({"tidefleet": "schedule"}))["desired"] for _ in desired]
    assert ticks == [{"cpu": n} for n in desired]


def test_a_tick_that_fails_is_one_error_line_and_the_function_returns_normally(monkeypatch, caplog):
    # Google unreachable: no endpoint answers (responses refuses every request).
    monkeypatch.setattr(google.auth, "default", lambda *a, **k: (AnonymousCredentials(), ENV.project))
    monkeypatch.setenv("TIDEFLEET_ENV", ENV.name)
    function_runtime.cache_clear()
    with responses.RequestsMock(assert_all_requests_are_fired=False), caplog.at_level(logging.INFO, "tidefleet"):
        result = main.on_kick(event({"tidefleet": "schedule"}))
    function_runtime.cache_clear()
    # The cloud's words (`GcpCloud.explain`; inside a deployed function, its operator's: test_gcp_function_errors.py).
    assert result["trigger"] == "schedule" and result["failed"].startswith("cannot reach Google Cloud for 'gcp-dev' (")
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [json.loads(r.getMessage()) for r in errors] == [result] and result["severity"] == "ERROR"


@pytest.mark.parametrize("name, problem", [
    # The function's setting, not a --env typed: no made-up <folder>/gcp-dve.toml, no path to give.
    ("gcp-dve", "TIDEFLEET_ENV: no environment 'gcp-dve' in the function's package (it has: "),
    (None, "TIDEFLEET_ENV: not set; the function's stack sets it to its environment's name: deploy "),
])  # fmt: skip
def test_settings_that_do_not_load_are_one_error_line_naming_the_problem(gcp, monkeypatch, caplog, name, problem):
    if name is None:
        monkeypatch.delenv("TIDEFLEET_ENV")
    else:
        monkeypatch.setenv("TIDEFLEET_ENV", name)
    function_runtime.cache_clear()
    with caplog.at_level(logging.INFO, "tidefleet"):
        result = main.on_kick(event({"tidefleet": "schedule"}))
    assert result["severity"] == "ERROR" and "\n" not in result["failed"]
    assert result["failed"].startswith(problem)
    assert [json.loads(r.getMessage()) for r in caplog.records if r.levelno >= logging.ERROR] == [result]


def test_a_tick_writes_its_decisions_as_custom_metrics_that_the_stack_declares(gcp):
    from tidefleet import metrics

    gcp.undelivered["tidefleet-gcp-dev-default"] = 3
    main.on_kick(event({"tidefleet": "schedule"}))
    written = {(s["metric"]["type"], tuple(sorted(s["metric"]["labels"].items()))): s for s in gcp.time_series}
    desired = written[(metrics.gcp_metric_type("DesiredUnits", ENV.name),
                       (("environment", "gcp-dev"), ("lifecycle", "spot"), ("pool", "cpu")))]  # fmt: skip
    assert desired["points"][0]["value"] == {"doubleValue": 2.0}
    assert desired["resource"] == {"type": "global", "labels": {"project_id": ENV.project}}
    assert {t for t, _ in written} == {metrics.gcp_metric_type(m.name, ENV.name)
                                       for m in metrics.METRICS.values() if m.source == "scaler"}  # fmt: skip


def test_a_metrics_write_that_fails_does_not_fail_the_tick(gcp, monkeypatch, caplog):
    from tidefleet.cloud.gcp.monitoring import MonitoringMetrics

    def refused(self, env, points, now=None):
        raise RuntimeError("403 monitoring.timeSeries.create denied")

    monkeypatch.setattr(MonitoringMetrics, "write", refused)
    gcp.undelivered["tidefleet-gcp-dev-default"] = 3
    with caplog.at_level(logging.WARNING, logger="tidefleet.scaler"):
        summary = main.on_kick(event({"tidefleet": "schedule"}))
    assert summary["desired"] == {"cpu": 2} and gcp.groups["tidefleet-gcp-dev-cpu"] == 2
    assert "metrics" in caplog.text and "timeSeries.create denied" in caplog.text


@pytest.mark.parametrize("timeout,ticks", [("120", 6), ("20", 2), (None, 1), ("soon", 1)])
def test_the_function_ticks_again_while_items_wait_within_the_timeout_its_stack_sets(
    gcp, monkeypatch, tmp_path, timeout, ticks
):
    from tidefleet import triggers
    from tidefleet.config import environments_dir

    text = (environments_dir() / f"{ENV.name}.toml").read_text()
    (tmp_path / f"{ENV.name}.toml").write_text(text.replace("tick_s = 60", "tick_s = 60\nwaiting_tick_s = 10", 1))
    monkeypatch.setenv("TIDEFLEET_ENVIRONMENTS", str(tmp_path))
    function_runtime.cache_clear()
    clock = Clock()
    monkeypatch.setattr(triggers, "time", clock)
    monkeypatch.setattr(main, "time", clock)  # the request's start, which the timeout counts from
    if timeout is None:
        monkeypatch.delenv("TIDEFLEET_TIMEOUT_S", raising=False)
    else:
        monkeypatch.setenv("TIDEFLEET_TIMEOUT_S", timeout)
    gcp.undelivered["tidefleet-gcp-dev-default"] = 3  # nothing receives them: they wait throughout
    assert main.on_kick(event({"tidefleet": "schedule"}))["ticks"] == ticks
    assert clock.slept == [10.0] * (ticks - 1)
