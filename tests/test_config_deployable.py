"""Configs that validate must deploy and work: GPU nodes need a driver, GCP templates one kind of
hardware, alarms and caps that let the scaler do what it means to."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from test_config import _with

from tidefleet.config import GPU_IMAGES, QUEUE_RETENTION_S, ConfigError, parse_environment
from tidefleet.resources import PUBSUB_RETENTION_S, SQS_RETENTION_S

ROOT = Path(__file__).resolve().parents[1] / "environments"
BASES = {name: tomllib.loads((ROOT / f"{name}.toml").read_text()) for name in ("dev", "gcp-dev", "train")}


def _env(base: str, **changes):
    """Parse environments/<base>.toml with dotted changes (None deletes a key)."""
    return parse_environment(_with(BASES[base], **changes), name=base)


def _refused(base: str, expected: str, **changes) -> None:
    with pytest.raises(ConfigError) as err:
        _env(base, **changes)
    problems = err.value.problems
    assert any(expected in p for p in problems), f"{expected!r} not in {problems}"
    assert len(problems) == 1, f"one problem, one message: {problems}"


AWS_GPU_TYPES = [{"type": "g5.xlarge", "weight": 1, "gpus": 1}]


def test_an_aws_gpu_pool_without_an_image_boots_the_deep_learning_ami():
    env = _env("dev", **{"pools.cpu.instance_types": AWS_GPU_TYPES, "pools.cpu.slots_per_unit": 1})
    assert env.pools["cpu"].image == GPU_IMAGES["aws"]
    assert GPU_IMAGES["aws"].startswith("ssm:/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-amazon-linux-2023/")
    assert _env("dev").pools["cpu"].image.startswith("ssm:/aws/service/ami-amazon-linux-latest/al2023")  # CPU: unchanged


@pytest.mark.parametrize(("changes", "disk_gb"), [
    ({}, 100),  # the image its GPUs give it
    ({"pools.cpu.image": GPU_IMAGES["aws"]}, 100),  # the same, named
    ({"pools.cpu.disk_gb": 60}, 60),  # its own say
    ({"pools.cpu.image": "ami-0123456789abcdef0"}, 50),  # its own image: its own size
])  # fmt: skip
def test_a_pool_on_a_deep_learning_image_gets_a_root_disk_its_snapshot_fits(changes, disk_gb):
    """Those images carry CUDA stacks: on the plain images' 50 GB a root smaller than the image's
    snapshot would fail every launch."""
    env = _env("dev", **{"pools.cpu.instance_types": AWS_GPU_TYPES, "pools.cpu.slots_per_unit": 1, **changes})
    assert env.pools["cpu"].disk_gb == disk_gb
    assert _env("dev").pools["cpu"].disk_gb == 50  # CPU: unchanged


def test_a_gcp_gpu_pool_without_an_image_boots_the_deep_learning_vm():
    env = _env("gcp-dev", **{"pools.gpu.image": None})
    assert env.pools["gpu"].image == GPU_IMAGES["gcp"] == BASES["gcp-dev"]["pools"]["gpu"]["image"]
    _refused("gcp-dev", "pools.cpu.image: required on gcp (got nothing)", **{"pools.cpu.image": None})


def test_a_gpu_pool_on_a_plain_os_image_without_a_driver_install_is_refused():
    al2023 = "ssm:/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-x86_64"
    _refused("dev", f"pools.cpu.image: a plain OS image has no NVIDIA driver, so nodes of the pool's GPU types would find "
             f"no GPU and be replaced forever (got {al2023!r}); remove image",
             **{"pools.cpu.instance_types": AWS_GPU_TYPES, "pools.cpu.slots_per_unit": 1, "pools.cpu.image": al2023})  # fmt: skip
    debian = "projects/debian-cloud/global/images/family/debian-12"
    _refused("gcp-dev", "pools.gpu.image: a plain OS image has no NVIDIA driver", **{"pools.gpu.image": debian})
    # The user's own driver install is their choice.
    _env("gcp-dev", **{"pools.gpu.image": debian, "pools.gpu.init_script": "/opt/install-nvidia-driver.sh"})


L4 = {"type": "g2-standard-8", "weight": 1, "gpus": 1, "accelerator": "nvidia-l4"}


@pytest.mark.parametrize("other,got", [
    ({"type": "n2-standard-8", "weight": 1}, "g2-standard-8 (1 x nvidia-l4), n2-standard-8 (0 x no accelerator)"),
    ({"type": "a2-highgpu-1g", "weight": 1, "gpus": 1, "accelerator": "nvidia-tesla-a100"},
     "g2-standard-8 (1 x nvidia-l4), a2-highgpu-1g (1 x nvidia-tesla-a100)"),
    ({"type": "g2-standard-24", "weight": 1, "gpus": 2, "accelerator": "nvidia-l4", "on_demand_price": 2.0,
      "spot_price": 0.8}, "g2-standard-8 (1 x nvidia-l4), g2-standard-24 (2 x nvidia-l4)"),
], ids=["gpu and cpu", "two accelerators", "two gpu counts"])  # fmt: skip
def test_a_gcp_pool_mixing_gpu_hardware_is_refused(other, got):
    _refused("gcp-dev", f"pools.gpu.instance_types: on gcp every type of a pool needs the same gpus and accelerator "
             f"(got {got}); the instance template is built for one, so split the types into pools",
             **{"pools.gpu.instance_types": [L4, other], "pools.gpu.capacity_unit": "nodes"})  # fmt: skip


@pytest.mark.parametrize("itype,expected", [
    ({"type": "n2-standard-8", "weight": 1, "gpus": 1},
     ("pools.gpu.instance_types[0].gpus: n2-standard-8 has no GPUs of its own (got gpus = 1 and no accelerator); "
     "set accelerator on an n1 type")),
    ({"type": "n2-standard-8", "weight": 1, "gpus": 1, "accelerator": "nvidia-l4"},
     ("pools.gpu.instance_types[0].accelerator: n2-standard-8 cannot have nvidia-l4 (got 'nvidia-l4'); GPUs attach "
     "only to N1 machine types (nvidia-tesla-t4, nvidia-tesla-v100, nvidia-tesla-p100, nvidia-tesla-p4)")),
    ({"type": "n1-standard-8", "weight": 1, "gpus": 1, "accelerator": "nvidia-l4", "on_demand_price": 1.0, "spot_price": 0.3},
     ("pools.gpu.instance_types[0].accelerator: n1-standard-8 cannot have nvidia-l4 (got 'nvidia-l4'); n1-standard-8 "
     "takes nvidia-tesla-t4, nvidia-tesla-v100")),
    ({"type": "g2-standard-8", "weight": 1, "gpus": 1, "accelerator": "nvidia-tesla-zz9"},
     ("pools.gpu.instance_types[0].accelerator: not a GCP accelerator type (got 'nvidia-tesla-zz9'); use one of "
     "nvidia-tesla-t4, nvidia-tesla-v100, nvidia-tesla-p100, nvidia-tesla-p4, nvidia-l4")),
], ids=["gpus without hardware", "accelerator on n2", "l4 on n1", "unknown accelerator"])  # fmt: skip
def test_a_gcp_gpu_declaration_without_matching_hardware_is_refused(itype, expected):
    _refused("gcp-dev", expected, **{"pools.gpu.instance_types": [itype]})


@pytest.mark.parametrize("itype", [
    {"type": "n1-standard-8", "weight": 1, "gpus": 1, "accelerator": "nvidia-tesla-t4", "on_demand_price": 0.73,
     "spot_price": 0.19},
    {"type": "g2-standard-8", "weight": 1, "gpus": 1},
    {"type": "a2-highgpu-1g", "weight": 1, "gpus": 1, "accelerator": "nvidia-tesla-a100"},
], ids=["t4 on n1", "g2 without naming its l4", "a100 on a2"])  # fmt: skip
def test_gcp_gpus_that_exist_are_accepted(itype):
    assert _env("gcp-dev", **{"pools.gpu.instance_types": [itype]}).pools["gpu"].instance_types[0].gpus == 1


def test_an_n1_machine_with_attached_gpus_needs_its_own_prices():
    """The logs/cost audit: an N1 with 4 V100s was priced at the machine's $0.38/h (about $10/h with
    its GPUs): `cost`, the cost caps and the simulator 27x low, nothing said."""
    _refused("gcp-dev", "pools.gpu.instance_types[0].on_demand_price: the built-in price of n1-standard-8 is the "
             "machine's alone, without its 4 attached nvidia-tesla-v100; set on_demand_price and spot_price in "
             "USD/hour, machine and GPUs together",
             **{"pools.gpu.instance_types": [{"type": "n1-standard-8", "weight": 4, "gpus": 4,
                                               "accelerator": "nvidia-tesla-v100"}]})  # fmt: skip


@pytest.mark.parametrize("target,max_wait", [(7200, 600), (600, 600)])
def test_a_wait_target_past_the_oldest_item_alarm_is_refused(target, max_wait):
    _refused("dev", f"queues.default.target_wait_s: must be below max_wait_s (got {target} >= {max_wait}); the "
             "oldest-item alarm would fire and escalate the queue to on-demand before the scaler means to launch; "
             "lower target_wait_s or raise max_wait_s",
             **{"queues.default.target_wait_s": target, "queues.default.max_wait_s": max_wait})  # fmt: skip
    assert _env("dev", **{"queues.default.target_wait_s": target - 1, "queues.default.max_wait_s": target})


def test_a_vcpu_weight_that_is_not_the_types_vcpu_count_is_refused():
    _refused("dev", "pools.cpu.instance_types[0].weight: with capacity_unit 'vcpus' the weight is the vCPU count, and "
             "c6i.large has 2 (got weight 1); set weight = 2", **{"pools.cpu.capacity_unit": "vcpus",
             "pools.cpu.instance_types": [{"type": "c6i.large", "weight": 1}]})  # fmt: skip
    # A type the price table does not know is the user's word.
    own = {"type": "c8i.large", "weight": 1, "on_demand_price": 0.1, "spot_price": 0.04}
    assert _env("dev", **{"pools.cpu.capacity_unit": "vcpus", "pools.cpu.instance_types": [own]})


def test_efa_on_a_type_without_it_is_refused():
    _refused("dev", "pools.cpu.efa: c6i.large cannot have an Elastic Fabric Adapter (got efa = true), so such nodes "
             "would never launch; use EFA-capable types (e.g. g4dn.12xlarge, ",
             **{"pools.cpu.efa": True, "pools.cpu.placement": "cluster",
                "pools.cpu.instance_types": [{"type": "c6i.large", "weight": 1}]})  # fmt: skip


GANG = "queues.train.nodes_per_item: a gang of 2 nodes "


@pytest.mark.parametrize("change,expected", [
    ({"scaler.cost_cap_usd_per_hour": 20.0}, ("costs at least 26.2 USD/hour (2 x 13.1, the pool's cheapest node), over "
     "scaler.cost_cap_usd_per_hour (got 20.0); it would never start; raise the cap or lower the gang's min")),
    ({"pools.gpu8.cost_cap_usd_per_hour": 20.0}, ("costs at least 26.2 USD/hour (2 x 13.1, the pool's cheapest node), "
     "over pools.gpu8.cost_cap_usd_per_hour (got 20.0)")),
    ({"teams.research": {"quota": {"gpus": 8}}}, ("holds at least 16 GPUs at once, over the 8 the quotas of the teams on "
     "pool 'gpu8' allow (got teams.research gpus = 8); it would never start; raise the quota to 16")),
    ({"teams.research": {"quota": {"gpus": 64}, "pools": {"gpu8": {"gpus": 8}}}}, ("holds at least 16 GPUs at once, over "
     "the 8 the quotas of the teams on pool 'gpu8' allow (got teams.research gpus = 8)")),
], ids=["scaler cap", "pool cap", "team quota", "team's pool quota"])  # fmt: skip
def test_a_gang_its_cap_or_quota_can_never_admit_is_refused(change, expected):
    _refused("train", GANG + expected, **change)


def test_a_gang_within_its_cap_and_quota_is_accepted():
    assert _env("train", **{"scaler.cost_cap_usd_per_hour": 27.0, "teams.research": {"quota": {"gpus": 16}}})


@pytest.mark.parametrize("image", [
    "ssm:/aws/service/ami-amazon-linux-latest/amzn2-ami-hvm-x86_64-gp2",
    "ssm:/aws/service/ami-amazon-linux-latest/amzn2-ami-kernel-5.10-hvm-x86_64-gp2",
    "ssm:/aws/service/canonical/ubuntu/server/24.04/stable/current/amd64/hvm/ebs-gp3/ami-id",
    "ssm:/aws/service/ecs/optimized-ami/amazon-linux-2/recommended/image_id",
], ids=["amazon linux 2", "amazon linux 2 kernel 5.10", "ubuntu", "ecs on amazon linux 2"])  # fmt: skip
def test_an_aws_image_of_another_os_than_al2023_is_refused_even_with_an_init_script(image):
    expected = (f"pools.cpu.image: the boot script needs Amazon Linux 2023 (dnf, python3.11) and stops before "
                f"init_script on another OS (got {image!r}); use an al2023 or Deep Learning AL2023 parameter, e.g. "
                "'ssm:/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-x86_64'")  # fmt: skip
    _refused("dev", expected, **{"pools.cpu.image": image})
    _refused("dev", expected, **{"pools.cpu.image": image, "pools.cpu.init_script": "dnf() { apt-get \"$@\"; }"})


def test_an_aws_deep_learning_ami_on_ubuntu_is_refused_for_the_al2023_one():
    ubuntu = "ssm:/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id"
    _refused("train", f"pools.gpu8.image: the boot script needs Amazon Linux 2023 (dnf, python3.11) and stops before "
             f"init_script on another OS (got {ubuntu!r}); use an al2023 or Deep Learning AL2023 parameter, e.g. "
             f"{GPU_IMAGES['aws']!r}", **{"pools.gpu8.image": ubuntu})  # fmt: skip
    # Amazon Linux 2023 in every form, and images that do not say their OS, are accepted.
    for image in (GPU_IMAGES["aws"], "ssm:/aws/service/ecs/optimized-ami/amazon-linux-2023/recommended/image_id",
                  "ami-0123456789abcdef0", "ssm:/acme/golden-ami"):
        assert _env("train", **{"pools.gpu8.image": image})


def test_an_aws_image_of_another_architecture_than_the_pools_types_is_refused():
    arm64 = "ssm:/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-arm64"
    _refused("dev", f"pools.cpu.image: an arm64 image cannot boot c6i.large, c7i.large, m6i.large (x86_64) (got "
             f"{arm64!r}); use the x86_64 parameter ('ssm:/aws/service/ami-amazon-linux-latest/"
             "al2023-ami-kernel-default-x86_64') or arm64 instance types",
             **{"pools.cpu.image": arm64, "pools.cpu.instance_types": [{"type": t, "weight": 1}
                                                                       for t in ("c6i.large", "c7i.large", "m6i.large")]})  # fmt: skip
    graviton = [{"type": t, "weight": 1, "on_demand_price": 0.07, "spot_price": 0.03} for t in ("c7g.large", "m7gd.large", "t4g.large")]
    _refused("dev", "pools.cpu.image: an x86_64 image cannot boot c7g.large, m7gd.large, t4g.large (arm64)",
             **{"pools.cpu.instance_types": graviton})
    _refused("dev", f"pools.cpu.image: an arm64 image cannot boot c6i.large (x86_64) (got {arm64!r}); move them to a "
             "pool of their own with the x86_64 parameter ('ssm:/aws/service/ami-amazon-linux-latest/"
             "al2023-ami-kernel-default-x86_64'), as one image serves a pool",
             **{"pools.cpu.image": arm64, "pools.cpu.instance_types": [*graviton, {"type": "c6i.large", "weight": 1}]})  # fmt: skip
    assert _env("dev", **{"pools.cpu.image": arm64, "pools.cpu.instance_types": graviton})


def test_a_pool_mixing_architectures_is_refused_whatever_its_image_says():
    """One launch template (one instance template) boots one image on every type of the pool: an
    image that does not name its architecture (an AMI id, the user's own parameter, a GCE image of
    their own) still runs on one only."""
    mixed = [{"type": "c6i.large", "weight": 1}, {"type": "c7g.large", "weight": 1, "on_demand_price": 0.07, "spot_price": 0.03}]
    for image in ("ami-0123456789abcdef0", "ssm:/acme/ami/worker"):
        _refused("dev", "pools.cpu.instance_types: mixes x86_64 types (c6i.large) and arm64 types (c7g.large), but the "
                 "pool boots one image, which runs on one architecture; move the arm64 types to a pool of their own "
                 "with an arm64 image", **{"pools.cpu.image": image, "pools.cpu.instance_types": mixed})  # fmt: skip
    assert _env("dev", **{"pools.cpu.image": "ami-0123456789abcdef0", "pools.cpu.instance_types": mixed[1:]})
    axion = {"type": "c4a-standard-4", "weight": 1, "on_demand_price": 0.2, "spot_price": 0.05}
    n2 = {"type": "n2-standard-4", "weight": 1, "on_demand_price": 0.2, "spot_price": 0.05}
    own = "projects/acme-images/global/images/family/worker"
    _refused("gcp-dev", "pools.cpu.instance_types: mixes x86_64 types (n2-standard-4) and arm64 types (c4a-standard-4)",
             **{"pools.cpu.image": own, "pools.cpu.instance_types": [n2, axion]})
    # A public image is x86_64 unless its name says arm64.
    debian = BASES["gcp-dev"]["pools"]["cpu"]["image"]
    _refused("gcp-dev", f"pools.cpu.image: an x86_64 image cannot boot c4a-standard-4 (arm64) (got {debian!r}); use an "
             "arm64 image (its name ends in -arm64, e.g. debian-12-arm64) or x86_64 machine types",
             **{"pools.cpu.instance_types": [axion]})  # fmt: skip
    _refused("gcp-dev", "pools.cpu.image: an arm64 image cannot boot n2-standard-4 (x86_64)",
             **{"pools.cpu.image": f"{debian}-arm64", "pools.cpu.instance_types": [n2]})
    assert _env("gcp-dev", **{"pools.cpu.image": f"{debian}-arm64", "pools.cpu.instance_types": [axion]})
    assert _env("gcp-dev", **{"pools.cpu.image": own, "pools.cpu.instance_types": [axion]})


@pytest.mark.parametrize("image", [
    "projects/debian-cloud/global/images/family/debian-11",
    "projects/debian-cloud/global/images/debian-11-bullseye-v20250415",
    "projects/ubuntu-os-cloud/global/images/family/ubuntu-2204-lts",
    "projects/ubuntu-os-cloud/global/images/family/ubuntu-minimal-2204-lts",
    "projects/cos-cloud/global/images/family/cos-stable",
    "projects/rocky-linux-cloud/global/images/family/rocky-linux-9",
    "projects/rhel-cloud/global/images/family/rhel-9",
    "projects/centos-cloud/global/images/family/centos-stream-9",
], ids=["debian 11", "a debian 11 image", "ubuntu 22.04", "ubuntu minimal 22.04", "cos", "rocky", "rhel", "centos"])  # fmt: skip
def test_a_gcp_image_without_apt_get_or_python_3_11_is_refused_even_with_an_init_script(image):
    expected = (f"pools.cpu.image: the boot script needs apt-get and python3 >= 3.11 (Debian 12+, Ubuntu 24.04+) and "
                f"stops before init_script without them (got {image!r}); use e.g. "
                "'projects/debian-cloud/global/images/family/debian-12'")  # fmt: skip
    _refused("gcp-dev", expected, **{"pools.cpu.image": image})
    _refused("gcp-dev", expected, **{"pools.cpu.image": image, "pools.cpu.init_script": "apt-get install -y python3.11"})


def test_a_gcp_gpu_image_of_an_old_release_is_refused_for_the_deep_learning_vm():
    old = "projects/deeplearning-platform-release/global/images/family/common-cu121-debian-11-py310"
    _refused("gcp-dev", f"pools.gpu.image: the boot script needs apt-get and python3 >= 3.11 (Debian 12+, Ubuntu "
             f"24.04+) and stops before init_script without them (got {old!r}); use e.g. {GPU_IMAGES['gcp']!r}",
             **{"pools.gpu.image": old})  # fmt: skip
    # Current releases, and projects whose images do not say their OS, are accepted.
    for pool, image in (("cpu", "projects/debian-cloud/global/images/family/debian-13"),
                        ("cpu", "projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64"),
                        ("cpu", "projects/acme-ml-dev/global/images/family/debian-11-python311"),
                        ("gpu", "projects/ubuntu-os-accelerator-images/global/images/family/ubuntu-accelerator-2404-amd64-with-nvidia-570")):  # fmt: skip
        assert _env("gcp-dev", **{f"pools.{pool}.image": image})


@pytest.mark.parametrize(("base", "change", "expected"), [
    ("dev", {"pools.cpu.max": 500, "network.vpc_cidr": "10.80.0.0/24"}, (
        "network.vpc_cidr: holds 22 node addresses (2 private /28 subnets less the 5 AWS keeps in each), fewer than "
        "the 500 the pools' max needs (got '10.80.0.0/24'); use a larger vpc_cidr (e.g. '10.80.0.0/20') or your own "
        "subnet_ids")),
    ("dev", {"pools.cpu.max": 9000}, (
        "network.vpc_cidr: holds 8182 node addresses (2 private /20 subnets less the 5 AWS keeps in each), fewer than "
        "the 9000 the pools' max needs (got '10.80.0.0/16'); no vpc_cidr up to a /16 holds them in 2 zones; raise "
        "az_count or use your own subnet_ids")),
    ("train", {"pools.gpu8.max": 96, "network.vpc_cidr": "10.91.0.0/24"}, (
        "network.vpc_cidr: the first private subnet, where cluster-placement pools launch, holds 11 node addresses "
        "(a /28 less the 5 AWS keeps), fewer than the 12 their max needs (got '10.91.0.0/24'); use a larger vpc_cidr "
        "(e.g. '10.91.0.0/23') or your own subnet_ids")),
    ("gcp-dev", {"pools.cpu.max": 300, "network.vpc_cidr": "10.80.0.0/24"}, (
        "network.vpc_cidr: holds 252 node addresses (one subnet less the 4 GCP keeps), fewer than the 308 the pools' "
        "max needs (got '10.80.0.0/24'); use a larger vpc_cidr (e.g. '10.80.0.0/23') or your own subnet_ids")),
], ids=["spread pool", "no cidr large enough", "cluster pool in the first subnet", "gcp"])  # fmt: skip
def test_a_vpc_cidr_without_an_address_for_every_node_the_pools_may_have_is_refused(base, change, expected):
    _refused(base, expected, **change)


def test_pools_that_fit_their_subnets_or_bring_their_own_are_accepted():
    assert _env("dev", **{"pools.cpu.max": 22, "network.vpc_cidr": "10.80.0.0/24"})
    assert _env("train", **{"pools.gpu8.max": 88, "network.vpc_cidr": "10.91.0.0/24"})  # 11 nodes of 8 GPUs
    assert _env("dev", **{"pools.cpu.max": 9000, "network.az_count": 3})
    assert _env("dev", **{"pools.cpu.max": 9000, "network.vpc_cidr": None, "network.subnet_ids": ["subnet-0123456789abcdef0"]})


def test_a_preemptible_queue_whose_items_time_out_before_their_min_runtime_is_refused():
    expected = ("queues.default.min_runtime_s: must be below item_timeout_s on a preemptible queue (got 600 >= 300); its "
                "items time out before they may be preempted, so none ever would be; lower min_runtime_s or remove "
                "preemptible")  # fmt: skip
    _refused("dev", expected, **{"queues.default.preemptible": True, "queues.default.item_timeout_s": 300})
    _refused("dev", "(got 1800 >= 1800)", **{"queues.default.preemptible": True, "queues.default.min_runtime_s": 1800})
    assert _env("dev", **{"queues.default.preemptible": True, "queues.default.min_runtime_s": 1799})
    assert _env("dev", **{"queues.default.item_timeout_s": 300})  # not preemptible: min_runtime_s is not read


def test_more_zones_than_the_region_has_are_refused():
    _refused("dev", ("network.az_count: eu-west-1 has 3 availability zones (got 4); the other subnets would land in "
                     "zones already used; use at most 3"), **{"region": "eu-west-1", "network.az_count": 4})  # fmt: skip
    _refused("dev", "network.az_count: us-west-2 has 4 availability zones (got 5)", **{"region": "us-west-2",
                                                                                    "network.az_count": 5})  # fmt: skip
    assert _env("dev", **{"network.az_count": 6})  # us-east-1
    assert _env("dev", **{"region": "eu-west-1", "network.az_count": 3})
    # In 3 zones a /16 holds 12,273 nodes: the fix is your own subnets, not a fourth zone.
    _refused("dev", ("network.vpc_cidr: holds 12273 node addresses (3 private /20 subnets less the 5 AWS keeps in each), "
                     "fewer than the 13000 the pools' max needs (got '10.80.0.0/16'); no vpc_cidr up to a /16 holds "
                     "them; use your own subnet_ids"),
             **{"region": "eu-west-1", "network.az_count": 3, "pools.cpu.max": 10000,
                "pools.more": {**BASES["dev"]["pools"]["cpu"], "max": 3000}})  # fmt: skip


def test_a_max_wait_the_queue_does_not_keep_an_item_for_is_refused():
    assert QUEUE_RETENTION_S == {"aws": SQS_RETENTION_S, "gcp": PUBSUB_RETENTION_S}
    _refused("gcp-dev", ("queues.default.max_wait_s: must be below the 604800 s (7 days) Pub/Sub keeps a waiting item "
                         "(got 864000); it would be dropped before the oldest-item alarm fires or the queue escalates; "
                         "lower max_wait_s, e.g. to 86400"), **{"queues.default.max_wait_s": 864000})  # fmt: skip
    _refused("dev", "queues.default.max_wait_s: must be below the 1209600 s (14 days) SQS keeps a waiting item (got "
             "1209600)", **{"queues.default.max_wait_s": 1209600})  # fmt: skip
    assert _env("gcp-dev", **{"queues.default.max_wait_s": 604799})
    assert _env("dev", **{"queues.default.max_wait_s": 864000})


def test_a_public_ip_is_taken_in_subnets_of_ones_own_only():
    """The created VPC's node subnets are private (refused there: tests/test_config.py); in subnets
    of one's own, which may be public, the pool's choice stands."""
    own = {"network.subnet_ids": ["subnet-0123456789abcdef0"], "network.vpc_cidr": None, "network.az_count": None}
    assert _env("dev", **{"pools.cpu.public_ip": True}, **own).pools["cpu"].public_ip
