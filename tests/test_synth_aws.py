"""Properties of the synthesized AWS stacks that must hold for every shipped environment."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest
from conftest import SHIPPED_ENVS

from stacks.aws.stack import terraform_literal
from tidefleet import naming
from tidefleet.config import environment_path, load_environment, parse_environment
from tidefleet.userdata import SHARED_FS_PLACEHOLDER, render_user_data

pytestmark = pytest.mark.synth

# The only statements allowed resource "*", and why.
UNSCOPED_SIDS = {
    "DescribeFleetUnscopable": "Describe* on Auto Scaling and EC2 has no resource-level permissions",
    "XRayWriteUnscopable": "X-Ray trace writes have no resource-level permissions",
    "ListQueuesUnscopable": "SQS ListQueues has no resource-level permissions",
    "PullImagesTokenUnscopable": "ECR GetAuthorizationToken has no resource-level permissions",
    "AccountAdministersAndUsesTheKeyThroughIam": "in a key policy '*' means this key",
    "LogsEncryptThisEnvironmentsLogGroups": "in a key policy '*' means this key",
    "AlarmsPublishToTheEncryptedTopic": "in a key policy '*' means this key",
}


def resources(stack: dict, rtype: str) -> dict:
    return stack["resource"].get(rtype, {})


def policy_documents(stack: dict) -> dict:
    return stack["data"]["aws_iam_policy_document"]


@pytest.fixture(scope="module")
def prod_variant(tmp_path_factory):
    """prod with a schedule named like the built-in minute watch, its state locked by S3's lock file."""
    from stacks.app import synth

    data = tomllib.loads(environment_path("prod").read_text())
    data["schedules"]["watch"] = data["schedules"]["nightly-eval"] | {"cron": "0 4 * * *"}
    del data["state"]["lock_table"]
    env = parse_environment(data, name="prod")
    return env, json.loads((synth(env, tmp_path_factory.mktemp("synth-prod-variant")) / "cdk.tf.json").read_text())


@pytest.fixture(params=SHIPPED_ENVS)
def shipped(request, synthesized):
    """(environment, parsed stack) for each shipped environment."""
    return load_environment(request.param), synthesized[request.param][1]


def test_every_launch_template_requires_imdsv2(shipped):
    _env, stack = shipped
    for name, template in resources(stack, "aws_launch_template").items():
        options = template["metadata_options"]
        assert (name, options["http_tokens"], options["http_endpoint"]) == (name, "required", "enabled")
        assert options["http_put_response_hop_limit"] in (1, 2)


def test_root_volumes_are_encrypted_gp3_of_the_pools_disk_size(shipped):
    env, stack = shipped
    templates = resources(stack, "aws_launch_template")
    for pool_name, pool in env.pools.items():
        (mapping,) = templates[f"pool-{pool_name}_launch-template"]["block_device_mappings"]
        assert mapping["ebs"] == {"volume_size": pool.disk_gb, "volume_type": "gp3", "encrypted": "true",
                                  "delete_on_termination": "true"}  # fmt: skip


def test_nodes_get_no_public_address_unless_the_pool_asks(shipped):
    env, stack = shipped
    templates = resources(stack, "aws_launch_template")
    for pool_name, pool in env.pools.items():
        (nic,) = templates[f"pool-{pool_name}_launch-template"]["network_interfaces"]
        assert nic["associate_public_ip_address"] == ("true" if pool.public_ip else "false")


def test_every_queue_is_encrypted_and_redrives_to_its_own_dead_letter_queue(shipped):
    env, stack = shipped
    queues = resources(stack, "aws_sqs_queue")
    assert all(q["sqs_managed_sse_enabled"] is True for q in queues.values())
    for name, queue in env.queues.items():
        main = queues[f"queue-{name}_queue"]
        assert main["name"] == naming.queue(env.name, name)
        assert main["visibility_timeout_seconds"] == queue.visibility_timeout_s
        dead_letter_arn = f"${{aws_sqs_queue.queue-{name}_dead-letter.arn}}"
        assert json.loads(main["redrive_policy"]) == {
            "deadLetterTargetArn": dead_letter_arn, "maxReceiveCount": queue.max_receive_count}  # fmt: skip
        assert queues[f"queue-{name}_dead-letter"]["name"] == naming.dead_letter_queue(env.name, name)


def test_job_table_is_on_demand_recoverable_and_encrypted_with_the_environment_key(shipped):
    env, stack = shipped
    table = resources(stack, "aws_dynamodb_table")["jobs_table"]
    assert (table["name"], table["billing_mode"], table["hash_key"], table["range_key"]) == (
        naming.table(env.name), "PAY_PER_REQUEST", "pk", "sk")  # fmt: skip
    assert table["point_in_time_recovery"] == {"enabled": True}
    assert table["server_side_encryption"] == {"enabled": True, "kms_key_arn": "${aws_kms_key.key_key.arn}"}


def test_artifacts_bucket_is_private_versioned_encrypted_and_tls_only(shipped):
    _env, stack = shipped
    block = resources(stack, "aws_s3_bucket_public_access_block")["artifacts_public-access-block"]
    assert all(block[k] is True for k in ("block_public_acls", "block_public_policy", "ignore_public_acls",
                                          "restrict_public_buckets"))  # fmt: skip
    assert resources(stack, "aws_s3_bucket_versioning")["artifacts_versioning"]["versioning_configuration"] == {
        "status": "Enabled"}  # fmt: skip
    (rule,) = resources(stack, "aws_s3_bucket_server_side_encryption_configuration")["artifacts_encryption"]["rule"]
    assert rule["apply_server_side_encryption_by_default"]["sse_algorithm"] == "aws:kms"
    (deny,) = policy_documents(stack)["artifacts_tls-only"]["statement"]
    assert (deny["effect"], deny["condition"][0]["variable"], deny["condition"][0]["values"]) == (
        "Deny", "aws:SecureTransport", ["false"])  # fmt: skip


def test_log_groups_keep_logs_and_are_encrypted(shipped):
    env, stack = shipped
    groups = resources(stack, "aws_cloudwatch_log_group")
    assert naming.item_log_group(env.name) in {g["name"] for g in groups.values()}
    assert {f"/aws/lambda/{naming.function(env.name, r)}" for r in ("scaler", "interruption")} <= {
        g["name"] for g in groups.values()}  # fmt: skip
    assert all(g["retention_in_days"] >= 365 and g["kms_key_id"] for g in groups.values())


def test_groups_mix_the_pools_types_with_their_weights(shipped):
    env, stack = shipped
    groups = resources(stack, "aws_autoscaling_group")
    for pool_name, pool in env.pools.items():
        group = groups[f"pool-{pool_name}_group"]
        policy = group["mixed_instances_policy"]
        assert [(o["instance_type"], o["weighted_capacity"]) for o in policy["launch_template"]["override"]] == [
            (t.type, str(t.weight)) for t in pool.instance_types]  # fmt: skip
        assert policy["instances_distribution"] == {
            "on_demand_base_capacity": pool.on_demand_base,
            "on_demand_percentage_above_base_capacity": pool.on_demand_percent,
            "spot_allocation_strategy": pool.spot_allocation_strategy,
            "spot_max_price": "" if pool.spot_max_price is None else str(pool.spot_max_price),
        }
        assert (group["name"], group["min_size"], group["max_size"], group["capacity_rebalance"]) == (
            naming.group(env.name, pool_name), pool.min, pool.max, True)  # fmt: skip
        # Weights count as units by default; AWS refuses an explicit desired_capacity_type in a group
        # without attribute-based (InstanceRequirements) overrides (terraform-provider-aws#31521).
        assert "desired_capacity_type" not in group


def test_terraform_ignores_desired_capacity_and_on_demand_base_because_the_scaler_owns_them(shipped):
    _env, stack = shipped
    owned = ["desired_capacity", "mixed_instances_policy[0].instances_distribution[0].on_demand_base_capacity"]
    for name, group in resources(stack, "aws_autoscaling_group").items():
        assert (name, group["lifecycle"]["ignore_changes"]) == (name, owned)


def test_every_group_spans_every_subnet(shipped):
    env, stack = shipped
    subnets = env.network.subnet_ids or [f"${{aws_subnet.network_private-{i}.id}}" for i in range(env.network.az_count)]
    for pool_name, pool in env.pools.items():
        group = resources(stack, "aws_autoscaling_group")[f"pool-{pool_name}_group"]
        # A cluster placement group lives in one zone: its pool uses the first subnet only.
        assert group["vpc_zone_identifier"] == (subnets[:1] if pool.placement == "cluster" else subnets)


def test_terminating_nodes_get_a_lifecycle_hook_to_hand_work_back(shipped):
    env, stack = shipped
    for pool_name in env.pools:
        (hook,) = resources(stack, "aws_autoscaling_group")[f"pool-{pool_name}_group"]["initial_lifecycle_hook"]
        assert hook["name"] == naming.lifecycle_hook(env.name, pool_name)
        assert (hook["lifecycle_transition"], hook["default_result"]) == ("autoscaling:EC2_INSTANCE_TERMINATING", "CONTINUE")
        assert 60 <= hook["heartbeat_timeout"] <= 900


def test_nodes_carry_env_pool_team_and_cost_tags_from_launch(shipped):
    env, stack = shipped
    for pool_name, pool in env.pools.items():
        tags = resources(stack, "aws_autoscaling_group")[f"pool-{pool_name}_group"]["tag"]
        assert all(t["propagate_at_launch"] for t in tags)
        assert {t["key"]: t["value"] for t in tags} == {
            **env.tags, "tidefleet:env": env.name, "tidefleet:pool": pool_name, "tidefleet:team": pool.team}  # fmt: skip


def test_no_policy_allows_a_wildcard_action_or_an_unscoped_resource_beyond_the_documented_ones(shipped):
    _env, stack = shipped
    for doc_name, doc in policy_documents(stack).items():
        for statement in doc["statement"]:
            where = (doc_name, statement.get("sid"))
            assert "*" not in statement["actions"], where
            if statement.get("effect", "Allow") == "Allow":
                assert [a for a in statement["actions"] if "*" in a] == [], where
                if "*" in statement.get("resources", []):  # trust policies name no resource
                    assert statement.get("sid") in UNSCOPED_SIDS, where


def test_each_node_role_touches_only_its_own_pools_queues_and_group(shipped):
    env, stack = shipped
    for pool_name in env.pools:
        statements = {s["sid"]: s for s in policy_documents(stack)[f"pool-{pool_name}_node-role_policy"]["statement"]}
        own = env.queues_of(pool_name)
        assert sorted(statements["WorkOwnQueues"]["resources"]) == sorted(
            f"${{aws_sqs_queue.queue-{q}_{kind}.arn}}" for q in own for kind in ("queue", "dead-letter"))  # fmt: skip
        (group_arn,) = statements["OwnGroup"]["resources"]  # terminating itself too: only a member of its group
        assert "autoscaling:TerminateInstanceInAutoScalingGroup" in statements["OwnGroup"]["actions"]
        assert group_arn.endswith(f":autoScalingGroupName/{naming.group(env.name, pool_name)}")
        buckets = statements["ReadAgent"]["resources"] + statements["OwnCheckpoints"]["resources"]
        assert [re.sub(r"^\$\{[^}]+\}", "", b) for b in buckets] == [
            "/agent/*", *(f"/{naming.checkpoint_prefix(q)}*" for q in sorted(own))]  # fmt: skip


def test_user_data_is_the_rendered_script_with_the_bucket_spliced_in(shipped):
    env, stack = shipped
    bucket = naming.artifacts_bucket(env.name, "${data.aws_caller_identity.account_caller.account_id}")
    for pool_name in env.pools:
        template = resources(stack, "aws_launch_template")[f"pool-{pool_name}_launch-template"]
        assert template["user_data"] == f"${{base64encode(local.user-data-{pool_name})}}"
        expected = terraform_literal(render_user_data(env, pool_name, artifacts_bucket="@@")).replace("@@", bucket)
        if env.shared_fs:  # the file system's address, known at apply
            lustre = "${aws_fsx_lustre_file_system.network_shared-fs_lustre"
            source = {"fsx-lustre": f"{lustre}.dns_name}}@tcp:/{lustre}.mount_name}}",
                      "efs": "${aws_efs_file_system.network_shared-fs_efs.dns_name}:/"}[env.shared_fs.kind]  # fmt: skip
            expected = expected.replace(SHARED_FS_PLACEHOLDER, source)
        assert stack["locals"][f"user-data-{pool_name}"] == expected


def test_functions_run_from_the_archive_pinned_by_its_hash(shipped):
    env, stack = shipped
    functions = resources(stack, "aws_lambda_function")
    scaler, interruption = functions["control_scaler"], functions["control_interruption"]
    for function, handler in ((scaler, "lambdas.scaler.handler.handler"),
                              (interruption, "lambdas.interruption.handler.handler")):  # fmt: skip
        assert function["runtime"] == "python3.12" and function["handler"] == handler
        assert function["filename"].endswith(f"build/functions-{env.name}.zip")  # its own: its file alone
        assert function["source_code_hash"] == f'${{filebase64sha256("{function["filename"]}")}}'
        assert function["environment"]["variables"] == {"TIDEFLEET_ENV": env.name}
    assert scaler["reserved_concurrent_executions"] == 1


def test_a_scaler_run_may_tick_again_for_a_minute_and_a_kick_throttled_meanwhile_expires_within_one(shipped):
    _env, stack = shipped
    assert resources(stack, "aws_lambda_function")["control_scaler"]["timeout"] == 120
    configs = resources(stack, "aws_lambda_function_event_invoke_config")
    assert configs["control_scaler-async"]["maximum_event_age_in_seconds"] == 60
    assert "maximum_event_age_in_seconds" not in configs["control_interruption-async"]


def test_the_scaler_is_ticked_by_schedule_and_by_one_backlog_alarm_per_queue(shipped):
    env, stack = shipped
    rules = resources(stack, "aws_cloudwatch_event_rule")
    assert re.fullmatch(r"rate\(\d+ minutes?\)", rules["control_tick"]["schedule_expression"])
    alarms = {k: a for k, a in resources(stack, "aws_cloudwatch_metric_alarm").items() if k.startswith("control_backlog-")}
    assert sorted(a["dimensions"]["QueueName"] for a in alarms.values()) == sorted(
        naming.queue(env.name, q) for q in env.queues)  # fmt: skip
    assert all(a["alarm_actions"] == ["${aws_lambda_function.control_scaler.arn}"] for a in alarms.values())
    principals = [p["principal"] for p in resources(stack, "aws_lambda_permission").values()]
    assert principals.count("lambda.alarms.cloudwatch.amazonaws.com") == len(env.queues)


def test_interruption_rules_cover_spot_warnings_rebalance_and_this_envs_terminate_hooks(shipped):
    env, stack = shipped
    rules = resources(stack, "aws_cloudwatch_event_rule")
    patterns = [json.loads(r["event_pattern"]) for r in rules.values() if "event_pattern" in r]
    assert sorted(p["detail-type"][0] for p in patterns) == [
        "EC2 Instance Rebalance Recommendation", "EC2 Instance-terminate Lifecycle Action",
        "EC2 Spot Instance Interruption Warning"]  # fmt: skip
    (hook,) = [p for p in patterns if p["source"] == ["aws.autoscaling"]]
    assert hook["detail"]["AutoScalingGroupName"] == sorted(naming.group(env.name, p) for p in env.pools)
    targets = resources(stack, "aws_cloudwatch_event_target").values()
    assert sum(t["arn"] == "${aws_lambda_function.control_interruption.arn}" for t in targets) == 3


def test_each_schedule_and_the_minute_watch_invoke_the_schedule_function_through_a_role_that_may_only_invoke_it(shipped):
    env, stack = shipped
    function = resources(stack, "aws_lambda_function")["schedules_function"]
    assert function["handler"] == "lambdas.schedule.handler.handler"
    fired = {s["target"]["input"]: s["schedule_expression"] for s in resources(stack, "aws_scheduler_schedule").values()}
    expected = {json.dumps({"tidefleet": "watch"}): "rate(1 minute)"} | {
        json.dumps({"tidefleet": "fire", "schedule": name, "at": "<aws.scheduler.scheduled-time>"}): when
        for name, when in {"model-merge": "rate(10 hours)", "nightly-eval": "cron(0 3 ? * 2-6 *)"}.items()
        if name in env.schedules
    }
    assert fired == expected
    documents = {k: v for k, v in policy_documents(stack).items() if k.startswith("schedules_scheduler-role_policy")}
    (only,) = documents.values()
    assert [(s["actions"], s["resources"]) for s in only["statement"]] == [
        (["lambda:InvokeFunction"], ["${aws_lambda_function.schedules_function.arn}"]),
        (["kms:Decrypt"], ["${aws_kms_key.key_key.arn}"])]  # the schedules' input is encrypted with the key


def test_a_schedule_named_watch_fires_beside_the_minute_watch_instead_of_replacing_it(prod_variant):
    env, stack = prod_variant
    fired = {s["name"]: (s["schedule_expression"], json.loads(s["target"]["input"]))
             for s in resources(stack, "aws_scheduler_schedule").values()}  # fmt: skip
    assert len(fired) == len(env.schedules) + 1
    assert fired["tidefleet-prod-watch"] == ("rate(1 minute)", {"tidefleet": "watch"})
    assert fired["tidefleet-prod-schedule-watch"] == (
        "cron(0 4 * * ? *)", {"tidefleet": "fire", "schedule": "watch", "at": "<aws.scheduler.scheduled-time>"})


def test_every_stack_requires_the_terraform_that_reads_its_state_lock(shipped, prod_variant):
    _env, stack = shipped
    assert stack["terraform"]["required_version"] == ">= 1.10"
    _env, variant = prod_variant
    assert variant["terraform"]["backend"]["s3"]["use_lockfile"] is True  # new in Terraform and OpenTofu 1.10
    assert variant["terraform"]["required_version"] == ">= 1.10"


def test_the_lambda_concurrency_an_environment_reserves_is_what_the_readme_says(synthesized):
    """A new account's concurrency quota refuses a reservation at apply: the README names the sum."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    said = int(re.search(r"environment reserves (\d+) concurrent Lambda executions", readme)[1])
    for name in ("dev", "prod"):
        functions = resources(synthesized[name][1], "aws_lambda_function").values()
        assert sum(f["reserved_concurrent_executions"] for f in functions) == said, name
