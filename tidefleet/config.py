"""Typed, validated environment config: one TOML file per environment.

Everything downstream (stacks, scaler, agent, CLI, simulator) reads an `Environment`,
never raw TOML. Problems are collected, not raised one at a time, and each names the
field, the value and the rule: ``pools.gpu.max: must be >= min (got 0 < 2)``.
"""

from __future__ import annotations

import difflib
import ipaddress
import os
import re
import shlex
import sys
import tomllib
import types
import typing
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from tidefleet import naming, prices, registries, schedules

NAME = r"[a-z][a-z0-9-]{0,30}"
NAME_RULE = "must start with a letter and use only a-z, 0-9 and '-' (at most 31 characters)"
# Every pattern here is used with re.fullmatch: re.match(...$) would accept a trailing newline.
AWS_INSTANCE_TYPE = r"[a-z][a-z0-9-]*\.[a-z0-9]+"
GCP_MACHINE_TYPE = r"[a-z][a-z0-9]*-[a-z0-9-]+"
# The GPUs each GCE machine family can have: N1 VMs take attached GPUs; the accelerator-optimized
# families come with their own (GCE docs, "GPU machine types"). NVIDIA K80 is retired.
GCP_GPUS = {
    "n1": ("nvidia-tesla-t4", "nvidia-tesla-v100", "nvidia-tesla-p100", "nvidia-tesla-p4"),
    "g2": ("nvidia-l4",),
    "g4": ("nvidia-rtx-pro-6000",),
    "a2": ("nvidia-tesla-a100", "nvidia-a100-80gb"),
    "a3": ("nvidia-h100-80gb", "nvidia-h100-mega-80gb", "nvidia-h200-141gb"),
    "a4": ("nvidia-b200",),
    "a4x": ("nvidia-gb200",),
}
# NVIDIA's counts on an N1 machine type, per accelerator (GCE's GPU machine types page).
GCP_N1_GPU_COUNTS = {"nvidia-tesla-t4": (1, 2, 4), "nvidia-tesla-p4": (1, 2, 4), "nvidia-tesla-p100": (1, 2, 4),
                     "nvidia-tesla-v100": (1, 2, 4, 8)}  # fmt: skip
# GPUs of G2 and G4 types by their vCPUs (the other GPU families end in their count: a3-highgpu-8g).
GCP_GPUS_BY_VCPUS = {"g2": {4: 1, 8: 1, 12: 1, 16: 1, 24: 2, 32: 1, 48: 4, 96: 8}, "g4": {48: 1, 96: 2, 192: 4, 384: 8}}
# EC2's GPU families: G (g4dn, g5, g6e, g5g), Gr (gr6) and P (p4d, p5en); no other family has GPUs.
AWS_GPU_FAMILY = r"(?:g|gr|p)\d+[a-z]*"
GCP_IMAGE = r"projects/[a-z][a-z0-9-]+/global/images/(family/)?[a-z][a-z0-9-]*"
AWS_IMAGE = r"ami-[0-9a-f]{8,17}|ssm:/[\w./-]+"
AWS_SUBNET = r"subnet-[0-9a-f]{8}([0-9a-f]{9})?"
GCP_SUBNET = r"(projects/[a-z][a-z0-9-]{4,28}[a-z0-9]/regions/[a-z0-9-]+/subnetworks/)?[a-z]([-a-z0-9]{0,61}[a-z0-9])?"
# GCP project ids: 6-30 characters, lowercase letters, digits and hyphens, a letter first.
GCP_PROJECT = r"[a-z][a-z0-9-]{4,28}[a-z0-9]"
# S3 (general purpose) and GCS bucket names; dotted names are allowed by both.
S3_BUCKET = r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]"
GCS_BUCKET = r"[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]"
# Mounting a file system over one of these would break the node.
SYSTEM_DIRS = frozenset({"/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib64", "/opt", "/proc", "/root",
                         "/run", "/sbin", "/sys", "/tmp", "/usr", "/var", "/mnt", "/srv"})  # fmt: skip
# ...nor inside one of these: the OS's own files (/usr/bin holds bash and python), the agent's install
# (templates/user-data.sh.j2: /opt/tidefleet/venv) and the item user's home (/var/lib/tidefleet-item).
SYSTEM_TREES = ("/bin/", "/boot/", "/dev/", "/etc/", "/lib/", "/lib64/", "/proc/", "/run/", "/sbin/", "/sys/", "/usr/",
                "/var/lib/", "/var/log/", "/var/run/", "/var/cache/", "/opt/tidefleet/")  # fmt: skip
ENV_VAR = r"[A-Za-z_][A-Za-z0-9_]*"
# The OCI / docker reference grammar (distribution/reference): [host[:port]/]path[:tag][@digest].
_DOMAIN = r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)(?:\.(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?))*(?::[0-9]+)?"
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[_.]|__|-+)[a-z0-9]+)*"
IMAGE_REFERENCE = (
    rf"(?:{_DOMAIN}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
    r"(?::[\w][\w.-]{0,127})?(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?"
)
IMAGE_NAME_MAX = 255
# Tags: AWS allows letters, digits, spaces and _ . : / = + - @ (keys 1-128, values 0-256).
# On GCP they become labels: lowercase letters, digits, '_' and '-', at most 63, keys start with a letter.
AWS_TAG = r"[\w .:/=+\-@]*"
GCP_LABEL_KEY = r"[a-z][a-z0-9_-]{0,62}"
GCP_LABEL_VALUE = r"[a-z0-9_-]{0,63}"
# aws: is AWS's own; the stacks set tidefleet:env/pool/team (AWS) and tidefleet-env/pool/... (GCP labels).
RESERVED_TAG_PREFIXES = ("aws:", "tidefleet:", "tidefleet-")
# How many tags a resource may carry: on AWS 50 of the user's own (aws: ones do not count), on GCP 64 labels.
# The stacks add theirs to [tags]: on AWS a node, its volume and its Auto Scaling group carry tidefleet:env,
# tidefleet:pool and tidefleet:team (tidefleet/resources.py; the others add only tidefleet:env and a Name); on
# GCP an instance template carries tidefleet-env/pool/team/lifecycle (stacks/gcp/stack.py, pool.py) and the
# google provider labels every resource goog-terraform-provisioned (add_terraform_attribution_label's default).
TAG_LIMITS = {"aws": 50, "gcp": 64}
STACK_TAGS = {
    "aws": ("tidefleet:env", "tidefleet:pool", "tidefleet:team"),
    "gcp": ("tidefleet-env", "tidefleet-pool", "tidefleet-team", "tidefleet-lifecycle", "goog-terraform-provisioned"),
}
# An Auto Scaling group's mixed instances policy: at most 40 instance types (overrides), each weight
# (WeightedCapacity) 1-999.
AWS_MAX_INSTANCE_TYPES = 40
AWS_MAX_WEIGHT = 999
# Largest group the scaler may ask for: an Auto Scaling group (AWS), a regional managed
# instance group (GCP: 2000 VMs).
MAX_GROUP_NODES = {"aws": 10000, "gcp": 2000}
DAY_S = 24 * 3600
# The boot script runs the pool's init_script from a quoted heredoc ending at this line.
INIT_SCRIPT_DELIMITER = "TIDEFLEET_INIT_SCRIPT"
# The regions each cloud has (opt-in and sovereign partitions included). A pattern would
# accept us-north-9; tests/test_config.py checks this list against botocore's.
AWS_REGIONS = frozenset({
    "af-south-1", "ap-east-1", "ap-east-2", "ap-northeast-1", "ap-northeast-2", "ap-northeast-3", "ap-south-1",
    "ap-south-2", "ap-southeast-1", "ap-southeast-2", "ap-southeast-3", "ap-southeast-4", "ap-southeast-5",
    "ap-southeast-6", "ap-southeast-7", "ca-central-1", "ca-west-1", "eu-central-1", "eu-central-2", "eu-north-1",
    "eu-south-1", "eu-south-2", "eu-west-1", "eu-west-2", "eu-west-3", "il-central-1", "me-central-1", "me-south-1",
    "mx-central-1", "sa-east-1", "us-east-1", "us-east-2", "us-west-1", "us-west-2",
    "us-gov-east-1", "us-gov-west-1", "cn-north-1", "cn-northwest-1",
})  # fmt: skip
GCP_REGIONS = frozenset({
    "africa-south1", "asia-east1", "asia-east2", "asia-northeast1", "asia-northeast2", "asia-northeast3",
    "asia-south1", "asia-south2", "asia-southeast1", "asia-southeast2", "asia-southeast3", "australia-southeast1",
    "australia-southeast2", "europe-central2", "europe-north1", "europe-north2", "europe-southwest1", "europe-west1",
    "europe-west2", "europe-west3", "europe-west4", "europe-west6", "europe-west8", "europe-west9", "europe-west10",
    "europe-west12", "me-central1", "me-central2", "me-west1", "northamerica-northeast1", "northamerica-northeast2",
    "northamerica-south1", "southamerica-east1", "southamerica-west1", "us-central1", "us-east1", "us-east4",
    "us-east5", "us-south1", "us-west1", "us-west2", "us-west3", "us-west4",
})  # fmt: skip
# The availability zones of each AWS region (AWS Global Infrastructure, 2025): 3, but for these. The most an
# account sees, an upper bound: some see fewer (most accounts 2 in us-west-1, 3 in ap-northeast-1). The
# stack puts private subnet i in zone i of the region's (stacks/aws/network.py, Terraform element() wraps).
AWS_ZONES = {"us-east-1": 6, "us-west-2": 4, "ap-northeast-1": 4, "ap-northeast-2": 4}
AWS_ZONES_USUAL = 3
SQS_MAX_VISIBILITY_S = 12 * 3600
# The most `item_timeout_s` allows: an attempt runs at most a week, on both clouds (see the README's
# `[queues.<name>]` on how a long attempt keeps its message).
MAX_ITEM_TIMEOUT_S = 7 * DAY_S
# How long a queue keeps a waiting item before dropping it (tidefleet/resources.py SQS_RETENTION_S and
# PUBSUB_RETENTION_S, the services' most): the oldest-item alarm and the escalation must come before it.
QUEUE_RETENTION_S = {"aws": 14 * 24 * 3600, "gcp": 7 * 24 * 3600}
# A node that dies holding an item (kill -9, a reclaim without notice) is rarely the item's
# fault, so the agent counts those losses apart from failed attempts and dead-letters an item
# only after this many of them (an item that kills its node every time must not loop forever).
# A hand-back or a retry is a fresh message, so SQS's receive count grows only with such
# losses: its redrive, maxReceiveCount = max_retries + 1 + this, is the backstop behind the agent.
NODE_LOSSES_TOLERATED = 5
# A pool with GPU types and no `image` boots one with the NVIDIA driver and container runtime (the
# Deep Learning AMI / Deep Learning VM of environments/train.toml and gcp-dev.toml): the boot script
# installs no driver, so on a plain image the agent finds no GPU, drains, and the node is replaced forever.
GPU_IMAGES = {
    "aws": "ssm:/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-amazon-linux-2023/latest/ami-id",
    "gcp": "projects/deeplearning-platform-release/global/images/family/common-cu128-ubuntu-2404-nvidia-570",
}
# Their root disk where the pool sets no disk_gb: these images carry CUDA stacks, and a root smaller
# than an image's snapshot fails every launch (the snapshot's size changes with each release, and is
# above the plain images' 50 GB default); 100 GB of gp3 is ~$0.01 an hour beside a GPU's dollars.
GPU_IMAGE_DISK_GB = 100
# What a GCP pool without GPUs is told to use (the image environments/gcp-dev.toml boots).
GCP_DEFAULT_IMAGE = "projects/debian-cloud/global/images/family/debian-12"
# Plain OS images, which carry no NVIDIA driver (the GPU-ready ones live elsewhere: Deep Learning
# AMIs, deeplearning-platform-release, ubuntu-os-accelerator-images).
DRIVERLESS_IMAGES = ("ssm:/aws/service/ami-amazon-linux-latest/", "projects/debian-cloud/", "projects/ubuntu-os-cloud/",
                     "projects/rocky-linux-cloud/", "projects/rhel-cloud/", "projects/centos-cloud/", "projects/cos-cloud/")  # fmt: skip
# The boot script (templates/user-data.sh.j2) runs under `set -e` and, before the pool's init_script,
# installs the agent's Python with `dnf install python3.11` (AWS): on another OS it stops there, so no
# init_script can make up for it, and the node is replaced forever. AWS's public SSM parameters name their OS:
# Amazon Linux 2 and 1 (yum, no dnf), Ubuntu, Debian, SUSE, Windows, Bottlerocket.
AWS_OTHER_OS_IMAGE = r"amzn2?-ami|amazon-linux-2(?!023)|ubuntu|debian|suse|sles|windows|bottlerocket"
# Graviton (arm64) EC2 families carry a 'g' among the letters after the generation (c7g, m7gd, c6gn, im4gn,
# g5g, t4g), and a1; every other family is x86_64 (as is every type of prices.SPECS). An image boots only
# on its own architecture, which AWS's public SSM parameters name (al2023-ami-kernel-default-arm64).
AWS_ARM64_FAMILY = r"a1|[a-z]+\d+[a-z]*g[a-z]*"
GCP_MIN_DISK_GB = 10  # the smallest public GCE images (debian-12, ubuntu-minimal) are 10 GB
# GCP's Arm machine families (Axion C4A and N4A, Ampere T2A, Grace A4X); the others are x86_64. Public images
# name an arm64 build (debian-12-arm64, ubuntu-2404-lts-arm64); without it they are x86_64.
GCP_ARM64_FAMILY = r"c4a|n4a|t2a|a4x"
# On GCP the boot script runs `apt-get install python3-venv` and needs python3 >= 3.11: the public image
# projects of OSes without apt-get (Container-Optimized OS, the RPM distributions, Windows) cannot boot a node,
# nor can Debian before 12 (3.9 on Debian 11) or Ubuntu before 23.04 (3.10 on 22.04), whose public images and
# Deep Learning VM families name their release (debian-11-bullseye-v2025..., common-cu121-debian-11-py310).
GCP_NO_APT_PROJECTS = frozenset({"cos-cloud", "rocky-linux-cloud", "rhel-cloud", "rhel-sap-cloud", "centos-cloud",
                                 "almalinux-cloud", "suse-cloud", "suse-sap-cloud", "opensuse-cloud",
                                 "fedora-coreos-cloud", "windows-cloud", "windows-sql-cloud"})  # fmt: skip
GCP_APT_PROJECTS = frozenset({"debian-cloud", "ubuntu-os-cloud", "ubuntu-os-pro-cloud", "ubuntu-os-accelerator-images",
                              "deeplearning-platform-release"})  # fmt: skip
GCP_OLD_PYTHON_IMAGE = r"(?:^|-)(?:debian-(?:[1-9]|1[01])|ubuntu-(?:[a-z]+-)*(?:1\d|2[0-2])(?:04|10))(?:-|$)"


class ConfigError(Exception):
    """One or more problems in an environment file, or in a setting (`source`: the file, or `env`,
    TIDEFLEET_ENV); `problems` holds one line each. One problem is one line; several, a list."""

    def __init__(self, source: str, problems: list[str]):
        self.source = source
        self.problems = problems
        if len(problems) == 1:
            super().__init__(f"{source}: {problems[0]}")
        else:
            super().__init__(f"{source}: {len(problems)} problem(s)\n" + "\n".join(f"  - {p}" for p in problems))


class _Model(BaseModel):
    # strict: "5" is not 5, and an unknown key is a typo, not something to ignore.
    # inf and nan are TOML floats too; no price or cap may be one.
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)


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


class PoolData(_Model):
    """The team's data a pool's nodes may reach: granted to that pool's role only."""

    read: list[str] = Field(default_factory=list, description="s3://bucket/prefix/ or gs://bucket/prefix/, read only")
    write: list[str] = Field(default_factory=list, description="likewise, read and write")
    shared_fs_mount: str | None = Field(None, description="mount the environment's [shared_fs] at this path on boot")

    def locations(self) -> list[tuple[str, str, bool]]:
        """(bucket, prefix, writable) per configured location, in the configured order."""
        out = []
        for uris, writable in ((self.read, False), (self.write, True)):
            for uri in uris:
                bucket, _, prefix = uri.split("://", 1)[1].partition("/")
                out.append((bucket, prefix, writable))
        return out


class SharedFs(_Model):
    kind: Literal["efs", "fsx-lustre", "filestore"] = Field(
        description="efs (elastic NFS), fsx-lustre (training data, AWS), filestore (NFS, GCP)"
    )
    size_gb: int | None = Field(None, ge=1, le=1_000_000, description="fsx-lustre and filestore: capacity")


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
        description="AMI id, or ssm:/parameter/path resolved at deploy time; a pool with GPU types defaults to "
        "GPU_IMAGES[cloud] (on gcp only GPU pools have a default)",
    )
    disk_gb: int = Field(50, ge=8, le=16384)
    container: str | None = Field(None, description="container image run per item (docker run IMAGE ARGS)")
    command: str | None = Field(None, description="command run per item; the item's args are appended")
    init_script: str = Field("", description="extra shell run once at boot, before the agent starts")
    env: dict[str, str] = Field(default_factory=dict, description="environment for every item")
    slots_per_unit: int = Field(1, ge=1, le=256, description="items of one slot a capacity unit runs at once")
    idle_timeout_s: int | None = Field(None, ge=0, le=DAY_S, description="idle time before removal; None = scaler default")
    boot_timeout_s: int = Field(600, ge=30, le=7200, description="launch to first heartbeat before replacement")
    boot_estimate_s: int = Field(
        60,
        ge=0,
        le=3600,
        description="typical launch to first heartbeat (AWS: about 60 s; GPU images longer); work that "
        "running nodes start sooner than this launches no node. An estimate, not the boot timeout",
    )
    team: str = Field("default", description=f"cost attribution; {NAME_RULE}")
    cost_cap_usd_per_hour: float | None = Field(None, gt=0)
    public_ip: bool = False
    run_as_root: bool = Field(False, description="run items as root instead of the unprivileged tidefleet-item user")
    gpu_sharing: bool = Field(False, description="more slots than GPUs: small items share a GPU (and its memory)")
    data: PoolData = PoolData()
    placement: Literal["spread", "cluster"] = Field(
        "spread", description="cluster: nodes close together for multi-node training (one zone, AWS placement group)"
    )
    zone: str | None = Field(None, description="GCP: every node of the pool, Spot and on-demand, in this zone of "
                             "the region (e.g. us-central1-a); keeps a cluster pool's gangs in one zone")
    efa: bool = Field(False, description="AWS: Elastic Fabric Adapter on every node (needs placement 'cluster')")
    checkpoint_and_move: bool = Field(
        False,
        description="consolidation may stop a cordoned node's attempts of preemptible queues (checkpoint, back to "
        "the queue) once they ran min_runtime_s and the other nodes have room: the node leaves now, not when its "
        "longest item ends",
    )

    def slots(self, itype: InstanceType) -> int:
        return itype.weight * self.slots_per_unit


class NodesRange(_Model):
    """An elastic gang: starts once `min` nodes joined, runs on as long as `min` remain, grows to `max`."""

    min: int = Field(ge=1, le=1000)
    max: int = Field(ge=1, le=1000)


class Queue(_Model):
    pool: str
    priority: int = Field(0, ge=0, le=1000, description="higher is served first when capacity is capped")
    max_retries: int = Field(3, ge=0, le=100, description="failed attempts retried before the dead-letter queue")
    item_timeout_s: int = Field(3600, ge=1, le=MAX_ITEM_TIMEOUT_S)
    slots_per_item: int = Field(1, ge=1, le=256, description="slots one item needs (e.g. GPUs)")
    nodes_per_item: int | NodesRange = Field(
        1,
        description="nodes one item runs on at once (a gang, e.g. distributed training), or {min, max} for an "
        "elastic gang (torchrun --nnodes=min:max); each member takes a whole node",
    )
    target_wait_s: int = Field(
        120, ge=0, le=DAY_S,
        description="waiting items may wait this long for running nodes to free up before a node is launched "
        "for them; once the oldest would miss it, nodes launch at once",
    )
    team: str | None = Field(None, description="None = the pool's team")
    accept_images: list[str] = Field(default_factory=list, description="glob patterns of images a job may ask for; '*' = any")
    accept_commands: list[str] = Field(default_factory=list, description="glob patterns of commands a job may ask for")
    # An item waiting longer than this raises the oldest-item alarm: longer than a slow GPU
    # boot plus a scale-out, shorter than anyone waits for a page.
    max_wait_s: int = Field(1800, ge=60, le=14 * DAY_S, description="oldest waiting item before the alarm")
    preemptible: bool = Field(
        False,
        description="its running items may be stopped (checkpoint and hand back: an interruption, never a failed "
        "attempt) to make room for a higher-priority queue's waiting items when the pool cannot grow",
    )
    min_runtime_s: int = Field(600, ge=0, le=DAY_S, description="a preemptible item runs this long before it may be preempted")
    on_demand_after_interruptions: int | None = Field(
        None, ge=1, le=100,
        description="an item handed back this many times (spot reclaims and drains; not the scaler's preemptions or moves) runs next on an "
        "on-demand node of its pool; None = wherever it lands",
    )

    @property
    def gang(self) -> tuple[int, int]:
        """(min, max) nodes an item runs on; (1, 1) for an ordinary queue."""
        n = self.nodes_per_item
        return (n, n) if isinstance(n, int) else (n.min, n.max)

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
    # Launch decisions on bursts of short items are only as timely as the ticks: a tick that sees
    # items waiting runs again this soon (within one invocation, for at most MAX_LOOP_S) rather
    # than leaving them to the next scheduled tick. 0: only the schedule, kicks and alarms.
    waiting_tick_s: int = Field(
        10, ge=0, le=3600, description="while items wait, tick again this soon (for up to a minute a run); 0 = never"
    )
    # 0 is meaningful for the delays below (no delay); a day or more is a typo.
    scale_in_delay_s: int | None = Field(
        None, ge=0, le=DAY_S,
        description="idle time before a node may be removed; None = break-even: keep an idle node only while "
        "its next item is expected sooner than a relaunch costs",
    )
    # 0: the break-even idle rule already keeps a node whose next item is near; a cooldown after
    # every launch only adds idle time (measured in the README). Set it with a fixed delay.
    scale_out_cooldown_s: int = Field(0, ge=0, le=DAY_S, description="no scale-in this long after a scale-out")

    @property
    def scheduled_tick_s(self) -> int:
        """How often a deployed stack's schedule fires: EventBridge and Cloud Scheduler fire at most
        once a minute (and above 60 on whole minutes, a rule below), so a tick_s under 60 (the
        sandbox's fast clock, which ticks itself) is a minute there."""
        return max(60, self.tick_s)

    spot_fallback_after_s: int = Field(240, ge=0, le=DAY_S, description="spot nodes pending this long count as short")
    spot_failure_window_s: int = Field(600, ge=0, le=DAY_S, description="how long a spot launch failure is remembered")
    dry_run: bool = False
    cost_cap_usd_per_hour: float | None = Field(None, gt=0, description="whole environment")


class Network(_Model):
    subnet_ids: list[str] = Field(default_factory=list, description="existing subnets; empty = create a VPC")
    vpc_cidr: str = Field("10.80.0.0/16", description="an IPv4 network, /16 to /24")
    az_count: int = Field(2, ge=1, le=6)


class State(_Model):
    backend: Literal["local", "s3", "gcs"] = "local"
    path: str | None = Field(None, description="local backend: state file path")
    bucket: str | None = None
    key: str | None = None
    region: str | None = None
    lock_table: str | None = Field(None, description="s3 backend: DynamoDB lock table; None = S3 lockfile")


class Alerts(_Model):
    """Who the alarms reach. Without it the alarms still exist, reaching no one."""

    email: list[str] = Field(default_factory=list, description="addresses (SNS email subscriptions / GCP email channels)")
    webhooks: list[str] = Field(default_factory=list, description="https:// endpoints (SNS HTTPS / GCP webhook channels)")

class Schedule(_Model):
    """A job submitted on a schedule (README "Scheduled jobs"). The items are written inline: the
    function that submits runs no user code, and the environment file is the one thing shipped."""

    cron: str | None = Field(None, description="5-field cron, UTC: minute hour day-of-month month day-of-week")
    rate: str | None = Field(None, description="'N minutes|hours|days'")
    queue: str
    items: list[str | list[str]] = Field(min_length=1, description="as in an items file: a URI or a list of args")
    admission: Literal["skip", "queue"] = Field("skip", description="when the previous run is still going")
    timeout_s: int | None = Field(None, ge=60, le=30 * DAY_S, description="whole run; then cancelled as timed out")


class Quota(_Model):
    """Capacity a team is owed; each limit set binds (None: that resource is not limited)."""

    gpus: int | None = Field(None, ge=0, description="GPUs of the nodes its items run on")
    vcpus: int | None = Field(None, ge=0, description="vCPUs (pools with capacity_unit = 'vcpus')")
    nodes: int | None = Field(None, ge=0, description="whole nodes' worth of slots")
    usd_per_hour: float | None = Field(None, ge=0, description="spot price of the slots its items hold")

    def limits(self) -> dict[str, float]:
        return {k: v for k, v in (("gpus", self.gpus), ("vcpus", self.vcpus), ("nodes", self.nodes),
                                  ("usd_per_hour", self.usd_per_hour)) if v is not None}  # fmt: skip


class Team(_Model):
    """A team's share of capacity (README "Teams, quotas and fair share")."""

    quota: Quota = Field(Quota(), description="over the whole environment")
    pools: dict[str, Quota] = Field(default_factory=dict, description="per pool, on top of `quota`")
    weight: int = Field(1, ge=1, le=1000, description="share of capacity beyond quotas, and of a capped pool")


class Environment(_Model):
    name: str = Field(description=NAME_RULE)
    cloud: Literal["aws", "gcp"] = "aws"
    region: str
    project: str | None = Field(None, description="GCP project id")
    network: Network = Network()
    state: State = State()
    scaler: Scaler = Scaler()
    alerts: Alerts = Alerts()
    tags: dict[str, str] = Field(default_factory=dict, description="cost tags on every resource")
    shared_fs: SharedFs | None = Field(None, description="one shared file system pools may mount (pools.X.data)")
    pools: dict[str, Pool] = Field(min_length=1)
    queues: dict[str, Queue] = Field(min_length=1)
    schedules: dict[str, Schedule] = Field(default_factory=dict)
    teams: dict[str, Team] = Field(default_factory=dict, description="quotas and fair-share weights by team")
    # The path it was loaded from when given as one (`--env ./x/dev.toml`): hints name it that way.
    _path: str | None = PrivateAttr(None)

    @model_validator(mode="before")
    @classmethod
    def _gpu_pools_default_to_a_driver_image(cls, data: object) -> object:
        """A pool with GPU types and no image gets GPU_IMAGES[cloud] (only the environment knows the
        cloud); a pool on one of those images, a root disk of GPU_IMAGE_DISK_GB unless it sets disk_gb."""
        if not isinstance(data, dict) or not isinstance(data.get("pools"), dict):
            return data
        image = GPU_IMAGES.get(data.get("cloud", "aws"))  # type: ignore[call-overload]

        def has_gpus(pool: object) -> bool:
            types = pool.get("instance_types") if isinstance(pool, dict) else None
            return isinstance(types, list) and any(
                isinstance(t, dict) and type(t.get("gpus")) is int and t["gpus"] > 0 for t in types)  # fmt: skip

        pools = {name: {**pool, "image": image} if image and "image" not in pool and has_gpus(pool) else pool
                 for name, pool in data["pools"].items()}  # fmt: skip
        pools = {name: {"disk_gb": GPU_IMAGE_DISK_GB, **pool} if isinstance(pool, dict)
                 and pool.get("image") in GPU_IMAGES.values() else pool for name, pool in pools.items()}  # fmt: skip
        return {**data, "pools": pools}

    def queues_of(self, pool: str) -> dict[str, Queue]:
        return {name: q for name, q in self.queues.items() if q.pool == pool}

    def idle_timeout_s(self, pool: str) -> int | None:
        """The fixed idle timeout of a pool, or None for the break-even rule (the default)."""
        own = self.pools[pool].idle_timeout_s
        return self.scaler.scale_in_delay_s if own is None else own

    def team_of(self, queue: str) -> str:
        """The team a queue's items are counted to: its own, else its pool's."""
        q = self.queues[queue]
        return q.team if q.team is not None else self.pools[q.pool].team


def _semantic_problems(env: Environment) -> list[str]:
    """Rules that span fields; run only once every field has the right type."""
    # The names and the project id first: every cloud name is derived from them.
    out = _name_problems(env)
    names_ok = not out
    out += _region_problems(env)
    out += _network_problems(env)
    out += _state_problems(env)
    out += _tag_problems(env)
    out += _shared_fs_problems(env)
    out += _alert_problems(env.alerts)
    boot_values_ok = names_ok and not _region_problems(env)
    for name, pool in env.pools.items():
        pool_problems = _pool_problems(env, name, pool)
        out += pool_problems
        if boot_values_ok and not pool_problems:  # the boot script renders only from valid values
            out += _boot_script_size_problems(env, name)
    for name, queue in env.queues.items():
        where = f"queues.{name}"
        if blank := [i for i, pattern in enumerate(queue.accept_images) if not pattern.strip()]:
            out.append(f"{where}.accept_images[{blank[0]}]: an empty pattern matches no image (got ''); "
                       "remove it, or write one like 'ghcr.io/acme/*'")  # fmt: skip
        if queue.target_wait_s >= queue.max_wait_s:
            # Past max_wait_s the oldest-item alarm fires and the queue escalates (spot counts as short).
            out.append(f"{where}.target_wait_s: must be below max_wait_s (got {queue.target_wait_s} >= "
                       f"{queue.max_wait_s}); the oldest-item alarm would fire and escalate the queue to on-demand "
                       "before the scaler means to launch; lower target_wait_s or raise max_wait_s")  # fmt: skip
        if queue.max_wait_s >= (kept := QUEUE_RETENTION_S[env.cloud]):
            service = "SQS" if env.cloud == "aws" else "Pub/Sub"
            out.append(f"{where}.max_wait_s: must be below the {kept} s ({kept // DAY_S} days) {service} keeps a waiting "
                       f"item (got {queue.max_wait_s}); it would be dropped before the oldest-item alarm fires or the "
                       "queue escalates; lower max_wait_s, e.g. to 86400")  # fmt: skip
        if queue.preemptible and queue.min_runtime_s >= queue.item_timeout_s:
            # An attempt is killed at item_timeout_s; the scaler preempts (and moves) only those past min_runtime_s.
            out.append(f"{where}.min_runtime_s: must be below item_timeout_s on a preemptible queue (got "
                       f"{queue.min_runtime_s} >= {queue.item_timeout_s}); its items time out before they may be "
                       "preempted, so none ever would be; lower min_runtime_s or remove preemptible")  # fmt: skip
        if queue.team is not None and not re.fullmatch(NAME, queue.team):
            out.append(f"{where}.team: bad team name (got {queue.team!r}); {NAME_RULE}")
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
            out += _gang_problems(where, queue, queue.pool, pool)
            out += _gang_budget_problems(env, where, queue)
            if queue.on_demand_after_interruptions is not None and queue.gang[1] > 1:
                # Only the lead's node is chosen by the message; members join on whatever node is free.
                out.append(f"{where}.on_demand_after_interruptions: a multi-node item's members join on any node, "
                           f"spot or not (got {queue.on_demand_after_interruptions} with nodes_per_item "
                           f"{queue.nodes_per_item!r}); remove it or run the item on one node")  # fmt: skip
            if queue.preemptible and queue.gang[1] > 1:
                # The scaler marks the attempt on the lead's node; nothing stops the gang with it.
                out.append(f"{where}.preemptible: preempting a multi-node item would stop its lead alone, not its "
                           f"members on the other nodes (got true with nodes_per_item {queue.nodes_per_item!r}); "
                           "remove preemptible or run the item on one node")  # fmt: skip
    for name, schedule in env.schedules.items():
        out += _schedule_problems(env, name, schedule)
    for name, team in env.teams.items():
        out += _team_problems(env, name, team)
    tick = env.scaler.tick_s  # the schedulers fire on whole minutes (stacks: schedule_expression, schedule)
    if tick > 60 and (tick % 60 or (env.cloud == "gcp" and 60 % (tick // 60))):
        whole = "a whole number of minutes that divides an hour" if env.cloud == "gcp" else "a whole number of minutes"
        out.append(f"scaler.tick_s: above 60 it must be {whole}, as the scheduler fires on minutes (got {tick}); "
                   f"use e.g. {max(60, tick // 60 * 60) if env.cloud == 'aws' else 300}")  # fmt: skip
    cap, cheapest = env.scaler.cost_cap_usd_per_hour, min(filter(None, map(_cheapest_node, env.pools.values())), default=None)
    if cap is not None and cheapest is not None and cap < cheapest:
        out.append(f"scaler.cost_cap_usd_per_hour: below the cheapest node of any pool (got {cap}, the cheapest is "
                   f"{cheapest} USD/hour); nothing would ever launch")  # fmt: skip
    elif cap is not None and (floor := round(sum(map(_min_cost, env.pools.values())), 4)) > cap:
        out.append(f"scaler.cost_cap_usd_per_hour: below what the pools' min units cost at least ({floor} USD/hour), "
                   f"which are always kept (got {cap}); raise the cap or lower the pools' min")  # fmt: skip
    if names_ok:
        out += _derived_name_problems(env)
        out += _name_clash_problems(env)
    return out


def _team_problems(env: Environment, name: str, team: Team) -> list[str]:
    """A quota must name a team that runs somewhere, limit what its pools can measure, and leave its
    queues some slot to run on, its own or borrowed."""
    where = f"teams.{name}"
    pools = {q.pool for qname, q in env.queues.items() if q.pool in env.pools and env.team_of(qname) == name}
    if not pools:
        known = ", ".join(sorted({env.team_of(q) for q, v in env.queues.items() if v.pool in env.pools})) or "none"
        return [(f"{where}: no queue runs items of team {name!r} (teams of queues: {known}); "
                "set queues.<name>.team or pools.<name>.team, or remove the table")]  # fmt: skip
    out = []
    for pool_name in team.pools:
        if pool_name not in pools:
            out.append(f"{where}.pools.{pool_name}: team {name!r} runs no queue on this pool (got {pool_name!r}); "
                       f"its pools: {', '.join(sorted(pools))}")  # fmt: skip
    quotas = [(f"{where}.quota", team.quota, pools)] + [
        (f"{where}.pools.{p}", q, {p}) for p, q in team.pools.items() if p in pools
    ]
    for at, quota, on in quotas:
        blind = sorted(p for p in on if env.pools[p].capacity_unit != "vcpus")
        if quota.vcpus is not None and blind:
            out.append(f"{at}.vcpus: pool {blind[0]} counts {env.pools[blind[0]].capacity_unit}, not vCPUs "
                       f"(got vcpus = {quota.vcpus}); set its capacity_unit = 'vcpus' or limit gpus, nodes "
                       "or usd_per_hour")  # fmt: skip
    from tidefleet.policy.quota import never_runs  # quota.py imports this module's models

    for pool_name in sorted(pools):
        if (zero := never_runs(env, name, pool_name)) is None:
            continue
        field, limit, one_slot = zero
        queues = ", ".join(q for q, v in env.queues.items() if v.pool == pool_name and env.team_of(q) == name)
        out.append(f"{where}.{field}: {limit:g} leaves the team's queues on pool {pool_name} ({queues}) no "
                   "slot, and no other team there has a quota to lend them one, so they never run; raise it to "
                   f"at least {one_slot:g} (one slot), give another team on the pool a quota, or remove the "
                   "limit")  # fmt: skip
    return out


def _gang_problems(where: str, queue: Queue, pool_name: str, pool: Pool) -> list[str]:
    """A gang runs one member per node (torchrun's nproc_per_node = the node's slots): every type
    must be exactly one member, and the pool must be able to hold the whole gang at once."""
    low, high = queue.gang
    at = f"{where}.nodes_per_item"
    if not 1 <= low <= 1000 or not 1 <= high <= 1000:
        return [f"{at}: nodes per item must be 1 to 1000 (got {queue.nodes_per_item!r})"]
    if low > high:
        return [f"{at}: min must be <= max (got min {low} > max {high}); e.g. {{ min = 2, max = 4 }}"]
    if high == 1:
        return []
    out = []
    other = sorted({pool.slots(t) for t in pool.instance_types} - {queue.slots_per_item})
    if other:
        out.append(f"{at}: each gang member takes a whole node, so slots_per_item must equal every type's slots "
                   f"(got slots_per_item {queue.slots_per_item}, nodes with {', '.join(map(str, other))} slots in pool "
                   f"{pool_name!r}); set slots_per_item to the node's slots")  # fmt: skip
    most_units = max(t.weight for t in pool.instance_types)
    if low * most_units > pool.max > 0:  # max 0: _pool_problems names every queue of the pool
        out.append(f"{at}: a gang of {low} nodes needs {low * most_units} capacity units at once (got pool "
                   f"{pool_name!r} max {pool.max}); raise the pool's max or lower the gang's size")  # fmt: skip
    return out


def _gang_budget_problems(env: Environment, where: str, queue: Queue) -> list[str]:
    """A gang starts only once its `min` nodes run at once: a cost cap or the pool's teams' GPU
    quotas that cannot pay for them leave it waiting forever."""
    low, pool = queue.gang[0], env.pools[queue.pool]
    cheapest = _cheapest_node(pool)
    if low < 2 or cheapest is None:
        return []
    at, out = f"{where}.nodes_per_item", []
    for field, cap in ((f"pools.{queue.pool}.cost_cap_usd_per_hour", pool.cost_cap_usd_per_hour),
                       ("scaler.cost_cap_usd_per_hour", env.scaler.cost_cap_usd_per_hour)):  # fmt: skip
        if cap is not None and low * cheapest > cap:
            out.append(f"{at}: a gang of {low} nodes costs at least {round(low * cheapest, 4)} USD/hour ({low} x "
                       f"{cheapest}, the pool's cheapest node), over {field} (got {cap}); it would never start; raise "
                       "the cap or lower the gang's min")  # fmt: skip
            break
    # The pool's use is bounded by the sum of its teams' quotas (README "Teams, quotas and fair share").
    gpus = low * min(t.gpus for t in pool.instance_types)
    teams = {env.team_of(name) for name, q in env.queues.items() if q.pool == queue.pool}
    limits = {}
    for team in sorted(teams):
        own = env.teams.get(team)
        quotas = [] if own is None else [q.gpus for q in (own.quota, own.pools.get(queue.pool)) if q and q.gpus is not None]
        if not quotas:
            return out
        limits[team] = min(quotas)
    if gpus and sum(limits.values()) < gpus:
        got = ", ".join(f"teams.{team} gpus = {n}" for team, n in limits.items())
        out.append(f"{at}: a gang of {low} nodes holds at least {gpus} GPUs at once, over the {sum(limits.values())} "
                   f"the quotas of the teams on pool {queue.pool!r} allow (got {got}); it would never start; raise the "
                   f"quota to {gpus} or lower the gang's min")  # fmt: skip
    return out


def _schedule_problems(env: Environment, name: str, schedule: Schedule) -> list[str]:
    where = f"schedules.{name}"
    out = []
    if (schedule.cron is None) == (schedule.rate is None):
        out.append(f"{where}: set exactly one of 'cron' or 'rate' (got {'both' if schedule.cron else 'neither'}); "
                   "e.g. rate = \"10 hours\" or cron = \"0 3 * * *\"")  # fmt: skip
    if schedule.cron is not None and (why := schedules.cron_problem(schedule.cron)):
        out.append(f"{where}.cron: not a 5-field cron, {why} (got {schedule.cron!r}); e.g. '0 3 * * *' (03:00 UTC daily)")
    elif schedule.cron is not None and env.cloud == "aws" and "*" not in schedule.cron.split()[2::2]:
        # EventBridge Scheduler takes a day of the month or of the week, not both.
        out.append(f"{where}.cron: on aws restrict the day of month or the day of week, not both "
                   f"(got {schedule.cron!r}); set one of them to '*'")  # fmt: skip
    if schedule.rate is not None:
        period = schedules.rate_seconds(schedule.rate)
        if period is None:
            out.append(f"{where}.rate: not a rate (got {schedule.rate!r}); write 'N minutes', 'N hours' or 'N days'")
        elif env.cloud == "gcp" and (86400 % period if period < 86400 else period != 86400):
            # Cloud Scheduler takes only cron: a rate must divide the day to become one exactly.
            out.append(f"{where}.rate: on gcp a rate must divide a day evenly (got {schedule.rate!r}); "
                       "use e.g. '6 hours' or a cron")  # fmt: skip
    if schedule.queue not in env.queues:
        out.append(f"{where}.queue: unknown queue (got {schedule.queue!r}); known queues: {', '.join(sorted(env.queues))}")
    for i, item in enumerate(schedule.items):
        args = [item] if isinstance(item, str) else item
        if not args or any("\0" in a for a in args) or (isinstance(item, str) and not item.strip()):
            out.append(f"{where}.items[{i}]: an item is a URI or a non-empty list of args without NUL (got {item!r})")
    return out


def boot_script_problems(env: Environment, pool_name: str) -> list[str]:
    """The rules for every value the node boot script carries (names, region, project,
    init_script, env), for a caller that renders one without having loaded it from a file."""
    return _name_problems(env) + _region_problems(env) + _workload_problems(f"pools.{pool_name}", env.pools[pool_name])


def _boot_script_size_problems(env: Environment, pool_name: str) -> list[str]:
    """The pool's boot script over its cloud's limit (EC2 user data, a GCE metadata value): measured by
    rendering it (tidefleet.userdata.boot_script_size_problem), as synth and the sandbox will."""
    try:
        from tidefleet.userdata import boot_script_size_problem
    except ImportError:  # no jinja2: a function's archive, which renders no boot script
        return []
    return [problem] if (problem := boot_script_size_problem(env, pool_name)) else []


# What SNS and Cloud Monitoring accept as an address; the rest is the mail system's business.
EMAIL = r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)+"
# An https URL without spaces, quotes, braces or `$` (it lands in Terraform JSON, which would
# interpolate `${...}`).
WEBHOOK = r"https://[A-Za-z0-9.-]+(:[0-9]{1,5})?(/[^\s\"'<>\\{}$]*)?"


def _alert_problems(alerts: Alerts) -> list[str]:
    out = []
    for field, values, rule, fix in (
        ("email", alerts.email, EMAIL, "use an address like oncall@example.com"),
        ("webhooks", alerts.webhooks, WEBHOOK, "use an https:// URL (SNS and Cloud Monitoring refuse plain http)"),
    ):
        for i, value in enumerate(values):
            if not re.fullmatch(rule, value):
                out.append(f"alerts.{field}[{i}]: not {'an email address' if field == 'email' else 'an https URL'} "
                           f"(got {value!r}); {fix}")  # fmt: skip
        seen = [v for i, v in enumerate(values) if v in values[:i]]
        if seen:
            out.append(f"alerts.{field}: listed twice (got {seen[0]!r}); list each once")
    return out


def _region_problems(env: Environment) -> list[str]:
    regions, example = (AWS_REGIONS, "us-east-1") if env.cloud == "aws" else (GCP_REGIONS, "us-central1")
    if env.region in regions:
        return []
    return [f"region: not a known {env.cloud} region (got {env.region!r}); use one like {example!r}"]


def _a(cloud: str) -> str:
    return {"aws": "an AWS", "gcp": "a GCP"}[cloud]


def _name_problems(env: Environment) -> list[str]:
    out = []
    if not re.fullmatch(NAME, env.name):
        out.append(f"name: bad environment name (got {env.name!r}); {NAME_RULE}; rename the file")
    for kind, names in (("pools", env.pools), ("queues", env.queues), ("schedules", env.schedules), ("teams", env.teams)):
        out += [f"{kind}.{name}: bad name (got {name!r}); {NAME_RULE}" for name in names if not re.fullmatch(NAME, name)]
    if env.cloud == "gcp" and not env.project:
        out.append("project: required when cloud = 'gcp' (got nothing); set your GCP project id")
    if env.cloud == "aws" and env.project is not None:
        out.append(f"project: only for cloud 'gcp' (got {env.project!r}); remove it")
    elif env.project is not None and not re.fullmatch(GCP_PROJECT, env.project):
        out.append(f"project: not a GCP project id (got {env.project!r}); "
                   "use 6-30 lowercase letters, digits and '-', starting with a letter")  # fmt: skip
    return out


def _derived_name_problems(env: Environment) -> list[str]:
    """Every cloud name the stack derives must fit its cloud's limit: one line per config
    field, for its worst name (a long environment name overflows many at once)."""
    worst: dict[str, tuple[int, str]] = {}
    for derived in naming.derived_names(env):
        why = derived.rule.problem(derived.name)
        if why is None:
            continue
        over = len(derived.name) - derived.rule.max_len
        whose = "environment name" if derived.field == "name" else f"{derived.field.split('.')[0][:-1]} name"
        got = env.name if derived.field == "name" else derived.field.split(".", 1)[1]
        if over > 0:
            shorter = "the environment name" if derived.field == "name" else f"the {whose} or the environment name"
            fix = f"shorten {shorter} by {over} character{'s' if over > 1 else ''}"
        else:
            fix = f"change the {whose}"
        line = (f"{derived.field}: the {derived.rule.resource} name {derived.name!r} {why} "
                f"(got {whose} {got!r}); {fix}")  # fmt: skip
        if derived.field not in worst or over > worst[derived.field][0]:
            worst[derived.field] = (over, line)
    return [line for _, line in worst.values()]


# NAME_RULES labels that name the same kind of cloud resource, in one namespace.
SAME_NAMESPACE = {"Pub/Sub topic and subscription": "Pub/Sub topic"}


def _name_clash_problems(env: Environment) -> list[str]:
    """Two config fields whose derived cloud names coincide (a queue named like one of the
    stack's own, GCP pools `cpu` and `cpu-od`): the apply would stop at "already exists"."""
    owner: dict[tuple[str, str], str] = {}
    out = []
    for derived in naming.derived_names(env):
        kind = SAME_NAMESPACE.get(derived.rule.resource, derived.rule.resource)
        first = owner.setdefault((kind, derived.name), derived.field)
        if first != derived.field:
            other, fix = ("the stack's own", f"rename {derived.field.split('.', 1)[1]!r}") if first == "name" else (
                f"{first}'s", "rename one of them")
            line = f"{derived.field}: the {kind} name {derived.name!r} is also {other}; {fix}"
            out += [line] if line not in out else []
    return out


# Cloud resources named once per account (AWS) or project (GCP), whatever the region: IAM, buckets,
# and GCP's global ones. Every other kind is named once per region.
ACCOUNT_WIDE = {("aws", "IAM role"), ("aws", "IAM instance profile"),
                ("aws", "S3 artifacts bucket (with a 12-digit account id)")}  # fmt: skip
REGIONAL_GCP = {"Cloud Function", "managed instance group", "MIG base instance", "Cloud Scheduler job", "KMS key ring",
                "KMS key"}  # fmt: skip


def environment_clashes(envs: dict[str, Environment]) -> list[str]:
    """Pairs of environments (by the name they were loaded as) whose stacks would create a cloud
    resource of the same name if deployed to one account (AWS: any region for IAM roles and the
    bucket, the same region otherwise) or one GCP project: env `a` with pool `b-c` and env `a-b`
    with pool `c` both name a group `tidefleet-a-b-c`; one file name in two folders clashes
    everywhere. One line per pair, naming the first clash; validate can only warn, as it cannot
    know the accounts they deploy to."""
    owners: dict[tuple, tuple[str, str]] = {}
    clashes: dict[tuple[str, str], list[tuple[str, str, str, str]]] = {}
    for loaded_as, env in envs.items():
        for derived in naming.derived_names(env):
            kind = SAME_NAMESPACE.get(derived.rule.resource, derived.rule.resource)
            wide = (env.cloud, kind) in ACCOUNT_WIDE or (env.cloud == "gcp" and kind not in REGIONAL_GCP)
            key = (env.cloud, env.project if env.cloud == "gcp" else None, None if wide else env.region, kind, derived.name)
            first, field = owners.setdefault(key, (loaded_as, derived.field))
            if first != loaded_as:
                clashes.setdefault((first, loaded_as), []).append((kind, derived.name, field, derived.field))
    out = []
    for (a, b), found in clashes.items():
        kind, name, field_a, field_b = found[0]
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        where = f"project {envs[a].project}" if envs[a].cloud == "gcp" else "one AWS account"
        fields = " or ".join(dict.fromkeys(f.split(".")[0][:-1] for f in (field_a, field_b) if f != "name"))
        rename = f"one of them (its file) or the {fields}" if fields else "one of them (its file)"
        out.append(f"environments {a} and {b} would both create the {kind} {name!r}{more} if deployed to {where} "
                   f"({a}: {field_a}, {b}: {field_b}); rename {rename}, or deploy them apart")
    return out


def environment_warnings(env: Environment) -> list[str]:
    """What validate says of a file that can deploy but may not do what its author expects."""
    return (instance_type_warnings(env) + _split_gang_warnings(env) + _unused_gpu_warnings(env)
            + _team_warnings(env) + registries.warnings(env))  # fmt: skip


def _team_warnings(env: Environment) -> list[str]:
    """With [teams]: a team a queue names (or its pool does) that has no table, likely a typo, whose
    items would count to no quota and be owed their whole demand; and a preemptible queue that no
    queue of its pool outranks, which nothing can ever preempt (but consolidation's moves, where
    the pool has `checkpoint_and_move`)."""
    out = []
    for name, queue in env.queues.items():
        team = env.team_of(name)
        if env.teams and team != "default" and team not in env.teams:
            at = f"queues.{name}.team" if queue.team is not None else f"pools.{queue.pool}.team"
            close = difflib.get_close_matches(team, sorted(env.teams), n=1, cutoff=0.6)
            guess = f"did you mean {close[0]!r}? " if close else ""
            out.append(f"{at}: team {team!r} has no [teams.{team}] table, so its items count to no quota and are owed "
                       f"their whole demand; {guess}add the table or name a team that has one")  # fmt: skip
        outranked = any(q.pool == queue.pool and q.priority > queue.priority for q in env.queues.values())
        if queue.preemptible and not outranked and not env.pools[queue.pool].checkpoint_and_move:  # moves use it too
            out.append(f"queues.{name}.preemptible: no queue of pool {queue.pool} has a priority above {queue.priority}, "
                       "so nothing ever preempts it; give the queue that should a higher priority")  # fmt: skip
    return out


def _unused_gpu_warnings(env: Environment) -> list[str]:
    """GPUs a pool pays for and never hands an item: fewer declared than its type has (`built_in_gpus`),
    or none, when the pool also boots no NVIDIA driver. A warning: such a pool runs (its items on the CPUs)."""
    out = []
    for name, pool in env.pools.items():
        for i, itype in enumerate(pool.instance_types):
            at, built_in = f"pools.{name}.instance_types[{i}].gpus", built_in_gpus(env.cloud, itype.type)
            unused = ", and the pool would boot no NVIDIA driver" if not itype.gpus else ""
            if built_in is not None and itype.gpus < built_in and (env.cloud == "aws" or not itype.gpus):
                out.append(f"{at}: {itype.type} has {built_in} GPU{'s' * (built_in != 1)} (got {itype.gpus or 'none'}); "
                           f"the pool would pay for {built_in - itype.gpus} that never run an item{unused}; set gpus "
                           f"= {built_in} (slots_per_item takes several per item), or pick a type without GPUs")  # fmt: skip
            elif built_in is None and env.cloud == "aws" and not itype.gpus:
                out.append(f"{at}: {itype.type} is a GPU type (family {itype.type.split('.')[0]}) (got none); its "
                           f"GPUs would never run an item{unused}; set gpus to its GPU count, or pick a type without "
                           "GPUs")  # fmt: skip
    return out


def _split_gang_warnings(env: Environment) -> list[str]:
    """A GCP cluster pool without a zone: its Spot and on-demand groups each pick their own zone
    (ANY_SINGLE_ZONE), so a gang on both kinds of node (a Spot shortage moves capacity to the
    on-demand group) may span two zones: slower and billed traffic between its ranks."""
    return [f"pools.{name}.zone: a cluster pool on gcp without a zone: its Spot and on-demand groups each pick their "
            f"own, so a gang on both kinds of node may span two zones; set zone (e.g. {env.region}-b, a zone that "
            f"offers its types) to keep every node in one"
            for name, pool in env.pools.items() if env.cloud == "gcp" and pool.placement == "cluster" and not pool.zone]  # fmt: skip


def instance_type_warnings(env: Environment) -> list[str]:
    """AWS instance types neither prices.SPECS nor the installed botocore knows: a typo (g5.xlarg) that
    passes with prices set, until plan asks EC2. Warnings, not problems: a type newer than the
    installed botocore is real, and refusing it would stop a valid file (and, in load_environment,
    the scaler and the agents). botocore's list is loaded only for a type SPECS lacks."""
    unknown = [(f"pools.{name}.instance_types[{i}].type", t.type) for name, pool in env.pools.items()
               for i, t in enumerate(pool.instance_types) if env.cloud == "aws" and t.type not in prices.SPECS]  # fmt: skip
    if not unknown:
        return []
    from tidefleet.cloud import aws_instance_types

    botocore, known = aws_instance_types()
    out = []
    for at, name in unknown:
        if name in known:
            continue
        close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.75)
        guess = f" (did you mean {close[0]!r}?)" if close else ""
        out.append(f"{at}: {botocore} knows no EC2 instance type {name!r}{guess}; fix the type, or if it is a type "
                   f"newer than {botocore} knows, upgrade boto3")  # fmt: skip
    return out


def _network_problems(env: Environment) -> list[str]:
    out = []
    cidr = env.network.vpc_cidr
    try:
        network = ipaddress.ip_network(cidr, strict=True)
    except ValueError:
        out.append(f"network.vpc_cidr: not a network (got {cidr!r}); write one like '10.80.0.0/16', host bits zero")
    else:
        # The stack carves /(prefix+4) subnets out of it: AWS subnets are /28 at the smallest.
        if network.version != 4 or not 16 <= network.prefixlen <= 24:
            out.append(f"network.vpc_cidr: must be an IPv4 network from /16 to /24 (got {cidr!r}); e.g. '10.80.0.0/16'")
        elif (network.is_loopback or network.is_link_local or network.is_multicast or network.is_reserved
              or network.subnet_of(ipaddress.ip_network("0.0.0.0/8"))):  # fmt: skip
            out.append(f"network.vpc_cidr: a loopback, link-local, multicast or reserved range, which neither cloud "
                       f"gives a network (got {cidr!r}); use a private one such as '10.80.0.0/16'")  # fmt: skip
        elif not env.network.subnet_ids:
            out += _address_problems(env, network)
    given = env.network.model_fields_set
    zones = AWS_ZONES.get(env.region, AWS_ZONES_USUAL)
    if env.cloud == "aws" and env.network.az_count > zones and env.region in AWS_REGIONS:
        out.append(f"network.az_count: {env.region} has {zones} availability zones (got {env.network.az_count}); "
                   f"the other subnets would land in zones already used; use at most {zones}")  # fmt: skip
    if env.cloud == "gcp" and "az_count" in given:
        out.append(f"network.az_count: not read on gcp (got {env.network.az_count}); a regional managed instance "
                   "group spreads over the region's zones itself; remove it")  # fmt: skip
    if env.network.subnet_ids:  # the stack creates no network: its shape is not read
        out += [f"network.{field}: not read with subnet_ids, as the stack creates no network "
                f"(got {getattr(env.network, field)!r}); remove it" for field in ("vpc_cidr", "az_count") if field in given]
    if repeated := sorted({s for s in env.network.subnet_ids if env.network.subnet_ids.count(s) > 1}):
        out.append(f"network.subnet_ids: {', '.join(repeated)} listed twice; list each subnet once")
    subnet_rule, example = (AWS_SUBNET, "subnet-0123456789abcdef0") if env.cloud == "aws" else (GCP_SUBNET, "nodes")
    for i, subnet in enumerate(env.network.subnet_ids):
        if not re.fullmatch(subnet_rule, subnet):
            out.append(f"network.subnet_ids[{i}]: not {_a(env.cloud)} subnet (got {subnet!r}); use one like {example!r}")
        elif env.cloud == "gcp" and (region := re.search(r"/regions/([^/]+)/", subnet)) and region[1] != env.region:
            out.append(f"network.subnet_ids[{i}]: a subnetwork of {region[1]}, but the environment's instance groups "
                       f"are in {env.region} and take their own region's only (got {subnet!r}); use one of {env.region}")  # fmt: skip
    if env.cloud == "gcp" and len(env.network.subnet_ids) > 1:  # stacks/gcp/stack.py: one instance template, one subnetwork
        out.append(f"network.subnet_ids: a GCE instance template has one subnetwork, the first would be used and the "
                   f"others never (got {env.network.subnet_ids}); list one")  # fmt: skip
    if env.cloud == "aws" and not env.network.subnet_ids:
        # stacks/aws/network.py: nodes launch in private subnets whose egress is the NAT gateway.
        out += [f"pools.{name}.public_ip: the VPC the stack creates puts nodes in private subnets, where a public IP "
                "is never reached (their traffic leaves through its NAT gateway) (got true); remove it, or launch in "
                "public subnets of your own with network.subnet_ids" for name, pool in env.pools.items() if pool.public_ip]  # fmt: skip
    return out


# stacks/aws/network.py splits vpc_cidr into /(prefix+4) subnets: a public one (the NAT gateway) and one
# private subnet per zone (az_count), where the nodes launch; a cluster-placement pool launches in the first
# only (stacks/aws/pool.py). The GCP stack makes vpc_cidr one subnet (stacks/gcp/stack.py). Each node takes
# an address, and the cloud keeps some of every subnet. (A file system's mount targets take a few more.)
SUBNET_RESERVED_ADDRESSES = {"aws": 5, "gcp": 4}


def _address_problems(env: Environment, network: ipaddress.IPv4Network | ipaddress.IPv6Network) -> list[str]:
    """The nodes the pools' max allows need an address each in the subnets the stack makes of vpc_cidr."""
    nodes = {name: -(-pool.max // min(t.weight for t in pool.instance_types)) for name, pool in env.pools.items()}
    if max(nodes.values()) > MAX_GROUP_NODES[env.cloud]:
        return []  # that pool's max is refused as such (_pool_problems)
    cloud, keeps = env.cloud, SUBNET_RESERVED_ADDRESSES[env.cloud]
    spread = sum(nodes.values())
    cluster = sum(n for name, n in nodes.items() if cloud == "aws" and env.pools[name].placement == "cluster")

    def room(prefix: int) -> tuple[int, int]:
        """(addresses of the first node subnet, of all of them) for a vpc_cidr of this prefix."""
        if cloud == "gcp":
            return (2 ** (32 - prefix) - keeps,) * 2
        one = 2 ** (28 - prefix) - keeps
        return one, one * env.network.az_count

    def fits(prefix: int) -> bool:
        first, every = room(prefix)
        return spread <= every and cluster <= first

    if fits(network.prefixlen):
        return []
    first, every = room(network.prefixlen)
    larger = next((p for p in range(network.prefixlen - 1, 15, -1) if fits(p)), None)
    if larger:
        fix = f"use a larger vpc_cidr (e.g. '{network.supernet(new_prefix=larger)}') or your own subnet_ids"
    elif cloud == "aws" and cluster <= room(16)[0] and env.network.az_count < AWS_ZONES.get(env.region, AWS_ZONES_USUAL):
        # More zones, more subnets (but not for the first one's cluster pools).
        fix = f"no vpc_cidr up to a /16 holds them in {env.network.az_count} zones; raise az_count or use your own subnet_ids"
    else:
        fix = "no vpc_cidr up to a /16 holds them; use your own subnet_ids"
    got = f"(got {str(network)!r}); {fix}"
    if cluster > first:
        return [(f"network.vpc_cidr: the first private subnet, where cluster-placement pools launch, holds {first} node "
                f"addresses (a /{network.prefixlen + 4} less the {keeps} AWS keeps), fewer than the {cluster} their max "
                f"needs {got}")]  # fmt: skip
    split = (f"{env.network.az_count} private /{network.prefixlen + 4} subnets less the {keeps} AWS keeps in each"
             if cloud == "aws" else f"one subnet less the {keeps} GCP keeps")  # fmt: skip
    return [f"network.vpc_cidr: holds {every} node addresses ({split}), fewer than the {spread} the pools' max needs {got}"]


# Per cloud, the state backends its stack writes; per backend, the [state] settings it reads
# (stacks/<cloud>/stack.py `_backend`): any other would be dropped without a word.
STATE_BACKENDS = {"aws": ("local", "s3"), "gcp": ("local", "gcs")}
STATE_SETTINGS = {"local": ("path",), "s3": ("bucket", "key", "region", "lock_table"), "gcs": ("bucket", "key")}


def _state_problems(env: Environment) -> list[str]:
    out = []
    state = env.state
    if state.backend not in STATE_BACKENDS[env.cloud]:
        usable = " or ".join(repr(b) for b in STATE_BACKENDS[env.cloud])
        out.append(f"state.backend: not available on {env.cloud} (got {state.backend!r}); use {usable}")
    if state.backend in ("s3", "gcs") and not state.bucket:
        out.append(f"state.bucket: required for backend {state.backend!r} (got nothing)")
    for field in ("path", "bucket", "key", "region", "lock_table"):
        value = getattr(state, field)
        if value is not None and field not in STATE_SETTINGS[state.backend]:
            readers = " or ".join(repr(b) for b, fields in STATE_SETTINGS.items() if field in fields)
            out.append(f"state.{field}: not read by backend {state.backend!r} (got {value!r}); remove it, or use "
                       f"backend {readers}")  # fmt: skip
    if state.bucket and not re.fullmatch(r"[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]", state.bucket):
        out.append(f"state.bucket: not a bucket name (got {state.bucket!r}); use 3-63 lowercase a-z, 0-9, '.' and '-'")
    if state.region is not None and state.backend == "s3" and state.region not in AWS_REGIONS:
        out.append(f"state.region: not a known aws region (got {state.region!r}); use one like 'us-east-1'")
    if state.lock_table is not None and not re.fullmatch(r"[A-Za-z0-9_.-]{3,255}", state.lock_table):
        out.append(f"state.lock_table: not a DynamoDB table name (got {state.lock_table!r}); use 3-255 of a-z, A-Z, 0-9, '_.-'")
    for field, value in (("path", state.path), ("key", state.key)):
        if value is not None and (not value or any(c in value for c in "\n\r\0")):
            out.append(f"state.{field}: must be a non-empty single line (got {value!r})")
    return out


def _tag_problems(env: Environment) -> list[str]:
    """One line per bad tag. On GCP tags become labels, so they must already be valid labels
    (lowercasing or replacing characters silently would merge or rename them)."""
    out = []
    for key, value in env.tags.items():
        where = f"tags.{key}"
        if key.lower().startswith(RESERVED_TAG_PREFIXES):
            out.append(f"{where}: reserved tag key (got {key!r}); keys starting {', '.join(RESERVED_TAG_PREFIXES)} "
                       "belong to the cloud or to tidefleet")  # fmt: skip
        elif env.cloud == "aws" and not (1 <= len(key) <= 128 and re.fullmatch(AWS_TAG, key)):
            out.append(f"{where}: not an AWS tag key (got {key!r}); use 1-128 letters, digits, spaces and _.:/=+-@")
        elif env.cloud == "aws" and not (len(value) <= 256 and re.fullmatch(AWS_TAG, value)):
            out.append(f"{where}: not an AWS tag value (got {value!r}); use at most 256 letters, digits, spaces and _.:/=+-@")
        elif env.cloud == "gcp" and not re.fullmatch(GCP_LABEL_KEY, key):
            out.append(f"{where}: not a GCP label key (got {key!r}); use 1-63 lowercase a-z, 0-9, '_' and '-', "
                       "starting with a letter")  # fmt: skip
        elif env.cloud == "gcp" and not re.fullmatch(GCP_LABEL_VALUE, value):
            out.append(f"{where}: not a GCP label value (got {value!r}); use at most 63 lowercase a-z, 0-9, '_' and '-'")
    limit, added = TAG_LIMITS[env.cloud], STACK_TAGS[env.cloud]
    if len(env.tags) + len(added) > limit:
        kind, cloud = ("tags", "AWS's") if env.cloud == "aws" else ("labels", "GCP's")
        out.append(f"tags: with the {len(added)} {kind} deploying adds ({', '.join(added)}) a resource would carry "
                   f"{len(env.tags) + len(added)}, over {cloud} {limit} {kind} per resource (got {len(env.tags)}); "
                   f"keep at most {limit - len(added)}")  # fmt: skip
    return out


def _pool_problems(env: Environment, name: str, pool: Pool) -> list[str]:
    where = f"pools.{name}"
    out: list[str] = []
    if pool.min > pool.max:
        out.append(f"{where}.max: must be >= min (got {pool.max} < {pool.min})")
    if pool.on_demand_base > pool.max:
        out.append(f"{where}.on_demand_base: must be <= max (got {pool.on_demand_base} > {pool.max})")
    queues = [q for q, queue in env.queues.items() if queue.pool == name]
    if pool.max == 0 and queues:
        # Any max >= 1 launches a node of any type (a group fills its desired units even past max by
        # a node's weight; a GCP group rounds units up to nodes), and every type fits one item
        # (queues.<name>.slots_per_item); a gang's min nodes are checked by _gang_problems.
        small = min(pool.instance_types, key=lambda t: t.weight)
        s = "s" * (len(queues) > 1)
        out.append(f"{where}.max: 0 launches no node, so the items of queue{s} {', '.join(map(repr, queues))} can "
                   f"never run (got 0); raise max to at least {small.weight} (one {small.type} node) or move the "
                   f"queue{s} to another pool")  # fmt: skip
    smallest = min(t.weight for t in pool.instance_types)
    most_nodes, limit = -(-pool.max // smallest), MAX_GROUP_NODES[env.cloud]
    if most_nodes > limit:
        group = "an Auto Scaling group" if env.cloud == "aws" else "a regional managed instance group"
        out.append(f"{where}.max: {most_nodes} nodes of weight {smallest} is over the {limit} of {group} "
                   f"(got {pool.max}); lower max or split the pool")  # fmt: skip
    if pool.boot_estimate_s > pool.boot_timeout_s:
        out.append(f"{where}.boot_estimate_s: must be <= boot_timeout_s (got {pool.boot_estimate_s} > "
                   f"{pool.boot_timeout_s}); a typical boot cannot take longer than the timeout")  # fmt: skip
    if pool.checkpoint_and_move and not any(q.preemptible and q.pool == name for q in env.queues.values()):
        out.append(f"{where}.checkpoint_and_move: no queue of pool {name!r} is preemptible, so nothing can move "
                   "(got true); set preemptible = true on the queues whose items checkpoint, or remove it")  # fmt: skip
    if not re.fullmatch(NAME, pool.team):
        out.append(f"{where}.team: bad team name (got {pool.team!r}); {NAME_RULE}")
    out += _workload_problems(where, pool)
    if env.cloud == "aws" and len(pool.instance_types) > AWS_MAX_INSTANCE_TYPES:
        out.append(f"{where}.instance_types: an Auto Scaling group's mixed instances policy takes at most "
                   f"{AWS_MAX_INSTANCE_TYPES} instance types (got {len(pool.instance_types)}); drop the least wanted "
                   "or split them into two pools")  # fmt: skip
    seen: set[str] = set()
    type_rule = AWS_INSTANCE_TYPE if env.cloud == "aws" else GCP_MACHINE_TYPE
    for i, itype in enumerate(pool.instance_types):
        at = f"{where}.instance_types[{i}]"
        if itype.type in seen:
            out.append(f"{at}.type: duplicate instance type (got {itype.type!r}); list each type once")
        seen.add(itype.type)
        if not re.fullmatch(type_rule, itype.type):
            out.append(f"{at}.type: not {_a(env.cloud)} instance type (got {itype.type!r})")
            continue
        if env.cloud == "aws" and itype.weight > AWS_MAX_WEIGHT:
            out.append(f"{at}.weight: an Auto Scaling group takes a type's weight (WeightedCapacity) up to "
                       f"{AWS_MAX_WEIGHT} (got {itype.weight}); count capacity in a larger unit (capacity_unit "
                       "'nodes' or 'gpus') or scale every weight of the pool down")  # fmt: skip
        if pool.capacity_unit == "gpus" and itype.weight != itype.gpus:
            out.append(
                f"{at}.weight: with capacity_unit 'gpus' the weight is the GPU count "
                f"(got weight {itype.weight}, gpus {itype.gpus})"
            )
        vcpus = prices.SPECS[itype.type][0] if itype.type in prices.SPECS else None
        if pool.capacity_unit == "vcpus" and vcpus is not None and itype.weight != vcpus:
            out.append(f"{at}.weight: with capacity_unit 'vcpus' the weight is the vCPU count, and {itype.type} has "
                       f"{vcpus} (got weight {itype.weight}); set weight = {vcpus}")  # fmt: skip
        missing = [f for f, spot in (("on_demand_price", False), ("spot_price", True)) if itype.price(spot) is None]
        # An N1 machine's built-in price is the machine's alone: its attached GPUs cost many times more
        # (4 V100s: about $10/h against the machine's $0.38), and cost, caps and the simulator read it.
        unpriced_gpus = [f for f, own in (("on_demand_price", itype.on_demand_price), ("spot_price", itype.spot_price))
                         if own is None] if itype.accelerator and itype.type.startswith("n1-") else []  # fmt: skip
        if missing:
            out.append(f"{at}.{missing[0]}: no built-in price for {itype.type!r}; set {' and '.join(missing)} in USD/hour")
        elif unpriced_gpus:
            out.append(f"{at}.{unpriced_gpus[0]}: the built-in price of {itype.type} is the machine's alone, without its "
                       f"{itype.gpus} attached {itype.accelerator}; set {' and '.join(unpriced_gpus)} in USD/hour, "
                       "machine and GPUs together")  # fmt: skip
        out += _gpu_slot_problems(at, pool, itype)
        # A node that shows fewer GPUs than declared takes no items (agent/gpus.py): never runs anything.
        # (GCP attaches accelerators to N1 types, and names the others' own: only built-in ones are known here.)
        built_in = built_in_gpus(env.cloud, itype.type)
        has = f"{itype.type} has {built_in} GPU{'s' * (built_in != 1)}"
        if built_in is not None and itype.gpus > built_in and (env.cloud == "aws" or built_in):
            out.append(f"{at}.gpus: {has} (got {itype.gpus}); its nodes would take no items; set gpus = {built_in} "
                       f"or pick a type with {itype.gpus}")  # fmt: skip
        elif env.cloud == "gcp" and built_in is not None and 0 < itype.gpus < built_in:  # fewer, none: a warning
            out.append(f"{at}.gpus: {has} (got {itype.gpus}); GCE refuses a template that attaches fewer than the "
                       f"type's own; set gpus = {built_in} (slots_per_item takes several per item)")  # fmt: skip
        if env.cloud == "aws" and itype.accelerator:
            out.append(f"{at}.accelerator: only for cloud 'gcp' (got {itype.accelerator!r})")
    with_gpus = [t.type for t in pool.instance_types if t.gpus]
    if env.cloud == "aws" and 0 < len(with_gpus) < len(pool.instance_types):  # gcp: _gcp_pool_problems says it
        without = ", ".join(t.type for t in pool.instance_types if not t.gpus)
        out.append(f"{where}.instance_types: mixes types with GPUs ({', '.join(with_gpus)}) and without ({without}); "
                   "items that need a GPU would land on nodes without one, and one image boots the pool; split "
                   "them into pools")  # fmt: skip
    if env.cloud == "gcp":
        out += _gcp_pool_problems(where, pool)
    out += _data_problems(env, where, pool)
    if env.cloud == "aws" and not re.fullmatch(AWS_IMAGE, pool.image):
        out.append(f"{where}.image: not an AMI id or ssm:/ parameter (got {pool.image!r})")
    if boot := _boot_image_problems(env, where, pool):
        out += boot
    elif any(t.gpus for t in pool.instance_types) and pool.image.startswith(DRIVERLESS_IMAGES) and not pool.init_script.strip():
        out.append(f"{where}.image: a plain OS image has no NVIDIA driver, so nodes of the pool's GPU types would find "
                   f"no GPU and be replaced forever (got {pool.image!r}); remove image (the default for GPU types is "
                   f"{GPU_IMAGES[env.cloud]!r}), or install the driver in init_script")  # fmt: skip
    if pool.spot_max_price is not None and pool.spot_max_price < min(
        t.price(True) or float("inf") for t in pool.instance_types
    ):
        out.append(f"{where}.spot_max_price: below every type's spot price (got {pool.spot_max_price}); spot would never launch")
    cheapest = _cheapest_node(pool)
    if pool.cost_cap_usd_per_hour is not None and cheapest is not None and pool.cost_cap_usd_per_hour < cheapest:
        out.append(f"{where}.cost_cap_usd_per_hour: below the pool's cheapest node (got {pool.cost_cap_usd_per_hour}, "
                   f"the cheapest is {cheapest} USD/hour); the pool would never launch")  # fmt: skip
    elif pool.cost_cap_usd_per_hour is not None and (floor := _min_cost(pool)) > pool.cost_cap_usd_per_hour:
        out.append(f"{where}.min: {pool.min} units cost at least {floor} USD/hour, above the pool's "
                   f"cost_cap_usd_per_hour {pool.cost_cap_usd_per_hour}, and the group is always kept at min (got "
                   f"min {pool.min}); lower min or raise the cap")  # fmt: skip
    return out


def _boot_image_problems(env: Environment, where: str, pool: Pool) -> list[str]:
    """An image the boot script cannot run on: another OS than it installs Python with, another architecture."""
    if env.cloud == "gcp":
        return _gcp_boot_image_problems(where, pool) or _architecture_problems(env, where, pool)
    if not pool.image.startswith("ssm:/aws/service/"):
        return _architecture_problems(env, where, pool)  # an AMI id or the user's own parameter says nothing of its OS
    if re.search(AWS_OTHER_OS_IMAGE, pool.image.lower()):
        al2023 = GPU_IMAGES["aws"] if any(t.gpus for t in pool.instance_types) else Pool.model_fields["image"].default
        return [(f"{where}.image: the boot script needs Amazon Linux 2023 (dnf, python3.11) and stops before init_script "
                f"on another OS (got {pool.image!r}); use an al2023 or Deep Learning AL2023 parameter, e.g. {al2023!r}")]  # fmt: skip
    arch = re.search(r"arm64|x86_64", pool.image)
    other = [t.type for t in pool.instance_types if arch and architecture("aws", t.type) != arch[0]]
    if not arch or not other:
        return []
    mine, theirs = arch[0], {"arm64": "x86_64", "x86_64": "arm64"}[arch[0]]
    theirs_image = pool.image.replace(mine, theirs)
    fix = (f"move them to a pool of their own with the {theirs} parameter ({theirs_image!r}), as one image serves a pool"
           if len(other) < len(pool.instance_types) else f"use the {theirs} parameter ({theirs_image!r}) or {mine} instance types")  # fmt: skip
    return [f"{where}.image: an {mine} image cannot boot {', '.join(other)} ({theirs}) (got {pool.image!r}); {fix}"]


def architecture(cloud: str, instance_type: str) -> str:
    """"arm64" or "x86_64": what an instance type boots (`AWS_ARM64_FAMILY`, `GCP_ARM64_FAMILY`)."""
    family, arm = (instance_type.split(".")[0], AWS_ARM64_FAMILY) if cloud == "aws" else (instance_type.split("-")[0], GCP_ARM64_FAMILY)
    return "arm64" if re.fullmatch(arm, family) else "x86_64"


def _architecture_problems(env: Environment, where: str, pool: Pool) -> list[str]:
    """A pool boots one image, which runs on one architecture: its types must share it, whatever the
    image, and on GCP a public image's (x86_64 unless its name says arm64) is known."""
    by_arch: dict[str, list[str]] = {}
    for itype in pool.instance_types:
        by_arch.setdefault(architecture(env.cloud, itype.type), []).append(itype.type)
    if len(by_arch) > 1:
        return [(f"{where}.instance_types: mixes x86_64 types ({', '.join(by_arch['x86_64'])}) and arm64 types "
                f"({', '.join(by_arch['arm64'])}), but the pool boots one image, which runs on one architecture; "
                "move the arm64 types to a pool of their own with an arm64 image")]  # fmt: skip
    public = env.cloud == "gcp" and re.fullmatch(GCP_IMAGE, pool.image) and pool.image.split("/")[1] in GCP_APT_PROJECTS
    if not public:
        return []
    image_arch = "arm64" if "arm64" in pool.image.rsplit("/", 1)[1] else "x86_64"
    (types_arch, types), = by_arch.items()
    if types_arch == image_arch:
        return []
    return [(f"{where}.image: an {image_arch} image cannot boot {', '.join(types)} ({types_arch}) (got {pool.image!r}); "
            f"use an {types_arch} image{' (its name ends in -arm64, e.g. debian-12-arm64)' if types_arch == 'arm64' else ''} "
            f"or {image_arch} machine types")]  # fmt: skip


def _gcp_boot_image_problems(where: str, pool: Pool) -> list[str]:
    if "image" not in pool.model_fields_set or not re.fullmatch(GCP_IMAGE, pool.image):
        return []  # said by _gcp_pool_problems
    project, name = pool.image.split("/")[1], pool.image.rsplit("/", 1)[1]
    if project in GCP_NO_APT_PROJECTS or (project in GCP_APT_PROJECTS and re.search(GCP_OLD_PYTHON_IMAGE, name)):
        image = GPU_IMAGES["gcp"] if any(t.gpus for t in pool.instance_types) else GCP_DEFAULT_IMAGE
        return [(f"{where}.image: the boot script needs apt-get and python3 >= 3.11 (Debian 12+, Ubuntu 24.04+) and "
                f"stops before init_script without them (got {pool.image!r}); use e.g. {image!r}")]  # fmt: skip
    return []


def _min_cost(pool: Pool) -> float:
    """The least USD/hour the pool's `min` units cost (each at the cheapest unit price, spot or
    on-demand); 0 without a min or any price."""
    unit = min((p / t.weight for t in pool.instance_types for p in (t.price(True), t.price(False)) if p is not None),
               default=0.0)  # fmt: skip
    return round(pool.min * unit, 4)


def built_in_gpus(cloud: str, instance_type: str) -> int | None:
    """The GPUs an instance type comes with; None where not known here: an EC2 type of a GPU family
    that `prices.SPECS` does not list, a GCE N1 type (its GPUs are attached, `accelerator`)."""
    if instance_type in prices.SPECS and not instance_type.startswith("n1-"):
        return prices.SPECS[instance_type][2]
    if cloud == "aws":
        return None if re.fullmatch(AWS_GPU_FAMILY, instance_type.split(".")[0]) else 0
    family, last = instance_type.split("-")[0], instance_type.rsplit("-", 1)[-1]
    if family == "n1":
        return None
    if family in GCP_GPUS_BY_VCPUS:
        return GCP_GPUS_BY_VCPUS[family].get(int(last)) if last.isdigit() else None
    if family in GCP_GPUS:
        return int(last[:-1]) if re.fullmatch(r"\d+g", last) else None
    return 0


def _cheapest_node(pool: Pool) -> float | None:
    """USD/hour of the pool's cheapest node, spot or on-demand; None without any price."""
    return min((p for t in pool.instance_types for p in (t.price(True), t.price(False)) if p is not None), default=None)


def _gpu_slot_problems(at: str, pool: Pool, itype: InstanceType) -> list[str]:
    """Slots map to GPUs (tidefleet/agent/gpus.py): whole GPUs per slot, or slots per GPU when shared."""
    slots, gpus = pool.slots(itype), itype.gpus
    if not gpus:
        return []
    if slots % gpus and gpus % slots:
        return [(f"{at}: {slots} slots cannot split {gpus} GPUs evenly (got weight {itype.weight} x slots_per_unit "
                f"{pool.slots_per_unit}); make one a multiple of the other")]  # fmt: skip
    if slots > gpus and not pool.gpu_sharing:
        return [(f"{at}: {slots} slots on {gpus} GPU{'s' * (gpus != 1)} would put several items on one GPU (got slots_per_unit "
                f"{pool.slots_per_unit}); set gpu_sharing = true on the pool (items then share GPU memory) "
                "or lower slots_per_unit")]  # fmt: skip
    return []


def _data_problems(env: Environment, where: str, pool: Pool) -> list[str]:
    """Data locations, the shared file system and the placement a pool asks for."""
    out = []
    scheme, bucket_rule = ("s3", S3_BUCKET) if env.cloud == "aws" else ("gs", GCS_BUCKET)
    for field in ("read", "write"):
        for i, uri in enumerate(getattr(pool.data, field)):
            at, got = f"{where}.data.{field}[{i}]", f"(got {uri!r})"
            bucket, _, prefix = uri.partition("://")[2].partition("/")
            if not uri.startswith(f"{scheme}://"):
                out.append(f"{at}: not {'an' if scheme == 's3' else 'a'} {scheme}:// location {got}; write one like '{scheme}://team-data/datasets/'")
            elif not re.fullmatch(bucket_rule, bucket):
                out.append(f"{at}: not a bucket name {got}; 3-63 lowercase letters, digits, '-' and '.'")
            elif (prefix and not prefix.endswith("/")) or any(c in prefix for c in "*?") or ".." in prefix.split("/"):
                out.append(f"{at}: a prefix must be a folder ending in '/' without '*', '?' or '..' {got}; "
                           f"e.g. '{scheme}://{bucket}/datasets/' (or '{scheme}://{bucket}/' for the whole bucket)")  # fmt: skip
    mount = pool.data.shared_fs_mount
    if mount is not None:
        if env.shared_fs is None:
            out.append(f"{where}.data.shared_fs_mount: no [shared_fs] in this environment (got {mount!r}); "
                       "add one (kind = 'efs', 'fsx-lustre' or 'filestore') or remove the mount")  # fmt: skip
        if (not re.fullmatch(r"/[A-Za-z0-9._/-]+", mount) or mount.rstrip("/") in SYSTEM_DIRS or ".." in mount.split("/")
                or f"{mount.rstrip('/')}/".startswith(SYSTEM_TREES)):  # fmt: skip
            out.append(f"{where}.data.shared_fs_mount: must be an absolute path of its own, not a system folder or one "
                       f"inside it, nor the agent's /opt/tidefleet (got {mount!r}); e.g. '/mnt/shared'")  # fmt: skip
    if pool.gpu_sharing and not any(t.gpus for t in pool.instance_types):
        out.append(f"{where}.gpu_sharing: no instance type of the pool has GPUs to share (got true); remove it, "
                   "or set gpus on the types")  # fmt: skip
    if pool.efa and (env.cloud != "aws" or pool.placement != "cluster"):
        out.append(f"{where}.efa: needs cloud 'aws' and placement 'cluster' (got cloud {env.cloud!r}, placement "
                   f"{pool.placement!r}); set placement = 'cluster' or drop efa")  # fmt: skip
    elif pool.efa and (no_efa := [t.type for t in pool.instance_types if t.type in prices.SPECS
                                  and t.type not in prices.EFA_TYPES]):  # fmt: skip
        out.append(f"{where}.efa: {', '.join(no_efa)} cannot have an Elastic Fabric Adapter (got efa = true), so such "
                   f"nodes would never launch; use EFA-capable types (e.g. {', '.join(sorted(prices.EFA_TYPES))}) "
                   "or drop efa")  # fmt: skip
    if pool.placement == "cluster" and env.cloud == "gcp" and env.network.subnet_ids:
        out.append(f"{where}.placement: 'cluster' opens traffic among the pool's nodes on the network the stack "
                   f"creates (got network.subnet_ids {env.network.subnet_ids}); remove subnet_ids or use 'spread'")  # fmt: skip
    if pool.zone is not None and env.cloud != "gcp":
        out.append(f"{where}.zone: only for cloud 'gcp' (got {pool.zone!r}); an AWS pool launches in its subnets' "
                   "zones, a cluster pool in the first one's: remove zone")  # fmt: skip
    elif pool.zone is not None and not re.fullmatch(rf"{re.escape(env.region)}-[a-z][a-z0-9]*", pool.zone):
        out.append(f"{where}.zone: not a zone of the environment's region {env.region} (got {pool.zone!r}); "
                   f"write {env.region}-<letter>, e.g. {env.region}-b, a zone that offers the pool's types")  # fmt: skip
    if pool.placement == "cluster" and env.cloud == "aws":
        burstable = [t.type for t in pool.instance_types if t.type.startswith("t")]
        if burstable:
            out.append(f"{where}.placement: a cluster placement group cannot hold burstable types (got "
                       f"{', '.join(burstable)}); drop them or use placement 'spread'")  # fmt: skip
    return out


def _shared_fs_problems(env: Environment) -> list[str]:
    fs = env.shared_fs
    if fs is None:
        return []
    kinds = {"aws": ("efs", "fsx-lustre"), "gcp": ("filestore",)}[env.cloud]
    if fs.kind not in kinds:
        return [f"shared_fs.kind: not available on {env.cloud} (got {fs.kind!r}); use one of {', '.join(kinds)}"]
    # The services' own capacity steps: FSx for Lustre PERSISTENT_2 is 1200 GiB or a multiple of
    # 2400; a basic HDD Filestore instance is 1-64 TiB; EFS grows by itself.
    if fs.kind == "efs" and fs.size_gb is not None:
        return [f"shared_fs.size_gb: EFS grows with its data (got {fs.size_gb}); remove size_gb"]
    if fs.kind == "fsx-lustre" and (fs.size_gb is None or fs.size_gb != 1200 and fs.size_gb % 2400):
        return [f"shared_fs.size_gb: FSx for Lustre takes 1200 or a multiple of 2400 GiB (got {fs.size_gb}); e.g. 1200"]
    if fs.kind == "filestore" and (fs.size_gb is None or not 1024 <= fs.size_gb <= 102400):
        return [f"shared_fs.size_gb: a regional Filestore instance is 1024-102400 GiB (got {fs.size_gb}); e.g. 1024"]
    if env.cloud == "gcp" and env.network.subnet_ids:
        return [(f"shared_fs: Filestore joins the network the stack creates (got network.subnet_ids "
                f"{env.network.subnet_ids}); remove subnet_ids or mount your own file system in init_script")]
    if not any(pool.data.shared_fs_mount for pool in env.pools.values()):
        return [("shared_fs: no pool mounts it (got a file system and no pools.X.data.shared_fs_mount); "
                "set shared_fs_mount on the pools that use it, or remove [shared_fs]")]
    return []


def _workload_problems(where: str, pool: Pool) -> list[str]:
    """What runs per item and at boot: the command, the container, init_script and env.
    init_script and env land in the node's boot script, so nothing in them may break out of it."""
    out = []
    if (pool.container is None) == (pool.command is None):
        out.append(f"{where}: set exactly one of 'command' or 'container' (got {'both' if pool.command else 'neither'})")
    if pool.command is not None:
        try:
            words = shlex.split(pool.command)
        except ValueError as err:
            out.append(f"{where}.command: not shell words ({err}) (got {pool.command!r}); close the quote or escape it")
        else:
            if not words:
                out.append(f"{where}.command: empty (got {pool.command!r}); give the program to run, e.g. 'python3 -m worker'")
            elif "\0" in pool.command:
                out.append(f"{where}.command: contains a NUL character (got {pool.command!r}); remove it")
    if pool.container is not None and not (
        len(pool.container.split("@")[0].rsplit(":", 1)[0]) <= IMAGE_NAME_MAX and re.fullmatch(IMAGE_REFERENCE, pool.container)
    ):
        out.append(f"{where}.container: not an image reference (got {pool.container!r}); "
                   "use [registry/]repository[:tag][@sha256:digest] in lowercase, e.g. 'ghcr.io/acme/train:1.0'")  # fmt: skip
    if INIT_SCRIPT_DELIMITER in pool.init_script or "\0" in pool.init_script:
        bad = INIT_SCRIPT_DELIMITER if INIT_SCRIPT_DELIMITER in pool.init_script else "a NUL character"
        out.append(f"{where}.init_script: may not contain {bad} (got {pool.init_script!r}); "
                   "the boot script ends the init_script there")  # fmt: skip
    for key, value in pool.env.items():
        if not re.fullmatch(ENV_VAR, key) or key.startswith("TIDEFLEET_"):
            out.append(f"{where}.env.{key}: not a usable variable name (got {key!r}); TIDEFLEET_* is reserved")
        elif any(c in value for c in "\n\r\0"):
            out.append(f"{where}.env.{key}: a value must be one line without NUL (got {value!r}); "
                       "put multi-line data in a file the init_script writes")  # fmt: skip
    return out


def _gcp_pool_problems(where: str, pool: Pool) -> list[str]:
    """A managed instance group sizes in VMs and a template is either Spot or standard."""
    out = [f"{where}.{field}: not read on gcp, where a Spot VM has no price cap or allocation strategy "
           f"(got {getattr(pool, field)!r}); remove it"
           for field in ("spot_max_price", "spot_allocation_strategy") if field in pool.model_fields_set]
    weights = sorted({t.weight for t in pool.instance_types})
    if len(weights) > 1:
        out.append(f"{where}.instance_types: on gcp every type of a pool needs the same weight (got {weights}); "
                   "a managed instance group counts VMs, so split the types into pools")
    # stacks/gcp/pool.py builds the instance template (scheduling, guest_accelerator) from the first type.
    hardware = sorted({(t.gpus, t.accelerator or "none") for t in pool.instance_types})
    if len(hardware) > 1:
        kinds = ", ".join(f"{t.type} ({t.gpus} x {t.accelerator or 'no accelerator'})" for t in pool.instance_types)
        out.append(f"{where}.instance_types: on gcp every type of a pool needs the same gpus and accelerator (got "
                   f"{kinds}); the instance template is built for one, so split the types into pools")  # fmt: skip
    if pool.disk_gb < GCP_MIN_DISK_GB:
        out.append(f"{where}.disk_gb: GCE's public images take {GCP_MIN_DISK_GB} GB at least, and a boot disk smaller "
                   f"than its image is refused (got {pool.disk_gb}); set disk_gb = {GCP_MIN_DISK_GB} or more")  # fmt: skip
    if pool.on_demand_percent:
        out.append(f"{where}.on_demand_percent: not supported on gcp (got {pool.on_demand_percent}); "
                   "use on_demand_base (the pool's on-demand group) instead")
    if "image" not in pool.model_fields_set:  # the default is an AWS image
        out.append(f"{where}.image: required on gcp (got nothing); set a GCE image such as {GCP_DEFAULT_IMAGE}")
    elif not re.fullmatch(GCP_IMAGE, pool.image):
        out.append(f"{where}.image: not a GCE image (got {pool.image!r}); "
                   "use projects/<project>/global/images/[family/]<name>")
    for i, itype in enumerate(pool.instance_types):
        at, family = f"{where}.instance_types[{i}]", itype.type.split("-")[0]
        takes = GCP_GPUS.get(family, ())
        if itype.accelerator and not itype.gpus:
            out.append(f"{at}.gpus: must be > 0 with an accelerator (got 0); set the GPU count")
        elif itype.accelerator and not any(itype.accelerator in names for names in GCP_GPUS.values()):
            known = ", ".join(name for names in GCP_GPUS.values() for name in names)
            out.append(f"{at}.accelerator: not a GCP accelerator type (got {itype.accelerator!r}); use one of {known}")
        elif itype.accelerator and itype.accelerator not in takes:
            fix = (f"{itype.type} takes {', '.join(takes)}" if takes else
                   f"GPUs attach only to N1 machine types ({', '.join(GCP_GPUS['n1'])}), the other families have their "
                   "own (g2: nvidia-l4, a2: nvidia-tesla-a100, ...)")  # fmt: skip
            out.append(f"{at}.accelerator: {itype.type} cannot have {itype.accelerator} (got {itype.accelerator!r}); "
                       f"{fix}; pick a matching type or accelerator")  # fmt: skip
        elif family == "n1" and itype.accelerator in GCP_N1_GPU_COUNTS and itype.gpus not in GCP_N1_GPU_COUNTS[itype.accelerator]:
            counts = GCP_N1_GPU_COUNTS[itype.accelerator]
            out.append(f"{at}.gpus: an N1 machine type takes {', '.join(map(str, counts[:-1]))} or {counts[-1]} "
                       f"{itype.accelerator} (got {itype.gpus}); GCE refuses another count, so pick one of these")  # fmt: skip
        elif itype.gpus and not itype.accelerator and family not in GCP_GPUS.keys() - {"n1"}:
            out.append(f"{at}.gpus: {itype.type} has no GPUs of its own (got gpus = {itype.gpus} and no accelerator); "
                       "set accelerator on an n1 type (e.g. 'nvidia-tesla-t4') or pick a GPU machine type such as "
                       "g2-standard-8")  # fmt: skip
    return out


def _field_path(data: object, loc: tuple, missing: bool) -> tuple[tuple, bool]:
    """(the error's location as the file spells it, whether it went through a union). A field
    that takes several types (an int or a {min, max} table) adds the branch's type name to the
    location (`nodes_per_item.int`): not a key of the file, so it is left out."""
    path, node, branched = [], data, False
    for i, part in enumerate(loc):
        if isinstance(node, dict) and (part in node or (missing and i == len(loc) - 1)):
            node = node.get(part)
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            node = node[part]
        else:
            branched = True
            continue
        path.append(part)
    return tuple(path), branched


def _model_at(path: tuple) -> type[BaseModel] | None:
    """The config model a table at this path is read as (None where the path leaves the models):
    through `dict[str, X]` tables, `list[X]` entries and `X | None` fields."""
    model: object = Environment
    keyed = False  # the part is a table's own name (`pools.<name>`), not a field
    for part in path:
        if isinstance(part, int) or keyed:
            keyed = False
            continue
        if not (isinstance(model, type) and issubclass(model, BaseModel)) or part not in model.model_fields:
            return None
        model = model.model_fields[part].annotation
        keyed = typing.get_origin(model) is dict
        while typing.get_origin(model) in (dict, list, typing.Union, types.UnionType):
            args = [a for a in typing.get_args(model) if isinstance(a, type) and issubclass(a, BaseModel)]
            model = args[-1] if args else None
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def _did_you_mean(path: tuple) -> str:
    """For an unknown key: the field of that table it most resembles, if one does."""
    model = _model_at(path[:-1])
    close = difflib.get_close_matches(str(path[-1]), list(model.model_fields) if model else [], n=1, cutoff=0.75)
    return f"did you mean {close[0]!r}?" if close else "check the spelling against the config reference in README.md"


def _pydantic_problems(err: ValidationError, data: dict) -> list[str]:
    found: dict[tuple, list[str]] = {}  # path -> messages, in order
    got: dict[tuple, str] = {}
    branched_paths = set()
    for e in err.errors():
        path, branched = _field_path(data, e["loc"], e["type"] == "missing")
        if branched:
            branched_paths.add(path)
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = f"unknown key; {_did_you_mean(path)}"
        elif e["type"] == "missing":
            msg = "required field is missing"
        msg = re.sub(r" or instance of \w+", "", msg)  # pydantic's class names mean nothing in a TOML file
        if found.get(path):  # a union's other branch: "Input should be a valid integer, or a valid dictionary"
            msg = msg.removeprefix("Input should be ")
        if msg not in found.setdefault(path, []):
            found[path].append(msg)
        got.setdefault(path, "" if e["type"] == "missing" else f" (got {e['input']!r})")
    out = []
    for path, messages in found.items():
        # A union's branch whose type did not match, where another branch got further: its own lines say more.
        if path in branched_paths and any(other[: len(path)] == path and other != path for other in found):
            continue
        where = ".".join(f"[{p}]" if isinstance(p, int) else str(p) for p in path).replace(".[", "[")
        out.append(f"{where}: {', or '.join(messages)}{got[path]}")
    return out


def parse_environment(data: dict, *, name: str, source: str = "<dict>") -> Environment:
    """Validate raw TOML data into an Environment, or raise ConfigError with every problem."""
    given = data.get("name", name)
    if given != name:
        raise ConfigError(source, [f"name: must match the file name (got {given!r}, file says {name!r})"])
    try:
        env = Environment.model_validate({**data, "name": name})
    except ValidationError as err:
        raise ConfigError(source, _pydantic_problems(err, {**data, "name": name})) from None
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


def env_argument(env: Environment) -> str:
    """What `--env` takes to name `env` again in a hint: the path it was loaded from, if it was
    given as one (its name may find another file, or none), else its name; quoted for a shell."""
    return shlex.quote(env._path or env.name)


def is_environment_path(name: str) -> bool:
    """Whether `--env`/`validate` got a path rather than an environment's name: it has a '/', a
    file extension (.toml, or any other), or is no environment name and exists (`.`, `..`). A
    name stays a name when a file or folder here has it too (a `prod/` beside `--env prod`)."""
    return ("/" in name or os.sep in name or Path(name).suffix != ""
            or (re.fullmatch(NAME, name) is None and Path(name).exists()))  # fmt: skip


def environment_path(name: str, root: Path | None = None) -> Path:
    """The file of environment `name`: `<environments dir>/<name>.toml`, or `name` if it is a path."""
    return Path(name) if is_environment_path(name) else (root or environments_dir()) / f"{name}.toml"


_DIGIT_RUN = re.compile(r"\d(?:_?\d)*")  # a TOML integer's digits, underscores between them allowed
_MARKER = 7_013_000_000_000_000_000  # stands in for the N-th too-long run of digits as _MARKER + N


def _too_long_integer_problems(text: str, file_name: str) -> list[str]:
    """tomllib reads an integer with int(), which refuses more than sys.get_int_max_str_digits()
    digits (4300) with a bare ValueError: no line, no key. The fields are found by reading the file
    again with each such run of digits replaced by a marker number, then looking for the markers
    (a run inside a string or a float only changes that string or float). One line per field."""
    limit, runs = sys.get_int_max_str_digits(), []

    def mark(match: re.Match) -> str:
        digits = match.group().replace("_", "")
        if limit == 0 or len(digits) <= limit:
            return match.group()
        runs.append((digits, text.count("\n", 0, match.start()) + 1))
        return str(_MARKER + len(runs) - 1)

    marked = _DIGIT_RUN.sub(mark, text)
    try:
        data: object = tomllib.loads(marked)
    except ValueError:
        data = None
    found, todo = [], [((), data)]
    while todo:
        path, node = todo.pop(0)
        if isinstance(node, dict):
            todo += [((*path, key), value) for key, value in node.items()]
        elif isinstance(node, list):
            todo += [((*path, i), value) for i, value in enumerate(node)]
        elif type(node) is int and 0 <= abs(node) - _MARKER < len(runs):
            digits = runs[abs(node) - _MARKER][0]
            where = ".".join(f"[{p}]" if isinstance(p, int) else str(p) for p in path).replace(".[", "[")
            shown = ("-" if node < 0 else "") + (digits if len(digits) <= 24 else f"{digits[:10]}...{digits[-10:]}")
            found.append(f"{where}: a whole number of {len(digits)} digits, too long to read (got {shown}); no setting "
                         "takes a number this large: use the value you meant (see the config reference in README.md)")
    if found:
        return found
    line = f" (line {runs[0][1]})" if runs else ""
    return [(f"{file_name}: a whole number of more than {limit} digits{line}, too long to read; no setting takes a "
             "number this large: use the value you meant (see the config reference in README.md)")]


def load_environment(name: str, root: Path | None = None) -> Environment:
    """Load `environments/<name>.toml`, or the file at a path (`is_environment_path`): a .toml
    file, or one with another extension that holds an environment's TOML."""
    if not name.strip():  # Path("") is ".": a directory, which says nothing of what was wrong
        raise ConfigError("env", [(f"empty (got {name!r}); give an environment name (one of "
                                   f"{', '.join(known_environments(root)) or 'none'}) or a .toml file's path")])  # fmt: skip
    path, given_path = environment_path(name, root), is_environment_path(name)
    try:
        if path.is_dir():
            raise ConfigError(str(path), [(f"env: a directory, not an environment file (got {name!r}); give a .toml "
                                          "file or an environment name")])  # fmt: skip
        if given_path and not path.exists():
            raise ConfigError(str(path), [f"env: no such file (got {name!r}); give the path of an environment .toml file"])
        if given_path and not path.is_file():  # /dev/null, a pipe: no environment file
            raise ConfigError(str(path), [(f"env: not a regular file (got {name!r}); give the path of an environment "
                                          ".toml file")])  # fmt: skip
        if not path.is_file():
            folder = root or environments_dir()
            known = ", ".join(known_environments(folder)) or f"none (no .toml files in {folder})"
            here = f"; a file {name!r} is here: give ./{name} to load it" if Path(name).is_file() else ""
            # No file's problem: the name given to --env is, so no made-up <folder>/<name>.toml names it.
            problem = f"unknown environment (got {name!r}); known: {known} (in {folder}; or give a .toml file's path){here}"
            if not folder.is_dir():
                variable = " ($TIDEFLEET_ENVIRONMENTS)" if root is None and os.environ.get("TIDEFLEET_ENVIRONMENTS") else ""
                missing = f"{folder}{variable} is not a folder" if folder.exists() else f"the folder {folder}{variable} does not exist"
                problem = (f"unknown environment (got {name!r}): {missing}; point it at your environments folder, "
                           "or give a .toml file's path")
            raise ConfigError("env", [problem])
        text = path.read_bytes().decode("utf-8-sig")  # -sig: an editor's byte-order mark
    except UnicodeDecodeError as err:
        raise ConfigError(str(path), [f"not UTF-8 text ({err}); save the file as UTF-8"]) from None
    except (OSError, ValueError) as err:  # unreadable, or a name no file can have (a NUL in it)
        raise ConfigError(str(path), [f"env: cannot read the environment file (got {name!r}: {err})"]) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        # TOML itself forbids defining a name twice ("Cannot declare ... twice").
        hint = "; duplicate names are not allowed" if "twice" in str(err) else ""
        if path.suffix != ".toml":  # a .txt, a .csv: most likely not meant as one
            hint += "; an environment is a TOML file (<name>.toml)"
        raise ConfigError(str(path), [f"not valid TOML ({err}){hint}"]) from None
    except ValueError:  # an integer longer than Python reads: no TOMLDecodeError, no position
        raise ConfigError(str(path), _too_long_integer_problems(text, path.name)) from None
    env = parse_environment(data, name=path.stem, source=str(path))
    if given_path:
        env._path = name
    return env
