"""The README's simulator command, read from README.md itself and run as written from a fresh
clone's root: it exits 0, prints a row per policy it names and writes the plot it names."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SECTION = (ROOT / "README.md").read_text().split("\n## The simulator\n", 1)[1].split("\n## ", 1)[0]
COMMAND = re.search(r"```bash\n(tidefleet simulate .*?)```", SECTION, re.DOTALL).group(1)


def test_the_readme_simulate_command_runs_as_written(tmp_path):
    # The clone's root as the command sees it: its traces and environments, and room for the plot.
    for name in ("traces", "environments"):
        (tmp_path / name).symlink_to(ROOT / name)
    words = shlex.split(COMMAND.replace("\\\n", " "))
    policies = [words[i + 1] for i, word in enumerate(words) if word == "--policy"]
    plot = tmp_path / words[words.index("--plot") + 1]
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"  # the venv's console script
    run = subprocess.run(["bash", "-c", COMMAND], check=False, cwd=tmp_path, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PATH": path, "TIDEFLEET_TRACES": ""})  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert len(policies) == 5
    for policy in policies:  # a table row with a cost
        row = rf"^\| {re.escape(policy)} \| [\d,.]+ \|"
        assert re.search(row, run.stdout, re.MULTILINE), (policy, run.stdout)
    assert f"plot: {plot.name}" in run.stderr
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and plot.stat().st_size > 10_000
