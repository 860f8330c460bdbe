"""What a function runtime installs is pinned to the versions installed where the archive was
built (and its tests ran), dependencies of dependencies included: a redeploy months later
installs the same libraries. The Cloud Function's requirements.txt says `name==version`, and the
Lambda wheels are downloaded as `name==version`."""

from __future__ import annotations

import importlib.metadata
import zipfile

import pytest

from stacks import package
from stacks.package import GCP_FUNCTION_REQUIREMENTS, build_gcp_archive


def installed(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def requirement_lines(text: str) -> list[str]:
    return [line.split("#")[0].strip() for line in text.splitlines() if line.split("#")[0].strip()]


def test_the_cloud_function_requirements_pin_every_installed_library_and_its_dependencies(tmp_path):
    with zipfile.ZipFile(build_gcp_archive(tmp_path / "f.zip")[0]) as archive:
        lines = requirement_lines(archive.read("requirements.txt").decode())
    pins = dict(line.split("==") for line in lines if "==" in line and installed(line.split("==")[0]) is not None)
    declared = [r.split(">")[0].split("=")[0] for r in GCP_FUNCTION_REQUIREMENTS]
    for name in declared:
        if installed(name) is not None:
            assert pins[name] == installed(name), name
        else:  # not installed here: nothing to pin it to, so it stays as declared (the build says so)
            assert next(r for r in GCP_FUNCTION_REQUIREMENTS if r.startswith(name)) in lines
    # What the declared libraries bring is pinned too: a new protobuf or google-api-core breaks as surely.
    assert {"pydantic-core", "google-api-core", "protobuf"} <= pins.keys()
    assert all(installed(name) == version for name, version in pins.items())
    assert len(lines) == len(pins) + sum(installed(n) is None for n in declared)


def test_the_lambda_wheels_are_downloaded_at_the_installed_versions(tmp_path, monkeypatch):
    asked = []

    def pip(argv, **kwargs):
        asked.append([str(a) for a in argv])
        return type("Done", (), {"returncode": 0, "stderr": ""})()

    monkeypatch.setattr(package.subprocess, "run", pip)
    package.runtime_wheels(tmp_path / "cache")
    (argv,) = asked
    wanted = argv[argv.index("--dest") + 2:]
    assert wanted and all(r.count("==") == 1 for r in wanted), wanted
    assert {r.split("==")[0] for r in wanted} >= {"pydantic", "pydantic-core", "typing-extensions"}
    assert all(installed(name) == version for name, version in (r.split("==") for r in wanted))


def test_a_library_installed_outside_its_declared_range_stops_the_build():
    with pytest.raises(RuntimeError, match=r"pydantic [\d.]+ is installed here, outside pydantic<2"):
        package.pinned(["pydantic<2"])


def test_a_library_not_installed_here_stays_as_declared():
    assert package.pinned(["no-such-library-here>=1"]) == ([], ["no-such-library-here>=1"])
