"""The functions archive is deterministic and holds what Lambda needs, and nothing it has."""

from __future__ import annotations

import zipfile

import pytest

from stacks.package import FIXED_TIME, build_archive, runtime_wheels


@pytest.fixture(scope="module")
def wheels():
    try:
        return runtime_wheels()
    except RuntimeError as err:  # no package index reachable: say so rather than pass
        pytest.skip(f"cannot pip download the Lambda wheels here: {err}")


def test_same_inputs_give_the_same_archive_byte_for_byte(tmp_path, wheels):
    first, digest = build_archive(tmp_path / "a.zip", wheels=wheels)
    (tmp_path / "touch").write_text("later")  # time passes, unrelated files change
    second, again = build_archive(tmp_path / "b.zip", wheels=wheels)
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
