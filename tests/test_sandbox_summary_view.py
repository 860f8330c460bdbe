"""The demo sandbox's summary table says when --time-limit cut the run short (exit 2 said it alone)."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from tidefleet.sandbox.run import Summary
from tidefleet.sandbox.view import summary_table


def summary(**changes) -> Summary:
    base = {"items": 4, "succeeded": 4, "failed": {}, "failed_unexpectedly": {}, "succeeded_unexpectedly": [],
            "unaccounted": {}, "duplicate_successes": {}, "duplicates_explained": True, "redelivered": 0,
            "interruptions": 0, "resumed": 0, "peak_nodes": 1, "node_seconds": 10.0, "submit_to_first_start_s": 1.0,
            "last_finish_to_zero_s": 2.0, "items_per_s": 1.0, "nodes_killed": 0, "spot_notices": 0,
            "duplicate_messages": 0, "time_limit_hit": False, "fleet_at_zero": True, "demo_workload": True,
            "wall_s": 12.0, "workdir": "/tmp/w"}  # fmt: skip
    return Summary(**{**base, **changes})


@pytest.mark.parametrize(("hit", "says"), [(True, "YES: the run was cut short"), (False, "no")])
def test_the_summary_says_whether_the_time_limit_cut_the_run_short(hit, says):
    out = io.StringIO()
    Console(file=out, width=200).print(summary_table(summary(time_limit_hit=hit, fleet_at_zero=not hit)))
    (line,) = [x for x in out.getvalue().splitlines() if "time limit" in x]
    assert line.split() == ["time", "limit", "(--time-limit)", "hit", *says.split()]


def test_what_workloads_and_paths_say_is_printed_as_it_is_not_read_as_markup():
    """The audit: a workload's `loading [/model] weights failed` ended the run in rich's
    MarkupError after all the work, and torch's `[rank0]:` prefix vanished from a reason."""
    out = io.StringIO()
    table = summary_table(summary(succeeded=2, failed={"000001": "exit 3; last output: loading [/model] weights failed",
                                                       "000002": "last output: [rank0]: RuntimeError: NCCL error"},
                                  workdir="/tmp/sbw-[/x]", notes=["kept in /tmp/[bold]x"]))  # fmt: skip
    Console(file=out, width=300).print(table)
    text = out.getvalue()
    for said in ("loading [/model] weights failed", "[rank0]: RuntimeError", "/tmp/sbw-[/x]", "/tmp/[bold]x"):
        assert said in text, said


def test_the_live_view_prints_the_scalers_words_and_the_environments_path_as_they_are():
    from types import SimpleNamespace

    from tidefleet.sandbox import view

    status = SimpleNamespace(job=SimpleNamespace(job_id="demo-1", total=2),
                             counts={"succeeded": 1, "failed": 0, "cancelled": 0, "queued": 1})  # fmt: skip
    panel = view.live(env_name="./envs/[/x].toml", started=0.0, status=status, queues={}, nodes=[], busy={},
                      reasons=["terminate i-1: idle [/q] 4s"], tick_error="throttled [/x]")  # fmt: skip
    out = io.StringIO()
    Console(file=out, width=300).print(panel)
    for said in ("./envs/[/x].toml", "idle [/q] 4s", "throttled [/x]"):
        assert said in out.getvalue(), said


def test_a_run_whose_fleet_cannot_reach_zero_says_why():
    """The audit: an environment with `min = 1` (or dev's 300-s scale-in delay) always ended at the
    time limit, exit 2, 'fleet back at zero: no', and no word of why."""
    from tidefleet.config import load_environment
    from tidefleet.sandbox.run import held_up

    sandbox = load_environment("sandbox")
    assert held_up(sandbox, 500) == []
    floor = sandbox.model_copy(update={"pools": {n: p.model_copy(update={"min": 1}) for n, p in sandbox.pools.items()}})
    (said,) = held_up(floor, 500)
    assert said.startswith("pool ") and "min = 1 keeps nodes up" in said
    dev = load_environment("dev")
    assert any("idle timeout (300 s) keeps idle nodes longer than the 100 s --time-limit left" in n for n in held_up(dev, 100))
