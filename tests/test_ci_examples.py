"""The CI pipelines in examples/ci/ parse, and every `invoke` task and `tidefleet` command they
run exists with the options they pass; the bootstrap stack that gives them their roles
synthesizes, trusts only the repository's pull requests (plan) and deploy environments
(deploy), and scans clean."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import click
import pytest
import yaml
from iam_eval import ACCOUNT, Request, Resolver, allowed
from invoke import Collection

import tasks
from stacks.aws.bootstrap import issuer, synth_bootstrap
from stacks.scan import scan
from tidefleet.cli import main
from tidefleet.config import load_environment

ROOT = Path(__file__).resolve().parents[1]
PIPELINES = sorted((ROOT / "examples" / "ci").rglob("*.yml"))


def shell_lines(node) -> list[str]:
    """Every string of a workflow file that a shell runs (GitHub `run:`, GitLab `script:` and friends)."""
    if isinstance(node, dict):
        out = []
        for key, value in node.items():
            if key in ("run", "script", "before_script", "after_script"):
                values = value if isinstance(value, list) else [value]
                out += [line for v in values if isinstance(v, str) for line in v.splitlines()]
            else:
                out += shell_lines(value)
        return out
    return [line for item in node for line in shell_lines(item)] if isinstance(node, list) else []


def commands(tool: str) -> list[tuple[str, list[str]]]:
    """(file, words) of each `.venv/bin/<tool> ...` call in the pipelines, up to a pipe or `;`/`&&`."""
    found = []
    for path in PIPELINES:
        for line in shell_lines(yaml.safe_load(path.read_text())):
            for match in re.finditer(rf"\.venv/bin/{tool} ([^|;&]+)", line):
                found.append((path.name, shlex.split(match[1])))
    return found


def flags(words: list[str]) -> set[str]:
    return {w.split("=")[0] for w in words if w.startswith("--")}


def test_the_pipelines_are_yaml_with_the_jobs_the_readme_describes():
    assert {p.name for p in PIPELINES} == {"tidefleet.yml", ".gitlab-ci.yml"}
    github = yaml.safe_load((ROOT / "examples/ci/github/workflows/tidefleet.yml").read_text())
    assert set(github["jobs"]) == {"check", "plan", "deploy-dev", "deploy-prod"}
    assert github["jobs"]["deploy-prod"]["needs"] == "deploy-dev" and github["jobs"]["deploy-prod"]["environment"] == "prod"
    assert github["jobs"]["plan"]["permissions"]["id-token"] == "write"  # OIDC, no stored keys
    gitlab = yaml.safe_load((ROOT / "examples/ci/gitlab/.gitlab-ci.yml").read_text())
    assert gitlab["deploy-prod"]["rules"][0]["when"] == "manual"
    for text in (p.read_text() for p in PIPELINES):
        assert "AWS_SECRET_ACCESS_KEY" not in text and "aws-secret-access-key" not in text


def test_every_invoke_task_a_pipeline_runs_exists_with_those_options():
    collection = Collection.from_module(tasks)
    calls = commands("invoke")
    assert {words[0] for _, words in calls} >= {"scan", "plan", "deploy", "test", "lint"}
    for file, (name, *args) in calls:
        assert name in collection.task_names, f"{file}: invoke {name}: no such task"
        known = {f"--{n}" for a in collection[name].get_arguments() for n in a.names if len(n) > 1}
        assert flags(args) <= known, f"{file}: invoke {name}: unknown option(s) {flags(args) - known}"


def test_every_tidefleet_command_a_pipeline_runs_exists_with_those_options():
    calls = commands("tidefleet")
    assert calls
    for file, (name, *args) in calls:
        command = main.get_command(click.Context(main), name)
        assert command is not None, f"{file}: tidefleet {name}: no such command"
        known = {opt for p in command.params if isinstance(p, click.Option) for opt in p.opts}
        assert flags(args) <= known, f"{file}: tidefleet {name}: unknown option(s) {flags(args) - known}"


@pytest.mark.parametrize(
    ("ci", "plan", "deploy"),
    [
        ("github", ["repo:acme/infra:pull_request"], ["repo:acme/infra:environment:dev", "repo:acme/infra:environment:prod"]),
        ("gitlab", ["project_path:acme/infra:ref_type:branch:ref:*"], ["project_path:acme/infra:ref_type:branch:ref:main"]),
    ],
)
def test_the_roles_trust_only_the_repository_and_its_deploy_environments(ci, plan, deploy):
    oidc = issuer(ci, "acme/infra", "main", ("dev", "prod"))
    assert list(oidc.plan_subjects) == plan and list(oidc.deploy_subjects) == deploy


@pytest.fixture(scope="module")
def bootstrap(tmp_path_factory):
    out = synth_bootstrap(tmp_path_factory.mktemp("bootstrap"), ci="github", repo="acme/infra", branch="main",
                          state=load_environment("prod").state, region="us-east-1", environments=("dev", "prod"))  # fmt: skip
    return out, json.loads((out / "cdk.tf.json").read_text())


def test_the_bootstrap_stack_binds_each_role_to_the_repository_through_oidc(bootstrap):
    _, stack = bootstrap
    docs = stack["data"]["aws_iam_policy_document"]
    for role, subjects in (("plan-trust", ["repo:acme/infra:pull_request"]),
                           ("deploy-trust", ["repo:acme/infra:environment:dev", "repo:acme/infra:environment:prod"])):  # fmt: skip
        (statement,) = docs[role]["statement"]
        assert statement["actions"] == ["sts:AssumeRoleWithWebIdentity"]
        conditions = {c["variable"]: (c["test"], c["values"]) for c in statement["condition"]}
        assert conditions == {
            "token.actions.githubusercontent.com:aud": ("StringEquals", ["sts.amazonaws.com"]),
            "token.actions.githubusercontent.com:sub": ("StringEquals", subjects),
        }
    deploy = docs["deploy-policy"]["statement"]
    assert all(s["resources"] != ["*"] or "condition" in s for s in deploy if s["effect"] == "Allow")
    assert not any("iam:*" in s["actions"] for s in deploy if s["effect"] == "Allow")
    (deny,) = [s for s in deploy if s["effect"] == "Deny"]  # the deploy role cannot widen its own rights
    assert deny["resources"][0].endswith(":role/tidefleet-ci-*")
    assert stack["resource"]["aws_iam_openid_connect_provider"]["oidc"]["url"] == "https://token.actions.githubusercontent.com"


def test_the_plan_role_reads_the_state_and_takes_the_lock_but_writes_no_state(bootstrap):
    """A pull request's own workflow runs with it: it could replace or delete prod's state around
    prod's reviewers. The deploy role writes it."""
    _, stack = bootstrap
    docs = stack["data"]["aws_iam_policy_document"]
    resolve = Resolver(stack, "us-east-1")
    plan, deploy = resolve(docs["plan-state-policy"]["statement"]), resolve(docs["deploy-policy"]["statement"])
    state = "arn:aws:s3:::acme-terraform-state/tidefleet/prod.tfstate"
    for request, by_plan in (
        (Request("s3:GetObject", state), True),
        (Request("s3:PutObject", state), False),
        (Request("s3:DeleteObject", state), False),
        (Request("s3:PutObject", f"{state}.tflock"), True),  # S3's own lock file
        (Request("s3:DeleteObject", f"{state}.tflock"), True),
        (Request("dynamodb:PutItem", f"arn:aws:dynamodb:us-east-1:{ACCOUNT}:table/acme-terraform-locks"), True),
    ):
        assert allowed(plan, request) is by_plan, request
        assert allowed(deploy, request), request


def test_the_bootstrap_stack_scans_clean(bootstrap):
    out, _ = bootstrap
    assert scan(out, "ci-bootstrap") == 0


def test_the_bootstrap_stack_requires_the_terraform_the_readme_names(bootstrap):
    _, stack = bootstrap
    assert stack["terraform"]["required_version"] == ">= 1.10"


# The IAM service whose actions create each Terraform resource type the AWS stacks declare
# (longest prefix wins). A type missing here fails the test below: add it, and the deploy role's right.
SERVICE_OF = {
    "aws_autoscaling_": "autoscaling", "aws_cloudwatch_dashboard": "cloudwatch", "aws_cloudwatch_metric_alarm": "cloudwatch",
    "aws_cloudwatch_event_": "events", "aws_cloudwatch_log_": "logs", "aws_dynamodb_": "dynamodb",
    "aws_efs_": "elasticfilesystem", "aws_fsx_": "fsx", "aws_iam_": "iam", "aws_kms_": "kms", "aws_lambda_": "lambda",
    "aws_s3_": "s3", "aws_scheduler_": "scheduler", "aws_sns_": "sns", "aws_sqs_": "sqs",
    **{t: "ec2" for t in ("aws_vpc", "aws_subnet", "aws_eip", "aws_internet_gateway", "aws_nat_gateway", "aws_route",
                          "aws_security_group", "aws_default_security_group", "aws_launch_template",
                          "aws_placement_group", "aws_flow_log")},
}  # fmt: skip


def test_the_deploy_role_may_create_every_resource_type_the_shipped_environments_declare(bootstrap, synthesized):
    """The CI deploy role lacked EventBridge Scheduler (every AWS stack's minute watch) and FSx/EFS
    ([shared_fs]): a deploy from the pipeline would have stopped at AccessDenied."""
    _, stack = bootstrap
    allowed = {action.split(":")[0] for s in stack["data"]["aws_iam_policy_document"]["deploy-policy"]["statement"]
               if s["effect"] == "Allow" for action in s["actions"]}  # fmt: skip
    declared = {kind for _, tf in synthesized.values() for kind in tf.get("resource", {})}
    assert "aws_scheduler_schedule" in declared and "aws_fsx_lustre_file_system" in declared  # what this test guards
    for kind in sorted(declared):
        prefix = max((p for p in SERVICE_OF if kind.startswith(p)), key=len, default=None)
        assert prefix is not None, f"{kind}: which IAM service creates it? add it to SERVICE_OF"
        assert SERVICE_OF[prefix] in allowed, f"{kind}: the deploy role has no {SERVICE_OF[prefix]}:* right"
    assert {"elasticfilesystem", "fsx", "scheduler"} <= allowed
    # An account's first group, Spot launch or file system makes the service's own role: only those may be made.
    (linked,) = [s for s in stack["data"]["aws_iam_policy_document"]["deploy-policy"]["statement"]
                 if s["actions"] == ["iam:CreateServiceLinkedRole"]]  # fmt: skip
    (condition,) = linked["condition"]
    assert condition["variable"] == "iam:AWSServiceName" and "autoscaling.amazonaws.com" in condition["values"]
    assert linked["resources"][0].endswith(":role/aws-service-role/*")
    statements = {s.get("sid"): s for s in stack["data"]["aws_iam_policy_document"]["deploy-policy"]["statement"]}
    # AWS's public parameters (the default images) have no account in their ARN.
    assert re.fullmatch(r"arn:\$\{[^}]+\}:ssm:us-east-1::parameter/aws/service/\*", statements["Images"]["resources"][0])
    # CreateKey with the provider's default tags is also a TagResource, before the key has a tag.
    assert statements["KeyTags"]["actions"] == ["kms:TagResource"]
    assert statements["KeyTags"]["condition"][0]["variable"] == "aws:RequestTag/tidefleet:env"
