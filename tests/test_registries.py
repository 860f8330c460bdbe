"""Private container images: the repositories a pool's images name, what its nodes may pull
(grants in the synthesized stacks) and how they log in (docker's credential helper at boot)."""

from __future__ import annotations

import json
import re
import tomllib

import pytest

from tidefleet.config import environment_path, environment_warnings, load_environment, parse_environment
from tidefleet.registries import Repository, pulls, repository
from tidefleet.userdata import render_user_data

ECR = "123456789012.dkr.ecr.us-east-1.amazonaws.com"


@pytest.mark.parametrize("reference,expected", [
    (f"{ECR}/team/train:v1", Repository(ECR, "123456789012", "us-east-1", "team/train")),
    (f"{ECR}/train@sha256:" + "0" * 64, Repository(ECR, "123456789012", "us-east-1", "train")),
    (f"{ECR}/team/*", Repository(ECR, "123456789012", "us-east-1", "team/*")),  # a pattern: IAM's wildcard
    (f"{ECR}/team/train:*", Repository(ECR, "123456789012", "us-east-1", "team/train")),
    (f"{ECR}/t[ab]in", Repository(ECR, "123456789012", "us-east-1", "t*")),  # IAM has no [..]: wider
    ("987654321098.dkr.ecr.cn-north-1.amazonaws.com.cn/x", Repository(
        "987654321098.dkr.ecr.cn-north-1.amazonaws.com.cn", "987654321098", "cn-north-1", "x")),
    ("us-docker.pkg.dev/acme-ml-dev/train/train:2026.11", Repository("us-docker.pkg.dev", "acme-ml-dev", "us", "train")),
    ("europe-west4-docker.pkg.dev/p/r/a/b:1", Repository("europe-west4-docker.pkg.dev", "p", "europe-west4", "r")),
    ("us-docker.pkg.dev/acme/repo/*", Repository("us-docker.pkg.dev", "acme", "us", "repo")),
    ("us-docker.pkg.dev/acme/*", None),  # which repository: not spelled out
    ("us-docker.pkg.dev/acme/repo", None),  # no image in it
    ("*.dkr.ecr.us-east-1.amazonaws.com/x", None),
    ("*", None),
    ("ghcr.io/acme/train:2026.11", None),
    ("ubuntu:24.04", None),
    ("library/ubuntu", None),
])  # fmt: skip
def test_a_reference_names_its_private_repository(reference, expected):
    assert repository(reference) == expected


def _env(text: str, name: str = "t"):
    return parse_environment(tomllib.loads(text), name=name)


AWS = f"""
cloud = "aws"
region = "us-east-1"
[pools.cpu]
max = 4
container = "{ECR}/acme/render:1"
instance_types = [{{ type = "c6i.large" }}]
[pools.cmd]
max = 4
command = "python3 work.py"
instance_types = [{{ type = "c6i.large" }}]
[queues.render]
pool = "cpu"
accept_images = ["{ECR}/team/*", "*", "ghcr.io/acme/*", "us-docker.pkg.dev/p/r/*"]
[queues.other]
pool = "cmd"
"""


def test_a_pool_pulls_from_its_container_and_its_queues_patterns_in_its_clouds_registry():
    env = _env(AWS)
    assert [r.name for r in pulls(env, "cpu")] == ["acme/render", "team/*"]
    assert pulls(env, "cmd") == []
    (warning,) = environment_warnings(env)
    assert warning.startswith("queues.render.accept_images[3]: 'us-docker.pkg.dev/p/r/*' is in Artifact Registry, "
                              "and the environment runs on aws")  # fmt: skip


def test_gcp_pulls_from_its_own_project_and_says_who_grants_another():
    text = environment_path("gcp-dev").read_text()
    env = _env(text.replace('container = "us-docker.pkg.dev/acme-ml-dev/', 'container = "us-docker.pkg.dev/shared-ml/'),
               name="gcp-dev")
    assert pulls(env, "gpu") == []
    (warning,) = [w for w in environment_warnings(env) if "shared-ml" in w]
    assert ("pools.gpu.container: 'us-docker.pkg.dev/shared-ml/train/train:2026.11' is in project shared-ml, not the "
            "environment's (acme-ml-dev): grant roles/artifactregistry.reader on repository train there to "
            "serviceAccount:") in warning  # fmt: skip
    assert pulls(load_environment("gcp-dev"), "gpu") == [Repository("us-docker.pkg.dev", "acme-ml-dev", "us", "train")]


def _config_json(script: str) -> dict:
    (body,) = re.findall(r"cat > /root/\.docker/config\.json <<'JSON'\n(.*?)\nJSON\n", script, re.DOTALL)
    return json.loads(body)


def test_the_boot_script_points_docker_at_the_ecr_credential_helper_for_each_registry():
    env = _env(AWS)
    script = render_user_data(env, "cpu", artifacts_bucket="b")
    assert _config_json(script) == {"credHelpers": {ECR: "ecr-login"}}
    assert re.search(r"^dnf install -y python3\.11 python3\.11-pip docker amazon-ecr-credential-helper$", script, re.MULTILINE)
    assert 'Environment="DOCKER_CONFIG=/root/.docker"' in script
    assert ".docker" not in render_user_data(env, "cmd", artifacts_bucket="b")  # a command pool


def test_the_gcp_boot_script_points_docker_at_gcloud_and_the_agent_finds_it():
    env = load_environment("gcp-dev")
    script = render_user_data(env, "gpu", artifacts_bucket="b")
    assert _config_json(script) == {"credHelpers": {"us-docker.pkg.dev": "gcloud"}}
    assert re.search(r'^Environment="PATH=[^"]*:/usr/bin:[^"]*:/snap/bin"$', script, re.MULTILINE)
    assert ".docker" not in render_user_data(env, "cpu", artifacts_bucket="b")  # a command pool


@pytest.mark.synth
def test_prods_render_nodes_may_pull_their_repository_and_nothing_else(synthesized):
    stack = synthesized["prod"][1]
    docs = stack["data"]["aws_iam_policy_document"]
    cpu = {s["sid"]: s for s in docs["pool-cpu_node-role_policy"]["statement"]}
    assert cpu["PullImages"]["resources"] == [("arn:${data.aws_partition.account_partition.partition}:ecr:us-east-1:"
                                              "123456789012:repository/acme/render")]  # fmt: skip
    assert sorted(cpu["PullImages"]["actions"]) == ["ecr:BatchCheckLayerAvailability", "ecr:BatchGetImage",
                                                    "ecr:GetDownloadUrlForLayer"]  # fmt: skip
    assert cpu["PullImagesTokenUnscopable"]["actions"] == ["ecr:GetAuthorizationToken"]
    gpu = {s["sid"] for s in docs["pool-gpu_node-role_policy"]["statement"]}
    assert not {"PullImages", "PullImagesTokenUnscopable"} & gpu, "a ghcr.io image: nothing to grant"
