"""The function archives are deterministic, and each holds what its cloud's runtime needs and
nothing that would shadow what the runtime provides or installs."""

from __future__ import annotations

import shutil
import zipfile

import pytest

from stacks.package import (
    AWS_SOURCES,
    FIXED_TIME,
    ROOT,
    build_aws_archive,
    build_gcp_archive,
    runtime_wheels,
)
from tidefleet.config import load_environment

ENVS = {"aws": load_environment("dev"), "gcp": load_environment("gcp-dev")}


@pytest.fixture(scope="module")
def wheels():
    try:
        return runtime_wheels()
    except RuntimeError as err:  # no package index reachable: say so rather than pass
        pytest.skip(f"cannot pip download the Lambda wheels here: {err}")


@pytest.fixture(scope="module")
def builders(wheels):
    return {"aws": lambda out, **kw: build_aws_archive(out, wheels=wheels, env=ENVS["aws"], **kw),
            "gcp": lambda out, **kw: build_gcp_archive(out, env=ENVS["gcp"], **kw)}


def names_and_infos(path):
    with zipfile.ZipFile(path) as archive:
        infos = archive.infolist()
    return [i.filename for i in infos], infos


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_same_inputs_give_the_same_archive_byte_for_byte(tmp_path, builders, cloud):
    # A snapshot of the sources: the shared checkout may change between the two builds.
    snapshot = tmp_path / "src"
    for top in (*AWS_SOURCES, "environments"):
        shutil.copytree(ROOT / top, snapshot / top)
    env_file = snapshot / "environments" / f"{ENVS[cloud].name}.toml"
    first, digest = builders[cloud](tmp_path / "a.zip", root=snapshot, env_file=env_file)
    for path in snapshot.rglob("*"):  # new timestamps and modes must not matter
        path.touch()
        path.chmod(0o755 if path.is_dir() else 0o600)
    second, again = builders[cloud](tmp_path / "b.zip", root=snapshot, env_file=env_file)
    assert digest == again and first.read_bytes() == second.read_bytes()


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_entries_are_sorted_with_one_time_and_mode_and_no_bytecode(tmp_path, builders, cloud):
    names, infos = names_and_infos(builders[cloud](tmp_path / "f.zip")[0])
    assert names == sorted(names)
    assert {(i.date_time, i.external_attr >> 16) for i in infos} == {(FIXED_TIME, 0o644)}
    assert not any("__pycache__" in n or n.endswith(".pyc") for n in names)


def test_the_lambda_archive_holds_the_aws_handlers_library_and_linux_wheels_but_not_boto3(tmp_path, wheels):
    names, _ = names_and_infos(build_aws_archive(tmp_path / "f.zip", wheels=wheels, env=load_environment("prod"))[0])
    assert {"lambdas/scaler/handler.py", "lambdas/interruption/handler.py", "tidefleet/triggers.py",
            "environments/prod.toml"} <= set(names)  # fmt: skip
    assert [n for n in names if n.startswith("environments/")] == ["environments/prod.toml"]  # its own alone
    assert any(n.startswith("pydantic_core/_pydantic_core.cpython-312-x86_64-linux-gnu") for n in names)
    assert not any(n.startswith(("boto3/", "botocore/", "lambdas/gcp_scaler/")) for n in names)
    assert "requirements.txt" not in names and "main.py" not in names


def test_the_cloud_function_archive_is_main_py_the_library_and_what_to_install_without_wheels(tmp_path):
    path, _ = build_gcp_archive(tmp_path / "f.zip", env=ENVS["gcp"])
    names, _ = names_and_infos(path)
    assert {n.split("/")[0] for n in names} == {"main.py", "requirements.txt", "tidefleet", "environments"}
    assert [n for n in names if n.startswith("environments/")] == ["environments/gcp-dev.toml"]
    with zipfile.ZipFile(path) as archive:
        assert archive.read("main.py") == (ROOT / "lambdas/gcp_scaler/main.py").read_bytes()
        wanted = [line for line in archive.read("requirements.txt").decode().splitlines() if not line.startswith("#")]
    names = {line.split("#")[0].split("==")[0].split(">")[0].strip() for line in wanted}
    assert {"google-cloud-compute", "google-cloud-firestore", "pydantic", "functions-framework"} <= names
