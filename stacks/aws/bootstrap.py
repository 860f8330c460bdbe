"""The CI bootstrap stack: what a pipeline needs before it can deploy, applied once by hand
with an administrator's credentials (`invoke bootstrap --repo OWNER/NAME`, then `terraform
apply` in the folder it prints). No access key is ever stored in CI:

- the CI provider's OIDC identity provider (GitHub Actions or GitLab CI), so a pipeline job
  exchanges its short-lived identity token for short-lived AWS credentials;
- a *plan* role, assumable from the repository's pull requests (GitLab: any branch of the
  project): read-only, plus reading the Terraform state and taking its lock (it may write no
  state: a pull request's own workflow runs with it);
- a *deploy* role, assumable only by jobs of the repository's deploy environments (GitHub
  Environments `dev`/`prod`, where prod's required reviewers are the approval and the
  environments' deployment branches limit them to the deploy branch; GitLab: the protected
  deploy branch): it writes the state and the stacks' resources, all named `tidefleet-*`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from cdktn import App, LocalBackend, TerraformOutput, TerraformStack
from cdktn_provider_aws.iam_openid_connect_provider import IamOpenidConnectProvider
from cdktn_provider_aws.iam_role import IamRole
from cdktn_provider_aws.iam_role_policy import IamRolePolicy
from cdktn_provider_aws.iam_role_policy_attachment import IamRolePolicyAttachment
from cdktn_provider_aws.provider import AwsProvider
from constructs import Construct

from stacks.aws.iam import AwsContext, Statement, policy_document
from stacks.terraform import require_terraform
from tidefleet import naming
from tidefleet.config import State

CI_ROLE_PREFIX = f"{naming.PREFIX}-ci-"
BOOTSTRAP_STACK = f"{naming.PREFIX}-ci-bootstrap"
STATE_DIR = Path(__file__).resolve().parents[2] / "state"  # as the fleet stacks' local state

@dataclass(frozen=True)
class OidcIssuer:
    url: str
    audience: str
    # The token's `sub` for a pull request / any branch (plan) and for a deploy (one per environment).
    plan_subjects: tuple[str, ...]
    deploy_subjects: tuple[str, ...]

    @property
    def host(self) -> str:
        return self.url.removeprefix("https://")


def issuer(ci: str, repo: str, branch: str, environments: tuple[str, ...]) -> OidcIssuer:
    """What the CI provider's identity tokens say about the repository's jobs."""
    if ci == "github":
        return OidcIssuer(
            url="https://token.actions.githubusercontent.com",
            audience="sts.amazonaws.com",
            plan_subjects=(f"repo:{repo}:pull_request",),
            deploy_subjects=tuple(f"repo:{repo}:environment:{e}" for e in environments),
        )
    return OidcIssuer(  # gitlab.com; a self-managed GitLab has its own URL
        url="https://gitlab.com",
        audience="https://gitlab.com",
        plan_subjects=(f"project_path:{repo}:ref_type:branch:ref:*",),
        deploy_subjects=(f"project_path:{repo}:ref_type:branch:ref:{branch}",),
    )


class CiBootstrapStack(TerraformStack):
    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        ci: str,
        repo: str,
        branch: str,
        region: str,
        state_bucket: str,
        lock_table: str | None,
        environments: tuple[str, ...],
        local_state_path: str,
    ) -> None:
        super().__init__(scope, id)
        require_terraform(self)
        LocalBackend(self, path=local_state_path)  # applied once, by hand; keep its state file safe
        AwsProvider(self, "aws", region=region)
        ctx = AwsContext(self, "account", region=region)
        oidc = issuer(ci, repo, branch, environments)
        provider = IamOpenidConnectProvider(self, "oidc", url=oidc.url, client_id_list=[oidc.audience])

        def trust(id: str, subjects: tuple[str, ...]):
            return policy_document(self, id, [{
                "effect": "Allow", "actions": ["sts:AssumeRoleWithWebIdentity"],
                "principals": [{"type": "Federated", "identifiers": [provider.arn]}],
                "condition": [
                    {"test": "StringEquals", "variable": f"{oidc.host}:aud", "values": [oidc.audience]},
                    {"test": "StringLike" if any("*" in s for s in subjects) else "StringEquals",
                     "variable": f"{oidc.host}:sub", "values": list(subjects)},
                ],
            }])  # fmt: skip

        state = state_statements(ctx, state_bucket, lock_table)
        # A pull request's own workflow runs with the plan role: it reads the state and takes the
        # lock, and may write nothing else (prod's state replaced or deleted around its reviewers).
        read_state = state_statements(ctx, state_bucket, lock_table, write=False)
        self.plan_role = IamRole(self, "plan", name=f"{CI_ROLE_PREFIX}plan", max_session_duration=3600,
                                 assume_role_policy=trust("plan-trust", oidc.plan_subjects).json)  # fmt: skip
        # Reading every resource type the stacks declare is what `plan` does: AWS's read-only policy.
        IamRolePolicyAttachment(self, "plan-read-only", role=self.plan_role.name,
                                policy_arn=f"arn:{ctx.partition}:iam::aws:policy/ReadOnlyAccess")  # fmt: skip
        IamRolePolicy(self, "plan-state", name="state", role=self.plan_role.id,
                      policy=policy_document(self, "plan-state-policy", read_state).json)  # fmt: skip
        self.deploy_role = IamRole(self, "deploy", name=f"{CI_ROLE_PREFIX}deploy", max_session_duration=3600,
                                   assume_role_policy=trust("deploy-trust", oidc.deploy_subjects).json)  # fmt: skip
        IamRolePolicy(self, "deploy-resources", name="resources", role=self.deploy_role.id,
                      policy=policy_document(self, "deploy-policy", [*state, *deploy_statements(ctx), deny_own_roles(ctx)]).json)  # fmt: skip
        TerraformOutput(self, "plan_role_arn", value=self.plan_role.arn)
        TerraformOutput(self, "deploy_role_arn", value=self.deploy_role.arn)

    def _allocate_logical_id(self, element) -> str:
        return "_".join(element.node.path.split("/")[1:])  # readable addresses, as the fleet stacks


def state_statements(ctx: AwsContext, bucket: str, lock_table: str | None, *, write: bool = True) -> list[Statement]:
    """Terraform's S3 backend: read (and, `write`, write) the state objects, take the lock (a
    DynamoDB item, or the `.tflock` object beside the state when there is no table)."""
    objects = f"arn:{ctx.partition}:s3:::{bucket}/{naming.PREFIX}/*"
    out = [Statement("StateList", ["s3:ListBucket"], [f"arn:{ctx.partition}:s3:::{bucket}"])]
    if write:
        out.append(Statement("StateObjects", ["s3:GetObject", "s3:PutObject", "s3:DeleteObject"], [objects]))
    else:
        out += [Statement("StateRead", ["s3:GetObject"], [objects]),
                Statement("StateLockFile", ["s3:PutObject", "s3:DeleteObject"], [f"{objects}.tflock"])]  # fmt: skip
    if lock_table:
        out.append(Statement("StateLock", ["dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:DeleteItem"],
                             [ctx.arn("dynamodb", f"table/{lock_table}")]))  # fmt: skip
    return out


def deploy_statements(ctx: AwsContext) -> list[Statement]:
    """What `invoke deploy` changes, limited to `tidefleet-*` names wherever the service has
    resource-level permissions; EC2, Auto Scaling, EFS, FSx and KMS key creation have none for
    creation, so they are held to the stack's region. tests/test_ci_examples.py checks that every
    resource type the shipped environments synthesize is of a service allowed here."""
    p, prefix = ctx.partition, naming.PREFIX
    in_region = [{"test": "StringEquals", "variable": "aws:RequestedRegion", "values": [ctx.region]}]
    return [
        Statement("Queues", ["sqs:*"], [ctx.arn("sqs", f"{prefix}-*")]),
        Statement("Tables", ["dynamodb:*"], [ctx.arn("dynamodb", f"table/{prefix}-*")]),
        Statement("Functions", ["lambda:*"], [ctx.arn("lambda", f"function:{prefix}-*")]),
        Statement("Schedules", ["events:*"], [ctx.arn("events", f"rule/{prefix}-*")]),
        # The minute watch and [schedules] are EventBridge Scheduler schedules, in its default group.
        Statement("Scheduler", ["scheduler:*"], [ctx.arn("scheduler", f"schedule/default/{prefix}-*")]),
        Statement("Alarms", ["cloudwatch:*"], [ctx.arn("cloudwatch", f"alarm:{prefix}-*"),
                                              ctx.arn("cloudwatch", f"dashboard/{prefix}-*", regional=False)]),
        Statement("Topics", ["sns:*"], [ctx.arn("sns", f"{prefix}-*")]),
        Statement("Logs", ["logs:*"], [ctx.arn("logs", f"log-group:/{prefix}/*"),
                                       ctx.arn("logs", f"log-group:/aws/lambda/{prefix}-*")]),
        Statement("Buckets", ["s3:*"], [f"arn:{p}:s3:::{prefix}-*"]),
        Statement("Roles", ROLE_ACTIONS, [ctx.arn("iam", f"role/{prefix}-*", regional=False),
                                       ctx.arn("iam", f"instance-profile/{prefix}-*", regional=False)]),
        # An account's first Auto Scaling group, Spot launch or file system creates the service's own
        # role (AWSServiceRoleFor...): the caller needs this, for these services only.
        Statement("ServiceRoles", ["iam:CreateServiceLinkedRole"], [ctx.arn("iam", "role/aws-service-role/*", regional=False)],
                  [{"test": "StringEquals", "variable": "iam:AWSServiceName", "values": SERVICE_LINKED}]),
        # AWS's public parameters have no account in their ARN (stacks/aws/pool.py).
        Statement("Images", ["ssm:GetParameter", "ssm:GetParameters"], [f"arn:{p}:ssm:{ctx.region}::parameter/aws/service/*"]),
        # [shared_fs]: EFS and FSx name a file system by an id they make, so creation is held to the region too.
        Statement("Fleet", ["ec2:*", "autoscaling:*", "elasticfilesystem:*", "fsx:*"], ["*"], in_region),
        Statement("Keys", ["kms:*"], [ctx.arn("kms", "key/*")],
                  [{"test": "Null", "variable": "aws:ResourceTag/tidefleet:env", "values": ["false"]}]),
        # CreateKey with the provider's default tags also needs TagResource, before the key carries any tag.
        Statement("KeyTags", ["kms:TagResource"], [ctx.arn("kms", "key/*")],
                  [{"test": "Null", "variable": "aws:RequestTag/tidefleet:env", "values": ["false"]}]),
        Statement("KeyAliases", ["kms:CreateAlias", "kms:DeleteAlias", "kms:UpdateAlias"],
                  [ctx.arn("kms", f"alias/{prefix}-*")]),
        Statement("Describe", ["kms:CreateKey", "kms:ListAliases", "sts:GetCallerIdentity", "logs:DescribeLogGroups",
                               "cloudwatch:DescribeAlarms"], ["*"], in_region),
    ]


SERVICE_LINKED = ["autoscaling.amazonaws.com", "spot.amazonaws.com", "elasticfilesystem.amazonaws.com", "fsx.amazonaws.com"]
# What the stacks do to their roles and instance profiles (no iam:*: no users, no account settings).
ROLE_ACTIONS = [f"iam:{a}" for a in (
    "CreateRole", "DeleteRole", "GetRole", "UpdateRole", "TagRole", "UntagRole", "UpdateAssumeRolePolicy", "PassRole",
    "PutRolePolicy", "GetRolePolicy", "DeleteRolePolicy", "ListRolePolicies", "ListAttachedRolePolicies",
    "AttachRolePolicy", "DetachRolePolicy", "ListInstanceProfilesForRole", "CreateInstanceProfile",
    "DeleteInstanceProfile", "GetInstanceProfile", "TagInstanceProfile", "UntagInstanceProfile",
    "AddRoleToInstanceProfile", "RemoveRoleFromInstanceProfile",
)]  # fmt: skip


def deny_own_roles(ctx: AwsContext) -> dict:
    """The deploy role may manage `tidefleet-*` roles, but never the CI roles themselves."""
    return {"effect": "Deny", "actions": ["iam:*"], "resources": [ctx.arn("iam", f"role/{CI_ROLE_PREFIX}*", regional=False)]}


def synth_bootstrap(out: Path, *, ci: str, repo: str, branch: str, state: State, region: str,
                    environments: tuple[str, ...]) -> Path:
    """Write `out/stacks/tidefleet-ci-bootstrap/cdk.tf.json`; return that directory. `state`: the
    S3 backend the pipelines' Terraform uses (an environment's [state])."""
    out = Path(out).resolve()
    stack_dir = out / "stacks" / BOOTSTRAP_STACK
    out.mkdir(parents=True, exist_ok=True)
    app = App(outdir=str(out))
    CiBootstrapStack(app, BOOTSTRAP_STACK, ci=ci, repo=repo, branch=branch, region=state.region or region,
                     state_bucket=state.bucket, lock_table=state.lock_table, environments=environments,
                     local_state_path=os.path.relpath(STATE_DIR / "ci-bootstrap.tfstate", stack_dir))  # fmt: skip
    app.synth()
    return stack_dir
