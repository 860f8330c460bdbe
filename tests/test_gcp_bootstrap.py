"""The GCP CI bootstrap stack (stacks/gcp/bootstrap.py) synthesizes; its Workload Identity
provider admits only the repository; each CI service account may be impersonated by exactly
the subjects the AWS roles trust; the plan account writes no state but its lock; the deploy
account may create every resource type the shipped GCP environments declare and grant only the
project roles they grant; and it scans clean."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest

from stacks.aws.bootstrap import issuer
from stacks.scan import scan
from tidefleet.config import environment_path, load_environment, parse_environment

pytestmark = pytest.mark.synth

ROOT = Path(__file__).resolve().parents[1]
PROJECT = "acme-ml-dev"
BUCKET, PREFIX = "acme-tf-state", "tidefleet"
POOL = "${google_iam_workload_identity_pool.pool.name}"
# Every shipped environment on GCP: the deploy environments of the bootstrap below.
GCP_ENVS = tuple(sorted(p.stem for p in (ROOT / "environments").glob("*.toml")
                        if tomllib.loads(p.read_text()).get("cloud") == "gcp"))  # fmt: skip


def gcp_dev_with_every_option():
    """gcp-dev plus what only some environments declare: a Filestore mounted by a cluster-placed
    pool, and a schedule (their resource types need the deploy account's rights too)."""
    data = tomllib.loads(environment_path("gcp-dev").read_text())
    data["shared_fs"] = {"kind": "filestore", "size_gb": 1024}
    gpu = data["pools"]["gpu"]
    gpu["placement"], gpu["data"] = "cluster", {**gpu["data"], "shared_fs_mount": "/mnt/shared"}
    data["schedules"] = {"nightly": {"cron": "0 3 * * *", "queue": "default", "items": ["gs://acme-ml/eval/a"]}}
    return parse_environment(data, name="gcp-dev")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory) -> dict:
    """Each shipped GCP environment's fleet stack, and gcp-dev with every option: name -> JSON."""
    from stacks.app import synth

    envs = {name: load_environment(name) for name in GCP_ENVS} | {"gcp-dev+options": gcp_dev_with_every_option()}
    return {name: json.loads((synth(env, tmp_path_factory.mktemp(f"fleet-{name}")) / "cdk.tf.json").read_text())
            for name, env in envs.items()}  # fmt: skip


def synth_bootstrap(tmp_path_factory, ci: str):
    from stacks.gcp.bootstrap import synth_gcp_bootstrap

    out = synth_gcp_bootstrap(tmp_path_factory.mktemp(f"bootstrap-{ci}"), ci=ci, repo="acme/infra", branch="main",
                              project=PROJECT, state_bucket=BUCKET, state_prefix=PREFIX,
                              environments=tuple(load_environment(n) for n in GCP_ENVS))  # fmt: skip
    return out, json.loads((out / "cdk.tf.json").read_text())


@pytest.fixture(scope="module")
def github(tmp_path_factory):
    return synth_bootstrap(tmp_path_factory, "github")


@pytest.fixture(scope="module")
def gitlab(tmp_path_factory):
    return synth_bootstrap(tmp_path_factory, "gitlab")


def resources(stack: dict, rtype: str) -> dict:
    return stack["resource"].get(rtype, {})


def project_roles(stack: dict, account: str) -> dict[str, dict]:
    """role -> grant, of the project grants to the `account` service account."""
    member = f"${{google_service_account.{account}.member}}"
    return {g["role"]: g for g in resources(stack, "google_project_iam_member").values() if g["member"] == member}


def test_the_shipped_gcp_environments_are_the_ones_this_test_covers():
    assert "gcp-dev" in GCP_ENVS


def test_the_provider_admits_only_the_repository(github, gitlab):
    _, stack = github
    (provider,) = resources(stack, "google_iam_workload_identity_pool_provider").values()
    assert provider["oidc"] == {"issuer_uri": "https://token.actions.githubusercontent.com"}
    assert provider["attribute_mapping"] == {"google.subject": "assertion.sub", "attribute.repository": "assertion.repository"}
    subjects = ["repo:acme/infra:pull_request", *(f"repo:acme/infra:environment:{e}" for e in GCP_ENVS)]
    assert provider["attribute_condition"] == 'assertion.repository == "acme/infra" && (' + " || ".join(
        f'assertion.sub == "{s}"' for s in subjects) + ")"  # fmt: skip
    assert provider["workload_identity_pool_id"] == "${google_iam_workload_identity_pool.pool.workload_identity_pool_id}"
    _, stack = gitlab
    (provider,) = resources(stack, "google_iam_workload_identity_pool_provider").values()
    assert provider["oidc"] == {"issuer_uri": "https://gitlab.com"}
    assert provider["attribute_mapping"] == {"google.subject": "assertion.sub", "attribute.project_path": "assertion.project_path"}
    assert provider["attribute_condition"] == 'assertion.project_path == "acme/infra" && assertion.ref_type == "branch"'


def test_each_account_may_be_impersonated_by_exactly_the_subjects_the_aws_roles_trust(github, gitlab):
    oidc = issuer("github", "acme/infra", "main", GCP_ENVS)
    expected = {"plan": [f"principal://iam.googleapis.com/{POOL}/subject/{s}" for s in oidc.plan_subjects],
                "deploy": [f"principal://iam.googleapis.com/{POOL}/subject/{s}" for s in oidc.deploy_subjects]}  # fmt: skip
    assert expected["plan"] == [f"principal://iam.googleapis.com/{POOL}/subject/repo:acme/infra:pull_request"]
    assert expected["deploy"] == [f"principal://iam.googleapis.com/{POOL}/subject/repo:acme/infra:environment:{e}"
                                  for e in GCP_ENVS]  # fmt: skip
    # GitLab: the deploy branch exactly; plan: any branch of the project, a principalSet (exact subjects only).
    expected_gitlab = {"plan": [f"principalSet://iam.googleapis.com/{POOL}/attribute.project_path/acme/infra"],
                       "deploy": [f"principal://iam.googleapis.com/{POOL}/subject/project_path:acme/infra:ref_type:branch:ref:main"]}  # fmt: skip
    for (_, stack), want in ((github, expected), (gitlab, expected_gitlab)):
        bindings = resources(stack, "google_service_account_iam_binding")
        assert {b["service_account_id"]: (b["role"], b["members"]) for b in bindings.values()} == {
            f"${{google_service_account.{a}.name}}": ("roles/iam.workloadIdentityUser", want[a]) for a in ("plan", "deploy")
        }  # fmt: skip
        assert not resources(stack, "google_service_account_iam_member")  # nothing else may impersonate them
        accounts = resources(stack, "google_service_account")
        assert {a["account_id"] for a in accounts.values()} == {"tidefleet-ci-plan", "tidefleet-ci-deploy"}


def evaluate(expression: str, name: str, list_prefix: str = "") -> bool:
    """An IAM condition of the forms the stack writes (startsWith/endsWith on the resource name
    or the listing prefix, && and ||), evaluated for an object `name` or a bucket listing."""
    py = expression.replace("&&", " and ").replace("||", " or ")
    py = py.replace('api.getAttribute("storage.googleapis.com/objectListPrefix", "")', "prefix")
    py = py.replace("resource.name", "name").replace(".startsWith(", ".startswith(").replace(".endsWith(", ".endswith(")
    assert re.fullmatch(r'[\s()a-z."/_:.*,+\-A-Z0-9]*', py) and "getAttribute" not in py, py
    return bool(eval(py, {"__builtins__": {}}, {"name": name, "prefix": list_prefix}))


def test_the_plan_account_writes_no_state_but_its_lock(github):
    """A pull request's own workflow runs as it: it could replace or delete prod's state around
    prod's reviewers. It creates and deletes the GCS backend's lock object only; deploy writes."""
    _, stack = github
    grants = {(g["member"].split(".")[1], g["role"]): g for g in resources(stack, "google_storage_bucket_iam_member").values()}
    assert {g["bucket"] for g in grants.values()} == {BUCKET}
    assert set(grants) == {("plan", "roles/storage.objectViewer"), ("plan", "roles/storage.objectUser"),
                           ("deploy", "roles/storage.objectUser")}  # fmt: skip
    objects = f"projects/_/buckets/{BUCKET}/objects/"
    lock = grants["plan", "roles/storage.objectUser"]["condition"]["expression"]
    assert lock == f'resource.name.startsWith("{objects}{PREFIX}/") && resource.name.endsWith(".tflock")'
    for name, writable in ((f"{PREFIX}/gcp-dev/default.tflock", True), (f"{PREFIX}/gcp-dev/default.tfstate", False),
                           (f"{PREFIX}/prod/default.tfstate", False), ("other/default.tflock", False)):  # fmt: skip
        assert evaluate(lock, objects + name) is writable, name
        assert evaluate(grants["deploy", "roles/storage.objectUser"]["condition"]["expression"],
                        objects + name) is name.startswith(f"{PREFIX}/")  # fmt: skip
    read = grants["plan", "roles/storage.objectViewer"]["condition"]["expression"]
    assert evaluate(read, objects + f"{PREFIX}/gcp-dev/default.tfstate") and not evaluate(read, objects + "other/x")
    assert evaluate(read, f"projects/_/buckets/{BUCKET}", list_prefix=f"{PREFIX}/gcp-dev/")  # the backend lists workspaces
    # On the project: read only (no role that writes objects or anything else).
    assert set(project_roles(stack, "plan")) == {"roles/viewer", "roles/storage.objectViewer",
                                                 "roles/serviceusage.serviceUsageConsumer"}  # fmt: skip


def granted_at_project_level(fleet: dict) -> set[str]:
    """Every role the fleet stacks grant on the project, custom roles by their full name."""
    out = set()
    for stack in fleet.values():
        (provider,) = stack["provider"]["google"]
        custom = resources(stack, "google_project_iam_custom_role")
        for grant in resources(stack, "google_project_iam_member").values():
            assert grant["project"] == provider["project"] == PROJECT
            if match := re.fullmatch(r"\$\{google_project_iam_custom_role\.([^.]+)\.name\}", grant["role"]):
                role = custom[match[1]]
                out.add(f"projects/{role.get('project', PROJECT)}/roles/{role['role_id']}")
            else:
                assert grant["role"].startswith("roles/"), grant["role"]
                out.add(grant["role"])
    return out


def test_the_deploy_account_may_grant_only_the_project_roles_the_fleet_stacks_grant(github, fleet):
    """Project IAM Admin unconditioned may grant Owner: the condition lists, exactly, what the
    synthesized GCP stacks grant at project level (a stack granting a new role fails here)."""
    _, stack = github
    roles = project_roles(stack, "deploy")
    condition = roles["roles/resourcemanager.projectIamAdmin"]["condition"]
    match = re.fullmatch(r"api\.getAttribute\('iam\.googleapis\.com/modifiedGrantsByRole', \[\]\)\.hasOnly\(\[(.*)\]\)",
                         condition["expression"])  # fmt: skip
    assert match, condition["expression"]
    listed = re.findall(r"'([^']+)'", match[1])
    assert match[1] == ", ".join(f"'{r}'" for r in listed)  # nothing but quoted role names
    expected = granted_at_project_level(fleet)
    assert any(r.startswith(f"projects/{PROJECT}/roles/tidefleet_gcp_dev_") for r in expected)  # custom roles are there
    assert sorted(listed) == sorted(expected)
    assert len(listed) == len(set(listed))
    # No other way to grant: no unconditioned IAM admin, no basic editor/owner role.
    for role, grant in roles.items():
        assert role not in ("roles/owner", "roles/editor", "roles/iam.securityAdmin", "roles/iam.workloadIdentityPoolAdmin")
        assert role != "roles/resourcemanager.projectIamAdmin" or grant.get("condition")


# The deploy account's role that creates each Terraform resource type the GCP stacks declare
# (longest prefix wins). A type missing here fails the test below: add it, and the account's role.
ROLE_OF = {
    "google_artifact_registry_": "roles/artifactregistry.admin",
    "google_cloud_run_": "roles/run.admin",
    "google_cloud_scheduler_": "roles/cloudscheduler.admin",
    "google_cloudfunctions2_": "roles/cloudfunctions.developer",
    "google_compute_": "roles/compute.admin",
    "google_filestore_": "roles/file.editor",
    "google_firestore_": "roles/datastore.owner",
    "google_kms_": "roles/cloudkms.admin",
    "google_logging_": "roles/logging.configWriter",
    "google_monitoring_": "roles/monitoring.editor",
    "google_project_iam_custom_role": "roles/iam.roleAdmin",
    "google_project_iam_member": "roles/resourcemanager.projectIamAdmin",  # conditioned: the test above
    "google_pubsub_": "roles/pubsub.admin",
    "google_service_account": "roles/iam.serviceAccountAdmin",
    "google_storage_": "roles/storage.admin",
}


def test_the_deploy_account_may_create_every_resource_type_the_gcp_environments_declare(github, fleet):
    _, stack = github
    roles = set(project_roles(stack, "deploy"))
    declared = {kind for tf in fleet.values() for kind in tf.get("resource", {})}
    # What this test guards: Filestore ([shared_fs]), Cloud Scheduler, the function and its run service.
    assert {"google_filestore_instance", "google_cloud_scheduler_job", "google_cloudfunctions2_function",
            "google_cloud_run_service_iam_member"} <= declared  # fmt: skip
    for kind in sorted(declared):
        prefix = max((p for p in ROLE_OF if kind.startswith(p)), key=len, default=None)
        assert prefix is not None, f"{kind}: which role creates it? add it to ROLE_OF"
        assert ROLE_OF[prefix] in roles, f"{kind}: the deploy account has no {ROLE_OF[prefix]}"
    # Templates, the function and its trigger run as the stacks' accounts: actAs on them.
    assert "roles/iam.serviceAccountUser" in roles


def test_the_apis_are_enabled_and_never_disabled_on_destroy(github):
    _, stack = github
    services = resources(stack, "google_project_service").values()
    assert {s["service"] for s in services} >= {f"{a}.googleapis.com" for a in (
        "iam", "iamcredentials", "sts", "compute", "pubsub", "firestore", "cloudfunctions", "cloudbuild", "run",
        "eventarc", "cloudscheduler", "cloudkms", "monitoring", "logging", "storage", "file", "artifactregistry")}  # fmt: skip
    assert all(s["disable_on_destroy"] is False and s["project"] == PROJECT for s in services)


def test_the_outputs_are_what_the_pipeline_authenticates_with(github):
    _, stack = github
    assert stack["output"] == {
        "workload_identity_provider": {"value": "${google_iam_workload_identity_pool_provider.provider.name}"},
        "plan_service_account": {"value": "${google_service_account.plan.email}"},
        "deploy_service_account": {"value": "${google_service_account.deploy.email}"},
    }
    assert "local" in stack["terraform"]["backend"]  # applied once by hand; no remote state yet


def test_the_bootstrap_stack_refuses_environments_outside_its_project_or_state(tmp_path):
    from stacks.gcp.bootstrap import synth_gcp_bootstrap

    gcp_dev = load_environment("gcp-dev")
    kwargs = {"ci": "github", "repo": "acme/infra", "branch": "main", "state_bucket": BUCKET, "state_prefix": PREFIX}
    with pytest.raises(ValueError, match="not a GCP environment of project other-project"):
        synth_gcp_bootstrap(tmp_path, project="other-project", environments=(gcp_dev,), **kwargs)
    with pytest.raises(ValueError, match="prod: not a GCP environment"):
        synth_gcp_bootstrap(tmp_path, project=PROJECT, environments=(gcp_dev, load_environment("prod")), **kwargs)
    elsewhere = gcp_dev.model_copy(update={"state": gcp_dev.state.model_copy(update={"backend": "gcs", "bucket": "x"})})
    with pytest.raises(ValueError, match=r"gs://x/tidefleet/gcp-dev, is not under gs://acme-tf-state/tidefleet/"):
        synth_gcp_bootstrap(tmp_path, project=PROJECT, environments=(elsewhere,), **kwargs)
    with pytest.raises(ValueError, match="deploys nothing"):
        synth_gcp_bootstrap(tmp_path, project=PROJECT, environments=(), **kwargs)


def test_the_bootstrap_stack_scans_clean(github, gitlab, capsys):
    for out, _ in (github, gitlab):
        assert scan(out, "ci-bootstrap") == 0, capsys.readouterr().out
        assert "stale suppression" not in capsys.readouterr().out


def test_the_bootstrap_stack_requires_the_terraform_the_readme_names(github):
    _, stack = github
    assert stack["terraform"]["required_version"] == ">= 1.10"
