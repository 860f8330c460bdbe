"""One environment's cloud resources, described once: what `stacks/` declares for a real account
and what the sandbox creates on the emulator (`tidefleet/cloud/aws/provision.py`).

`resources(env, account=...)` is pure (no SDK, no cdktn): names come from `tidefleet.naming`,
settings from the typed config and the rules below. Neither side computes a value of its own;
tests/test_resource_spec.py checks the synthesized Terraform and what boto3 describes on the
emulator against this description, one fact per row. Where the sandbox must differ from a real
account, a field here says so (`LaunchTemplateSpec.emulator_image`), not a second constant.

Values are the environment's cloud's: for GCP, a queue's visibility timeout is the Pub/Sub
subscription's ack deadline and its receive count is the dead-letter policy's
`max_delivery_attempts`, each clamped into the range Pub/Sub accepts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tidefleet import naming
from tidefleet.config import Environment, Queue

# SQS keeps a message at most 14 days: the longest a queued item can wait for a fleet at zero.
SQS_RETENTION_S = 14 * 24 * 3600
# Pub/Sub's most for a subscription: a queued item survives a long weekend with the fleet at zero.
PUBSUB_RETENTION_S = 7 * 24 * 3600
PUBSUB_ACK_DEADLINE_S = (10, 600)
PUBSUB_DELIVERY_ATTEMPTS = (5, 100)
# One year: checkov's CKV_AWS_338 floor, and long enough to answer "why did item X fail" later.
LOG_RETENTION_DAYS = 365
# Time a terminating node gets to hand its items back (the agent stops intake, signals the
# workload, waits its grace, releases the items) before the group goes on anyway. Not the item
# timeout: a draining node hands work back rather than finishing it.
DRAIN_HEARTBEAT_S = 300
TABLE_KEYS = ("pk", "sk")  # hash, range; both strings (see tidefleet/cloud/aws/dynamodb.py)
# moto ships this AMI; the emulator resolves neither `ssm:` images nor most real AMI ids.
EMULATOR_IMAGE = "ami-12c6146b"


def _clamp(value: int, bounds: tuple[int, int]) -> int:
    low, high = bounds
    return min(max(value, low), high)


def redrive_receives(cloud: str, queue: Queue) -> int:
    """Receives after which the queue's own policy dead-letters a message: SQS's maxReceiveCount,
    or Pub/Sub's max_delivery_attempts, which only takes 5..100."""
    count = queue.max_receive_count
    return _clamp(count, PUBSUB_DELIVERY_ATTEMPTS) if cloud == "gcp" else count


def _visibility_timeout_s(cloud: str, queue: Queue) -> int:
    return (
        _clamp(queue.visibility_timeout_s, PUBSUB_ACK_DEADLINE_S)
        if cloud == "gcp"
        else queue.visibility_timeout_s
    )


@dataclass(frozen=True)
class QueueSpec:
    name: str
    dead_letter_name: str
    # SQS VisibilityTimeout; Pub/Sub ack deadline. The agent extends it while an item runs, so it
    # only decides how soon an item held by a dead node comes back (see Queue.visibility_timeout_s).
    visibility_timeout_s: int
    retention_s: int  # the queue's and its dead-letter queue's
    max_receive_count: int  # SQS redrive maxReceiveCount; Pub/Sub max_delivery_attempts
    # Queues, unlike the rest, are not encrypted with the environment key on AWS: every producer
    # (the job SDK, EventBridge, alarms) can then send without KMS grants.
    encryption: Literal["sqs-managed", "environment-key"]


@dataclass(frozen=True)
class IndexSpec:
    name: str
    hash_key: str  # a string attribute
    range_key: str
    projection: str
    range_type: str = "N"  # DynamoDB's attribute type of range_key


# The job records alone, oldest first: only they have both keys (sk "JOB" and a number `created_at`),
# so `tidefleet jobs` reads them without scanning every item and heartbeat. Keys only: a job's
# counters, moved as its items settle, never write to the index (one partition for every job).
JOBS_INDEX = IndexSpec("jobs", hash_key="sk", range_key="created_at", projection="KEYS_ONLY")
# A job's failed items alone: only an item whose status is failed has `failed_in` (its job's key,
# set and removed with its status), so `tidefleet status` shows why items failed without reading
# the job's other items. Whole items: few, and their reasons are what is shown.
FAILED_INDEX = IndexSpec("failed", hash_key="failed_in", range_key="sk", projection="ALL", range_type="S")


@dataclass(frozen=True)
class TableSpec:
    name: str
    hash_key: str
    range_key: str
    billing_mode: str
    point_in_time_recovery: bool
    ttl_attribute: str | None  # None: records are kept; `tidefleet` lists finished jobs too
    jobs_index: IndexSpec = JOBS_INDEX
    failed_index: IndexSpec = FAILED_INDEX

    @property
    def indexes(self) -> tuple[IndexSpec, ...]:
        return (self.jobs_index, self.failed_index)

    @property
    def key_types(self) -> dict[str, str]:
        """The type of every key attribute, the table's and its indexes': all DynamoDB declares."""
        types = {self.hash_key: "S", self.range_key: "S"}
        for index in self.indexes:
            types |= {index.hash_key: "S", index.range_key: index.range_type}
        return types


def table_spec(env_name: str) -> TableSpec:
    """The environment's job table (on AWS; GCP keeps jobs in Firestore)."""
    return TableSpec(naming.table(env_name), *TABLE_KEYS, billing_mode="PAY_PER_REQUEST", point_in_time_recovery=True,
                     ttl_attribute=None)  # fmt: skip


@dataclass(frozen=True)
class LogGroupSpec:
    name: str
    retention_days: int


@dataclass(frozen=True)
class BucketSpec:
    name: str
    versioned: bool
    noncurrent_version_expiration_days: int  # old agent wheels and superseded checkpoints
    abort_incomplete_upload_days: int


@dataclass(frozen=True)
class HookSpec:
    name: str
    transition: str
    heartbeat_timeout_s: int
    default_result: str


@dataclass(frozen=True)
class LaunchTemplateSpec:
    name: str
    image: str  # the pool's: an AMI id or `ssm:/parameter/path`
    emulator_image: str  # what the sandbox launches instead (the emulator knows only its own AMIs)
    http_tokens: str  # IMDSv2 only
    # Containers on docker's bridge network are one hop further from IMDS.
    http_put_response_hop_limit: int
    root_volume_gb: int


@dataclass(frozen=True)
class PoolSpec:
    group_name: str
    # The scaler owns desired capacity; this is only what the group is created with.
    min_size: int
    max_size: int
    initial_desired: int
    instance_types: tuple[tuple[str, int], ...]  # (type, weight) in the configured order
    on_demand_base: int
    on_demand_percent: int
    spot_allocation_strategy: str
    spot_max_price: str  # "" = capped at the on-demand price
    capacity_rebalance: bool
    health_check_grace_period_s: int
    # The scaler picks which idle nodes go; zone rebalancing would pick busy ones.
    suspended_processes: tuple[str, ...]
    drain_hook: HookSpec
    tags: dict[str, str]  # on every node and volume, propagated at launch
    launch_template: LaunchTemplateSpec


@dataclass(frozen=True)
class FailureQueueSpec:
    name: str  # failed asynchronous function invocations (AWS)
    retention_s: int


@dataclass(frozen=True)
class EnvResources:
    env: str
    cloud: str
    tags: dict[str, str]  # on every resource
    queues: dict[str, QueueSpec]  # by configured queue name
    table: TableSpec
    item_logs: LogGroupSpec  # AWS: CloudWatch log group; GCP: the Cloud Logging log id
    log_retention_days: int  # every log group (the functions' too)
    artifacts: BucketSpec
    pools: dict[str, PoolSpec]  # by configured pool name
    function_failures: FailureQueueSpec


def resources(env: Environment, *, account: str) -> EnvResources:
    """account: the AWS account id or GCP project the artifacts bucket's name carries (on AWS, the
    stack passes the Terraform reference to the caller's account)."""
    gcp = env.cloud == "gcp"
    retention_s = PUBSUB_RETENTION_S if gcp else SQS_RETENTION_S
    queues = {
        name: QueueSpec(
            name=naming.queue(env.name, name),
            dead_letter_name=naming.dead_letter_queue(env.name, name),
            visibility_timeout_s=_visibility_timeout_s(env.cloud, q),
            retention_s=retention_s,
            max_receive_count=redrive_receives(env.cloud, q),
            encryption="environment-key" if gcp else "sqs-managed",
        )
        for name, q in env.queues.items()
    }
    return EnvResources(
        env=env.name,
        cloud=env.cloud,
        tags={**env.tags, "tidefleet:env": env.name},
        queues=queues,
        table=table_spec(env.name),
        item_logs=LogGroupSpec(
            naming.item_log(env.name) if gcp else naming.item_log_group(env.name), LOG_RETENTION_DAYS
        ),
        log_retention_days=LOG_RETENTION_DAYS,
        artifacts=BucketSpec(
            naming.artifacts_bucket(env.name, account),
            versioned=True,
            noncurrent_version_expiration_days=30,
            abort_incomplete_upload_days=7,
        ),
        pools={name: _pool(env, name) for name in env.pools},
        function_failures=FailureQueueSpec(naming.function_failures(env.name), retention_s),
    )


def _pool(env: Environment, name: str) -> PoolSpec:
    pool = env.pools[name]
    return PoolSpec(
        group_name=naming.group(env.name, name),
        min_size=pool.min,
        max_size=pool.max,
        initial_desired=pool.min,
        instance_types=tuple((t.type, t.weight) for t in pool.instance_types),
        on_demand_base=pool.on_demand_base,
        on_demand_percent=pool.on_demand_percent,
        spot_allocation_strategy=pool.spot_allocation_strategy,
        spot_max_price="" if pool.spot_max_price is None else str(pool.spot_max_price),
        capacity_rebalance=True,
        health_check_grace_period_s=pool.boot_timeout_s,
        suspended_processes=("AZRebalance",),
        drain_hook=HookSpec(
            naming.lifecycle_hook(env.name, name),
            "autoscaling:EC2_INSTANCE_TERMINATING",
            DRAIN_HEARTBEAT_S,
            "CONTINUE",
        ),
        # Cost attribution on every node and volume (the provider's default_tags skip those).
        tags={**env.tags, "tidefleet:env": env.name, "tidefleet:pool": name, "tidefleet:team": pool.team},
        launch_template=LaunchTemplateSpec(
            name=naming.launch_template(env.name, name),
            image=pool.image,
            emulator_image=EMULATOR_IMAGE,
            http_tokens="required",
            http_put_response_hop_limit=2 if pool.container else 1,
            root_volume_gb=pool.disk_gb,
        ),
    )
