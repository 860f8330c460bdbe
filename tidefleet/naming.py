"""Cloud resource names derived from an environment: one place, used by the stacks, the
adapters, the agent, the CLI and the sandbox, so they always agree."""

from __future__ import annotations

import hashlib

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


# -- GCP only -------------------------------------------------------------------------------
# Pub/Sub topics and subscriptions use queue() / dead_letter_queue() (separate namespaces);
# the Firestore database uses table(); the spot managed instance group uses group().
def on_demand_group(env: str, pool: str) -> str:
    """GCP: a template is either Spot or standard, so on-demand capacity is a second group."""
    return f"{PREFIX}-{env}-{pool}-od"


def service_account(env: str, role: str) -> str:
    """GCP service account id (6-30 chars): the readable name, or a short hash when too long."""
    name = f"{PREFIX}-{env}-{role}"
    return name if len(name) <= 30 else f"{PREFIX}-{hashlib.sha256(name.encode()).hexdigest()[:16]}"


def item_log(env: str) -> str:
    """GCP: the Cloud Logging log id that carries every item's output (labels job/item/attempt)."""
    return f"{PREFIX}-{env}-items"


def kick_topic(env: str) -> str:
    """GCP: the scaler function's trigger topic (Cloud Scheduler's tick and the SDK's kick)."""
    return stack_resource(env, "kick")
