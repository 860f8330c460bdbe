"""The functions archive is deterministic and holds what Lambda needs, and nothing it has."""

from __future__ import annotations

import shutil
import zipfile

import pytest

from stacks.package import FIXED_TIME, GCP_FUNCTION_REQUIREMENTS, ROOT, SOURCES, build_archive, runtime_wheels


@pytest.fixture(scope="module")
def wheels():
    try:
        return runtime_wheels()
    except RuntimeError as err:  # no package index reachable: say so rather than pass
        pytest.skip(f"cannot pip download the Lambda wheels here: {err}")


def test_same_inputs_give_the_same_archive_byte_for_byte(tmp_path, wheels):
    # A snapshot of the sources: the shared checkout may change between the two builds.
    snapshot = tmp_path / "src"
    for top in SOURCES:
        shutil.copytree(ROOT / top, snapshot / top)
    first, digest = build_archive(tmp_path / "a.zip", root=snapshot, wheels=wheels)
    for path in snapshot.rglob("*"):  # new timestamps and modes must not matter
        path.touch()
        path.chmod(0o755 if path.is_dir() else 0o600)
    second, again = build_archive(tmp_path / "b.zip", root=snapshot, wheels=wheels)
    assert digest == again and first.read_bytes() == second.read_bytes()


def test_archive_holds_handlers_library_environments_and_linux_wheels_but_not_boto3(tmp_path, wheels):
    path, _ = build_archive(tmp_path / "f.zip", wheels=wheels)
    with zipfile.ZipFile(path) as archive:
        infos = archive.infolist()
    names = [i.filename for i in infos]
    assert names == sorted(names)
    assert {"tidefleet/config.py", "environments/prod.toml", "lambdas/__init__.py"} <= set(names)
    assert any(n.startswith("pydantic_core/_pydantic_core.cpython-312-x86_64-linux-gnu") for n in names)
    assert not any(n.startswith(("boto3/", "botocore/")) or "__pycache__" in n for n in names)
    assert {(i.date_time, i.external_attr >> 16) for i in infos} == {(FIXED_TIME, 0o644)}


def test_archive_tells_the_cloud_functions_build_what_to_install(tmp_path, wheels):
    path, _ = build_archive(tmp_path / "f.zip", wheels=wheels)
    with zipfile.ZipFile(path) as archive:
        wanted = archive.read("requirements.txt").decode().splitlines()
    assert wanted == list(GCP_FUNCTION_REQUIREMENTS)
    names = {r.split(">")[0] for r in wanted}
    assert {"google-cloud-compute", "google-cloud-firestore", "pydantic", "functions-framework"} <= names
