"""Typed, validated environment config: one TOML file per environment.

Everything downstream (stacks, scaler, agent, CLI, simulator) reads an `Environment`,
never raw TOML. Problems are collected, not raised one at a time, and each names the
field, the value and the rule: ``pools.gpu.max: must be >= min (got 0 < 2)``.
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tidefleet import prices

NAME = r"^[a-z][a-z0-9-]{0,30}$"
NAME_RULE = "must start with a letter and use only a-z, 0-9 and '-' (at most 31 characters)"
AWS_REGION = re.compile(r"^(us|eu|ap|sa|ca|me|af|il|mx)(-gov)?-(north|south|east|west|central|northeast|southeast|northwest|southwest)-\d$")
GCP_REGION = re.compile(r"^[a-z]+-[a-z]+\d$")
AWS_INSTANCE_TYPE = re.compile(r"^[a-z][a-z0-9-]*\.[a-z0-9]+$")
GCP_MACHINE_TYPE = re.compile(r"^[a-z][a-z0-9]*-[a-z0-9-]+$")
GCP_IMAGE = re.compile(r"^projects/[a-z][a-z0-9-]+/global/images/(family/)?[a-z][a-z0-9-]*$")
AWS_IMAGE = re.compile(r"^(ami-[0-9a-f]{8,17}|ssm:/[\w./-]+)$")
SQS_MAX_VISIBILITY_S = 12 * 3600
# A node that dies holding an item (kill -9, a reclaim without notice) is rarely the item's
# fault, so the agent counts those losses apart from failed attempts and dead-letters an item
# only after this many of them (an item that kills its node every time must not loop forever).
# A hand-back or a retry is a fresh message, so SQS's receive count grows only with such
# losses: its redrive, maxReceiveCount = max_retries + 1 + this, is the backstop behind the agent.
NODE_LOSSES_TOLERATED = 5


class ConfigError(Exception):
    """One or more problems in an environment file; `problems` holds one line each."""

    def __init__(self, source: str, problems: list[str]):
        self.source = source
        self.problems = problems
        super().__init__(f"{source}: {len(problems)} problem(s)\n" + "\n".join(f"  - {p}" for p in problems))


class _Model(BaseModel):
    # strict: "5" is not 5, and an unknown key is a typo, not something to ignore.
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class InstanceType(_Model):
    type: str = Field(description="EC2 instance type (c6i.large) or GCE machine type (n2-standard-4)")
    weight: int = Field(1, ge=1, le=1000, description="capacity units one node of this type provides")
    gpus: int = Field(0, ge=0, le=16, description="GPUs on one node of this type")
    accelerator: str | None = Field(None, description="GCP only: accelerator type attached to the VM")
    on_demand_price: float | None = Field(None, gt=0, description="USD/hour; default from tidefleet.prices")
    spot_price: float | None = Field(None, gt=0, description="USD/hour; default from tidefleet.prices")

    def price(self, spot: bool) -> float | None:
        own = self.spot_price if spot else self.on_demand_price
        return own if own is not None else prices.default_price(self.type, spot)


class Pool(_Model):
    instance_types: list[InstanceType] = Field(min_length=1)
    capacity_unit: Literal["nodes", "vcpus", "gpus"] = "nodes"
    min: int = Field(0, ge=0, description="capacity units always kept")
    max: int = Field(ge=0, description="capacity units never exceeded")
    on_demand_base: int = Field(0, ge=0, description="capacity units always bought on demand")
    on_demand_percent: int = Field(0, ge=0, le=100, description="share above the base bought on demand")
    spot_allocation_strategy: Literal["price-capacity-optimized", "capacity-optimized", "lowest-price"] = (
        "price-capacity-optimized"
    )
    spot_max_price: float | None = Field(None, gt=0, description="USD/hour per node; None = on-demand price")
    image: str = Field(
        "ssm:/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-x86_64",
        description="AMI id, or ssm:/parameter/path resolved at deploy time",
    )
    disk_gb: int = Field(50, ge=8, le=16384)
    container: str | None = Field(None, description="container image run per item (docker run IMAGE ARGS)")
    command: str | None = Field(None, description="command run per item; the item's args are appended")
    init_script: str = Field("", description="extra shell run once at boot, before the agent starts")
    env: dict[str, str] = Field(default_factory=dict, description="environment for every item")
    slots_per_unit: int = Field(1, ge=1, le=256, description="items of one slot a capacity unit runs at once")
    idle_timeout_s: int | None = Field(None, ge=0, description="idle time before removal; None = scaler default")
    boot_timeout_s: int = Field(600, ge=30, le=7200, description="launch to first heartbeat before replacement")
    boot_estimate_s: int = Field(
        60,
        ge=0,
        le=3600,
        description="typical launch to first heartbeat (AWS: about 60 s; GPU images longer); work that "
        "running nodes start sooner than this launches no node. An estimate, not the boot timeout",
    )
    team: str = Field("default", pattern=NAME)
    cost_cap_usd_per_hour: float | None = Field(None, gt=0)
    public_ip: bool = False
    run_as_root: bool = Field(False, description="run items as root instead of the unprivileged tidefleet-item user")

    def slots(self, itype: InstanceType) -> int:
        return itype.weight * self.slots_per_unit


class Queue(_Model):
    pool: str
    priority: int = Field(0, ge=0, le=1000, description="higher is served first when capacity is capped")
    max_retries: int = Field(3, ge=0, le=100, description="failed attempts retried before the dead-letter queue")
    item_timeout_s: int = Field(3600, ge=1, le=7 * 24 * 3600)
    slots_per_item: int = Field(1, ge=1, le=256, description="slots one item needs (e.g. GPUs)")
    team: str | None = Field(None, pattern=NAME, description="None = the pool's team")

    @property
    def visibility_timeout_s(self) -> int:
        # The agent extends visibility while an item runs, so the queue's own timeout only
        # decides how soon an item held by a dead node comes back: short, but longer than
        # a short item's whole run so a healthy agent never races its own heartbeat.
        return min(self.item_timeout_s + 30, 600, SQS_MAX_VISIBILITY_S)

    @property
    def max_receive_count(self) -> int:
        """The redrive policy's maxReceiveCount (see NODE_LOSSES_TOLERATED); stack and sandbox share it."""
        return self.max_retries + 1 + NODE_LOSSES_TOLERATED


class Scaler(_Model):
    tick_s: int = Field(60, ge=1, le=3600, description="scheduled control tick")
    scale_in_delay_s: int = Field(300, ge=0, description="idle time before a node may be removed")
    scale_out_cooldown_s: int = Field(120, ge=0, description="no scale-in this long after a scale-out")
    spot_fallback_after_s: int = Field(240, ge=0, description="spot nodes pending this long count as short")
    spot_failure_window_s: int = Field(600, ge=0, description="how long a spot launch failure is remembered")
    dry_run: bool = False
    cost_cap_usd_per_hour: float | None = Field(None, gt=0, description="whole environment")


class Network(_Model):
    subnet_ids: list[str] = Field(default_factory=list, description="existing subnets; empty = create a VPC")
    vpc_cidr: str = Field("10.80.0.0/16", pattern=r"^\d{1,3}(\.\d{1,3}){3}/(1[6-9]|2[0-4])$")
    az_count: int = Field(2, ge=1, le=6)


class State(_Model):
    backend: Literal["local", "s3", "gcs"] = "local"
    path: str | None = Field(None, description="local backend: state file path")
    bucket: str | None = None
    key: str | None = None
    region: str | None = None
    lock_table: str | None = Field(None, description="s3 backend: DynamoDB lock table; None = S3 lockfile")


class Environment(_Model):
    name: str = Field(pattern=NAME)
    cloud: Literal["aws", "gcp"] = "aws"
    region: str
    project: str | None = Field(None, description="GCP project id")
    network: Network = Network()
    state: State = State()
    scaler: Scaler = Scaler()
    tags: dict[str, str] = Field(default_factory=dict, description="cost tags on every resource")
    pools: dict[str, Pool] = Field(min_length=1)
    queues: dict[str, Queue] = Field(min_length=1)

    def queues_of(self, pool: str) -> dict[str, Queue]:
        return {name: q for name, q in self.queues.items() if q.pool == pool}

    def idle_timeout_s(self, pool: str) -> int:
        own = self.pools[pool].idle_timeout_s
        return self.scaler.scale_in_delay_s if own is None else own


def _semantic_problems(env: Environment) -> list[str]:
    """Rules that span fields; run only once every field has the right type."""
    out: list[str] = []
    region_rule = AWS_REGION if env.cloud == "aws" else GCP_REGION
    if not region_rule.match(env.region):
        example = "us-east-1" if env.cloud == "aws" else "us-central1"
        out.append(f"region: not a {env.cloud} region (got {env.region!r}); use a name like {example!r}")
    if env.cloud == "gcp" and not env.project:
        out.append("project: required when cloud = 'gcp' (got nothing); set your GCP project id")
    if env.state.backend in ("s3", "gcs") and not env.state.bucket:
        out.append(f"state.bucket: required for backend {env.state.backend!r} (got nothing)")
    if env.state.backend == "local" and (env.state.bucket or env.state.lock_table):
        out.append("state.bucket: only for a remote backend (got a bucket with backend 'local')")
    for key, value in env.tags.items():
        if key.lower().startswith("aws:") or not 1 <= len(key) <= 128 or len(value) > 256:
            out.append(f"tags.{key}: not a valid tag (got {value!r}); keys 1-128 chars not starting 'aws:'")
    for name in list(env.pools) + list(env.queues):
        if not re.match(NAME, name):
            kind = "pools" if name in env.pools else "queues"
            out.append(f"{kind}.{name}: bad name (got {name!r}); {NAME_RULE}")
    for name, pool in env.pools.items():
        out += _pool_problems(env, name, pool)
    seen_queue_names: dict[str, str] = {}
    for name, queue in env.queues.items():
        where = f"queues.{name}"
        if queue.pool not in env.pools:
            known = ", ".join(sorted(env.pools))
            out.append(f"{where}.pool: unknown pool (got {queue.pool!r}); known pools: {known}")
        else:
            # Every type must fit an item: the group picks types by price and capacity, and a
            # node too small for the queue's items would leave them pending with no way out.
            pool = env.pools[queue.pool]
            small = [t.type for t in pool.instance_types if pool.slots(t) < queue.slots_per_item]
            if small:
                out.append(
                    f"{where}.slots_per_item: nodes of {', '.join(small)} in pool {queue.pool!r} have fewer slots "
                    f"(got {queue.slots_per_item} > {min(pool.slots(t) for t in pool.instance_types)}); "
                    "use a pool whose every type fits the item"
                )
        for cloud_name in (name, f"{name}-dlq"):
            if cloud_name in seen_queue_names:
                out.append(
                    f"{where}: duplicate queue name {cloud_name!r} (also used by queues.{seen_queue_names[cloud_name]}); "
                    "rename one of them"
                )
            seen_queue_names[cloud_name] = name
    return out


def _pool_problems(env: Environment, name: str, pool: Pool) -> list[str]:
    where = f"pools.{name}"
    out: list[str] = []
    if pool.min > pool.max:
        out.append(f"{where}.max: must be >= min (got {pool.max} < {pool.min})")
    if pool.on_demand_base > pool.max:
        out.append(f"{where}.on_demand_base: must be <= max (got {pool.on_demand_base} > {pool.max})")
    if (pool.container is None) == (pool.command is None):
        out.append(f"{where}: set exactly one of 'command' or 'container' (got {'both' if pool.command else 'neither'})")
    seen: set[str] = set()
    type_rule = AWS_INSTANCE_TYPE if env.cloud == "aws" else GCP_MACHINE_TYPE
    for i, itype in enumerate(pool.instance_types):
        at = f"{where}.instance_types[{i}]"
        if itype.type in seen:
            out.append(f"{at}.type: duplicate instance type (got {itype.type!r}); list each type once")
        seen.add(itype.type)
        if not type_rule.match(itype.type):
            out.append(f"{at}.type: not a {env.cloud} instance type (got {itype.type!r})")
            continue
        if pool.capacity_unit == "gpus" and itype.weight != itype.gpus:
            out.append(
                f"{at}.weight: with capacity_unit 'gpus' the weight is the GPU count "
                f"(got weight {itype.weight}, gpus {itype.gpus})"
            )
        missing = [f for f, spot in (("on_demand_price", False), ("spot_price", True)) if itype.price(spot) is None]
        if missing:
            out.append(f"{at}.{missing[0]}: no built-in price for {itype.type!r}; set {' and '.join(missing)} in USD/hour")
        if env.cloud == "aws" and itype.accelerator:
            out.append(f"{at}.accelerator: only for cloud 'gcp' (got {itype.accelerator!r})")
    if env.cloud == "gcp":
        out += _gcp_pool_problems(where, pool)
    if env.cloud == "aws" and not AWS_IMAGE.match(pool.image):
        out.append(f"{where}.image: not an AMI id or ssm:/ parameter (got {pool.image!r})")
    if pool.spot_max_price is not None and pool.spot_max_price < min(
        t.price(True) or float("inf") for t in pool.instance_types
    ):
        out.append(f"{where}.spot_max_price: below every type's spot price (got {pool.spot_max_price}); spot would never launch")
    for key in pool.env:
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key) or key.startswith("TIDEFLEET_"):
            out.append(f"{where}.env.{key}: not a usable variable name (got {key!r}); TIDEFLEET_* is reserved")
    return out


def _gcp_pool_problems(where: str, pool: Pool) -> list[str]:
    """A managed instance group sizes in VMs and a template is either Spot or standard."""
    out = []
    weights = sorted({t.weight for t in pool.instance_types})
    if len(weights) > 1:
        out.append(f"{where}.instance_types: on gcp every type of a pool needs the same weight (got {weights}); "
                   "a managed instance group counts VMs, so split the types into pools")
    if pool.on_demand_percent:
        out.append(f"{where}.on_demand_percent: not supported on gcp (got {pool.on_demand_percent}); "
                   "use on_demand_base (the pool's on-demand group) instead")
    if not GCP_IMAGE.match(pool.image):
        out.append(f"{where}.image: not a GCE image (got {pool.image!r}); "
                   "use projects/<project>/global/images/[family/]<name>")
    for i, itype in enumerate(pool.instance_types):
        if itype.accelerator and not itype.gpus:
            out.append(f"{where}.instance_types[{i}].gpus: must be > 0 with an accelerator (got 0); set the GPU count")
    return out


def _pydantic_problems(err: ValidationError) -> list[str]:
    out = []
    for e in err.errors():
        path = ".".join(f"[{p}]" if isinstance(p, int) else str(p) for p in e["loc"]).replace(".[", "[")
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown key; check the spelling against the config reference in README.md"
        elif e["type"] == "missing":
            msg = "required field is missing"
        got = "" if e["type"] == "missing" else f" (got {e['input']!r})"
        out.append(f"{path}: {msg}{got}")
    return out


def parse_environment(data: dict, *, name: str, source: str = "<dict>") -> Environment:
    """Validate raw TOML data into an Environment, or raise ConfigError with every problem."""
    given = data.get("name", name)
    if given != name:
        raise ConfigError(source, [f"name: must match the file name (got {given!r}, file says {name!r})"])
    try:
        env = Environment.model_validate({**data, "name": name})
    except ValidationError as err:
        raise ConfigError(source, _pydantic_problems(err)) from None
    problems = _semantic_problems(env)
    if problems:
        raise ConfigError(source, problems)
    return env


def environments_dir() -> Path:
    """$TIDEFLEET_ENVIRONMENTS, else ./environments, else the one beside the package."""
    if os.environ.get("TIDEFLEET_ENVIRONMENTS"):
        return Path(os.environ["TIDEFLEET_ENVIRONMENTS"])
    here = Path.cwd() / "environments"
    return here if here.is_dir() else Path(__file__).resolve().parents[1] / "environments"


def known_environments(root: Path | None = None) -> list[str]:
    return sorted(p.stem for p in (root or environments_dir()).glob("*.toml"))


def load_environment(name: str, root: Path | None = None) -> Environment:
    """Load `environments/<name>.toml` (or a path to a .toml file)."""
    path = Path(name) if name.endswith(".toml") else (root or environments_dir()) / f"{name}.toml"
    if not path.is_file():
        known = ", ".join(known_environments(path.parent)) or "none"
        raise ConfigError(str(path), [f"env: unknown environment (got {name!r}); known: {known}"])
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as err:
        # Covers duplicate tables/keys too: TOML itself forbids defining a name twice.
        raise ConfigError(str(path), [f"{path.name}: not valid TOML ({err}); duplicate names are not allowed"]) from None
    return parse_environment(data, name=path.stem, source=str(path))
