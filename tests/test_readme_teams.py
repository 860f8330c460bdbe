"""The README's "Teams, quotas and fair share" examples, read from README.md itself: the environment
validates, the two ticks it describes give the reason lines it shows, and its simulate command
runs as written and prints a row per team."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tidefleet.config import ConfigError, parse_environment
from tidefleet.policy import decide
from tidefleet.policy.model import FleetView, NodeView, PoolView, QueueView

ROOT = Path(__file__).resolve().parent.parent
WHOLE = (ROOT / "README.md").read_text().split("\n## Teams, quotas and fair share\n", 1)[1].split("\n## ", 1)[0]
SECTION = WHOLE.split("\n### Preemption\n", 1)[0]  # its own example is tests/test_policy_preemption.py's
PLACEMENT = WHOLE.split("\n### Interruption-aware placement\n", 1)[1].split("\n### ", 1)[0]
ENV_TOML = re.search(r"```toml\n(.*?)```", SECTION, re.DOTALL).group(1)
TICKS = re.findall(r"```text\n(.*?)```", SECTION, re.DOTALL)
COMMAND = re.search(r"```bash\n(tidefleet simulate .*?)```", SECTION, re.DOTALL).group(1)
NOW = 100_000.0


def test_the_readme_environment_validates_with_its_teams():
    env = parse_environment(tomllib.loads(ENV_TOML), name="shared")
    assert set(env.teams) == {"vision", "nlp"} and env.teams["nlp"].weight == 2


def tick(vision: tuple[int, int], nlp: tuple[int, int], vision_waited_s: float | None = None, *,
         data: dict | None = None, extra: tuple[QueueView, ...] = ()) -> list[str]:  # fmt: skip
    """The README's fleet: 12 one-GPU nodes, each running one of vision's items."""
    env = parse_environment(data or tomllib.loads(ENV_TOML), name="shared")
    nodes = tuple(
        NodeView(f"i-{i}", "g5.xlarge", 1, 1, True, "running", NOW - 3600, busy_slots=1, last_heartbeat=NOW - 5)
        for i in range(12)
    )
    queues = tuple(
        QueueView(name, "gpu", 0, 1, *depth, team=env.team_of(name), max_wait_s=env.queues[name].max_wait_s,
                  oldest_age_s=age)
        for name, depth, age in (("vision-train", vision, vision_waited_s), ("nlp-train", nlp, None))
    )
    (decision,) = decide(env, FleetView((PoolView("gpu", nodes, 12, 0),), queues + extra), NOW)
    return list(decision.reasons)


def test_the_readme_ticks_give_the_reasons_it_shows():
    assert len(TICKS) == 2
    borrowing, given_back = (block.strip().splitlines() for block in TICKS)
    assert tick(vision=(3, 12), nlp=(0, 0)) == borrowing
    assert tick(vision=(3, 12), nlp=(8, 0)) == given_back


def test_the_readme_escalation_line_is_what_an_overdue_queue_gets():
    line = re.search(r"\(`(queue vision-train waited .*?)`\)", SECTION).group(1)
    assert line in tick(vision=(3, 12), nlp=(8, 0), vision_waited_s=2000.0)


def test_the_readme_refusal_of_a_quota_of_no_slot_is_what_validate_says_and_idle_quota_lifts_it():
    """vision at 0 GPUs beside nlp's 8: vision borrows nlp's idle quota. Without nlp's table, nothing
    is lent (capacity owed to no one), and validate refuses the quota with the README's line."""
    line = " ".join(re.search(r"refuses it: `(teams\.vision\.quota\.gpus: .*?), \.\.\.`", SECTION, re.DOTALL)
                    .group(1).split())  # fmt: skip
    data = tomllib.loads(ENV_TOML)
    data["teams"]["vision"]["quota"] = {"gpus": 0}
    assert parse_environment(data, name="shared").teams["vision"].quota.gpus == 0
    del data["teams"]["nlp"]
    with pytest.raises(ConfigError) as err:
        parse_environment(data, name="shared")
    assert [p[: len(line)] for p in err.value.problems] == [line]


def test_the_readme_placement_queue_validates_and_its_tick_gives_the_line_it_shows():
    data = tomllib.loads(ENV_TOML)
    data["queues"] |= tomllib.loads(re.search(r"```toml\n(.*?)```", PLACEMENT, re.DOTALL).group(1))["queues"]
    (line,) = re.findall(r"```text\n(.*?)```", PLACEMENT, re.DOTALL)
    train = QueueView("train", "gpu", 0, 1, 0, 2, on_demand_wanted=2)  # hidden by the spot nodes: in flight
    assert line.strip() in tick(vision=(0, 12), nlp=(0, 0), data=data, extra=(train,))


def test_the_readme_by_team_command_runs_as_written(tmp_path):
    for name in ("traces", "environments"):
        (tmp_path / name).symlink_to(ROOT / name)
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"  # the venv's console script
    run = subprocess.run(["bash", "-c", COMMAND], check=False, cwd=tmp_path, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PATH": path, "TIDEFLEET_TRACES": "", "PYTHONPATH": str(ROOT)})  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    table = run.stdout.split("tidefleet, by team:\n", 1)[1]
    teams = re.findall(r"^\| (vc-[0-9a-f]{6}) \| (\d+) GPUs \| 1 \| (\d+) \|", table, re.MULTILINE)
    assert len(teams) >= 5, run.stdout  # the day's active virtual clusters, each with its quota
    assert all(int(items) > 0 for _, _, items in teams)
