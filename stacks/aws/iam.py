"""Account context and least-privilege IAM helpers shared by every AWS construct.

Policies are `aws_iam_policy_document` data sources, not JSON strings, so both checkov and
the synth tests read every statement structurally.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cdktn_provider_aws.data_aws_caller_identity import DataAwsCallerIdentity
from cdktn_provider_aws.data_aws_iam_policy_document import (
    DataAwsIamPolicyDocument,
    DataAwsIamPolicyDocumentStatement,
    DataAwsIamPolicyDocumentStatementCondition,
    DataAwsIamPolicyDocumentStatementPrincipals,
)
from cdktn_provider_aws.data_aws_partition import DataAwsPartition
from cdktn_provider_aws.iam_role import IamRole
from cdktn_provider_aws.iam_role_policy import IamRolePolicy
from constructs import Construct


@dataclass(frozen=True)
class Statement:
    """One Allow statement. `resources=("*",)` only for actions without resource-level
    permissions (Describe*, X-Ray writes); the synth tests hold every such use to a list."""

    sid: str
    actions: Sequence[str]
    resources: Sequence[str]
    conditions: Sequence[dict] = ()

    def render(self) -> dict:
        out = {"sid": self.sid, "effect": "Allow", "actions": list(self.actions), "resources": list(self.resources)}
        return out | ({"condition": list(self.conditions)} if self.conditions else {})


class AwsContext(Construct):
    """Partition, account and region of the deployment, for ARNs of this environment."""

    def __init__(self, scope: Construct, id: str, *, region: str) -> None:
        super().__init__(scope, id)
        self.region = region
        self.account_id = DataAwsCallerIdentity(self, "caller").account_id
        self.partition = DataAwsPartition(self, "partition").partition

    def arn(self, service: str, resource: str, *, regional: bool = True) -> str:
        region = self.region if regional else ""
        return f"arn:{self.partition}:{service}:{region}:{self.account_id}:{resource}"


def policy_document(scope: Construct, id: str, statements: Sequence[Statement | dict]) -> DataAwsIamPolicyDocument:
    """A policy document from `Statement`s or raw statement dicts (trust, deny, key policies)."""
    return DataAwsIamPolicyDocument(scope, id, statement=[_statement(s.render() if isinstance(s, Statement) else s) for s in statements])


def _statement(raw: dict) -> DataAwsIamPolicyDocumentStatement:
    # jsii turns a dict into a struct only at the top level of an argument, not inside lists.
    nested = {
        "principals": [DataAwsIamPolicyDocumentStatementPrincipals(**p) for p in raw.get("principals", [])],
        "condition": [DataAwsIamPolicyDocumentStatementCondition(**c) for c in raw.get("condition", [])],
    }
    return DataAwsIamPolicyDocumentStatement(**{**raw, **{k: v for k, v in nested.items() if v}})


class ServiceRole(Construct):
    """An IAM role a service principal assumes, with one inline least-privilege policy."""

    def __init__(
        self, scope: Construct, id: str, *, name: str, service: str, statements: Sequence[Statement]
    ) -> None:
        super().__init__(scope, id)
        trust = policy_document(
            self,
            "trust",
            [{"effect": "Allow", "actions": ["sts:AssumeRole"], "principals": [{"type": "Service", "identifiers": [service]}]}],
        )
        self.role = IamRole(self, "role", name=name, assume_role_policy=trust.json)
        self.policy = policy_document(self, "policy", statements)
        IamRolePolicy(self, "inline", name=name, role=self.role.id, policy=self.policy.json)
        self.arn = self.role.arn
        self.name = self.role.name
