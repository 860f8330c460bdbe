"""The GCP CI bootstrap stack, the counterpart of stacks/aws/bootstrap.py: what a pipeline needs
before it can deploy to a project, applied once by hand with an administrator's credentials
(`invoke bootstrap --env <a gcp environment with a gcs [state]> --repo OWNER/NAME`, then
`terraform apply` in the folder it prints). No service account key is ever made:

- the APIs the fleet stacks and CI use, enabled on the project (never disabled on destroy);
- a Workload Identity pool, `tidefleet-ci`, with one OIDC provider for the CI (GitHub Actions or
  gitlab.com) whose attribute condition admits the one repository's tokens and no other's;
- a *plan* service account, impersonable by the repository's pull requests (GitLab: any branch
  of the project): read-only on the project, reading the Terraform state and taking its lock
  (the GCS backend's `.tflock` objects) but writing no state, for a pull request's own
  workflow runs with it;
- a *deploy* service account, impersonable only by jobs of the repository's deploy environments
  (GitHub Environments, GitLab: the protected deploy branch), the very subjects the AWS deploy
  role trusts (`stacks.aws.bootstrap.issuer`): it writes the state and the stacks' resources.
  Its Project IAM Admin grant is held by an IAM condition to the roles the fleet stacks grant at
  project level, so it is not owner-equivalent.

What IAM cannot express here, unlike AWS's explicit deny on the CI roles: the deploy account's
project-wide Service Account Admin (the stacks make their accounts) reaches the two CI accounts
too, and its Role Admin may change the `tidefleet_*` custom roles it may grant. It stays a
protected environment's account; README "CI pipeline" says so.
"""

from __future__ import annotations

import os
from pathlib import Path

from cdktn import App, LocalBackend, TerraformOutput, TerraformStack
from cdktn_provider_google.iam_workload_identity_pool import IamWorkloadIdentityPool
from cdktn_provider_google.iam_workload_identity_pool_provider import IamWorkloadIdentityPoolProvider
from cdktn_provider_google.project_iam_member import ProjectIamMember
from cdktn_provider_google.project_service import ProjectService
from cdktn_provider_google.provider import GoogleProvider
from cdktn_provider_google.service_account import ServiceAccount
from cdktn_provider_google.service_account_iam_binding import ServiceAccountIamBinding
from cdktn_provider_google.storage_bucket_iam_member import StorageBucketIamMember
from constructs import Construct

from stacks.aws.bootstrap import BOOTSTRAP_STACK, CI_ROLE_PREFIX, STATE_DIR, issuer
from stacks.gcp.control import BUILD_ROLES
from stacks.terraform import require_terraform
from tidefleet import naming
from tidefleet.config import Environment

POOL_ID = f"{naming.PREFIX}-ci"
# The fleet stacks' APIs (Cloud Functions 2nd gen builds with Cloud Build, stores in Artifact
# Registry, runs on Cloud Run, is triggered through Eventarc; Filestore for [shared_fs]) and
# what Workload Identity Federation and Terraform's google provider call.
SERVICES = (
    "iam", "iamcredentials", "sts", "cloudresourcemanager", "serviceusage", "compute", "pubsub", "firestore",
    "cloudfunctions", "cloudbuild", "artifactregistry", "run", "eventarc", "cloudscheduler", "cloudkms",
    "monitoring", "logging", "storage", "file",
)  # fmt: skip
# google.subject may hold at most 127 bytes (the provider's attribute mapping rule).
MAX_SUBJECT = 127

PLAN_ROLES = (
    "roles/viewer",
    # Refreshing the scaler's source object (google_storage_bucket_object) reads it; Viewer does not.
    "roles/storage.objectViewer",
    "roles/serviceusage.serviceUsageConsumer",
)
# The deploy account's project roles; tests/test_gcp_bootstrap.py maps every resource type the
# shipped GCP environments synthesize to one of these (a new type fails it).
DEPLOY_ROLES = (
    "roles/compute.admin",  # network, subnet, router, NAT, firewalls, instance templates, groups
    "roles/pubsub.admin",  # topics, subscriptions and their IAM
    "roles/datastore.owner",  # the Firestore database
    "roles/cloudfunctions.developer",  # the scaler function
    "roles/run.admin",  # the function's Cloud Run service's invoker grant
    "roles/eventarc.admin",  # the function's Pub/Sub trigger
    "roles/artifactregistry.admin",  # pull grants on the pools' repositories
    "roles/cloudkms.admin",  # key ring, key, its grants to the Google service agents
    "roles/logging.configWriter",  # item-log bucket, sink, log-based metric
    "roles/monitoring.editor",  # alert policies, channels, dashboard, metric descriptors
    "roles/iam.serviceAccountAdmin",  # the scaler's, build's, tick's and nodes' accounts and their IAM
    "roles/iam.roleAdmin",  # the scaler's and the pools' leave custom roles
    "roles/iam.serviceAccountUser",  # actAs: templates, function, trigger run as the stacks' accounts
    "roles/cloudscheduler.admin",  # the minute tick and [schedules]
    "roles/storage.admin",  # the artifacts bucket, its objects and grants (and a same-project state bucket)
    "roles/file.editor",  # [shared_fs]: Filestore
    "roles/serviceusage.serviceUsageConsumer",
)  # fmt: skip
PROJECT_IAM_ADMIN = "roles/resourcemanager.projectIamAdmin"
# The predefined roles the fleet stacks grant at project level (google_project_iam_member):
# node and scaler job-store access, log writing, the scaler's backlog reads and metrics, and the
# function build's roles. The custom roles come from fleet_custom_roles().
FLEET_PROJECT_ROLES = tuple(sorted({
    "roles/datastore.user", "roles/logging.logWriter", "roles/monitoring.viewer", "roles/monitoring.metricWriter",
    *BUILD_ROLES,
}))  # fmt: skip


def fleet_custom_roles(project: str, env: Environment) -> list[str]:
    """The custom roles an environment's stack makes and grants at project level: the scaler's
    (stacks/gcp/control.py) and each pool's leave role (stacks/gcp/pool.py)."""
    ids = [naming.custom_role(env.name, "scaler"), *(naming.custom_role(env.name, f"{p}_leave") for p in env.pools)]
    return [f"projects/{project}/roles/{i}" for i in ids]


def grantable_roles(project: str, environments: tuple[Environment, ...]) -> list[str]:
    """Every role the deploy account may grant or revoke on the project, exactly."""
    custom = {role for env in environments for role in fleet_custom_roles(project, env)}
    return sorted({*FLEET_PROJECT_ROLES, *custom})


def grant_limit(roles: list[str]) -> dict:
    """An IAM condition on Project IAM Admin: only grants and revocations of `roles` (the
    modifiedGrantsByRole API attribute); without it the role may grant Owner."""
    listed = ", ".join(f"'{r}'" for r in roles)
    return {"title": "only the fleet stacks' project roles",
            "description": "Grant and revoke only the roles the tidefleet stacks grant at project level.",
            "expression": f"api.getAttribute('iam.googleapis.com/modifiedGrantsByRole', []).hasOnly([{listed}])"}  # fmt: skip


def state_objects_condition(bucket: str, prefix: str, *, locks_only: bool) -> dict:
    """The state objects under `prefix/` (and listings of that prefix); `locks_only`: only the
    GCS backend's lock objects, `<prefix>/<workspace>.tflock` (no listing: none is needed)."""
    objects = f'resource.name.startsWith("projects/_/buckets/{bucket}/objects/{prefix}/")'
    if locks_only:
        return {"title": "only the state locks", "description": f"Lock objects (*.tflock) under {prefix}/.",
                "expression": f'{objects} && resource.name.endsWith(".tflock")'}  # fmt: skip
    listing = f'api.getAttribute("storage.googleapis.com/objectListPrefix", "").startsWith("{prefix}/")'
    return {"title": "only the state", "description": f"State objects under {prefix}/.",
            "expression": f"{objects} || {listing}"}  # fmt: skip


class GcpCiBootstrapStack(TerraformStack):
    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        ci: str,
        repo: str,
        branch: str,
        project: str,
        state_bucket: str,
        state_prefix: str,
        environments: tuple[Environment, ...],
        local_state_path: str,
    ) -> None:
        super().__init__(scope, id)
        require_terraform(self)
        LocalBackend(self, path=local_state_path)  # applied once, by hand; keep its state file safe
        GoogleProvider(self, "google", project=project)
        oidc = issuer(ci, repo, branch, tuple(e.name for e in environments))
        apis = [ProjectService(self, f"api-{name}", project=project, service=f"{name}.googleapis.com",
                               disable_on_destroy=False, disable_dependent_services=False)
                for name in SERVICES]  # fmt: skip
        pool = IamWorkloadIdentityPool(
            self, "pool", project=project, workload_identity_pool_id=POOL_ID, display_name="tidefleet CI",
            description=f"CI jobs of {repo} ({ci})", depends_on=apis,
        )  # fmt: skip
        if ci == "github":
            claim, attribute = "repository", "repository"
            # The repository, and of its tokens only those of the subjects the accounts trust (its
            # pull requests, its deploy environments): no other workflow of it gets a token here.
            subjects = " || ".join(f'assertion.sub == "{s}"' for s in (*oidc.plan_subjects, *oidc.deploy_subjects))
            condition = f'assertion.repository == "{repo}" && ({subjects})'
        else:  # GitLab: only its branch pipelines, as the AWS roles (their subjects all say ref_type:branch)
            claim, attribute = "project_path", "project_path"
            condition = f'assertion.project_path == "{repo}" && assertion.ref_type == "branch"'
        # The audience is left to its default, the provider's own resource name: what
        # google-github-actions/auth asks for (GitLab: the job's id_tokens `aud`, see README).
        self.provider = IamWorkloadIdentityPoolProvider(
            self, "provider", project=project, workload_identity_pool_id=pool.workload_identity_pool_id,
            workload_identity_pool_provider_id=ci, display_name=f"{ci} {repo}"[:32],
            attribute_mapping={"google.subject": "assertion.sub", f"attribute.{attribute}": f"assertion.{claim}"},
            # Never open to any repository: a token of another repository is refused at the exchange.
            attribute_condition=condition,
            oidc={"issuer_uri": oidc.url},
        )  # fmt: skip

        def principals(subjects: tuple[str, ...]) -> list[str]:
            out = []
            for subject in subjects:
                if "*" in subject:
                    # GitLab's plan subject (any branch of the project) is a wildcard on AWS; a WIF
                    # principal:// subject is exact, so it is the project's set: every token the
                    # provider admits is this project's branch pipeline (its attribute condition).
                    out.append(f"principalSet://iam.googleapis.com/{pool.name}/attribute.{attribute}/{repo}")
                elif len(subject.encode()) > MAX_SUBJECT:
                    raise ValueError(f"{subject!r}: Workload Identity holds at most {MAX_SUBJECT} bytes of subject")
                else:
                    out.append(f"principal://iam.googleapis.com/{pool.name}/subject/{subject}")
            return out

        self.plan = ServiceAccount(self, "plan", project=project, account_id=f"{CI_ROLE_PREFIX}plan",
                                   display_name="tidefleet CI plan",
                                   description=f"Plans of {repo}'s pull requests: reads the project and the state.")  # fmt: skip
        self.deploy = ServiceAccount(self, "deploy", project=project, account_id=f"{CI_ROLE_PREFIX}deploy",
                                     display_name="tidefleet CI deploy",
                                     description=f"Deploys of {repo}'s deploy environments.")  # fmt: skip
        # Authoritative for the role: exactly these principals may impersonate each account.
        for name, account, subjects in (("plan", self.plan, oidc.plan_subjects),
                                        ("deploy", self.deploy, oidc.deploy_subjects)):  # fmt: skip
            ServiceAccountIamBinding(self, f"{name}-federated", service_account_id=account.name,
                                     role="roles/iam.workloadIdentityUser", members=principals(subjects))  # fmt: skip

        for role in PLAN_ROLES:
            ProjectIamMember(self, f"plan-{_short(role)}", project=project, role=role, member=self.plan.member)
        # The state bucket may be another project's: its grants are on the bucket. A pull request's
        # own workflow runs as the plan account: it reads the state and creates and deletes the
        # lock, and writes no state (it could replace or delete prod's around prod's reviewers).
        StorageBucketIamMember(self, "plan-state-read", bucket=state_bucket, role="roles/storage.objectViewer",
                               member=self.plan.member,
                               condition=state_objects_condition(state_bucket, state_prefix, locks_only=False))  # fmt: skip
        StorageBucketIamMember(self, "plan-state-lock", bucket=state_bucket, role="roles/storage.objectUser",
                               member=self.plan.member,
                               condition=state_objects_condition(state_bucket, state_prefix, locks_only=True))  # fmt: skip

        for role in DEPLOY_ROLES:
            ProjectIamMember(self, f"deploy-{_short(role)}", project=project, role=role, member=self.deploy.member)
        ProjectIamMember(self, "deploy-grants", project=project, role=PROJECT_IAM_ADMIN, member=self.deploy.member,
                         condition=grant_limit(grantable_roles(project, environments)))  # fmt: skip
        StorageBucketIamMember(self, "deploy-state", bucket=state_bucket, role="roles/storage.objectUser",
                               member=self.deploy.member,
                               condition=state_objects_condition(state_bucket, state_prefix, locks_only=False))  # fmt: skip

        # For google-github-actions/auth's workload_identity_provider (GitLab: the token audience).
        TerraformOutput(self, "workload_identity_provider", value=self.provider.name)
        TerraformOutput(self, "plan_service_account", value=self.plan.email)
        TerraformOutput(self, "deploy_service_account", value=self.deploy.email)

    def _allocate_logical_id(self, element) -> str:
        return "_".join(element.node.path.split("/")[1:])  # readable addresses, as the fleet stacks


def _short(role: str) -> str:
    """roles/iam.serviceAccountUser -> iam-serviceAccountUser: a readable, unique resource id."""
    return role.removeprefix("roles/").replace(".", "-")


def synth_gcp_bootstrap(out: Path, *, ci: str, repo: str, branch: str, project: str, state_bucket: str,
                        state_prefix: str, environments: tuple[Environment, ...]) -> Path:
    """Write `out/stacks/tidefleet-ci-bootstrap/cdk.tf.json`; return that directory.
    `state_bucket`/`state_prefix`: the GCS backend the pipelines' Terraform uses (each deploy
    environment's state lives under `<state_prefix>/`). `environments`: the deploy environments,
    whose names are the CI's deploy environments (as on AWS) and whose stacks' project-level
    grants the deploy account may make; each must deploy to `project`."""
    if ci not in ("github", "gitlab"):
        raise ValueError(f"ci: github or gitlab (got {ci!r})")
    if not environments:
        raise ValueError("environments: a deploy account that no environment may use deploys nothing")
    state_prefix = state_prefix.strip("/")
    for env in environments:
        if env.cloud != "gcp" or env.project != project:
            raise ValueError(f"{env.name}: not a GCP environment of project {project} (cloud {env.cloud}, "
                             f"project {env.project}); the deploy account may deploy only there")  # fmt: skip
        prefix = env.state.key or f"{naming.PREFIX}/{env.name}"  # as GcpFleetStack's GcsBackend
        if env.state.backend == "gcs" and (env.state.bucket != state_bucket or not prefix.startswith(f"{state_prefix}/")):
            raise ValueError(f"{env.name}: its state, gs://{env.state.bucket}/{prefix}, is not under "
                             f"gs://{state_bucket}/{state_prefix}/, which the CI accounts may use")  # fmt: skip
    out = Path(out).resolve()
    stack_dir = out / "stacks" / BOOTSTRAP_STACK
    out.mkdir(parents=True, exist_ok=True)
    app = App(outdir=str(out))
    GcpCiBootstrapStack(app, BOOTSTRAP_STACK, ci=ci, repo=repo, branch=branch, project=project,
                        state_bucket=state_bucket, state_prefix=state_prefix, environments=tuple(environments),
                        local_state_path=os.path.relpath(STATE_DIR / f"ci-bootstrap-{project}.tfstate", stack_dir))  # fmt: skip
    app.synth()
    return stack_dir
