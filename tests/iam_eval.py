"""A small evaluator of IAM identity policies, over the synthesized policy documents.

moto implements no policy simulation (no SimulateCustomPolicy), so the policy tests use this
instead: it is ours, not AWS's. It decides Allow/Deny for one request (action, resource ARN,
request context) the way IAM's documented evaluation does for what our policies use: action
and resource globs (`*`, `?`), explicit Deny over Allow, and the condition operators
StringEquals, StringLike, ArnEquals, ArnLike, Bool and their ForAllValues: forms (any listed
value matches; a missing key fails a condition, except under ForAllValues:, where it passes,
as in IAM). Anything else raises, so an unmodelled operator can never pass silently.
`tests/test_iam_policies.py` checks the evaluator itself, including that it denies when an
action is missing.

Terraform references in the documents are first replaced by concrete ARNs built from the
referenced resource's own configuration (name, bucket), in a made-up account.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from fnmatch import fnmatchcase

ACCOUNT = "123456789012"
REFERENCE = re.compile(r"\$\{([a-z0-9_]+)\.([A-Za-z0-9_-]+)\.([a-z_]+)\}")
DATA_REFERENCE = re.compile(r"\$\{data\.([a-z0-9_]+)\.([A-Za-z0-9_-]+)\.([a-z_]+)\}")


@dataclass(frozen=True)
class Request:
    action: str
    resource: str
    context: dict[str, str | list[str]] = field(default_factory=dict)


class Resolver:
    """Concrete values for the `${type.name.attribute}` references of one synthesized stack."""

    def __init__(self, stack: dict, region: str):
        self.stack, self.region = stack, region

    def __call__(self, value):
        if isinstance(value, list):
            return [self(v) for v in value]
        if isinstance(value, dict):
            return {k: self(v) for k, v in value.items()}
        if not isinstance(value, str):
            return value
        value = DATA_REFERENCE.sub(lambda m: self._data(m[1], m[3]), value)
        return REFERENCE.sub(lambda m: self._attribute(m[1], m[2], m[3]), value)

    def _data(self, kind: str, attribute: str) -> str:
        known = {("aws_partition", "partition"): "aws", ("aws_caller_identity", "account_id"): ACCOUNT}
        return known[(kind, attribute)]

    def _attribute(self, kind: str, name: str, attribute: str) -> str:
        config = self.stack["resource"][kind][name]
        if attribute in ("name", "bucket", "function_name"):
            return self(config[attribute])
        assert attribute == "arn", f"unresolved reference {kind}.{name}.{attribute}"
        region, named = self.region, lambda key: self(config[key])
        arns = {
            "aws_launch_template": lambda: f"arn:aws:ec2:{region}:{ACCOUNT}:launch-template/lt-{name}",
            "aws_iam_role": lambda: f"arn:aws:iam::{ACCOUNT}:role/{named('name')}",
            "aws_dynamodb_table": lambda: f"arn:aws:dynamodb:{region}:{ACCOUNT}:table/{named('name')}",
            "aws_s3_bucket": lambda: f"arn:aws:s3:::{named('bucket')}",
            "aws_cloudwatch_log_group": lambda: f"arn:aws:logs:{region}:{ACCOUNT}:log-group:{named('name')}",
            "aws_sqs_queue": lambda: f"arn:aws:sqs:{region}:{ACCOUNT}:{named('name')}",
            "aws_kms_key": lambda: f"arn:aws:kms:{region}:{ACCOUNT}:key/{name}",
            "aws_lambda_function": lambda: f"arn:aws:lambda:{region}:{ACCOUNT}:function:{named('function_name')}",
            "aws_sns_topic": lambda: f"arn:aws:sns:{region}:{ACCOUNT}:{named('name')}",
        }
        return arns[kind]()


def _values(context_value) -> list[str]:
    return context_value if isinstance(context_value, list) else [context_value]


def _matches(operator: str, actual: str, expected: str) -> bool:
    if operator in ("StringEquals", "ArnEquals", "Bool"):
        return actual == expected
    if operator in ("StringLike", "ArnLike"):
        return fnmatchcase(actual, expected)
    raise NotImplementedError(f"condition operator {operator!r} is not modelled")


def _condition_holds(condition: dict, context: dict) -> bool:
    operator, key, expected = condition["test"], condition["variable"], condition["values"]
    every = operator.startswith("ForAllValues:")
    operator = operator.removeprefix("ForAllValues:")
    if key not in context:
        return every  # IAM: ForAllValues over no values is true; any other operator fails
    actual = _values(context[key])
    if every:
        return all(any(_matches(operator, a, e) for e in expected) for a in actual)
    return any(_matches(operator, a, e) for a in actual for e in expected)


def _statement_matches(statement: dict, request: Request) -> bool:
    return (
        any(fnmatchcase(request.action.lower(), a.lower()) for a in statement["actions"])
        and any(fnmatchcase(request.resource, r) for r in statement["resources"])
        and all(_condition_holds(c, request.context) for c in statement.get("condition", []))
    )


def allowed(statements: list[dict], request: Request) -> bool:
    """IAM's verdict for one request under one identity policy (no boundaries, no SCPs)."""
    matching = [s.get("effect", "Allow") for s in statements if _statement_matches(s, request)]
    return "Allow" in matching and "Deny" not in matching
