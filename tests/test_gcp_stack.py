"""Synth and scan of gcp-dev: the properties that matter, read from the Terraform JSON."""

from __future__ import annotations

import base64
import json
import re
import tomllib
from types import SimpleNamespace

import pytest

from tidefleet import naming
from tidefleet.config import Queue, environment_path, load_environment, parse_environment
from tidefleet.resources import redrive_receives

pytestmark = pytest.mark.synth
# gcp-dev with schedules: one named like the built-in minute watch, one rate no single cron writes.
SCHEDULES = """
[schedules.watch]
cron = "0 3 * * 1-5"
queue = "default"
items = ["gs://acme-ml/eval/suite-a"]

[schedules.merge]
rate = "45 minutes"
queue = "default"
items = [["--merge", "gs://acme-ml/checkpoints/latest"]]
admission = "queue"
"""
# Its gpu pool trains across nodes: placement "cluster".
ENV_TEXT = environment_path("gcp-dev").read_text().replace(
    'disk_gb = 200\n', 'disk_gb = 200\nplacement = "cluster"\nzone = "us-central1-b"\n') + SCHEDULES
ENV = parse_environment(tomllib.loads(ENV_TEXT), name="gcp-dev")


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    from stacks.app import synth

    stack_dir = synth(ENV, tmp_path_factory.mktemp("synth-gcp-dev"))
    return stack_dir, json.loads((stack_dir / "cdk.tf.json").read_text())


def resources(stack, rtype: str) -> dict:
    return stack[1]["resource"].get(rtype, {})


def test_spot_templates_are_spot_deleted_on_preemption_shielded_and_without_external_ip(stack):
    templates = resources(stack, "google_compute_instance_template")
    spot = {k: v for k, v in templates.items() if k.endswith("template-spot")}
    assert set(spot) == {"pool-cpu_template-spot", "pool-gpu_template-spot"}
    for t in templates.values():
        (nic,) = t["network_interface"]
        assert "access_config" not in nic, "no external IP unless the pool asks for one"
        assert t["shielded_instance_config"] == {"enable_integrity_monitoring": True, "enable_secure_boot": True, "enable_vtpm": True}
        assert t["metadata"]["startup-script"].startswith("#!/bin/bash")
    for t in spot.values():
        assert t["scheduling"] == {"automatic_restart": False, "instance_termination_action": "DELETE",
                                   "on_host_maintenance": "TERMINATE", "preemptible": True, "provisioning_model": "SPOT"}


def test_gpu_pool_attaches_its_accelerator_and_never_live_migrates(stack):
    templates = resources(stack, "google_compute_instance_template")
    for kind in ("spot", "on-demand"):
        t = templates[f"pool-gpu_template-{kind}"]
        assert t["machine_type"] == "g2-standard-8"
        assert t["guest_accelerator"] == [{"count": 1, "type": "nvidia-l4"}]
        assert t["scheduling"]["on_host_maintenance"] == "TERMINATE"
    assert "guest_accelerator" not in templates["pool-cpu_template-spot"]


def test_group_size_is_left_to_the_scaler(stack):
    groups = resources(stack, "google_compute_region_instance_group_manager")
    assert set(groups) == {f"pool-{p}_group-{k}" for p in ("cpu", "gpu") for k in ("spot", "on-demand")}
    for g in groups.values():
        assert g["lifecycle"]["ignore_changes"] == ["target_size"]
        assert g["target_size"] == 0


def test_a_cluster_pools_groups_each_keep_their_nodes_in_one_zone_and_other_pools_spread(stack):
    """Its gangs talk to each other: one zone GCP picks with capacity for the whole group, where a
    spread pool's Spot VMs go to whichever zones have capacity."""
    assert ENV.pools["gpu"].placement == "cluster" and ENV.pools["cpu"].placement == "spread"
    groups = resources(stack, "google_compute_region_instance_group_manager")
    for kind in ("spot", "on-demand"):
        assert groups[f"pool-gpu_group-{kind}"]["distribution_policy_target_shape"] == "ANY_SINGLE_ZONE"
        assert groups[f"pool-cpu_group-{kind}"]["distribution_policy_target_shape"] == "ANY"
        assert groups[f"pool-gpu_group-{kind}"]["update_policy"]["instance_redistribution_type"] == "NONE"
        # `zone`: both groups in it, so a gang on Spot and on-demand nodes does not span two zones
        assert groups[f"pool-gpu_group-{kind}"]["distribution_policy_zones"] == ["us-central1-b"]
        assert "distribution_policy_zones" not in groups[f"pool-cpu_group-{kind}"]


def test_every_queue_dead_letters_after_its_attempts_with_ack_deadline_from_the_item_timeout(stack):
    subs = resources(stack, "google_pubsub_subscription")
    topics = resources(stack, "google_pubsub_topic")
    for name, queue in ENV.queues.items():
        sub = subs[f"queue-{name}_subscription"]
        assert sub["dead_letter_policy"] == {
            "dead_letter_topic": f"${{google_pubsub_topic.queue-{name}_dlq-topic.id}}",
            "max_delivery_attempts": queue.max_receive_count,
        }
        assert sub["ack_deadline_seconds"] == min(queue.item_timeout_s + 30, 600)
        assert sub["expiration_policy"] == {"ttl": ""}
        assert f"queue-{name}_dlq-subscription" in subs and topics[f"queue-{name}_dlq-topic"]["kms_key_name"]


@pytest.mark.parametrize("retries,attempts", [(0, 6), (3, 9), (100, 100)])
def test_delivery_attempts_are_clamped_to_what_pubsub_accepts(retries, attempts):
    assert redrive_receives("gcp", Queue(pool="cpu", max_retries=retries)) == attempts


def test_node_service_accounts_are_scoped_to_their_own_resources(stack):
    project_roles = {(m["member"], m["role"]) for m in resources(stack, "google_project_iam_member").values()}
    cpu = "${google_service_account.pool-cpu_node.member}"
    leave_role = "${google_project_iam_custom_role.pool-cpu_leave-role.name}"
    assert {r for m, r in project_roles if m == cpu} == {"roles/datastore.user", "roles/logging.logWriter", leave_role}
    (leave,) = [m for m in resources(stack, "google_project_iam_member").values() if m["role"] == leave_role]
    group = "instanceGroupManagers/tidefleet-gcp-dev-cpu"
    assert group in leave["condition"]["expression"] and '.startsWith("tidefleet-gcp-dev-cpu")' in leave["condition"]["expression"]
    role = resources(stack, "google_project_iam_custom_role")["pool-cpu_leave-role"]
    assert sorted(role["permissions"]) == ["compute.instanceGroupManagers.get", "compute.instanceGroupManagers.update",
                                           "compute.instances.delete"]  # its own group, deleteInstances only
    assert not any(r in ("roles/editor", "roles/owner") for _, r in project_roles)
    datastore = [m for m in resources(stack, "google_project_iam_member").values() if m["role"] == "roles/datastore.user"]
    assert all('databases/tidefleet-gcp-dev")' in m["condition"]["expression"] for m in datastore)
    subs = resources(stack, "google_pubsub_subscription_iam_member").values()
    cpu_subs = {s["subscription"] for s in subs if s["member"] == cpu}
    assert cpu_subs == {"${google_pubsub_subscription.queue-default_subscription.id}"}, "only its own queue"
    templates = resources(stack, "google_compute_instance_template")
    assert templates["pool-cpu_template-spot"]["service_account"]["email"] == "${google_service_account.pool-cpu_node.email}"


def test_the_scalers_function_may_submit_to_every_queue_as_its_schedules_and_releases_do(stack):
    """Its function fires [schedules] and releases --after jobs (a submit: publish, and lease_s reads
    the subscription's ack deadline); it had no Pub/Sub right, so each got 403 on a deployed stack."""
    scaler = "${google_service_account.control_scaler.member}"
    topics = {(m["topic"], m["role"]) for m in resources(stack, "google_pubsub_topic_iam_member").values() if m["member"] == scaler}
    subs = {(m["subscription"], m["role"]) for m in resources(stack, "google_pubsub_subscription_iam_member").values()
            if m["member"] == scaler}  # fmt: skip
    queues = load_environment("gcp-dev").queues
    assert topics == {(f"${{google_pubsub_topic.queue-{q}_topic.id}}", "roles/pubsub.publisher") for q in queues}
    assert subs == {(f"${{google_pubsub_subscription.queue-{q}_subscription.id}}", "roles/pubsub.viewer") for q in queues}


def test_scaler_runs_on_a_schedule_and_kicks_with_one_instance_internal_only(stack):
    (fn,) = resources(stack, "google_cloudfunctions2_function").values()
    assert fn["service_config"]["max_instance_count"] == 1
    assert fn["service_config"]["ingress_settings"] == "ALLOW_INTERNAL_ONLY"
    assert fn["build_config"]["entry_point"] == "on_kick"
    job = resources(stack, "google_cloud_scheduler_job")["control_schedule"]
    assert job["schedule"] == "* * * * *"
    assert job["pubsub_target"]["topic_name"] == fn["event_trigger"]["pubsub_topic"]
    # A delivery turned away while a run ticks (one request at a time) is retried, not dropped:
    # it may be a schedule's fire, and every message is idempotent.
    assert fn["event_trigger"]["retry_policy"] == "RETRY_POLICY_RETRY"
    dead_letters = resources(stack, "google_monitoring_alert_policy")["alerts_dead-letters"]
    assert all("num_undelivered_messages" in c["condition_threshold"]["filter"] for c in dead_letters["conditions"])
    assert resources(stack, "google_firestore_database")["jobs"]["type"] == "FIRESTORE_NATIVE"
    assert "item-logs" in resources(stack, "google_logging_project_bucket_config")


def scheduled_jobs(stack) -> dict[str, dict]:
    """The Cloud Scheduler jobs by name, the scaler's tick aside."""
    return {job["name"]: job for key, job in resources(stack, "google_cloud_scheduler_job").items()
            if key != "control_schedule"}  # fmt: skip


def test_each_schedule_fires_and_the_watch_runs_every_minute_through_the_scalers_topic(stack):
    (fn,) = resources(stack, "google_cloudfunctions2_function").values()
    topic = fn["event_trigger"]["pubsub_topic"]
    fire = lambda name: {"tidefleet": "fire", "schedule": name}
    published = {name: (job["schedule"], json.loads(base64.b64decode(job["pubsub_target"]["data"])),
                        job["pubsub_target"]["topic_name"]) for name, job in scheduled_jobs(stack).items()}  # fmt: skip
    assert published == {
        "tidefleet-gcp-dev-watch": ("* * * * *", {"tidefleet": "watch"}, topic),
        "tidefleet-gcp-dev-schedule-watch": ("0 3 * * 1-5", fire("watch"), topic),
        # every 45 minutes from midnight: 00:00 00:45 01:30 02:15 03:00 ...
        "tidefleet-gcp-dev-schedule-merge": ("0,45 */3 * * *", fire("merge"), topic),
        "tidefleet-gcp-dev-schedule-merge_2": ("30 1-22/3 * * *", fire("merge"), topic),
        "tidefleet-gcp-dev-schedule-merge_3": ("15 2-23/3 * * *", fire("merge"), topic),
    }
    jobs = resources(stack, "google_cloud_scheduler_job").values()
    assert {(j["region"], j["time_zone"]) for j in jobs} == {(ENV.region, "Etc/UTC")}
    # Created after the function, whose trigger subscribes: a first deploy's early fire reached no one.
    assert all("google_cloudfunctions2_function.control_function" in job["depends_on"] for job in scheduled_jobs(stack).values())


def test_the_scheduled_messages_reach_the_scheduled_job_code_as_the_function_parses_them(stack, tmp_path, monkeypatch):
    import google.auth
    import responses
    from google.auth.credentials import AnonymousCredentials

    from lambdas.gcp_scaler import main
    from tests.gcp_fake import FakeGcp
    from tidefleet.cloud.gcp import function_runtime

    env_file = tmp_path / "gcp-dev.toml"
    env_file.write_text(ENV_TEXT)
    monkeypatch.setenv("TIDEFLEET_ENV", str(env_file))
    monkeypatch.setattr(google.auth, "default", lambda *a, **k: (AnonymousCredentials(), ENV.project))
    function_runtime.cache_clear()
    with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
        fake = FakeGcp(ENV.project, ENV.region)
        fake.add_queue(naming.queue(ENV.name, "default"))
        fake.add_topic(naming.kick_topic(ENV.name))
        fake.install(mock)
        # As Eventarc delivers the published data: inside the CloudEvent's Pub/Sub message.
        ran = {name: main.on_kick(SimpleNamespace(data={"message": {"data": job["pubsub_target"]["data"], "messageId": "1"},
                                                        "subscription": "x"}))
               for name, job in scheduled_jobs(stack).items()}  # fmt: skip
    function_runtime.cache_clear()
    assert (ran["tidefleet-gcp-dev-watch"]["trigger"], ran["tidefleet-gcp-dev-watch"]["env"]) == ("watch", "gcp-dev")
    for name, schedule in (("tidefleet-gcp-dev-schedule-watch", "watch"), ("tidefleet-gcp-dev-schedule-merge", "merge")):
        assert (ran[name]["trigger"], ran[name]["schedule"]) == ("fire", schedule), ran[name]
        assert ran[name]["decision"].startswith(f"submit {schedule}-"), ran[name]


def test_the_stack_requires_the_terraform_the_readme_names(stack):
    assert stack[1]["terraform"]["required_version"] == ">= 1.10"


def test_the_scaler_may_tick_again_for_a_minute_and_is_told_its_timeout(stack):
    (fn,) = resources(stack, "google_cloudfunctions2_function").values()
    config = fn["service_config"]
    assert config["timeout_seconds"] == 120
    assert config["environment_variables"]["TIDEFLEET_TIMEOUT_S"] == str(config["timeout_seconds"])
    (slow,) = resources(stack, "google_monitoring_alert_policy")["alerts_scaler-duration"]["conditions"]
    assert slow["condition_threshold"]["threshold_value"] == 0.8 * 120 * 1000


def test_gcp_dev_has_zero_unsuppressed_checkov_failures(stack, capsys):
    from stacks.scan import scan

    assert scan(stack[0], "gcp-dev") == 0, capsys.readouterr().out


# What each storage role lets a node do; `condition` holds it to names under some prefixes.
WRITES = {"roles/storage.objectViewer": False, "roles/storage.objectUser": True}
CLAUSE = re.compile(r'(resource\.name|api\.getAttribute\("storage\.googleapis\.com/objectListPrefix", ""\))'
                    r'\.startsWith\("([^"]*)"\)')  # fmt: skip


def condition_allows(expression: str, *, object_name: str | None = None, list_prefix: str | None = None) -> bool:
    """The two clause forms the stack writes, joined by `||`; any other text fails the test."""
    clauses = expression.split(" || ")
    assert all(CLAUSE.fullmatch(c) for c in clauses), expression
    for clause in clauses:
        subject, prefix = CLAUSE.fullmatch(clause).groups()
        if subject == "resource.name" and object_name is not None:
            if object_name.startswith(prefix):
                return True
        elif subject != "resource.name" and list_prefix is not None and list_prefix.startswith(prefix):
            return True
    return False


def bucket_access(stack, member: str, *, object_name: str | None = None, list_prefix: str | None = None) -> set[str]:
    """'read' and/or 'write' that the member's bucket grants give on one object or one listing."""
    bucket = naming.artifacts_bucket(ENV.name, ENV.project)
    out = set()
    for grant in resources(stack, "google_storage_bucket_iam_member").values():
        if grant["member"] != member:
            continue
        assert "condition" in grant, f"an unconditioned bucket grant: {grant['role']}"
        full = None if object_name is None else f"projects/_/buckets/{bucket}/objects/{object_name}"
        if condition_allows(grant["condition"]["expression"], object_name=full, list_prefix=list_prefix):
            out |= {"read", "write"} if WRITES[grant["role"]] else {"read"}
    return out


@pytest.mark.parametrize(
    ("object_name", "list_prefix", "access"),
    [
        ("agent/requirements.txt", None, {"read"}),  # boot installs what it names, as root
        ("agent/wheels/tidefleet-0.1.0-py3-none-any.whl", None, {"read"}),
        (None, "agent/", {"read"}),
        ("checkpoints/default/job-1/item-1/state.pt", None, {"read", "write"}),
        (None, "checkpoints/default/job-1/", {"read", "write"}),
        ("checkpoints/train/job-1/item-1/state.pt", None, set()),  # the gpu pool's queue
        ("functions/scaler-0123.zip", None, set()),  # the scaler's source
        (None, "", set()),
    ],
)
def test_a_node_reads_the_agent_and_writes_only_its_own_queues_checkpoints(stack, object_name, list_prefix, access):
    cpu = "${google_service_account.pool-cpu_node.member}"
    assert bucket_access(stack, cpu, object_name=object_name, list_prefix=list_prefix) == access


# -- alert policies and the dashboard -------------------------------------------------------
def known_gcp_metric(filter: str) -> bool:
    """A filter's metric type is one of ours (a custom metric or the outcome log metric), the
    scaler's error log metric, or one Google publishes."""
    from tidefleet import metrics

    (metric_type,) = re.findall(r'metric\.type = "([^"]+)"', filter)
    ours = {metrics.gcp_metric_type(name, ENV.name) for name in metrics.METRICS}
    errors = f"logging.googleapis.com/user/{naming.stack_resource(ENV.name, 'scaler-errors')}"
    return metric_type in ours | {errors} | metrics.CLOUD_METRICS["gcp"]


def test_every_alert_policy_has_its_runbook_notifies_the_channels_and_watches_an_emitted_metric(stack):
    from stacks.alarms import RUNBOOKS

    channels = resources(stack, "google_monitoring_notification_channel")
    assert sorted((c["type"], next(iter(c["labels"].values()))) for c in channels.values()) == sorted(
        [("email", a) for a in ENV.alerts.email] + [("webhook_tokenauth", u) for u in ENV.alerts.webhooks])
    policies = {k.removeprefix("alerts_"): p for k, p in resources(stack, "google_monitoring_alert_policy").items()}
    # gcp-dev has no cost cap; the AWS-only alarms have no GCP signal.
    expected = {k for k, r in RUNBOOKS.items() if "gcp" in r.clouds} - {"cost-over-cap"}
    assert set(policies) == expected
    for key, policy in policies.items():
        assert policy["documentation"]["content"] == RUNBOOKS[key].text()
        assert len(policy["notification_channels"]) == len(channels)
        for condition in policy["conditions"]:
            threshold = condition["condition_threshold"]
            assert known_gcp_metric(threshold["filter"]), threshold["filter"]
            if "denominator_filter" in threshold:
                assert known_gcp_metric(threshold["denominator_filter"])


def test_each_pool_has_a_launches_held_condition_that_fires_at_rule_14s_count(stack):
    from tidefleet import metrics
    from tidefleet.policy.faults import FAULTS_IN_A_ROW

    policy = resources(stack, "google_monitoring_alert_policy")["alerts_launches-held"]
    thresholds = [c["condition_threshold"] for c in policy["conditions"]]
    assert [t["filter"] for t in thresholds] == [metrics.gcp_filter("NodesFaulted", ENV.name, Pool=p) for p in sorted(ENV.pools)]
    for threshold in thresholds:
        assert threshold["comparison"] == "COMPARISON_GT" and threshold["duration"] == "60s"
        assert FAULTS_IN_A_ROW > threshold["threshold_value"] >= FAULTS_IN_A_ROW - 1  # a whole count: fires at 3, not 2
        assert threshold["aggregations"][0]["per_series_aligner"] == "ALIGN_MAX"


def test_every_scaler_metric_has_a_descriptor_and_every_dashboard_chart_an_emitted_metric(stack):
    from tidefleet import metrics

    descriptors = {d["type"] for d in resources(stack, "google_monitoring_metric_descriptor").values()}
    assert descriptors == {metrics.gcp_metric_type(m.name, ENV.name) for m in metrics.METRICS.values() if m.source == "scaler"}
    (board,) = resources(stack, "google_monitoring_dashboard").values()
    tiles = json.loads(board["dashboard_json"])["mosaicLayout"]["tiles"]
    filters = [d["timeSeriesQuery"]["timeSeriesFilter"]["filter"] for t in tiles for d in t["widget"]["xyChart"]["dataSets"]]
    assert filters and all(known_gcp_metric(f) for f in filters)
    assert any("nodes by lifecycle x activity" in t["widget"]["title"] for t in tiles)


def test_a_pool_of_a_private_image_may_read_its_repository_only(stack):
    pulls = [{k: v for k, v in m.items() if k != "//"}
             for m in resources(stack, "google_artifact_registry_repository_iam_member").values()]
    assert pulls == [{"project": "acme-ml-dev", "location": "us", "repository": "train",
                      "role": "roles/artifactregistry.reader", "member": "${google_service_account.pool-gpu_node.member}"}]


def test_the_scaler_builds_as_its_own_account_once_it_may(stack):
    """Not the project's default account, which holds no role where the organization forbids
    default grants (new organizations since 2024): the first build failed there."""
    (function,) = resources(stack, "google_cloudfunctions2_function").values()
    assert function["build_config"]["service_account"] == "${google_service_account.control_build.id}"
    member = "${google_service_account.control_build.member}"
    roles = {m["role"] for m in resources(stack, "google_project_iam_member").values() if m["member"] == member}
    assert roles == {"roles/logging.logWriter", "roles/artifactregistry.writer"}
    (source,) = [m for m in resources(stack, "google_storage_bucket_iam_member").values() if m["member"] == member]
    assert source["role"] == "roles/storage.objectViewer"
    assert source["condition"]["expression"].startswith(
        'resource.name.startsWith("projects/_/buckets/tidefleet-gcp-dev-artifacts-acme-ml-dev/objects/functions/")')
    assert sorted(function["depends_on"]) == ["google_project_iam_member.control_build-artifactregistry",
                                              "google_project_iam_member.control_build-logging",
                                              "google_storage_bucket_iam_member.control_build-source"]


def test_pubsub_may_sign_the_triggers_pushes_as_the_trigger_account_only(stack):
    (grant,) = resources(stack, "google_service_account_iam_member").values()
    assert grant["service_account_id"] == "${google_service_account.control_trigger.name}"
    assert grant["role"] == "roles/iam.serviceAccountTokenCreator"
    assert grant["member"] == "serviceAccount:service-${data.google_project.project.number}@gcp-sa-pubsub.iam.gserviceaccount.com"
