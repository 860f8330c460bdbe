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

BUILD_INFO = "tidefleet/build_info.json"
pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def git(repo, *args) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args], cwd=repo,
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip


def info_of(archive) -> dict:
    with zipfile.ZipFile(archive) as z:
        return json.loads(z.read(BUILD_INFO))


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
    for build in (build_gcp_archive, lambda out, root: build_aws_archive(out, root=root, wheels=[])):
        assert info_of(build(tmp_path / "f.zip", root=checkout)[0]) == {"commit": head, "dirty": False, "changed": []}


def test_uncommitted_packaged_files_are_recorded_and_others_are_not(checkout, tmp_path):
    head = git(checkout, "rev-parse", "HEAD")
    (checkout / "tidefleet" / "naming.py").write_text("edited\n")  # changed
    (checkout / "tidefleet" / "new.py").write_text("x = 1\n")  # untracked
    (checkout / "environments" / "dev.toml").unlink()  # deleted
    (checkout / "README.md").write_text("edited\n")  # not packaged
    (checkout / "tidefleet" / "sim" / "engine.py").write_text("edited\n")  # left out of both archives
    (checkout / "lambdas" / "scaler" / "handler.py").write_text("edited\n")  # AWS only
    both = ["environments/dev.toml", "tidefleet/naming.py", "tidefleet/new.py"]
    gcp = info_of(build_gcp_archive(tmp_path / "g.zip", root=checkout)[0])
    assert gcp == {"commit": head, "dirty": True, "changed": both}
    aws = info_of(build_aws_archive(tmp_path / "a.zip", root=checkout, wheels=[])[0])
    assert aws == {"commit": head, "dirty": True, "changed": sorted([*both, "lambdas/scaler/handler.py"])}
    git(checkout, "add", "tidefleet/naming.py")  # staged is still not committed
    assert "tidefleet/naming.py" in info_of(build_gcp_archive(tmp_path / "g.zip", root=checkout)[0])["changed"]


def test_a_commit_that_packages_nothing_new_leaves_the_archive_byte_for_byte(checkout, tmp_path):
    """The recorded commit is the newest one that changed a packaged file, not HEAD: a commit of
    docs alone must not change the archive's hash, which would redeploy every function."""
    first = build_gcp_archive(tmp_path / "a.zip", root=checkout)[1]
    (checkout / "README.md").write_text("more docs\n")
    git(checkout, "commit", "-q", "-am", "docs")
    assert build_gcp_archive(tmp_path / "b.zip", root=checkout)[1] == first
    (checkout / "tidefleet" / "naming.py").write_text("edited\n")
    git(checkout, "commit", "-q", "-am", "code")
    path, digest = build_gcp_archive(tmp_path / "c.zip", root=checkout)
    assert digest != first and info_of(path)["commit"] == git(checkout, "rev-parse", "HEAD")


def test_no_git_checkout_builds_and_says_so(tmp_path):
    snapshot = tmp_path / "src"
    for top in ("lambdas", "tidefleet", "environments"):
        shutil.copytree(ROOT / top, snapshot / top)
    info = info_of(build_gcp_archive(tmp_path / "f.zip", root=snapshot)[0])
    assert info == {"commit": None, "dirty": None, "changed": [], "note": "not a git checkout"}


def test_invoke_build_prints_one_line_naming_the_uncommitted_files(checkout, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(package, "ROOT", checkout)
    tasks.build(MockContext(), cloud="gcp", out=str(tmp_path))
    assert capsys.readouterr().err == ""  # clean: nothing to say
    (checkout / "tidefleet" / "naming.py").write_text("edited\n")
    (checkout / "environments" / "dev.toml").write_text("edited\n")
    tasks.build(MockContext(), cloud="gcp", out=str(tmp_path))
    said = capsys.readouterr()
    head = git(checkout, "rev-parse", "HEAD")[:12]
    assert said.err.splitlines() == [
        (f"warning: {tmp_path / 'gcp-scaler.zip'} is built from uncommitted changes in 2 files: environments/dev.toml, "
         f"tidefleet/naming.py (the archive records commit {head} and these files in tidefleet/build_info.json)")
    ]  # fmt: skip
    assert said.out.startswith(f"{tmp_path / 'gcp-scaler.zip'} sha256=")


def test_invoke_build_outside_a_git_checkout_says_so_and_goes_on(tmp_path, monkeypatch, capsys):
    snapshot = tmp_path / "src"
    for top in ("lambdas", "tidefleet", "environments"):
        shutil.copytree(ROOT / top, snapshot / top)
    monkeypatch.setattr(package, "ROOT", snapshot)
    monkeypatch.setenv("PATH", "/nonexistent")  # no git at all: the same line
    tasks.build(MockContext(), cloud="gcp", out=str(tmp_path / "out"))
    said = capsys.readouterr()
    assert said.err.splitlines() == [(f"note: {tmp_path / 'out' / 'gcp-scaler.zip'}: not a git checkout, so the "
                                      "archive records no commit")]  # fmt: skip
    assert (tmp_path / "out" / "gcp-scaler.zip").is_file()
