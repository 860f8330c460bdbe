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
