"""The README's simulator commands, read from README.md itself and run as written from a fresh
clone's root: each exits 0, prints a row per policy (and wait target) it names and writes the plot it names."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
SECTION = README.split("\n## The simulator\n", 1)[1].split("\n## ", 1)[0]
COMMAND = re.search(r"```bash\n(tidefleet simulate .*?)```", SECTION, re.DOTALL).group(1)
WAIT_TARGETS = README.split("\n#### Wait targets\n", 1)[1].split("\n#### ", 1)[0]
CURVE_COMMAND = re.search(r"```bash\n(tidefleet simulate .*?)```", WAIT_TARGETS, re.DOTALL).group(1)


def run_as_written(command: str, tmp_path: Path) -> tuple[subprocess.CompletedProcess, list[str], Path]:
    """(the run, the rows its --policy and --target-wait-s flags ask for, the plot it names)."""
    # The clone's root as the command sees it: its traces and environments, and room for the plot.
    for name in ("traces", "environments"):
        (tmp_path / name).symlink_to(ROOT / name)
    words = shlex.split(command.replace("\\\n", " "))
    rows = [words[i + 1] for i, word in enumerate(words) if word == "--policy"]
    rows += [f"tidefleet, target_wait_s={words[i + 1]}" for i, word in enumerate(words) if word == "--target-wait-s"]
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"  # the venv's console script
    run = subprocess.run(["bash", "-c", command], check=False, cwd=tmp_path, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PATH": path, "TIDEFLEET_TRACES": ""})  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    return run, rows, tmp_path / words[words.index("--plot") + 1]


def test_the_readme_simulate_command_runs_as_written(tmp_path):
    run, policies, plot = run_as_written(COMMAND, tmp_path)
    assert len(policies) == 5
    for policy in policies:  # a table row with a cost
        row = rf"^\| {re.escape(policy)} \| [\d,.]+ \|"
        assert re.search(row, run.stdout, re.MULTILINE), (policy, run.stdout)
    assert f"plot: {plot.name}" in run.stderr
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and plot.stat().st_size > 10_000


def test_the_readme_wait_target_curve_command_runs_as_written(tmp_path):
    run, rows, plot = run_as_written(CURVE_COMMAND, tmp_path)
    assert len(rows) == 4 and "wait-curve" in plot.name
    costs = {}
    for row in rows:  # a table row with a cost
        found = re.search(rf"^\| {re.escape(row)} \| ([\d,.]+) \|", run.stdout, re.MULTILINE)
        assert found, (row, run.stdout)
        costs[row] = float(found[1].replace(",", ""))
    # The README's numbers, as printed.
    assert costs == {"tidefleet": 7.96, "keda": 11.80, "tidefleet, target_wait_s=300": 7.49,
                     "tidefleet, target_wait_s=900": 7.52}  # fmt: skip
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
