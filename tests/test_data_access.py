"""The team's data: a pool reads and writes exactly the prefixes its config names, data
stays off the NAT, the shared file system is reachable from the nodes only, and a training
pool's nodes sit together with all traffic among them allowed (the `train` environment)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
from iam_eval import Request, Resolver, allowed

from tidefleet.config import load_environment, parse_environment

ROOT = Path(__file__).resolve().parents[1] / "environments"
pytestmark = pytest.mark.synth


def _resources(stack: dict, kind: str) -> dict:
    return stack["resource"].get(kind, {})


@pytest.fixture(scope="module")
def train(synthesized) -> dict:
    return synthesized["train"][1]


@pytest.fixture(scope="module")
def node_policy(train):
    """The statements of the train pool's node role, references resolved."""
    resolve = Resolver(train, "us-east-1")
    return resolve(train["data"]["aws_iam_policy_document"]["pool-gpu8_node-role_policy"]["statement"])


DATA_REQUESTS = [  # (action, resource, context, allowed?)
    ("s3:GetObject", "arn:aws:s3:::acme-datasets/imagenet/train/0001.jpg", {}, True),
    ("s3:GetObject", "arn:aws:s3:::acme-models/base/llama.safetensors", {}, True),
    ("s3:GetObject", "arn:aws:s3:::acme-models/finetuned/run-7/model.pt", {}, True),
    ("s3:GetObject", "arn:aws:s3:::acme-datasets/private/salaries.csv", {}, False),
    ("s3:GetObject", "arn:aws:s3:::acme-datasets/imagenet-secret/x", {}, False),  # folders end in /: no sibling leaks
    ("s3:PutObject", "arn:aws:s3:::acme-models/finetuned/run-7/model.pt", {}, True),
    ("s3:PutObject", "arn:aws:s3:::acme-datasets/imagenet/train/0001.jpg", {}, False),
    ("s3:DeleteObject", "arn:aws:s3:::acme-models/base/llama.safetensors", {}, False),
    ("s3:PutObject", "arn:aws:s3:::another-bucket/x", {}, False),
    ("s3:ListBucket", "arn:aws:s3:::acme-datasets", {"s3:prefix": "imagenet/train/"}, True),
    ("s3:ListBucket", "arn:aws:s3:::acme-datasets", {"s3:prefix": "private/"}, False),
    ("s3:ListBucket", "arn:aws:s3:::acme-datasets", {}, False),
    ("s3:ListBucket", "arn:aws:s3:::acme-models", {"s3:prefix": "finetuned/"}, True),
]


@pytest.mark.parametrize(("action", "resource", "context", "expected"), DATA_REQUESTS)
def test_the_node_role_reaches_only_the_configured_prefixes(node_policy, action, resource, context, expected):
    assert allowed(node_policy, Request(action, resource, context)) is expected


def test_data_and_the_job_store_skip_the_nat_through_gateway_endpoints(train):
    endpoints = _resources(train, "aws_vpc_endpoint").values()
    assert sorted(e["service_name"].rsplit(".", 1)[1] for e in endpoints) == ["dynamodb", "s3"]
    assert all(e["vpc_endpoint_type"] == "Gateway" and e["route_table_ids"] for e in endpoints)


def test_the_training_pool_sits_in_one_zone_in_a_cluster_placement_group_with_efa(train):
    (group,) = [g for name, g in _resources(train, "aws_autoscaling_group").items() if "gpu8" in name]
    (placement,) = _resources(train, "aws_placement_group").values()
    assert placement["strategy"] == "cluster" and group["placement_group"].startswith("${aws_placement_group.")
    assert len(group["vpc_zone_identifier"]) == 1
    (template,) = [t for name, t in _resources(train, "aws_launch_template").items() if "gpu8" in name]
    (interface,) = template["network_interfaces"]
    assert interface["interface_type"] == "efa" and len(interface["security_groups"]) == 2


def test_the_gang_group_admits_only_its_own_nodes(train):
    (gang,) = [sg for name, sg in _resources(train, "aws_security_group").items() if name.endswith("_gang")]
    for rule in gang["ingress"] + gang["egress"]:
        assert rule["self"] is True and not rule.get("cidr_blocks")


def test_nodes_reach_the_lustre_file_system_on_its_ports_only_and_mount_it_at_boot(train):
    sgs = _resources(train, "aws_security_group")
    nodes = sgs["network_nodes"]
    to_fs = [r for r in nodes["egress"] if r.get("security_groups")]
    assert sorted((r["from_port"], r["to_port"]) for r in to_fs) == [(988, 988), (1018, 1023)]
    assert [r["cidr_blocks"] for r in nodes["egress"] if not r.get("security_groups")] == [["0.0.0.0/0"]]
    (lustre,) = _resources(train, "aws_fsx_lustre_file_system").values()
    assert lustre["storage_capacity"] == 1200 and lustre["kms_key_id"]
    fs_group = "${aws_security_group.network_shared-fs_security-group.id}"
    rules = [(kind, r) for kind in ("ingress", "egress")
             for r in _resources(train, f"aws_vpc_security_group_{kind}_rule").values()]  # fmt: skip
    assert {(kind, r["from_port"], r["to_port"], r["referenced_security_group_id"]) for kind, r in rules} == {
        ("ingress", 988, 988, "${aws_security_group.network_nodes.id}"),
        ("ingress", 1018, 1023, "${aws_security_group.network_nodes.id}"),
        ("ingress", 988, 1023, fs_group), ("egress", 988, 1023, fs_group),  # Lustre servers among themselves
    }  # fmt: skip
    assert all(r["security_group_id"] == fs_group for _, r in rules)
    # Inline rules beside rule resources: each apply would revoke the others' (the nodes' mounts).
    assert not {"ingress", "egress"} & set(sgs["network_shared-fs_security-group"])
    script = _resources(train, "aws_launch_template")["pool-gpu8_launch-template"]
    user_data = train["locals"]["user-data-gpu8"]
    assert "mount -t lustre" in user_data and "${aws_fsx_lustre_file_system." in user_data
    assert "TIDEFLEET-SHARED-FS-PLACEHOLDER" not in user_data and script


@pytest.fixture(scope="module")
def gcp_training(tmp_path_factory) -> dict:
    """gcp-dev plus a Filestore and a cluster-placed gpu pool mounting it."""
    from stacks.app import synth

    data = tomllib.loads((ROOT / "gcp-dev.toml").read_text())
    data["shared_fs"] = {"kind": "filestore", "size_gb": 1024}
    gpu = data["pools"]["gpu"]
    gpu["placement"] = "cluster"
    gpu["data"] = {**gpu["data"], "shared_fs_mount": "/mnt/shared"}
    env = parse_environment(data, name="gcp-dev")
    stack_dir = synth(env, tmp_path_factory.mktemp("synth-gcp-training"))
    return json.loads((stack_dir / "cdk.tf.json").read_text())


def test_gcp_grants_each_bucket_to_its_prefixes_only(gcp_training):
    grants = [g for name, g in _resources(gcp_training, "google_storage_bucket_iam_member").items() if "-data-" in name]
    by_bucket = {g["bucket"]: g for g in grants}
    assert by_bucket["acme-ml-datasets"]["role"] == "roles/storage.objectViewer"
    assert by_bucket["acme-ml-models"]["role"] == "roles/storage.objectUser"
    assert 'objects/imagenet/")' in by_bucket["acme-ml-datasets"]["condition"]["expression"]
    assert "datasets" not in by_bucket["acme-ml-models"]["condition"]["expression"]


def test_gcp_mounts_filestore_and_opens_the_gang_firewall_to_the_pool_only(gcp_training):
    (filestore,) = _resources(gcp_training, "google_filestore_instance").values()
    assert filestore["file_shares"]["capacity_gb"] == 1024 and filestore["kms_key_name"]
    gang = _resources(gcp_training, "google_compute_firewall")["gang-gpu"]
    assert gang["source_service_accounts"] == gang["target_service_accounts"]
    templates = _resources(gcp_training, "google_compute_instance_template")
    script = templates["pool-gpu_template-spot"]["metadata"]["startup-script"]
    assert "mount -t nfs" in script and "google_filestore_instance.shared-fs.networks[0].ip_addresses" in script
    assert "mount" not in templates["pool-cpu_template-spot"]["metadata"]["startup-script"].split("tidefleet-agent")[0]


def test_each_gcp_resource_encrypted_with_the_key_waits_for_its_services_grant(gcp_training):
    """Pub/Sub, Cloud Storage, Compute Engine and Filestore each check at creation that their agent
    may use the key: a resource that took the key's id directly could be created before the grant
    (the first apply failed). Each takes it from its service's grant; Cloud Storage's agent comes
    from its data source, which makes it on a fresh project."""
    grants = _resources(gcp_training, "google_kms_crypto_key_iam_member")
    assert grants["key-user-storage"]["member"] == "serviceAccount:${data.google_storage_project_service_account.storage-agent.email_address}"
    assert grants["key-user-filestore"]["member"].endswith("@cloud-filer.iam.gserviceaccount.com")
    via = lambda service: f"${{google_kms_crypto_key_iam_member.key-user-{service}.crypto_key_id}}"
    (filestore,) = _resources(gcp_training, "google_filestore_instance").values()
    assert filestore["kms_key_name"] == via("filestore")
    topics = _resources(gcp_training, "google_pubsub_topic").values()
    assert topics and all(t["kms_key_name"] == via("pubsub") for t in topics)
    (bucket,) = _resources(gcp_training, "google_storage_bucket").values()
    assert bucket["encryption"]["default_kms_key_name"] == via("storage")
    templates = _resources(gcp_training, "google_compute_instance_template").values()
    keys = {d["disk_encryption_key"]["kms_key_self_link"] for t in templates for d in t["disk"]}
    assert keys == {via("compute")}


def test_the_train_environment_loads_with_data_a_shared_fs_and_efa():
    env = load_environment("train", ROOT)
    pool = env.pools["gpu8"]
    assert pool.efa and pool.placement == "cluster" and env.shared_fs.kind == "fsx-lustre"
    assert [w for *_, w in pool.data.locations()] == [False, False, True]
