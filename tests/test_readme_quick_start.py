"""The README's first blocks as a user pastes them: the quick start (what CI installs and runs, and
the sandbox it starts) and the sample `tidefleet validate` output of the configuration reference."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def block_after(heading: str) -> str:
    """The first fenced block after `heading`."""
    return re.search(re.escape(heading) + r"\n.*?```[a-z]*\n(.*?)```", README, re.DOTALL)[1]


def outside_env() -> dict[str, str]:
    """This environment without tidefleet's variables: a user's shell, as the README assumes."""
    return {k: v for k, v in os.environ.items() if not k.startswith("TIDEFLEET_")}


def quick_start() -> tuple[list[str], str]:
    """(step 1's commands, step 2's command)."""
    install, test = [line for line in block_after("## Quick start").splitlines() if line and not line.startswith("#")]
    return install.split(" && "), test


def test_ci_installs_as_the_quick_start_says_and_runs_its_test_command():
    (venv, pip, _sandbox), test = quick_start()
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert venv in ci
    quiet = pip.replace(" install ", " install -q ")  # CI's log: the same install, quieter
    assert any(line.startswith(quiet + " ") for line in ci), (quiet, ci)
    assert ci[-1] == test, "CI's last command is the README's test command"


@pytest.mark.sandbox
def test_the_quick_starts_sandbox_command_runs_the_demo_to_the_end():
    *_, sandbox = quick_start()[0]
    argv = shlex.split(sandbox)
    assert argv[0] == ".venv/bin/invoke"
    argv[0] = str(Path(sys.executable).parent / "invoke")  # this test run's environment, as the README's
    run = subprocess.run(argv, check=False, cwd=ROOT, capture_output=True, text=True, timeout=600, env=outside_env())
    said = run.stdout + run.stderr
    assert run.returncode == 0 and "Traceback" not in said, said[-3000:]
    assert re.search(r"failed unexpectedly\W+0\b", said) and re.search(r"fleet back at zero\W+yes", said), said[-3000:]


def test_the_sample_validate_output_is_what_validate_says(tmp_path):
    dev = (ROOT / "environments" / "dev.toml").read_text()
    mistakes = [("min = 0\n", "min = 5\n"), ("max = 10\n", "max = 2\n"), ('pool = "cpu"\n', 'pool = "gpu"\n')]
    for right, wrong in mistakes:
        assert dev.count(right) == 1, right
        dev = dev.replace(right, wrong)
    (tmp_path / "environments").mkdir()
    (tmp_path / "environments" / "dev.toml").write_text(dev)
    run = subprocess.run([sys.executable, "-m", "tidefleet.cli", "validate", "dev"], check=False, cwd=tmp_path,
                         capture_output=True, text=True, timeout=120, env=outside_env())  # fmt: skip
    header, *problems = block_after("## Configuration reference").strip().splitlines()
    said = (run.stdout + run.stderr).strip().splitlines()
    assert run.returncode == 1 and said[1:] == problems, said
    assert header.startswith("/") and header.endswith("/environments/dev.toml: 2 problem(s)")
    assert said[0] == f"{tmp_path}/environments/dev.toml: 2 problem(s)"  # ./environments, where it was run


def test_the_offline_gpu_recipe_installs_every_runtime_dependency():
    """docs/gpu-tests.md installs the project with --no-deps, so its lists must name what the
    project needs at run time: they left out psutil, and both GPU test files failed to import."""
    import tomllib

    needed = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    doc = (ROOT / "docs" / "gpu-tests.md").read_text().replace("\\\n", " ")
    download = next(line for line in doc.splitlines() if line.startswith("pip download"))
    install = next(line for line in doc.splitlines() if line.startswith("python3 -m pip install") and "--no-deps" not in line)
    for line in (download, install):
        assert [d for d in needed if f"'{d}'" not in line] == [], line
