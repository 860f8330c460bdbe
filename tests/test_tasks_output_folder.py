"""The tasks write under build/ (synthesized stacks, archives): where that is a file or cannot be
written, synth, scan, plan, deploy, destroy and bootstrap end in one line naming the folder and
what to do, as `invoke build --out` does, not in a NotADirectoryError traceback."""

from __future__ import annotations

import pytest
from invoke import Exit, MockContext

import tasks


@pytest.fixture
def build_is_a_file(tmp_path, monkeypatch):
    out = tmp_path / "build"
    out.write_text("not a folder")
    monkeypatch.setattr(tasks, "OUT", out)
    monkeypatch.delenv("TIDEFLEET_ENV", raising=False)
    return out


def fix(out) -> str:
    return f"the tasks write under {out}: make it a folder you can write (move away a file of that name)"


@pytest.mark.parametrize("task", [tasks.synth, tasks.scan])
def test_synth_and_scan_name_the_folder(build_is_a_file, task):
    with pytest.raises(Exit) as refused:
        task(MockContext(), env="dev")
    assert refused.value.code == 1
    assert refused.value.message == (f"cannot write {build_is_a_file}/synth/dev (Not a directory); "
                                     f"{fix(build_is_a_file)}")  # fmt: skip


def test_bootstrap_names_the_folder(build_is_a_file):
    with pytest.raises(Exit) as refused:
        tasks.bootstrap(MockContext(), repo="a/b")
    assert refused.value.message == (f"cannot write {build_is_a_file}/synth/bootstrap (Not a directory); "
                                     f"{fix(build_is_a_file)}")  # fmt: skip


def test_the_archive_build_plan_and_deploy_run_first_gives_no_out_option_to_fix_it(build_is_a_file):
    """plan/deploy/destroy build the archive without --out: "give --out a folder" is no advice there."""
    with pytest.raises(Exit) as refused:
        tasks.build(MockContext(), cloud="gcp")
    assert refused.value.message.startswith(f"build: cannot write {build_is_a_file} (")
    assert refused.value.message.endswith(fix(build_is_a_file)) and "--out" not in refused.value.message
