"""Alarms that reach a person, and dashboards that show only what something emits.

Synthesized prod (with `[alerts]`) and dev (without) on AWS, gcp-dev on GCP: every alarm of
`stacks.alarms.RUNBOOKS` exists where its cloud has the signal, carries its runbook line and
notifies the configured people; every metric an alarm or a dashboard names is one that
`tidefleet.metrics` emits (or the cloud itself publishes). The sandbox test checks the AWS
dashboard against what a real run published.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from stacks.alarms import RUNBOOKS
from stacks.aws.alarms import dashboard
from tidefleet import control, metrics, naming
from tidefleet.config import load_environment

pytestmark = pytest.mark.synth
README = Path(__file__).resolve().parents[1] / "README.md"


def resources(synthesized, env_name: str, rtype: str) -> dict:
    return synthesized[env_name][1]["resource"].get(rtype, {})


def dashboard_metrics(body: dict) -> list[tuple[str, str, dict]]:
    """(namespace, name, dimensions) of every metric line of a CloudWatch dashboard body."""
    out = []
    for widget in body["widgets"]:
        for line in widget["properties"]["metrics"]:
            fields = [f for f in line if not isinstance(f, dict)]  # a trailing dict holds render options
            namespace, name, *dims = fields
            out.append((namespace, name, dict(zip(dims[::2], dims[1::2], strict=True))))
    return out


def assert_emitted(namespace: str, name: str, dimensions: dict, env_name: str) -> None:
    """A metric of ours with exactly its dimensions and this environment, or one AWS publishes."""
    if namespace != metrics.NAMESPACE:
        assert (namespace, name) in metrics.CLOUD_METRICS["aws"], (namespace, name)
        return
    assert name in metrics.METRICS, name
    assert tuple(dimensions) == metrics.METRICS[name].dimensions, (name, dimensions)
    assert dimensions["Environment"] == env_name


def alarms(synthesized, env_name: str) -> dict:
    return {a["alarm_name"]: a for a in resources(synthesized, env_name, "aws_cloudwatch_metric_alarm").values()}


@pytest.mark.parametrize("env_name", ["prod", "dev", "sandbox"])
def test_every_dashboard_widget_shows_a_metric_that_something_emits(synthesized, env_name):
    (board,) = resources(synthesized, env_name, "aws_cloudwatch_dashboard").values()
    shown = dashboard_metrics(json.loads(board["dashboard_body"]))
    assert shown
    for namespace, name, dims in shown:
        assert_emitted(namespace, name, dims, env_name)


@pytest.mark.parametrize("env_name", ["prod", "dev"])
def test_every_alarm_watches_a_metric_that_something_emits(synthesized, env_name):
    for alarm in alarms(synthesized, env_name).values():
        queries = alarm.get("metric_query") or [{"metric": alarm}]
        for query in queries:
            metric = query.get("metric")
            if metric is None:
                assert query["expression"] and query["return_data"]
                continue
            assert_emitted(metric["namespace"], metric["metric_name"], metric["dimensions"], env_name)


def test_prod_has_every_aws_alarm_with_its_runbook_and_each_notifies_the_encrypted_topic(synthesized):
    env = load_environment("prod")
    (topic,) = resources(synthesized, "prod", "aws_sns_topic").values()
    assert topic["name"] == naming.stack_resource("prod", "alerts") and "aws_kms_key" in topic["kms_master_key_id"]
    found = alarms(synthesized, "prod")
    notifying = {n: a for n, a in found.items() if not n.endswith("-backlog")}  # backlog alarms tick the scaler
    for key, runbook in RUNBOOKS.items():
        named = [a for n, a in notifying.items() if n.endswith(f"-{key}")]
        assert named, f"no {key} alarm"
        assert all(runbook.text() in a["alarm_description"] for a in named)
    for name, alarm in notifying.items():
        assert alarm["alarm_actions"] == alarm["ok_actions"] == ["${aws_sns_topic.alarms_topic.arn}"], name
    for q, queue in env.queues.items():
        assert found[naming.stack_resource("prod", f"{q}-oldest-item")]["threshold"] == queue.max_wait_s
    assert found[naming.stack_resource("prod", "cost-over-cap")]["threshold"] == env.scaler.cost_cap_usd_per_hour
    assert found[naming.stack_resource("prod", "gpu-cost-over-cap")]["threshold"] == env.pools["gpu"].cost_cap_usd_per_hour


def test_each_pool_alarms_once_its_launches_are_held_for_nodes_that_cannot_run_items(synthesized):
    """Rule 14 holds a pool's launches at `FAULTS_IN_A_ROW` faults in a row, from that tick on:
    the pool's `launches-held` alarm watches that count (`NodesFaulted`) and fires at it, not below."""
    from tidefleet.policy.faults import FAULTS_IN_A_ROW

    for env_name in ("prod", "dev"):
        found = alarms(synthesized, env_name)
        for pool in load_environment(env_name).pools:
            alarm = found[naming.stack_resource(env_name, f"{pool}-launches-held")]
            assert (alarm["namespace"], alarm["metric_name"], alarm["dimensions"]) == (
                metrics.NAMESPACE, "NodesFaulted", {"Environment": env_name, "Pool": pool})  # fmt: skip
            assert (alarm["statistic"], alarm["period"], alarm["evaluation_periods"]) == ("Maximum", 60, 1)
            assert alarm["comparison_operator"] == "GreaterThanThreshold"
            assert FAULTS_IN_A_ROW > alarm["threshold"] >= FAULTS_IN_A_ROW - 1  # a whole count: fires at 3, not at 2
            assert alarm["alarm_description"].startswith(f"{pool}: {RUNBOOKS['launches-held'].text()}")
    assert "launches-held" in naming.POOL_ALARMS


def test_scaler_throttles_fire_only_after_15_minutes_of_throttles_that_started_no_run(synthesized):
    found = alarms(synthesized, "prod")
    alarm = found[naming.stack_resource("prod", "scaler-throttles")]
    assert (alarm["threshold"], alarm["evaluation_periods"], alarm["datapoints_to_alarm"]) == (0, 15, 15)
    assert "metric_name" not in alarm
    queries = {q["id"]: q for q in alarm["metric_query"]}
    for query_id, name in (("invocations", "Invocations"), ("throttles", "Throttles")):
        metric = queries.pop(query_id)["metric"]
        assert (metric["namespace"], metric["metric_name"], metric["stat"], metric["period"]) == (
            "AWS/Lambda", name, "Sum", 60)  # fmt: skip
        assert metric["dimensions"] == {"FunctionName": naming.function("prod", "scaler")}
    (math,) = queries.values()
    assert math["return_data"] and math["expression"] == "IF(FILL(invocations, 0) == 0, throttles, 0)"
    # A run that loops stops by 60 s plus one tick: past 80 % of the 120-s timeout is a slow tick.
    assert found[naming.stack_resource("prod", "scaler-duration")]["threshold"] == 0.8 * 120 * 1000


def test_alerts_subscribe_the_configured_people_and_without_alerts_no_one(synthesized):
    env = load_environment("prod")
    subscriptions = resources(synthesized, "prod", "aws_sns_topic_subscription").values()
    assert sorted((s["protocol"], s["endpoint"]) for s in subscriptions) == sorted(
        [("email", a) for a in env.alerts.email] + [("https", u) for u in env.alerts.webhooks])
    assert resources(synthesized, "dev", "aws_sns_topic_subscription") == {}
    assert len(alarms(synthesized, "dev")) > len(load_environment("dev").queues)  # the alarms exist all the same


def test_only_this_environments_alarms_may_publish_and_the_key_lets_them(synthesized):
    (policy,) = resources(synthesized, "prod", "aws_sns_topic_policy").values()
    assert policy["policy"] == "${data.aws_iam_policy_document.alarms_topic-policy-doc.json}"
    docs = synthesized["prod"][1]["data"]["aws_iam_policy_document"]
    (statement,) = docs["alarms_topic-policy-doc"]["statement"]
    assert statement["principals"] == [{"identifiers": ["cloudwatch.amazonaws.com"], "type": "Service"}]
    assert statement["condition"][0]["values"][0].endswith(":alarm:tidefleet-prod-*")
    key_statements = {s["sid"]: s for s in docs["key_policy"]["statement"]}
    assert key_statements["AlarmsPublishToTheEncryptedTopic"]["principals"][0]["identifiers"] == ["cloudwatch.amazonaws.com"]


def test_the_readme_lists_every_alarm_with_its_meaning_and_first_action():
    text = README.read_text()
    section = text[text.index("## Alarms and dashboard"):text.index("## Configuration reference")]
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `([a-z-]+)` \|.*$", section, re.MULTILINE)}
    assert set(rows) == set(RUNBOOKS)
    for key, runbook in RUNBOOKS.items():
        assert runbook.meaning in rows[key] and runbook.first_action in rows[key], key
        assert ("AWS only" in rows[key]) == (runbook.clouds == ("aws",)), key


def test_the_readme_lists_every_metric_with_its_dimensions_and_meaning():
    text = README.read_text()
    section = text[text.index("## Alarms and dashboard"):text.index("## Configuration reference")]
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `([A-Za-z]+)` \|.*$", section, re.MULTILINE)}
    assert set(rows) == set(metrics.METRICS)
    for name, metric in metrics.METRICS.items():
        cells = [c.strip() for c in rows[name].strip("|").split("|")]
        assert cells[1] == (", ".join(metric.dimensions[1:]) or "—"), name
        assert metric.help in cells[2] and cells[3] == metric.source, name


def test_the_scaler_errors_runbook_tells_a_tick_that_still_scaled_by_its_line():
    """A tick that only went without job-store reads (`control.WITHOUT`) scaled, and still fails
    its run, which fires the alarm: the runbook quotes the words its failure line starts with."""
    degraded = control.TickError([("job store: hold marks not read", RuntimeError("throttled"))], (), unread=1)
    assert f"`{degraded.summary}` still scaled" in RUNBOOKS["scaler-errors"].meaning


def test_the_dashboard_has_a_row_per_pool_and_the_environment_row():
    env = load_environment("prod")
    titles = [w["properties"]["title"] for w in dashboard(env)["widgets"]]
    for pool in env.pools:
        assert any(t.startswith(f"{pool}: nodes by lifecycle x activity") for t in titles)
        (trouble,) = [w for w in dashboard(env)["widgets"] if w["properties"]["title"] == f"{pool}: decisions and trouble"]
        shown = {line[1] for line in trouble["properties"]["metrics"]}
        assert {"NodesStuckBooting", "NodesSilent", "NodesFaulted"} <= shown
        assert any(t.startswith(f"{pool}: oldest waiting item") for t in titles)
    assert {"$/hour (configured prices)", "attempts: succeeded, failed, interrupted"} <= set(titles)


def test_the_readmes_alerts_example_is_a_valid_alerts_section():
    import tomllib

    from tidefleet.config import parse_environment

    text = README.read_text()
    section = text[text.index("### `[alerts]`"):]
    start = section.index("```toml\n") + len("```toml\n")
    example = section[start : section.index("\n```", start)]
    base = tomllib.loads((Path(__file__).resolve().parents[1] / "environments" / "dev.toml").read_text())
    env = parse_environment({**base, **tomllib.loads(example)}, name="dev")
    assert env.alerts.email and env.alerts.webhooks
