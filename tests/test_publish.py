"""`invoke deploy` publishes what a node installs at boot to the artifacts bucket: a wheelhouse
of the agent and its dependencies and hash-pinned requirements. The wheelhouse here is real
(pip downloads from its cache or the index), and it is installed with the exact pip line of the
rendered user-data, with every pip configuration file and index out of reach."""

import hashlib
import os
import re
import shutil
import subprocess
import sys

import boto3
import pytest

from stacks.publish import ROOT, build_agent_wheel, build_wheelhouse, publish_agent
from tests.gcp_fake import FakeGcp
from tests.test_gcp_jobs import calls, gcp  # noqa: F401 - gcp is a fixture
from tidefleet import naming
from tidefleet.config import environment_path, load_environment
from tidefleet.userdata import render_user_data

PIN = re.compile(r"([a-z0-9-]+)==(\S+)((?: --hash=sha256:[0-9a-f]{64})+)")


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory):
    """The dev environment's wheelhouse, built from this checkout for every node platform."""
    out = tmp_path_factory.mktemp("publish")
    return build_wheelhouse(load_environment("dev"), build_agent_wheel(out / "dist"), out / "house")


def sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def pins(house) -> dict[str, tuple[str, set[str]]]:
    out = {}
    for line in (house / "requirements.txt").read_text().splitlines():
        match = PIN.fullmatch(line)
        assert match, f"not pinned with hashes: {line!r}"
        out[match[1]] = (match[2], set(re.findall(r"[0-9a-f]{64}", match[3])))
    return out


def node_install(house, venv):
    """The user-data's install line, run with the wheelhouse where a node downloads it."""
    script = render_user_data(load_environment("dev"), "cpu", artifacts_bucket="b")
    (line,) = [line for line in script.splitlines() if "--require-hashes" in line]
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    line = line.replace("/opt/tidefleet/venv", str(venv)).replace("/opt/tidefleet/agent", str(house))
    return subprocess.run(["bash", "-c", line], capture_output=True, text=True, check=False,
                          env={"PATH": os.environ["PATH"], "HOME": str(venv), "PIP_CONFIG_FILE": os.devnull})  # fmt: skip


def test_requirements_pin_every_wheel_to_one_version_and_its_sha256(wheelhouse):
    pinned = pins(wheelhouse)
    wheels = sorted((wheelhouse / "wheels").glob("*.whl"))
    assert {sha256(w) for w in wheels} == set().union(*(hashes for _, hashes in pinned.values()))
    assert {"tidefleet", "pydantic", "pydantic-core", "boto3", "jinja2", "click", "rich", "psutil"} <= set(pinned)
    psutil = [w.name for w in wheels if w.name.startswith("psutil-")]
    assert [any(arch in name for name in psutil) for arch in ("x86_64", "aarch64")] == [True, True]


def test_dependencies_are_pinned_to_the_versions_installed_where_the_agent_was_tested(wheelhouse):
    from importlib.metadata import version

    pinned = pins(wheelhouse)
    assert {name: pinned[name][0] for name in ("pydantic", "boto3", "jinja2")} == {
        name: version(name) for name in ("pydantic", "boto3", "jinja2")}  # fmt: skip


def test_a_node_installs_the_agent_from_the_wheelhouse_alone(wheelhouse, tmp_path):
    result = node_install(wheelhouse, tmp_path / "venv")
    assert result.returncode == 0, result.stderr
    out = subprocess.run([str(tmp_path / "venv/bin/tidefleet"), "agent", "--help"], capture_output=True, text=True,
                         check=False)
    assert out.returncode == 0 and "--pool" in out.stdout, out.stderr


def test_a_node_refuses_a_wheel_replaced_in_the_bucket(wheelhouse, tmp_path):
    house = tmp_path / "house"
    shutil.copytree(wheelhouse, house)
    (wheel,) = (house / "wheels").glob("tidefleet-*.whl")
    wheel.write_bytes(wheel.read_bytes() + b"\0")
    result = node_install(house, tmp_path / "venv")
    assert result.returncode != 0 and "DO NOT MATCH THE HASHES" in result.stderr


def test_publish_puts_the_wheelhouse_and_environment_where_user_data_fetches_them(aws, wheelhouse):
    env = load_environment("dev")
    bucket = naming.artifacts_bucket("dev", boto3.client("sts").get_caller_identity()["Account"])
    boto3.client("s3").create_bucket(Bucket=bucket)

    written = publish_agent(env, wheelhouse)

    wheels = sorted(f"agent/wheels/{w.name}" for w in (wheelhouse / "wheels").glob("*.whl"))
    # Wheels first: a node booting meanwhile never reads requirements naming a missing wheel.
    assert written == [f"s3://{bucket}/{k}" for k in [*wheels, "agent/requirements.txt", "agent/environments/dev.toml"]]
    keys = sorted(o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket=bucket)["Contents"])
    assert keys == sorted([*wheels, "agent/requirements.txt", "agent/environments/dev.toml"])


def test_publish_uploads_the_file_the_environment_was_loaded_from_not_a_same_named_one(aws, wheelhouse, tmp_path):
    """`--env path/to/dev.toml`: the nodes got environments/dev.toml of the checkout, which the
    function archive never did (stacks.package.environment_file)."""
    given = tmp_path / "dev.toml"
    given.write_text(environment_path("dev").read_text().replace("max = 10", "max = 7"))
    env = load_environment(str(given))
    assert env.pools["cpu"].max == 7
    bucket = naming.artifacts_bucket("dev", boto3.client("sts").get_caller_identity()["Account"])
    boto3.client("s3").create_bucket(Bucket=bucket)
    publish_agent(env, wheelhouse)
    uploaded = boto3.client("s3").get_object(Bucket=bucket, Key="agent/environments/dev.toml")["Body"].read()
    assert uploaded == given.read_bytes()


def test_a_gce_node_gets_the_google_clients_for_each_of_its_pythons(tmp_path):
    # x86_64 only, to keep the download small; the arm64 wheels come the same way (above).
    house = build_wheelhouse(load_environment("gcp-dev"), build_agent_wheel(tmp_path / "dist"), tmp_path / "house",
                             archs=("x86_64",))  # fmt: skip
    pinned = pins(house)
    assert {"google-cloud-pubsub", "google-cloud-firestore", "grpcio", "tidefleet"} <= set(pinned)
    grpcio = [w.name for w in (house / "wheels").glob("grpcio-*.whl")]
    assert [any(f"-{tag}-" in name for name in grpcio) for tag in ("cp311", "cp312")] == [True, True]


def test_publish_on_gcp_uploads_to_the_artifacts_bucket_through_the_gcs_json_api(gcp: FakeGcp, tmp_path):  # noqa: F811
    env = load_environment("gcp-dev")
    (tmp_path / "wheels").mkdir()
    wheel = tmp_path / "wheels" / "tidefleet-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"wheel")
    (tmp_path / "requirements.txt").write_text(f"tidefleet==0.1.0 --hash=sha256:{sha256(wheel)}\n")

    written = publish_agent(env, tmp_path)

    bucket = naming.artifacts_bucket("gcp-dev", env.project)
    names = [f"agent/wheels/{wheel.name}", "agent/requirements.txt", "agent/environments/gcp-dev.toml"]
    assert [(c["query"], c["content_type"]) for c in calls(gcp, "POST", f"/upload/storage/v1/b/{bucket}/o")] == [
        ({"uploadType": "media", "name": name}, "application/octet-stream") for name in names
    ]
    assert gcp.objects == {f"{bucket}/agent/wheels/{wheel.name}": b"wheel",
                           f"{bucket}/agent/requirements.txt": (tmp_path / "requirements.txt").read_bytes(),
                           f"{bucket}/agent/environments/gcp-dev.toml": (ROOT / "environments/gcp-dev.toml").read_bytes()}
    assert written == [f"gs://{bucket}/{name}" for name in names]
