"""Cloud resource names derived from an environment: one place, used by the stacks, the
adapters, the agent, the CLI and the sandbox, so they always agree."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tidefleet.config import Environment

PREFIX = "tidefleet"


def queue(env: str, queue_name: str) -> str:
    return f"{PREFIX}-{env}-{queue_name}"


def dead_letter_queue(env: str, queue_name: str) -> str:
    return f"{PREFIX}-{env}-{queue_name}-dlq"


def table(env: str) -> str:
    return f"{PREFIX}-{env}"


def artifacts_bucket(env: str, account_id: str) -> str:
    # Bucket names are global: the account id keeps two accounts' "dev" apart.
    return f"{PREFIX}-{env}-artifacts-{account_id}"


def item_log_group(env: str) -> str:
    return f"/{PREFIX}/{env}/items"


def checkpoint_prefix(queue_name: str) -> str:
    """Key prefix, in the artifacts bucket, of the checkpoints of the items of one queue. A
    node's role may write only under its own queues' prefixes; the item's checkpoint URI is
    `<bucket>/<prefix><job>/<item>/`. By queue, not pool: an item never changes queue, while
    a queue can be moved to another pool between two attempts."""
    return f"checkpoints/{queue_name}/"


def item_log_stream_prefix(queue_name: str) -> str:
    """Prefix of the item log streams (`<prefix><job>/<item>/<attempt>`) of one queue's items:
    a node's role may write only to its own queues' streams."""
    return f"{queue_name}/"


def stack_zones(region: str) -> list[str]:
    """The zone names a stack-made network may use, in name order (its subnets take the first
    `network.az_count` of those that exist): a closed set, not "every available zone", so that a
    zone AWS adds, or one impaired for a while, never shifts the subnets Terraform manages; no
    Local Zone's."""
    return [f"{region}{letter}" for letter in "abcdef"]


def group(env: str, pool: str) -> str:
    return f"{PREFIX}-{env}-{pool}"


def launch_template(env: str, pool: str) -> str:
    return f"{PREFIX}-{env}-{pool}"


def lifecycle_hook(env: str, pool: str) -> str:
    return f"{PREFIX}-{env}-{pool}-drain"


def function(env: str, role: str) -> str:
    """role: 'scaler' or 'interruption'."""
    return f"{PREFIX}-{env}-{role}"


def node_role(env: str, pool: str) -> str:
    return f"{PREFIX}-{env}-{pool}-node"


def function_failures(env: str) -> str:
    """SQS queue receiving the events the functions failed on (async on-failure destination)."""
    return f"{PREFIX}-{env}-function-failures"


def stack_resource(env: str, what: str) -> str:
    """Names only the stack itself uses (VPC, security group, alarms, rules, key alias, roles)."""
    return f"{PREFIX}-{env}-{what}"


def schedule(env: str, schedule_name: str, part: int = 1) -> str:
    """A `[schedules.NAME]`'s EventBridge Scheduler schedule (AWS) or Cloud Scheduler job (GCP).
    `part` > 1: GCP's further jobs for a rate one cron cannot write ('_' is in no schedule name)."""
    return stack_resource(env, f"schedule-{schedule_name}") + (f"_{part}" if part > 1 else "")


def watch_schedule(env: str) -> str:
    """The one-minute watch's schedule: outside schedule()'s names, since a schedule may be named 'watch'."""
    return stack_resource(env, "watch")


# -- GCP only -------------------------------------------------------------------------------
# Pub/Sub topics and subscriptions use queue() / dead_letter_queue() (separate namespaces);
# the Firestore database uses table(); the spot managed instance group uses group().
def on_demand_group(env: str, pool: str) -> str:
    """GCP: a template is either Spot or standard, so on-demand capacity is a second group."""
    return f"{PREFIX}-{env}-{pool}-od"


def instance_template_prefix(env: str, pool: str, kind: str) -> str:
    """GCP: an instance template's name prefix (Terraform adds a unique suffix; it accepts at most 37)."""
    return f"{launch_template(env, pool)}-{kind}-"[:37]


def service_account(env: str, role: str) -> str:
    """GCP service account id (6-30 chars): the readable name, or a short hash when too long."""
    name = f"{PREFIX}-{env}-{role}"
    return name if len(name) <= 30 else f"{PREFIX}-{hashlib.sha256(name.encode()).hexdigest()[:16]}"


def custom_role(env: str, what: str) -> str:
    """GCP: an IAM custom role's id (letters, digits, '_' and '.'): the scaler's, a pool's node leave."""
    return f"{PREFIX}_{env}_{what}".replace("-", "_")


def item_log(env: str) -> str:
    """GCP: the Cloud Logging log id that carries every item's output (labels job/item/attempt)."""
    return f"{PREFIX}-{env}-items"


def kick_topic(env: str) -> str:
    """GCP: the scaler function's trigger topic (Cloud Scheduler's tick and the SDK's kick)."""
    return stack_resource(env, "kick")


def flow_log_group(env: str) -> str:
    """AWS: the created VPC's flow logs."""
    return f"/{PREFIX}/{env}/vpc-flow-logs"


def function_log_group(env: str, role: str) -> str:
    """AWS: a Lambda function's own log group (the name Lambda writes to)."""
    return f"/aws/lambda/{function(env, role)}"


# -- Limits ---------------------------------------------------------------------------------
# Every name above, with its cloud's documented length limit and character rule, so that
# `tidefleet validate` refuses an environment whose names a cloud would reject at apply time.
# A name the stacks create that is missing here fails tests/test_naming_limits.py (which
# synthesizes the stacks and looks for every resource name in `derived_names`).
# AWS account ids are always 12 digits; the artifacts bucket carries one.
LONGEST_ACCOUNT_ID = "123456789012"
_RFC1035 = r"[a-z]([-a-z0-9]*[a-z0-9])?"
_RFC1035_RULE = "lowercase a-z, 0-9 and '-', starting with a letter and not ending with '-'"


@dataclass(frozen=True)
class NameRule:
    """One kind of derived name: what it names, where, how long and of which characters it may be."""

    resource: str
    cloud: str  # "aws" or "gcp"
    scope: str  # "env" (one name), "pool", "queue" or "schedule" (one per pool / queue / schedule)
    derive: Callable[..., str]  # (env) or (env, pool_or_queue_name) -> name; env: config.Environment
    max_len: int
    charset: str  # full-match regex
    charset_rule: str
    min_len: int = 1

    def problem(self, name: str) -> str | None:
        """Why the cloud would refuse `name`, or None."""
        if not self.min_len <= len(name) <= self.max_len:
            return f"is {len(name)} characters; {self.cloud.upper()} allows {self.min_len}-{self.max_len}"
        if not re.fullmatch(self.charset, name):
            return f"is not {self.charset_rule}"
        return None


_SQS = (80, r"[A-Za-z0-9_-]+", "a-z, A-Z, 0-9, '_' and '-'")
_IAM_ROLE = (64, r"[\w+=,.@-]+", "alphanumerics and '+=,.@_-'")
_IAM_PROFILE = (128, r"[\w+=,.@-]+", "alphanumerics and '+=,.@_-'")
_LOG_GROUP = (512, r"[.\-_/#A-Za-z0-9]+", "a-z, A-Z, 0-9 and '._-/#'")
_EVENT_RULE = (64, r"[.\-_A-Za-z0-9]+", "a-z, A-Z, 0-9 and '._-'")
_GCE = (63, _RFC1035, _RFC1035_RULE)
_ALARM = (255, r"[^\x00-\x1f]+", "free of control characters")
# The functions and the alarms the AWS stack names (stacks/aws/functions.py, schedules.py, alarms.py).
FUNCTION_ROLES = ("scaler", "interruption", "schedule")
ENV_ALARMS = ("scaler-errors", "scaler-throttles", "scaler-duration", "interruption-errors", "cost-over-cap")
POOL_ALARMS = ("stuck-booting", "silent-nodes", "launches-held", "spot-launch-failures", "on-demand-fallback",
               "cost-over-cap")
QUEUE_ALARMS = ("backlog", "dead-letters", "failure-rate", "oldest-item")
_PUBSUB = (255, r"(?!goog)[A-Za-z][A-Za-z0-9\-_.~+%]*", "a letter then a-z, A-Z, 0-9 and '-_.~+%', not starting 'goog'")
_CLOUD_SCHEDULER = (500, r"[A-Za-z0-9_-]+", "a-z, A-Z, 0-9, '_' and '-'")
_GCS_LOGGING = (100, r"[A-Za-z0-9_.-]+", "a-z, A-Z, 0-9 and '_-.'")
_S3_BUCKET = r"(?!.*\.\.)[a-z0-9][a-z0-9.-]*[a-z0-9]"
_GCS_BUCKET = r"(?!goog)(?!.*(google|g00gle))[a-z0-9][a-z0-9_.-]*[a-z0-9]"


def _per_role(fn: Callable[[str, str], str], role: str) -> Callable:
    return lambda env: fn(env.name, role)


NAME_RULES: tuple[NameRule, ...] = (
    # AWS, one per environment
    NameRule("DynamoDB table", "aws", "env", lambda env: table(env.name), 255, r"[A-Za-z0-9_.-]+", "a-z, A-Z, 0-9 and '_.-'", 3),
    NameRule("S3 artifacts bucket (with a 12-digit account id)", "aws", "env",
          lambda env: artifacts_bucket(env.name, LONGEST_ACCOUNT_ID), 63, _S3_BUCKET,
          "lowercase a-z, 0-9, '.' and '-', without '..'", 3),
    NameRule("CloudWatch log group", "aws", "env", lambda env: item_log_group(env.name), *_LOG_GROUP),
    NameRule("CloudWatch log group", "aws", "env", lambda env: flow_log_group(env.name), *_LOG_GROUP),
    *(NameRule("CloudWatch log group", "aws", "env", _per_role(function_log_group, role), *_LOG_GROUP)
      for role in FUNCTION_ROLES),
    *(NameRule("Lambda function", "aws", "env", _per_role(function, role), 64, r"[A-Za-z0-9_-]+", "a-z, A-Z, 0-9, '_' and '-'")
      for role in FUNCTION_ROLES),
    *(NameRule("IAM role", "aws", "env", _per_role(function, role), *_IAM_ROLE) for role in FUNCTION_ROLES),
    NameRule("IAM role", "aws", "env", lambda env: f"{function(env.name, 'schedule')}-invoke", *_IAM_ROLE),
    NameRule("EventBridge Scheduler schedule", "aws", "env", lambda env: watch_schedule(env.name), *_EVENT_RULE),
    NameRule("SNS topic", "aws", "env", _per_role(stack_resource, "alerts"), 256, r"[A-Za-z0-9_-]+",
             "a-z, A-Z, 0-9, '_' and '-'"),
    *(NameRule("CloudWatch alarm", "aws", "env", _per_role(stack_resource, key), *_ALARM) for key in ENV_ALARMS),
    NameRule("IAM role", "aws", "env", _per_role(stack_resource, "flow-logs"), *_IAM_ROLE),
    NameRule("SQS queue", "aws", "env", lambda env: function_failures(env.name), *_SQS),
    *(NameRule("EventBridge rule", "aws", "env", _per_role(stack_resource, kind), *_EVENT_RULE)
      for kind in ("scaler-tick", "spot-warning", "rebalance", "terminate-hook")),
    NameRule("KMS alias", "aws", "env", lambda env: f"alias/{stack_resource(env.name, 'key')}", 256,
          r"alias/[A-Za-z0-9/_-]+", "'alias/' then a-z, A-Z, 0-9 and '/_-'"),
    NameRule("security group", "aws", "env", _per_role(stack_resource, "nodes"), 255, r"[\w .:/()#,@\[\]+=&;{}!$*-]+",
          "a-z, A-Z, 0-9, spaces and ._-:/()#,@[]+=&;{}!$*"),
    NameRule("CloudWatch dashboard", "aws", "env", _per_role(stack_resource, "fleet"), 255, r"[A-Za-z0-9_-]+",
          "a-z, A-Z, 0-9, '_' and '-'"),
    # AWS, one per pool
    NameRule("Auto Scaling group", "aws", "pool", lambda env, pool: group(env.name, pool), 255, r"[^:\x00-\x1f]+", "free of ':' and control characters"),
    NameRule("launch template", "aws", "pool", lambda env, pool: launch_template(env.name, pool), 128, r"[A-Za-z0-9().\-/_]+",
          "a-z, A-Z, 0-9 and '().-/_'", 3),
    NameRule("lifecycle hook", "aws", "pool", lambda env, pool: lifecycle_hook(env.name, pool), 255, r"[A-Za-z0-9\-_/]+",
          "a-z, A-Z, 0-9 and '-_/'"),
    NameRule("IAM role", "aws", "pool", lambda env, pool: node_role(env.name, pool), *_IAM_ROLE),
    *(NameRule("CloudWatch alarm", "aws", "pool", lambda env, pool, key=key: stack_resource(env.name, f"{pool}-{key}"), *_ALARM)
      for key in POOL_ALARMS),
    NameRule("IAM instance profile", "aws", "pool", lambda env, pool: node_role(env.name, pool), *_IAM_PROFILE),
    # AWS, one per queue
    NameRule("SQS queue", "aws", "queue", lambda env, q: queue(env.name, q), *_SQS),
    NameRule("SQS queue", "aws", "queue", lambda env, q: dead_letter_queue(env.name, q), *_SQS),
    *(NameRule("CloudWatch alarm", "aws", "queue", lambda env, q, key=key: stack_resource(env.name, f"{q}-{key}"), *_ALARM)
      for key in QUEUE_ALARMS),
    NameRule("EventBridge Scheduler schedule", "aws", "schedule", lambda env, name: schedule(env.name, name), *_EVENT_RULE),
    # GCP, one per environment
    *(NameRule("KMS " + what, "gcp", "env", _per_role(stack_resource, part), 63, r"[A-Za-z0-9_-]+", "a-z, A-Z, 0-9, '_' and '-'")
      for what, part in (("key ring", "keys"), ("key", "data"))),
    NameRule("Firestore database", "gcp", "env", lambda env: table(env.name), 63, r"[a-z][a-z0-9-]*[a-z0-9]",
          _RFC1035_RULE, 4),
    NameRule("Cloud Storage bucket", "gcp", "env", lambda env: artifacts_bucket(env.name, env.project or ""), 63, _GCS_BUCKET,
          "lowercase a-z, 0-9, '_.-', without 'google'", 3),
    NameRule("Cloud Logging bucket and sink", "gcp", "env", lambda env: item_log(env.name), *_GCS_LOGGING),
    NameRule("log-based metric", "gcp", "env", _per_role(stack_resource, "item-outcomes"), *_GCS_LOGGING),
    NameRule("log-based metric", "gcp", "env", _per_role(stack_resource, "scaler-errors"), *_GCS_LOGGING),
    *(NameRule(what, "gcp", "env", _per_role(stack_resource, part), *_GCE)
      for what, part in (("VPC network, subnet, router and NAT", "nodes"), ("firewall rule", "nodes-deny-ingress"))),
    NameRule("Pub/Sub topic", "gcp", "env", lambda env: kick_topic(env.name), *_PUBSUB, 3),
    *(NameRule("service account", "gcp", "env", _per_role(service_account, role), 30, _RFC1035, _RFC1035_RULE, 6)
      for role in ("scaler", "tick", "build")),
    NameRule("IAM custom role", "gcp", "env", _per_role(custom_role, "scaler"), 64, r"[A-Za-z0-9_.]+",
             "a-z, A-Z, 0-9, '_' and '.'", 3),
    NameRule("Cloud Function", "gcp", "env", _per_role(function, "scaler"), *_GCE),
    *(NameRule("Cloud Scheduler job", "gcp", "env", derive, *_CLOUD_SCHEDULER)
      for derive in (_per_role(stack_resource, "tick"), lambda env: watch_schedule(env.name))),
    # GCP, one per pool
    NameRule("service account", "gcp", "pool", lambda env, pool: service_account(env.name, f"{pool}-node"), 30, _RFC1035,
          _RFC1035_RULE, 6),
    NameRule("IAM custom role", "gcp", "pool", lambda env, pool: custom_role(env.name, f"{pool}_leave"), 64,
             r"[A-Za-z0-9_.]+", "a-z, A-Z, 0-9, '_' and '.'", 3),
    NameRule("managed instance group", "gcp", "pool", lambda env, pool: group(env.name, pool), *_GCE),
    NameRule("managed instance group", "gcp", "pool", lambda env, pool: on_demand_group(env.name, pool), *_GCE),
    # The group's base instance name: VM names add '-' and 4 characters to it.
    NameRule("MIG base instance", "gcp", "pool", lambda env, pool: on_demand_group(env.name, pool), 58, _RFC1035, _RFC1035_RULE),
    *(NameRule("instance template prefix", "gcp", "pool", lambda env, pool, kind=kind: instance_template_prefix(env.name, pool, kind),
            37, r"[a-z][-a-z0-9]*", "lowercase a-z, 0-9 and '-', starting with a letter") for kind in ("spot", "on-demand")),
    # GCP, one per schedule (a rate one cron cannot write adds jobs named `_2`, `_3`, ...)
    NameRule("Cloud Scheduler job", "gcp", "schedule", lambda env, name: schedule(env.name, name), *_CLOUD_SCHEDULER),
    # GCP, one per queue: topic and subscription share the name
    NameRule("Pub/Sub topic and subscription", "gcp", "queue", lambda env, q: queue(env.name, q), *_PUBSUB, 3),
    NameRule("Pub/Sub topic and subscription", "gcp", "queue", lambda env, q: dead_letter_queue(env.name, q), *_PUBSUB, 3),
)


@dataclass(frozen=True)
class DerivedName:
    field: str  # the config field whose value is in the name: "name", "project", "pools.gpu", "queues.train"
    name: str
    rule: NameRule


def derived_names(env: Environment) -> list[DerivedName]:
    """Every cloud name the environment's stack creates, with the rule it must meet."""
    out = []
    for rule in NAME_RULES:
        if rule.cloud != env.cloud:
            continue
        if rule.scope == "env":
            out.append(DerivedName("name", rule.derive(env), rule))
        else:
            keys = {"pool": env.pools, "queue": env.queues, "schedule": env.schedules}[rule.scope]
            out += [DerivedName(f"{rule.scope}s.{key}", rule.derive(env, key), rule) for key in sorted(keys)]
    return out
