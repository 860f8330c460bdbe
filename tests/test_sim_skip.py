"""The simulator's skipped ticks (TidefleetPolicy.skip_unchanged) change no outcome.

Each workload is replayed twice with the real control tick, once deciding at every tick and
once skipping the ticks `tidefleet.policy.quiet` shows change nothing: every reported number,
the timeline and the per-team rows must be the same, and the skipping replay must compute
fewer ticks (or the test shows nothing)."""

from __future__ import annotations

import pytest

from tidefleet import control
from tidefleet.config import load_environment
from tidefleet.sim import Interruptions, load_trace, simulate
from tidefleet.sim.bench import TRACES_DIR, with_moves
from tidefleet.sim.policies import TidefleetPolicy
from tidefleet.sim.shapes import SHAPES
from tidefleet.sim.trace import load_spot_trace

SPOT = TRACES_DIR / "spot" / "availability" / "16-node" / "aws-08-27-2023" / "us-west-2a_v100_1.json"


def philly(start: int, n: int):
    return load_trace(TRACES_DIR / "philly_2017_jobs.csv")[start : start + n]


WORKLOADS = {  # name: (environment, pool, items, interruptions, by team)
    "philly gangs": ("bench", "gpu8", lambda: philly(20_000, 600), Interruptions(), False),
    "genai lora": (
        "bench",
        "gpu",
        lambda: load_trace(TRACES_DIR / "alibaba_genai_lora_2024_requests.csv")[:1500],
        Interruptions(),
        False,
    ),
    "bursty-short, spot reclaims": (
        "bench",
        "gpu",
        lambda: SHAPES["bursty-short"].items(7)[:800],
        Interruptions(rate_per_hour=0.3, spot=load_spot_trace(SPOT)),
        False,
    ),
    "diurnal-steady, timed scale-in and cost caps": (
        "prod",
        "gpu",
        lambda: SHAPES["diurnal-steady"].items(3)[:600],
        Interruptions(),
        False,
    ),
    "philly teams": ("philly-teams", "gpu8", lambda: philly(5_000, 250), Interruptions(), True),
    # Nodes that list preemptible attempts are never skipped; the quiet ticks between still are.
    "rare-large, checkpoint-and-move": (
        lambda: with_moves(load_environment("bench"), "gpu8"),
        "gpu8",
        lambda: SHAPES["rare-large"].items(2)[:300],
        Interruptions(),
        False,
    ),
}


def replay(monkeypatch, workload: str, skip: bool):
    env_name, pool, items, interruptions, by_team = WORKLOADS[workload]
    env = load_environment(env_name) if isinstance(env_name, str) else env_name()
    computed = 0
    real_tick = control.tick

    def counted(*args, **kwargs):
        nonlocal computed
        computed += 1
        return real_tick(*args, **kwargs)

    monkeypatch.setattr(TidefleetPolicy, "skip_unchanged", skip)
    monkeypatch.setattr(control, "tick", counted)
    report = simulate(
        env, pool, items(), ["tidefleet"], interruptions=interruptions, seed=11, by_team=by_team
    )
    return report, computed


@pytest.mark.parametrize("workload", list(WORKLOADS))
def test_skipping_quiet_ticks_changes_no_outcome(monkeypatch, workload):
    every, every_ticks = replay(monkeypatch, workload, skip=False)
    skipping, skipping_ticks = replay(monkeypatch, workload, skip=True)
    assert skipping.results == every.results
    assert skipping.timelines == every.timelines
    assert skipping.teams == every.teams
    assert skipping_ticks < every_ticks, (skipping_ticks, every_ticks)
