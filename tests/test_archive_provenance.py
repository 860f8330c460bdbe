"""A function archive says what it was built from: `tidefleet/build_info.json` inside it names
the newest commit that changed a packaged file and whether the packaged files differ from it
(uncommitted edits, new or deleted files), and `invoke build` (so plan and deploy too) prints one
line when they do. The build still works from any working tree, or from no git checkout at all."""

from __future__ import annotations

import json
import shutil
import subprocess
import zipfile

import pytest
from invoke import MockContext

import tasks
from stacks import package
from stacks.package import ROOT, build_aws_archive, build_gcp_archive
from tidefleet.config import load_environment

BUILD_INFO = "tidefleet/build_info.json"
ENV = load_environment("dev")  # the environment the archives package: the checkout's dev.toml (`packaging`)
pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def git(repo, *args) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args], cwd=repo,
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip


def info_of(archive) -> dict:
    with zipfile.ZipFile(archive) as z:
        return json.loads(z.read(BUILD_INFO))


def packaging(root) -> dict:
    """The builders' arguments for dev from `root`'s own environments/dev.toml."""
    return {"root": root, "env": ENV, "env_file": root / "environments" / "dev.toml"}


@pytest.fixture
def checkout(tmp_path):
    """A git checkout holding a copy of the packaged sources, all committed."""
    repo = tmp_path / "repo"
    for top in ("lambdas", "tidefleet", "environments"):
        shutil.copytree(ROOT / top, repo / top, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (repo / "README.md").write_text("docs\n")
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "first")
    return repo


def test_a_clean_checkout_records_its_commit_and_no_changes(checkout, tmp_path):
    head = git(checkout, "rev-parse", "HEAD")
    for build in (build_gcp_archive, lambda out, **kw: build_aws_archive(out, wheels=[], **kw)):
        assert info_of(build(tmp_path / "f.zip", **packaging(checkout))[0]) == {"commit": head, "dirty": False,
                                                                               "changed": []}  # fmt: skip


def test_uncommitted_packaged_files_are_recorded_and_others_are_not(checkout, tmp_path):
    head = git(checkout, "rev-parse", "HEAD")
    (checkout / "tidefleet" / "naming.py").write_text("edited\n")  # changed
    (checkout / "tidefleet" / "new.py").write_text("x = 1\n")  # untracked
    (checkout / "tidefleet" / "cli.py").unlink()  # deleted
    (checkout / "README.md").write_text("edited\n")  # not packaged
    (checkout / "tidefleet" / "sim" / "engine.py").write_text("edited\n")  # left out of both archives
    (checkout / "environments" / "prod.toml").write_text("edited\n")  # another environment's: not packaged
    (checkout / "environments" / "dev.toml").write_text((ROOT / "environments" / "dev.toml").read_text() + "\n")
    (checkout / "lambdas" / "scaler" / "handler.py").write_text("edited\n")  # AWS only
    both = ["environments/dev.toml", "tidefleet/cli.py", "tidefleet/naming.py", "tidefleet/new.py"]
    gcp = info_of(build_gcp_archive(tmp_path / "g.zip", **packaging(checkout))[0])
    assert gcp == {"commit": head, "dirty": True, "changed": both}
    aws = info_of(build_aws_archive(tmp_path / "a.zip", wheels=[], **packaging(checkout))[0])
    assert aws == {"commit": head, "dirty": True, "changed": sorted([*both, "lambdas/scaler/handler.py"])}
    git(checkout, "add", "tidefleet/naming.py")  # staged is still not committed
    assert "tidefleet/naming.py" in info_of(build_gcp_archive(tmp_path / "g.zip", **packaging(checkout))[0])["changed"]


def test_a_commit_that_packages_nothing_new_leaves_the_archive_byte_for_byte(checkout, tmp_path):
    """The recorded commit is the newest one that changed a packaged file, not HEAD: a commit of
    docs alone, or of another environment's file, must not change the archive's hash, which
    would redeploy every function."""
    first = build_gcp_archive(tmp_path / "a.zip", **packaging(checkout))[1]
    (checkout / "README.md").write_text("more docs\n")
    git(checkout, "commit", "-q", "-am", "docs")
    assert build_gcp_archive(tmp_path / "b.zip", **packaging(checkout))[1] == first
    (checkout / "environments" / "prod.toml").write_text("# prod, edited\n")
    git(checkout, "commit", "-q", "-am", "prod")
    assert build_gcp_archive(tmp_path / "b.zip", **packaging(checkout))[1] == first
    (checkout / "tidefleet" / "naming.py").write_text("edited\n")
    git(checkout, "commit", "-q", "-am", "code")
    path, digest = build_gcp_archive(tmp_path / "c.zip", **packaging(checkout))
    assert digest != first and info_of(path)["commit"] == git(checkout, "rev-parse", "HEAD")
    (checkout / "environments" / "dev.toml").write_text((ROOT / "environments" / "dev.toml").read_text() + "\n")
    git(checkout, "commit", "-q", "-am", "dev")  # the environment's own file: packaged, so recorded
    path, again = build_gcp_archive(tmp_path / "d.zip", **packaging(checkout))
    assert again != digest and info_of(path) == {"commit": git(checkout, "rev-parse", "HEAD"), "dirty": False,
                                                 "changed": []}  # fmt: skip


def test_an_environment_file_from_outside_the_checkout_is_named_as_such(checkout, tmp_path):
    outside = tmp_path / "configs" / "dev.toml"
    outside.parent.mkdir()
    outside.write_bytes((checkout / "environments" / "dev.toml").read_bytes())
    info = info_of(build_gcp_archive(tmp_path / "f.zip", root=checkout, env=ENV, env_file=outside)[0])
    assert info == {"commit": git(checkout, "rev-parse", "HEAD"), "dirty": False, "changed": [],
                    "outside_checkout": ["environments/dev.toml"]}  # fmt: skip


def test_no_git_checkout_builds_and_says_so(tmp_path):
    snapshot = tmp_path / "src"
    for top in ("lambdas", "tidefleet", "environments"):
        shutil.copytree(ROOT / top, snapshot / top)
    info = info_of(build_gcp_archive(tmp_path / "f.zip", **packaging(snapshot))[0])
    assert info == {"commit": None, "dirty": None, "changed": [], "note": "not a git checkout"}


def test_invoke_build_prints_one_line_naming_the_uncommitted_files(checkout, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(package, "ROOT", checkout)
    monkeypatch.setenv("TIDEFLEET_ENVIRONMENTS", str(checkout / "environments"))  # the checkout's gcp-dev.toml
    tasks.build(MockContext(), env="gcp-dev", out=str(tmp_path))
    assert capsys.readouterr().err == ""  # clean: nothing to say
    (checkout / "tidefleet" / "naming.py").write_text("edited\n")
    (checkout / "environments" / "gcp-dev.toml").write_text((ROOT / "environments" / "gcp-dev.toml").read_text() + "\n")
    (checkout / "environments" / "dev.toml").write_text("edited\n")  # not gcp-dev's archive's
    tasks.build(MockContext(), env="gcp-dev", out=str(tmp_path))
    said = capsys.readouterr()
    head = git(checkout, "rev-parse", "HEAD")[:12]
    assert said.err.splitlines() == [
        (f"warning: {tmp_path / 'gcp-scaler-gcp-dev.zip'} is built from uncommitted changes in 2 files: "
         f"environments/gcp-dev.toml, tidefleet/naming.py (the archive records commit {head} and these files in "
         "tidefleet/build_info.json)")
    ]  # fmt: skip
    assert said.out.startswith(f"{tmp_path / 'gcp-scaler-gcp-dev.zip'} sha256=")


def test_invoke_build_outside_a_git_checkout_says_so_and_goes_on(tmp_path, monkeypatch, capsys):
    snapshot = tmp_path / "src"
    for top in ("lambdas", "tidefleet", "environments"):
        shutil.copytree(ROOT / top, snapshot / top)
    monkeypatch.setattr(package, "ROOT", snapshot)
    monkeypatch.setenv("TIDEFLEET_ENVIRONMENTS", str(snapshot / "environments"))
    monkeypatch.setenv("PATH", "/nonexistent")  # no git at all: the same line
    tasks.build(MockContext(), env="gcp-dev", out=str(tmp_path / "out"))
    said = capsys.readouterr()
    assert said.err.splitlines() == [(f"note: {tmp_path / 'out' / 'gcp-scaler-gcp-dev.zip'}: not a git checkout, so "
                                      "the archive records no commit")]  # fmt: skip
    assert (tmp_path / "out" / "gcp-scaler-gcp-dev.zip").is_file()
