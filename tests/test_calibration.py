"""The simulator against the sandbox on the calibration scenarios (`tidefleet.sim.calibration`):
a burst, a steady stream, a long-tail mix with two-slot items and a checkpoint-and-move, run side
by side in one sandbox (real agents on a moto server) and replayed by the simulator with the same
environment and the sandbox's measured boot, tick and agent times. About 40-100 s on a 2-core machine."""

from __future__ import annotations

import pytest

from tidefleet.sim.calibration import SCENARIOS, calibrate, format_rows, pooled

pytestmark = pytest.mark.calibration


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    return calibrate(tmp_path_factory.mktemp("calibration"))


def test_every_scenario_ran_every_item_in_the_sandbox_and_in_the_simulator(rows):
    assert {r.scenario for r in rows} == set(SCENARIOS)
    for r in rows:
        assert len(r.sandbox_waits) == len(r.sim_waits) == len(SCENARIOS[r.scenario])
        assert r.sandbox_node_s > 0 and r.sim_node_s > 0


def test_the_moves_scenario_moves_an_item_in_the_sandbox_and_in_the_simulator_and_no_other_does(rows):
    """Checkpoint-and-move on both sides: a cordoned node's long item stopped and resumed elsewhere
    (sleep_work keeps how long it slept), not merely a pool that drained on its own."""
    resumed = {r.scenario: (r.sandbox_resumed, r.sim_resumed) for r in rows}
    assert resumed.pop("moves") == (1, 1)
    assert set(resumed.values()) == {(0, 0)}


def test_over_the_scenarios_the_simulator_is_within_15_percent_of_the_sandbox(rows, tmp_path_factory):
    """The sandbox side is a real run on a shared 2-core machine: its pooled node-seconds vary by
    a few percent from run to run (sim/sandbox 0.84-0.92 on 2026-11-24; 0.76-0.87 in 7 runs on
    2026-11-26, then 0.96-0.97 once the simulator kept a finished item in flight until its ack
    batch's delete and learnt item times a heartbeat late). A run that disagrees is measured once
    more; both must disagree to fail."""
    if pooled(rows).agrees():
        return
    again = calibrate(tmp_path_factory.mktemp("calibration-again"))
    assert pooled(again).agrees(), "\nfirst run:\n" + format_rows(rows) + "\nsecond run:\n" + format_rows(again)
