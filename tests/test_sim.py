"""The simulator on tiny traces whose answers are worked out by hand."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import replace
from pathlib import Path

import psutil
import pytest
from click.testing import CliRunner

from tidefleet import control
from tidefleet.config import load_environment, parse_environment
from tidefleet.policy.model import ITEM_SECONDS_WEIGHT
from tidefleet.ports import Ports
from tidefleet.sim import Interruptions, Timing, TraceError, TraceItem, bench, load_trace, simulate
from tidefleet.sim.bench import check_traces
from tidefleet.sim.cli import simulate as simulate_command
from tidefleet.sim.engine import Outcome, Simulation
from tidefleet.sim.policies import POLICY_NAMES, TidefleetPolicy
from tidefleet.sim.ports import SimulationPorts
from tidefleet.sim.trace import SpotTrace, traces_dir
from tidefleet.sim.words import format_table

BOOT = 45.0
NO_KICK = Timing(boot_s=BOOT, notice_s=120.0, kick_s=0.0)


def make_env(*, slots_per_unit=1, types=None, idle_s=60):
    types = types or [{"type": "c6i.large", "weight": 1, "on_demand_price": 2.0, "spot_price": 1.0}]
    return parse_environment(
        {
            "region": "us-east-1",
            "scaler": {"tick_s": 60, "scale_in_delay_s": idle_s, "scale_out_cooldown_s": 0},
            "pools": {
                "p": {"max": 10, "command": "run", "slots_per_unit": slots_per_unit, "instance_types": types}
            },
            # The most an attempt may run: these tests replay items of up to days (see split_too_long).
            "queues": {"q": {"pool": "p", "item_timeout_s": 7 * 86400}},
        },
        name="t",
    )


def run(env, items, policy="tidefleet", **kw):
    report = simulate(env, "p", items, [policy], timing=kw.pop("timing", NO_KICK), **kw)
    return report.results[0]


def test_measured_boots_go_to_the_nodes_in_launch_order():
    # Two items at once on one-slot nodes: two nodes launch together; with the calibration's
    # per-node boots they are ready 10 s and 50 s after launch, in turn, not both at boot_s.
    timing = replace(NO_KICK, boots_s=(10.0, 50.0))
    result = run(make_env(), [TraceItem(0, 100, 1), TraceItem(0, 100, 1)], timing=timing)
    assert (result.wait_s["p50"], result.wait_s["max"]) == (10.0, 50.0)
    assert run(make_env(), [TraceItem(0, 100, 1), TraceItem(0, 100, 1)]).wait_s["max"] == BOOT


def test_a_finished_items_message_stays_in_flight_until_deleted_while_its_slot_takes_the_next():
    """The agent frees a slot as it queues the success, and deletes the message with the next
    batch (`Timing.ack_s` after the exit): the scaler counts the item in flight until then, while
    the slot already runs the next item. One one-slot node: the first item runs 45..145, the
    second (sent at 100) starts at 145, the first's message is deleted at 165."""
    env = make_env(slots_per_unit=1).model_copy(update={"pools": {"p": make_env().pools["p"].model_copy(update={"max": 1})}})
    items = [TraceItem(0, 100, 1), TraceItem(100, 100, 1)]
    outcome = Simulation(env, "p", items, TidefleetPolicy(env, 0.0), replace(NO_KICK, ack_s=20.0), sample_s=5.0).run()
    assert outcome.first_start == [BOOT, BOOT + 100]
    in_flight = {s.t: s.running_items for s in outcome.samples}
    assert (in_flight[140], in_flight[150], in_flight[160], in_flight[170]) == (1, 2, 2, 1)
    plain = Simulation(env, "p", items, TidefleetPolicy(env, 0.0), NO_KICK, sample_s=5.0).run()
    assert {s.t: s.running_items for s in plain.samples}[150] == 1


def test_one_item_waits_exactly_the_boot_time():
    result = run(make_env(), [TraceItem(0, 100, 1)])
    assert result.wait_s == {"p50": BOOT, "p95": BOOT, "p99": BOOT, "max": BOOT}
    assert result.items_finished == 1


def test_one_item_costs_node_time_times_the_spot_price():
    # Launched at 0, item runs 45..145, idle > 60 s first seen at the 240 s tick: terminated then.
    result = run(make_env(), [TraceItem(0, 100, 1)])
    assert result.node_hours == pytest.approx(240 / 3600)
    assert result.cost_usd == pytest.approx(240 / 3600 * 1.0)
    assert result.idle_node_hours == pytest.approx((240 - 100) / 3600)


def test_two_one_slot_items_share_one_two_slot_node():
    result = run(make_env(slots_per_unit=2), [TraceItem(0, 100, 1), TraceItem(0, 100, 1)])
    assert result.peak_nodes == 1
    assert result.wait_s["max"] == BOOT
    assert result.node_hours == pytest.approx(240 / 3600)


def test_a_spot_reclaim_redoes_the_lost_work_from_scratch():
    # Spot level falls at t=200: notice then, reclaim at 320; the item ran 45..320 and is lost.
    market = SpotTrace(100.0, (1.0, 1.0) + (0.0,) + (1.0,) * 97)
    result = run(make_env(), [TraceItem(0, 300, 1)], interruptions=Interruptions(spot=market))
    assert result.items_interrupted == 1
    assert result.work_redone_s == pytest.approx(320 - 45)
    assert result.items_finished == 1


def test_an_item_that_ends_within_the_notice_still_finishes():
    market = SpotTrace(100.0, (1.0, 1.0) + (0.0,) + (1.0,) * 97)
    result = run(make_env(), [TraceItem(0, 200, 1)], interruptions=Interruptions(spot=market))
    assert result.items_interrupted == 0 and result.items_finished == 1


def test_an_item_behind_busy_slots_running_far_longer_than_the_mean_gets_a_node_in_time_for_its_target():
    """Ten 10 s items make the queue's mean 10 s; three slots then run 10,000 s items. An item
    arriving later is counted as started by their turnover (39 starts within 120 s) until it
    waited a boot and would miss its target, with no item taken: then it gets a node (within a
    tick, then a boot)."""
    env = make_env(idle_s=None)  # break-even: the short items' nodes leave once idle
    env = env.model_copy(update={"queues": {"q": env.queues["q"].model_copy(update={"target_wait_s": 120})}})
    items = [TraceItem(0.0, 10.0, 1)] * 10 + [TraceItem(0.0, 10_000.0, 1)] * 3 + [TraceItem(3000.0, 60.0, 1)]
    result = run(env, items)
    assert result.items_finished == 14
    assert BOOT < result.wait_s["max"] <= (120 - BOOT) + 60 + BOOT, result.wait_s


def test_oracle_is_the_work_at_the_cheapest_price_per_slot():
    types = [
        {"type": "c6i.large", "weight": 1, "on_demand_price": 2.0, "spot_price": 1.0},  # $1 per slot-hour
        {"type": "c6i.4xlarge", "weight": 4, "on_demand_price": 4.0, "spot_price": 2.0},  # $0.5 per slot-hour
    ]
    report = simulate(make_env(types=types), "p", [TraceItem(0, 3600, 1), TraceItem(10, 3600, 1)], ["oracle"])
    oracle = report.results[0]
    assert oracle.cost_usd == pytest.approx(2 * 0.5) == report.lower_bound_usd
    assert oracle.wait_s["max"] == 0 and oracle.idle_node_hours == 0


@pytest.mark.parametrize("slots_per_unit,items,node_s", [
    (1, [(0, 100)], 45 + 100),  # a boot, then the item
    (1, [(0, 100), (120, 100)], 45 + 100 + 20 + 100),  # a gap shorter than a boot: kept idle
    (1, [(0, 100), (200, 100)], 45 + 100 + 45 + 100),  # longer: let go, and a boot again
    (1, [(0, 100), (100, 100)], 45 + 200),  # one ends as the next starts: the same node
    (1, [(0, 100), (50, 100)], 45 + 100 + 45 + 100),  # at once: two nodes, each booted
    (2, [(0, 100), (50, 100)], 45 + 150),  # on two-slot nodes: one
    (1, [(0, 100), (1000, 0)], 45 + 100),  # an item of 0 s holds no slot
    (1, [(0, 0), (5, 10)], 45 + 10),  # first, too
])  # fmt: skip
def test_the_zero_wait_bound_pays_each_node_a_boot_or_the_idle_gap_before_it_serves(slots_per_unit, items, node_s):
    from tidefleet.sim.run import zero_wait_bound

    env = make_env(slots_per_unit=slots_per_unit)  # $1 a node-hour on spot
    bound = zero_wait_bound(env, "p", [TraceItem(t, d, 1) for t, d in items], [1] * len(items), BOOT)
    assert bound == pytest.approx(node_s / 3600)


def test_the_zero_wait_bound_is_above_the_work_and_every_report_carries_it():
    rng = __import__("random").Random(7)
    items = sorted((TraceItem(rng.uniform(0, 5000), rng.uniform(5, 600), rng.choice([1, 2])) for _ in range(300)),
                   key=lambda i: i.submit_s)  # fmt: skip
    report = simulate(make_env(slots_per_unit=4), "p", items, ["tidefleet", "oracle"], timing=NO_KICK)
    assert report.lower_bound_usd < report.zero_wait_usd
    for r in report.results:
        assert r.cost_vs_zero_wait == pytest.approx(r.cost_usd / report.zero_wait_usd)


def test_the_oracles_peak_nodes_are_its_busiest_slots_on_nodes_of_the_type_it_bills():
    """Five 1-slot items overlap at t=50 (the 0-s item holds no slot): 5 slots. The oracle bills the
    cheapest $/slot-hour, the 2-unit type (8 slots, $0.1875 a slot-hour against $0.25): 1 node;
    on the 1-unit type alone, 2 nodes of 4."""
    cheap_big = [{"type": "c6i.large", "weight": 1, "on_demand_price": 2.0, "spot_price": 1.0},
                 {"type": "c6i.xlarge", "weight": 2, "on_demand_price": 3.0, "spot_price": 1.5}]  # fmt: skip
    items = [TraceItem(0, 100, 1)] * 3 + [TraceItem(50, 100, 1)] * 2 + [TraceItem(50, 0, 1), TraceItem(500, 10, 1)]
    (oracle,) = simulate(make_env(slots_per_unit=4), "p", items, ["oracle"], timing=NO_KICK).results
    assert (oracle.peak_nodes, oracle.node_hours) == (2, pytest.approx(510 / 3600 / 4))
    (oracle,) = simulate(make_env(slots_per_unit=4, types=cheap_big), "p", items, ["oracle"], timing=NO_KICK).results
    assert (oracle.peak_nodes, oracle.node_hours) == (1, pytest.approx(510 / 3600 / 8))


def test_an_item_bigger_than_every_node_is_reported_not_replayed():
    report = simulate(
        make_env(), "p", [TraceItem(0, 100, 1), TraceItem(5, 100, 4)], ["tidefleet"], timing=NO_KICK
    )
    assert report.unfittable["count"] == 1 and report.unfittable["by_slots"] == {"4": 1}
    assert report.results[0].items_finished == 1


def _timeout_env(item_timeout_s):
    env = make_env()
    return env.model_copy(update={"queues": {"q": env.queues["q"].model_copy(update={"item_timeout_s": item_timeout_s})}})


@pytest.mark.parametrize("policy", ["tidefleet", "keda", "oracle"])
def test_an_item_longer_than_its_queues_item_timeout_is_reported_not_replayed(policy):
    """The agent kills an attempt at item_timeout_s: an item that runs longer never finishes on the
    real system, so a replay that ran it to success would predict work the deployment cannot do."""
    items = [TraceItem(0, 100, 1), TraceItem(5, 3600, 1), TraceItem(9, 7200, 1), TraceItem(20, 5000, 1)]
    report = simulate(_timeout_env(3600), "p", items, [policy], timing=NO_KICK)
    # Deployed as is: max_retries + 1 = 4 attempts each, killed at 3,600 s: 8 slot-hours at $1.
    assert report.too_long == {"count": 2, "work_s": 12200.0, "attempts": 8, "attempts_usd": 8.0,
                               "by_queue": {"q": {"count": 2, "item_timeout_s": 3600, "longest_s": 7200.0}}}  # fmt: skip
    result = report.results[0]
    assert (result.items_finished, result.items_unfinished) == (2, 0)  # 100 s and exactly the timeout
    assert report.lower_bound_usd == pytest.approx(3700 / 3600 * 1.0)  # the work of the two replayed, $1 a slot-hour
    assert report.to_json()["too_long"]["count"] == 2


def test_the_simulate_command_says_which_items_outlast_their_timeout_and_the_fix(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("submit_s,duration_s,gpus\n0,60,1\n5,900000,1\n")
    out = CliRunner().invoke(simulate_command, [str(path), "--env", "bench", "--pool", "gpu", "--policy", "oracle"])
    assert out.exit_code == 0, out.output
    assert ("not replayed: 1 item runs longer than its queue's item_timeout_s (gpu: 1 over 7.0 days, the longest "
            "10.4 days); the agent kills an attempt at it, so deployed as configured it would fail max_retries + 1 "
            "attempts and be dead-lettered (4 attempts, each killed at the timeout: at least $141.12 of node time): "
            "split the work (7 days is the most item_timeout_s allows)") in out.output  # 4 x 168 h of a $0.21 g4dn.xlarge
    path.write_text("submit_s,duration_s,gpus\n5,900000,1\n")
    out = CliRunner().invoke(simulate_command, [str(path), "--env", "bench", "--pool", "gpu", "--policy", "oracle"])
    assert out.exit_code == 1 and "Traceback" not in out.output
    assert ("no items to replay (1 read, 1 longer than their queue's item_timeout_s); check the file, or split the "
            "work (7 days is the most item_timeout_s allows)") in out.output  # no --window given: none to widen


def test_a_timeout_below_the_most_allowed_is_named_as_the_fix():
    from tidefleet.sim.words import too_long_line

    line = too_long_line({"count": 3, "work_s": 0.0, "attempts": 12, "attempts_usd": 0.5, "by_queue": {"a": {"count": 2, "item_timeout_s": 3600, "longest_s": 9000.0},
                                                               "b": {"count": 1, "item_timeout_s": 604800, "longest_s": 700000.0}}})  # fmt: skip
    assert line.startswith("not replayed: 3 items run longer than their queue's item_timeout_s (a: 2 over 3,600 s, the "
                           "longest 2.5 h; b: 1 over 7.0 days, the longest 8.1 days)")
    assert line.endswith("(12 attempts, each killed at the timeout: at least $0.5000 of node time): raise item_timeout_s "
                         "(at most 7 days) or split the work")
    assert too_long_line({"count": 0, "work_s": 0.0, "by_queue": {}}) == ""


@pytest.mark.parametrize("policy", ["tidefleet", "target-tracking", "clearml", "keda"])
def test_an_item_after_a_quiet_month_is_replayed_not_given_up_as_stalled(policy):
    # A stall (waiting work, nothing started or finished for a week) counts from the item's arrival.
    result = run(make_env(), [TraceItem(0, 100, 1), TraceItem(30 * 86400, 100, 1)], policy=policy)
    assert (result.items_finished, result.items_unfinished) == (2, 0)


@pytest.mark.parametrize("policy", ["tidefleet", "target-tracking", "clearml", "keda"])
def test_every_policy_finishes_a_burst(policy):
    items = [TraceItem(i * 7.0, 300 + 50 * (i % 5), 1) for i in range(40)]
    result = run(make_env(), items, policy=policy)
    assert result.items_finished == 40 and result.items_unfinished == 0
    assert result.cost_usd >= result.lower_bound_usd


def test_tidefleet_never_kills_busy_work_on_scale_in():
    items = [TraceItem(i * 30.0, 100 + 400 * (i % 3), 1) for i in range(60)]
    result = run(make_env(), items)
    assert result.busy_items_killed_by_scale_in == 0 and result.items_interrupted == 0


def test_a_node_running_one_item_for_hours_keeps_heartbeating_and_is_never_replaced():
    # Nothing changes on the node for 3 boot timeouts: only its periodic heartbeat tells the
    # policy the agent is alive (a silent node would be replaced and its item redone).
    env = make_env()
    long = 3 * env.pools["p"].boot_timeout_s + 100
    result = run(env, [TraceItem(0, long, 1)])
    assert (result.items_interrupted, result.busy_items_killed_by_scale_in, result.peak_nodes) == (0, 0, 1)
    assert result.items_finished == 1


def test_the_same_seed_gives_the_same_run_and_another_seed_another():
    items = [TraceItem(i * 20.0, 900, 1) for i in range(50)]

    def with_seed(seed):
        report = simulate(make_env(), "p", items, ["tidefleet", "keda"], timing=NO_KICK,
                          interruptions=Interruptions(rate_per_hour=2.0), seed=seed)  # fmt: skip
        return json.dumps(report.to_json(), sort_keys=True)

    assert with_seed(1) == with_seed(1)
    assert with_seed(1) != with_seed(2)


def test_items_listed_out_of_submit_order_replay_as_in_submit_order():
    """The engine took arrivals in list order: an item listed last but submitted first waited from
    its submit for all the others (the library call took it silently)."""
    items = [TraceItem(i * 300.0, 60, 1) for i in range(20)]
    shuffled = items[10:] + items[:10]

    def replay(listed):
        return json.dumps(simulate(make_env(), "p", listed, ["tidefleet", "keda"], timing=NO_KICK).to_json(), sort_keys=True)

    assert replay(shuffled) == replay(items)
    assert run(make_env(), shuffled).wait_s["max"] == BOOT


def write(tmp_path, text):
    path = tmp_path / "trace.csv"
    path.write_text(text)
    return path


def test_window_keeps_only_items_submitted_inside_it(tmp_path):
    path = write(tmp_path, "submit_s,duration_s,gpus\n0,10,1\n10,10,1\n19,10,\n20,10,2\n")
    assert [i.submit_s for i in load_trace(path, (10, 20))] == [10, 19]
    assert [i.slots for i in load_trace(path)] == [1, 1, 1, 2]


@pytest.mark.parametrize(
    ("csv_text", "message"),
    [
        ("submit,duration_s\n0,1\n", ("missing column(s) submit_s (got submit, duration_s); a trace needs submit_s and "
                                      "duration_s, optionally gpus, cpus and group")),
        ("submit_s,duration_s\n0,1\nabc,5\n", "line 3: column 'submit_s' is not a number (got 'abc')"),
        # The file's line, not the row's count: blank lines (skipped) and a quoted field's line breaks.
        ("submit_s,duration_s\n0,1\n\n\nabc,5\n", "line 5: column 'submit_s' is not a number (got 'abc')"),
        ("submit_s,duration_s\r\n0,1\r\n\r\n5,x\r\n", "line 4: column 'duration_s' is not a number (got 'x')"),
        ('submit_s,duration_s,group\n0,1,"a\nb\nc"\n5,x,d\n', "line 5: column 'duration_s' is not a number (got 'x')"),
        ('submit_s,duration_s,group\n0,1,a\nabc,1,"x\ny"\n', "line 3: column 'submit_s' is not a number (got 'abc')"),
        ('submit_s,duration_s,group\r\n0,1,"a\r\nb\rc"\r\n5,x,d\r\n', "line 5: column 'duration_s' is not a number (got 'x')"),
        (
            "submit_s,duration_s\n0,-5\n",
            "line 2: column 'duration_s' must be a finite number >= 0 (got '-5')",
        ),
        ("submit_s,duration_s,gpus\n0,5,1.5\n", "line 2: column 'gpus' must be a whole number (got '1.5')"),
        ("submit_s,duration_s\n0,\n", "line 2: column 'duration_s' is not a number (got '')"),
        # Milliseconds taken for seconds: refused, not replayed for hours a minute at a time.
        ("submit_s,duration_s\n0,5\n400000000,5\n", "submit_s spans 400,000,000 s (13 years, more than 10)"),
        ("submit_s,duration_s\n0,400000000\n", "longest duration_s is 400,000,000 s (13 years, more than 10)"),
        ("submit_s,duration_s,gpus\n0,5,1,a\n", "line 2: 4 fields, the header names 3; quote fields that hold commas"),
        ("submit_s,duration_s,submit_s\n0,5,7\n", "column(s) submit_s named twice in the header"),
    ],
)
def test_a_bad_trace_names_the_line_and_column(tmp_path, csv_text, message):
    with pytest.raises(TraceError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_trace(write(tmp_path, csv_text))


@pytest.mark.parametrize(
    ("csv_text", "line"),
    [
        ('submit_s,duration_s,gpus,cpus,group\n0,10,1,,"team\n', 2),  # a quote left open on the last line
        ('submit_s,duration_s,gpus,cpus,group\n0,10,1,,"team\n5,10,1,,a\n', 2),  # ...would swallow the rest
        ('submit_s,duration_s\n0,1\n1,"' + "x" * 140_000 + "\n2,3\n", 3),  # a field over the csv module's limit
        ('"submit_s,duration_s\n0,1\n', 1),
    ],
)
def test_a_trace_the_csv_module_cannot_split_is_one_line_naming_where_the_record_starts(tmp_path, csv_text, line):
    path = write(tmp_path, csv_text)
    with pytest.raises(TraceError, match=rf"^trace.csv line {line}: not a CSV record \(.*\); an unbalanced quote\?"):
        load_trace(path)
    out = CliRunner().invoke(simulate_command, [str(path), "--env", "bench", "--pool", "gpu8"])
    assert out.exit_code == 1 and isinstance(out.exception, SystemExit), out.output
    assert f"trace.csv line {line}: not a CSV record" in _no_traceback_one_line(out.output)


def test_a_trace_from_a_spreadsheet_reads_and_a_compressed_one_is_named(tmp_path):
    path = tmp_path / "excel.csv"
    path.write_bytes(b"\xef\xbb\xbfsubmit_s, duration_s\r\n0,5\r\n")  # byte-order mark, a space, CRLF
    assert load_trace(path) == [TraceItem(0.0, 5.0, 1)]
    path = tmp_path / "trace.csv.gz"
    path.write_bytes(__import__("gzip").compress(b"submit_s,duration_s\n0,5\n"))
    with pytest.raises(TraceError, match="trace.csv.gz: not a UTF-8 CSV text file"):
        load_trace(path)


def test_a_spot_trace_whose_level_never_falls_interrupts_nothing_and_ends(tmp_path):
    from tidefleet.sim.trace import load_spot_trace

    flat = tmp_path / "flat.json"
    flat.write_text('{"metadata": {"gap_seconds": 600}, "data": [4, 4, 4]}')
    market = load_spot_trace(flat)
    assert list(market.drops(0, __import__("math").inf)) == []
    result = run(make_env(), [TraceItem(0, 200, 1)], interruptions=Interruptions(spot=market))
    assert result.items_finished == 1 and result.items_interrupted == 0


@pytest.mark.parametrize("metadata,data", [('{"gap_seconds": 1e-300}', "[1, 0]"), ('{"gap_seconds": "nan"}', "[1, 0]"),
                                           ('{"gap_seconds": 60}', '[1, "inf"]'), ('{"gap_seconds": 60}', "[1, -1]")])  # fmt: skip
def test_a_spot_trace_with_times_or_levels_out_of_range_is_refused(tmp_path, metadata, data):
    from tidefleet.sim.trace import load_spot_trace

    path = tmp_path / "spot.json"
    path.write_text(f'{{"metadata": {metadata}, "data": {data}}}')
    with pytest.raises(TraceError, match="spot.json: a spot trace needs gap_seconds >= 1 and data of finite numbers"):
        load_spot_trace(path)


def test_the_command_prints_the_documented_json(tmp_path):
    path = write(tmp_path, "submit_s,duration_s,gpus,group\n0,100,1,a\n30,200,1,b\n")
    out = CliRunner().invoke(
        simulate_command,
        [
            str(path),
            "--env",
            "bench",
            "--pool",
            "gpu",
            "--policy",
            "tidefleet",
            "--policy",
            "oracle",
            "--json",
        ],
    )
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)  # progress goes to stderr
    assert data["schema"] == "tidefleet.sim/1" and data["items"] == 2
    assert [r["policy"] for r in data["results"]] == ["tidefleet", "oracle"]
    twice = CliRunner().invoke(simulate_command, [str(path), "--env", "bench", "--pool", "gpu", "--policy", "oracle",
                                                  "--policy", "keda", "--policy", "oracle", "--json"])  # fmt: skip
    assert [r["policy"] for r in json.loads(twice.stdout)["results"]] == ["oracle", "keda"]  # a policy named twice: once
    assert set(data["results"][0]["wait_s"]) == {"p50", "p95", "p99", "max"}


SIX_DAYS = [TraceItem(0, 6 * 86400, 1)] * 10


def test_items_still_running_when_a_replay_gives_up_are_unfinished_not_interrupted():
    """keda runs ten 6-day items two at a time (ceil(10 / 5) replicas) until the replay gives up, a
    week past the last submit plus twice the longest item: the ones running then are cut off by the
    end, not by a spot notice or a scale-in (its one interruption is a scale-in's, at 315 s)."""
    keda = simulate(load_environment("bench"), "gpu", SIX_DAYS, ["keda"]).results[0]
    assert (keda.items_unfinished, keda.stopped) == (4, "horizon")
    assert keda.items_interrupted == keda.busy_items_killed_by_scale_in == 1
    assert (keda.work_redone_s, keda.items_dead_lettered) == (315.0, 0)


def test_a_replay_that_gives_up_says_so_and_why(tmp_path):
    """Nodes that boot for longer than the engine waits on a stall (a week; clearml: the fewest polls
    meanwhile): it gives up with both items never started, and the table says so under it; the JSON has `stopped`."""
    from tidefleet.sim.cli import stop_notes

    report = simulate(make_env(), "p", [TraceItem(0, 100, 1), TraceItem(5, 100, 1)], ["clearml", "oracle"],
                      timing=Timing(boot_s=8 * 86400.0, notice_s=120.0))  # fmt: skip
    assert [r.stopped for r in report.results] == ["stalled", None]
    assert [r["stopped"] for r in report.to_json()["results"]] == ["stalled", None]
    assert stop_notes(report) == [(
        "note: the clearml replay gave up with 2 of 2 items unfinished; items waited 7 days while nothing arrived, "
        "started or finished: the pool never served them (nodes that never finish booting, or are interrupted as "
        "they boot? see --boot-s, --interruption-rate)"
    )]
    trace = tmp_path / "six-days.csv"  # keda's horizon case above, through the command
    trace.write_text("submit_s,duration_s,gpus\n" + "".join(f"{i.submit_s},{i.duration_s},1\n" for i in SIX_DAYS))
    out = CliRunner().invoke(simulate_command, [str(trace), "--env", "bench", "--pool", "gpu", "--policy", "keda"])
    assert out.exit_code == 0, out.output
    assert out.stdout.splitlines()[-1].startswith("note: the keda replay gave up with 4 of 10 items unfinished; a week "
                                                  "past the last submit plus twice the longest item"), out.stdout  # fmt: skip


def test_a_trace_with_nothing_to_replay_is_an_error_naming_the_file(tmp_path):
    for text in ("submit_s,duration_s,gpus\n", "submit_s,duration_s,gpus\n0,100,64\n"):
        path = write(tmp_path, text)
        out = CliRunner().invoke(simulate_command, [str(path), "--env", "bench", "--pool", "gpu"])
        assert out.exit_code == 1 and f"{path.name}: no items to replay" in out.output, out.output


def test_the_json_is_strict_json_when_a_bound_is_zero(tmp_path):
    path = write(tmp_path, "submit_s,duration_s,gpus\n0,0,1\n5,0,1\n")  # every item 0 s: both bounds $0
    out = CliRunner().invoke(simulate_command, [str(path), "--env", "bench", "--pool", "gpu", "--json",
                                                "--window=-inf:100"])  # fmt: skip
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout, parse_constant=lambda token: pytest.fail(f"not JSON: {token}"))
    assert data["results"][0]["cost_vs_lower_bound"] is None and data["window"] == [None, 100.0]
    assert out.stdout.count("\n") == 1  # one object on one line, as every --json
    table = CliRunner().invoke(simulate_command, [str(path), "--env", "bench", "--pool", "gpu", "--policy", "oracle"])
    assert "| oracle | 0.00 | - | - |" in table.stdout and "inf" not in table.stdout, table.output  # no multiple of $0


def test_the_command_explains_a_bad_trace(tmp_path):
    path = write(tmp_path, "submit_s,duration_s\n0,x\n")
    out = CliRunner().invoke(simulate_command, [str(path), "--env", "bench", "--pool", "gpu"])
    assert out.exit_code == 1 and "column 'duration_s' is not a number" in out.output


def test_the_command_writes_the_plot_it_is_asked_for(tmp_path):
    path = write(tmp_path, "submit_s,duration_s,gpus\n0,100,1\n30,200,1\n400,50,1\n")
    plot = tmp_path / "out" / "run.png"
    out = CliRunner().invoke(
        simulate_command,
        [str(path), "--env", "bench", "--pool", "gpu", "--policy", "tidefleet", "--policy", "keda",
         "--plot", str(plot)],
    )  # fmt: skip
    assert out.exit_code == 0, out.output
    assert f"plot: {plot}" in out.stderr and "plot:" not in out.stdout  # stdout carries the result alone
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and plot.stat().st_size > 10_000
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(plot.stat().st_mode) == 0o666 & ~umask  # as any file it writes: not mkstemp's 0600


def test_ctrl_c_in_a_replay_says_nothing_was_written_and_exits_130(tmp_path, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("tidefleet.sim.cli.run_simulation", interrupted)
    out = CliRunner().invoke(simulate_command, [str(write(tmp_path, "submit_s,duration_s\n0,100\n")), "--env", "bench",
                                                "--pool", "gpu"])  # fmt: skip
    assert out.exit_code == 130 and out.stderr == "simulate: interrupted; nothing written\n", out.output


def test_ctrl_c_while_the_plot_is_written_leaves_no_half_plot_and_exits_130(tmp_path, monkeypatch):
    plot = tmp_path / "run.png"
    plot.write_bytes(b"an earlier run's plot")  # left as it was

    def interrupted(report, path):
        path.write_bytes(b"\x89PNG half")
        raise KeyboardInterrupt

    monkeypatch.setattr("tidefleet.sim.plot.plot_report", interrupted)
    out = CliRunner().invoke(simulate_command, [str(write(tmp_path, "submit_s,duration_s\n0,100\n")), "--env", "bench",
                                                "--pool", "gpu", "--plot", str(plot)])  # fmt: skip
    assert out.exit_code == 130 and plot.read_bytes() == b"an earlier run's plot", out.output
    assert list(tmp_path.glob(".run*")) == []  # nor a half-written one beside it
    assert out.stderr.endswith(f"simulate: interrupted while writing the plot; {plot} not written\n")


def test_an_item_killed_max_receive_count_times_is_dead_lettered_not_retried_forever():
    # Target tracking sees no visible backlog while the item runs, scales in to zero after 15
    # datapoints (killing it: no protection), its 0 -> 1 alarm brings a node back, and so on.
    env = make_env()
    receives = env.queues["q"].max_receive_count
    result = run(env, [TraceItem(0, 6 * 86400, 1)], policy="target-tracking")
    assert (result.items_dead_lettered, result.items_unfinished, result.items_finished) == (1, 1, 0)
    assert result.items_interrupted == result.busy_items_killed_by_scale_in == receives


def test_the_policy_sees_the_mean_time_of_finished_items_only():
    """No clairvoyance: before the first item finishes the mean is unknown, then it is the EWMA."""
    seen = []

    class Watching(TidefleetPolicy):
        def poll(self, sim):
            view = SimulationPorts(sim)
            fleet = control.observe(self.env, Ports(view, view, view, view), sim.now, ["p"]).fleet
            seen.append((sim.now, fleet.queues[0].mean_item_s))
            super().poll(sim)

    env = make_env()
    policy = Watching(env, kick_s=0.0)
    Simulation(env, "p", [TraceItem(0, 100, 1), TraceItem(0, 200, 1)], policy, NO_KICK).run()
    first_done, second_done = BOOT + 100, BOOT + 200
    assert all(mean is None for t, mean in seen if t < first_done)
    assert {mean for t, mean in seen if first_done <= t < second_done} == {100.0}
    assert {mean for t, mean in seen if t >= second_done} == {100.0 + ITEM_SECONDS_WEIGHT * (200.0 - 100.0)}


def ticks_while_one_node_is_busy(items: list[TraceItem], timing: Timing, waiting_tick_s: int) -> tuple[list[float], Outcome]:
    """The times the scaler ticked (skipped ticks too) over `items` on a pool of one node at most,
    and the run's outcome."""
    seen = []

    class Watching(TidefleetPolicy):
        def _tick_once(self, sim):
            seen.append(sim.now)
            super()._tick_once(sim)

    env = make_env()
    env = env.model_copy(update={
        "pools": {"p": env.pools["p"].model_copy(update={"max": 1})},
        "scaler": env.scaler.model_copy(update={"waiting_tick_s": waiting_tick_s}),
    })  # fmt: skip
    outcome = Simulation(env, "p", items, Watching(env, kick_s=timing.kick_s), timing).run()
    return seen, outcome


@pytest.mark.parametrize("waiting_tick_s,ticks", [(10, [60, 70, 80, 90, 100, 110]), (0, [60, 77])])
def test_while_items_wait_the_run_ticks_again_and_a_submit_meanwhile_sends_no_kick(waiting_tick_s, ticks):
    """One node at most: the second item waits for the first. The run the 60 s schedule starts
    ticks again every 10 s while it waits, for 50 s (the next would be within a wait of the
    next scheduled tick); the item submitted at 75 s is throttled into that run rather than
    kicking its own (2 s after it). Without re-ticks: the schedule and the kick."""
    items = [TraceItem(0, 200, 1), TraceItem(0, 200, 1), TraceItem(75, 10, 1)]
    seen, outcome = ticks_while_one_node_is_busy(items, Timing(boot_s=BOOT, notice_s=120.0, kick_s=2.0), waiting_tick_s)
    assert [t for t in seen if 60 <= t < 120] == ticks
    assert all(start is not None for start in outcome.first_start)


def test_a_scheduled_tick_during_a_runs_loop_goes_on_ticking_while_items_wait():
    """One node at most, busy: an item submitted at 23 s waits. Its kick's run starts at 25 s and
    ticks again every 10 s until 75 s (the next would be within a wait of its minute). The
    schedule's tick at 60 s comes while that run still loops: the function runs one invocation at
    a time, so it would be throttled until that run's last tick and then loop on its own. So the
    reticks carry on to 105 s. Before, the retick it asked for was dropped beside the pending one,
    and nothing ticked from 75 s to the 120-s schedule while the item waited (unseen shape 28: a
    153-s wait behind a 120-s target)."""
    items = [TraceItem(0, 1000, 1), TraceItem(23, 10, 1)]  # the first keeps the one node busy
    seen, outcome = ticks_while_one_node_is_busy(items, Timing(boot_s=10.0, notice_s=120.0, kick_s=2.0), 10)
    assert [t for t in seen if 55 <= t < 120] == [55, 60, 65, 75, 85, 95, 105]
    assert all(start is not None for start in outcome.first_start)


# --- Where the traces come from: the project's traces/, whatever the cwd; a missing one is one line.

ROOT = Path(__file__).resolve().parent.parent


def _no_traceback_one_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    assert "Traceback" not in text and len(lines) == 1, text
    return lines[0]


def test_the_traces_default_to_the_projects_folder_from_any_cwd(tmp_path, monkeypatch):
    monkeypatch.delenv("TIDEFLEET_TRACES", raising=False)
    monkeypatch.chdir(tmp_path)
    assert traces_dir() == ROOT / "traces"
    check_traces(traces_dir())  # every bench trace is there
    monkeypatch.setenv("TIDEFLEET_TRACES", str(tmp_path))
    assert traces_dir() == tmp_path


@pytest.mark.parametrize(
    ("args", "named", "hint"),
    [
        (["nope.csv"], "nope.csv: no such trace file", "traces"),
        (["{tmp}"], "{tmp}: is a folder", "traces"),
        (["{csv}", "--spot-trace", "gone.json"], "gone.json: no such spot trace file", "spot"),
        (["{csv}", "--spot-trace", "{csv}/x.json"], "{csv}/x.json: cannot read it (Not a directory)", "spot"),
        (["{csv}", "--spot-trace", "{tmp}"], "{tmp}: is a folder, with no spot trace JSON file", "e.g. {spot}/"),
        (["{csv}", "--spot-trace", "{spot}"], "{spot}: is a folder; give one spot trace JSON file", "e.g. {spot}/"),
    ],
)
def test_a_missing_trace_stops_simulate_with_one_line_naming_it(tmp_path, args, named, hint):
    csv_path = write(tmp_path, "submit_s,duration_s\n0,1\n")
    fill = {"tmp": str(tmp_path), "csv": str(csv_path), "spot": str(ROOT / "traces" / "spot")}
    args = [a.format(**fill) for a in args] + ["--env", "bench", "--pool", "gpu"]
    out = CliRunner().invoke(simulate_command, args)
    assert out.exit_code == 1 and isinstance(out.exception, SystemExit), out.output  # not a crash
    line = _no_traceback_one_line(out.output)
    assert named.format(**fill) in line and str(ROOT / "traces") in line and hint.format(**fill) in line


@pytest.mark.parametrize("folder", ["{tmp}", "{spot}", "{spot}/availability"])
def test_a_folder_given_as_a_spot_trace_names_a_file_that_simulate_takes(tmp_path, folder):
    spot = ROOT / "traces" / "spot"
    folder = folder.format(tmp=tmp_path, spot=spot)
    out = CliRunner().invoke(simulate_command, [str(write(tmp_path, "submit_s,duration_s\n0,1\n")), "--env", "bench",
                                                "--pool", "gpu", "--spot-trace", folder])  # fmt: skip
    assert out.exit_code == 1, out.output
    example = _no_traceback_one_line(out.output).rsplit("e.g. ", 1)[1].rstrip(")")
    assert example.startswith(str(spot if folder == str(tmp_path) else folder)), example
    taken = CliRunner().invoke(simulate_command, [str(tmp_path / "trace.csv"), "--env", "bench", "--pool", "gpu",
                                                  "--spot-trace", example])  # fmt: skip
    assert taken.exit_code == 0, taken.output


def test_a_trace_reads_from_a_pipe_or_stdin_and_names_it(tmp_path):
    text = "submit_s,duration_s,gpus\n0,100,1\n"
    piped = CliRunner().invoke(simulate_command, ["-", "--env", "bench", "--pool", "gpu8", "--json"], input=text)
    assert piped.exit_code == 0, piped.output
    assert (json.loads(piped.stdout)["trace"], json.loads(piped.stdout)["items"]) == ("<stdin>", 1)
    fifo = tmp_path / "trace.fifo"  # what <(zcat t.csv.gz) gives, a path that is no regular file
    os.mkfifo(fifo)
    run = subprocess.run(
        ["bash", "-c", f"(printf '{text}' > {fifo} &) && exec {sys.executable} -m tidefleet.cli simulate {fifo} --env bench --pool gpu8"],
        check=False, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0 and run.stdout.startswith(f"{fifo} on bench/gpu8: 1 item"), run.stdout + run.stderr
    gzipped = CliRunner().invoke(simulate_command, ["-", "--env", "bench", "--pool", "gpu8"],
                                 input=__import__("gzip").compress(text.encode()))  # fmt: skip
    assert gzipped.exit_code == 1 and "<stdin>: not a UTF-8 CSV text file" in gzipped.output
    assert "zcat FILE.gz | tidefleet simulate - ... reads it from stdin" in _no_traceback_one_line(gzipped.output)


@pytest.mark.parametrize(
    ("make_folder", "named"),
    [
        (lambda tmp: tmp / "absent", "absent: no such folder"),
        (lambda tmp: tmp, "missing alibaba_genai_lora_2024_requests.csv, alibaba_openb_2023_pods.csv"),
    ],
)
def test_invoke_bench_without_its_traces_says_which_folder_and_what_to_do(tmp_path, make_folder, named):
    folder = make_folder(tmp_path)
    if folder.is_dir():  # one of the three is there; the other two are named
        (folder / "philly_2017_jobs.csv").write_text("submit_s,duration_s\n0,1\n")
    run = subprocess.run(
        [sys.executable, "-m", "invoke", "--search-root", str(ROOT), "bench", "--out", str(tmp_path / "out")],
        check=False, cwd=tmp_path, capture_output=True, text=True, env={**os.environ, "TIDEFLEET_TRACES": str(folder)},
        timeout=120,
    )  # fmt: skip
    assert run.returncode != 0
    line = _no_traceback_one_line(run.stdout + run.stderr)
    assert str(folder) in line and named in line and "TIDEFLEET_TRACES" in line


def test_invoke_bench_into_a_file_says_so_in_one_line(tmp_path):
    (tmp_path / "a-file").write_text("")
    run = subprocess.run(
        [sys.executable, "-m", "invoke", "--search-root", str(ROOT), "bench", "--out", str(tmp_path / "a-file")],
        check=False, cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 1
    line = _no_traceback_one_line(run.stdout + run.stderr)
    assert line == f"bench: cannot write {tmp_path / 'a-file'} (File exists); give --out a folder that can be written"


def test_simulate_says_each_policy_as_it_is_done_on_stderr_and_keeps_stdout_for_the_result(tmp_path):
    path = write(tmp_path, "submit_s,duration_s,gpus\n0,100,1\n30,200,1\n")
    out = CliRunner().invoke(simulate_command, [str(path), "--env", "bench", "--pool", "gpu", "--policy", "tidefleet",
                                                "--policy", "oracle", "--json"])  # fmt: skip
    assert out.exit_code == 0 and json.loads(out.stdout)["items"] == 2, out.output
    assert [re.sub(r": \d+\.\d s$", ": N s", line) for line in out.stderr.splitlines()] == [
        "replaying 2 items under 2 policies", "[1/2] tidefleet: N s", "[2/2] oracle: N s"
    ]


def test_a_long_replay_says_how_far_it_is_on_stderr_and_the_result_stays_the_same(tmp_path, monkeypatch):
    from tidefleet.sim import engine, run

    rows = "".join(f"{i * 40},{300 + i % 7 * 100},1\n" for i in range(400))  # 400 items over ~4.4 h
    path = write(tmp_path, "submit_s,duration_s,gpus\n" + rows)
    args = [str(path), "--env", "bench", "--pool", "gpu", "--json"]
    quiet = CliRunner().invoke(simulate_command, args)
    monkeypatch.setattr(engine, "PROGRESS_EVENTS", 100)
    monkeypatch.setattr(run, "PROGRESS_EVERY_S", 0.0)  # every callback says it
    told = CliRunner().invoke(simulate_command, args)
    assert quiet.exit_code == told.exit_code == 0, told.output
    assert json.loads(told.stdout)["results"] == json.loads(quiet.stdout)["results"]
    lines = told.stderr.splitlines()
    assert lines[0] == "replaying 400 items under 1 policy" and re.fullmatch(r"\[1/1\] tidefleet: \d+\.\d s", lines[-1])
    steps = [re.fullmatch(r"  tidefleet: (\d+) of 400 items done \((\d+)%\), trace hour (\d) of 4, \d+ s", line)
             for line in lines[1:-1]]  # fmt: skip
    assert len(steps) >= 5 and all(steps), lines
    done = [int(m[1]) for m in steps]
    assert done == sorted(done) and done[-1] > done[0], done
    hours = [int(m[3]) for m in steps]  # a trace shorter than two days is told in hours
    assert hours == sorted(hours) and hours[-1] > hours[0], hours
    assert all(int(m[2]) == round(100 * int(m[1]) / 400) for m in steps)


# --- invoke bench as it runs: a line per run on stderr; Ctrl-C and a failing run stop the rest at once.


def _tiny_bench(tmp_path) -> list[bench.Run]:
    """One workload of four items: a held-out run per policy and the tuning runs (the tuned run follows)."""
    (tmp_path / "tiny.csv").write_text("submit_s,duration_s,gpus\n0,100,1\n30,200,1\n60,50,1\n90,10,1\n")
    tiny = bench.Workload("tiny.csv", "Tiny", "gpu")
    return [bench.Run(tiny, 1, name) for name in POLICY_NAMES] + [bench.Run(tiny, 0, "tidefleet", o) for o in bench.TUNING_GRID]


def _sleep(run, traces_dir):  # a run of Philly's length, as far as the bench can tell
    time.sleep(120)


def _fail_first_else_sleep(run, traces_dir):
    if run.half == 0 and run.overrides is None:  # the first run submitted
        raise TraceError("tiny.csv line 3: column 'duration_s' is not a number (got 'x')")
    time.sleep(120)


def test_invoke_bench_says_each_run_as_it_ends_on_stderr_and_nothing_of_the_workers(tmp_path, capfd):
    runs = _tiny_bench(tmp_path)
    done = bench._execute(runs, tmp_path, workers=2)
    out, err = capfd.readouterr()
    total = len(runs) + 1  # and the tuned run
    assert len(done) == total and out == ""
    lines = [re.sub(r": \d+\.\d s$", ": N s", line) for line in err.splitlines()]
    assert [line.split("] ")[0] for line in lines] == [f"[{k}/{total}" for k in range(1, total + 1)], err
    assert {line.split("] ")[1] for line in lines} == {
        *(f"Tiny: {name}: N s" for name in POLICY_NAMES), "Tiny: tidefleet tuned: N s",
        *(f"Tiny, first half: tidefleet ({bench.describe(o)}): N s" for o in bench.TUNING_GRID),
    }  # fmt: skip


def _ended(worker) -> bool:
    """A pool's worker process has ended: its exit code is known, or the pool's own manager thread
    reaped it first (its Process object then never learns the code: its waitpid finds no child)."""
    worker.join(10)
    if worker.exitcode is not None:
        return True
    try:
        return psutil.Process(worker.pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _workers_of_the_pool(monkeypatch) -> list:
    """The bench pool's worker processes, as they start (its own list is gone after a shutdown)."""
    workers = []

    class Watched(ProcessPoolExecutor):
        def submit(self, *args, **kwargs):
            future = super().submit(*args, **kwargs)
            workers.extend(w for w in self._processes.values() if w not in workers)
            return future

    monkeypatch.setattr(bench, "ProcessPoolExecutor", Watched)
    return workers


def test_ctrl_c_in_invoke_bench_cancels_the_queued_runs_ends_the_running_ones_and_exits_130(tmp_path, monkeypatch, capfd):
    runs = _tiny_bench(tmp_path)
    monkeypatch.setattr(bench, "_run_one", _sleep)
    workers = _workers_of_the_pool(monkeypatch)
    futures = []

    def ctrl_c(pending, return_when):  # while both workers are busy with runs of minutes
        futures.extend(pending)
        time.sleep(1)
        raise KeyboardInterrupt

    monkeypatch.setattr(bench, "wait", ctrl_c)
    started = time.monotonic()
    with pytest.raises(SystemExit) as stopped:
        bench._execute(runs, tmp_path, workers=2)
    assert stopped.value.code == 130 and time.monotonic() - started < 30
    assert capfd.readouterr().err == f"bench: interrupted after 0 of {len(runs) + 1} runs; nothing written\n"
    # None runs on: each is cancelled, or broken with the pool (whichever its manager thread sees first).
    deadline = time.monotonic() + 10
    while not all(f.done() for f in futures) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(f.cancelled() or (f.done() and isinstance(f.exception(), BrokenProcessPool)) for f in futures)
    assert all(_ended(worker) for worker in workers)  # not two minutes into a run


def test_a_run_that_fails_stops_invoke_bench_at_once_naming_it(tmp_path, monkeypatch, capfd):
    runs = _tiny_bench(tmp_path)
    monkeypatch.setattr(bench, "_run_one", _fail_first_else_sleep)
    workers = _workers_of_the_pool(monkeypatch)
    started = time.monotonic()
    with pytest.raises(TraceError, match="tiny.csv line 3"):
        bench._execute(runs, tmp_path, workers=2)
    assert time.monotonic() - started < 30  # not after the other worker's two minutes
    assert capfd.readouterr().err == (f"[1/{len(runs) + 1}] Tiny, first half: tidefleet (the defaults): failed "
                                      "(tiny.csv line 3: column 'duration_s' is not a number (got 'x'))\n")  # fmt: skip
    assert all(_ended(worker) for worker in workers)  # not two minutes into a run


def test_invoke_simulate_finds_a_bare_trace_name_in_the_projects_folder_from_another_cwd(tmp_path):
    run = subprocess.run(
        [sys.executable, "-m", "invoke", "--search-root", str(ROOT), "simulate", "--trace",
         "alibaba_genai_lora_2024_requests.csv", "--env", "bench", "--pool", "gpu", "--extra", "--window 0:3600"],
        check=False, cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert "alibaba_genai_lora_2024_requests.csv on bench/gpu" in run.stdout and "| tidefleet |" in run.stdout


def test_the_simulated_idle_poll_is_the_agents():
    from tidefleet.agent.worker import LEAVE_POLL_S

    assert Timing(boot_s=45, notice_s=120).idle_poll_s == LEAVE_POLL_S


def test_checkpoint_and_move_frees_a_cordoned_node_and_the_moved_item_resumes_with_its_work():
    """Two 4-slot nodes each end up with one 10,000-s item once the short ones are done: one is
    cordoned (demand fits on the other); with checkpoint_and_move, its item moves once it ran
    min_runtime_s, resumes on the other node with its work kept plus `Timing.resume_s`, and the
    cordoned node leaves ~9,000 s early. Without it, both run to the end."""

    def moving(move: bool):
        env = make_env(slots_per_unit=4)
        queue = env.queues["q"].model_copy(update={"preemptible": True, "min_runtime_s": 600})
        pool = env.pools["p"].model_copy(update={"checkpoint_and_move": move})
        return env.model_copy(update={"queues": {"q": queue}, "pools": {"p": pool}})

    items = ([TraceItem(0, 10_000, 1)] + [TraceItem(0, 100, 1)] * 3) * 2
    stay, move = run(moving(False), items), run(moving(True), items)
    assert (stay.items_interrupted, stay.work_redone_s, stay.makespan_s) == (0, 0.0, BOOT + 10_000)
    assert stay.node_hours * 3600 > 2 * 10_000
    resume_s = NO_KICK.resume_s
    assert (move.items_finished, move.items_interrupted, move.work_redone_s) == (8, 1, resume_s)
    assert move.makespan_s == BOOT + 10_000 + resume_s  # resumed at once: the other node had free slots
    assert move.node_hours * 3600 < stay.node_hours * 3600 - 9_000
    assert move.busy_items_killed_by_scale_in == 0


SCALER_TOML = """
region = "us-east-1"
[scaler]
tick_s = 60
scale_in_delay_s = 60
scale_out_cooldown_s = 0
"""  # a tick a minute, an idle minute before scale-in, no cooldown


def test_resume_s_is_the_work_a_moved_item_does_again_and_the_json_says_which_was_used(tmp_path):
    env = tmp_path / "moving.toml"
    env.write_text(SCALER_TOML + """[pools.p]
max = 10
command = "run"
slots_per_unit = 4
checkpoint_and_move = true
instance_types = [{ type = "c6i.large", weight = 1, on_demand_price = 2.0, spot_price = 1.0 }]
[queues.q]
pool = "p"
preemptible = true
item_timeout_s = 20000
""")
    trace = write(tmp_path, "submit_s,duration_s,gpus\n" + "".join(f"0,{d},1\n" for d in [10_000, 100, 100, 100] * 2))

    def redone(*extra: str) -> tuple[float, float]:
        out = CliRunner().invoke(simulate_command, [str(trace), "--env", str(env), "--pool", "p", "--json", *extra])
        assert out.exit_code == 0, out.output
        data = json.loads(out.stdout)
        (result,) = data["results"]
        assert result["items_interrupted"] == 1  # the one move
        return data["resume_s"], result["work_redone_s"]

    assert redone() == (60.0, 60.0)
    assert redone("--resume-s", "300") == (300.0, 300.0)
    refused = CliRunner().invoke(simulate_command, [str(trace), "--env", str(env), "--pool", "p", "--resume-s", "-1"])
    assert refused.exit_code == 2 and "--resume-s: must be a finite number >= 0 (got -1.0)" in refused.output


ONE_NODE_TOML = SCALER_TOML + """[pools.p]
max = 1
command = "run"
instance_types = [{ type = "c6i.large", weight = 1, on_demand_price = 2.0, spot_price = 1.0 }]
[queues.q]
pool = "p"
"""


@pytest.mark.parametrize("too_big", [1, 2])
def test_the_table_prints_cents_under_a_dollar_to_4_digits_waits_with_separators_and_counts_in_words(tmp_path, too_big):
    """Three 1,000-s items queue for one 1-slot node at $1 an hour: waits 45, 1,045 and 2,045 s, and
    costs under $1, printed so that 0.8667 / 0.8333 can be checked against the printed 1.04."""
    env = tmp_path / "one.toml"
    env.write_text(ONE_NODE_TOML)
    trace = write(tmp_path, "submit_s,duration_s,gpus\n" + "0,1000,1\n" * 3 + "0,10,2\n" * too_big)
    out = CliRunner().invoke(simulate_command, [str(trace), "--env", str(env), "--pool", "p", "--policy", "tidefleet",
                                                "--policy", "oracle", "--boot-s", "45"])  # fmt: skip
    assert out.exit_code == 0, out.output
    head, unfit, _, _, tidefleet, oracle = out.stdout.splitlines()
    assert head.endswith("lower bound $0.8333, zero-wait bound $0.8708")
    items = "1 item needs" if too_big == 1 else "2 items need"
    assert unfit.startswith(f"not replayed: {items} more than the 1 slot of the pool's biggest node (")
    assert tidefleet.startswith("| tidefleet | 0.8667 | 1.04 | 1.00 | 0.9 | 0.0 | 1,045/2,045/2,045/2,045 |")
    assert oracle.startswith("| oracle | 0.8333 | 1.00 |")
    big = simulate(make_env(), "p", [TraceItem(0, 516_087, 1)] * 8, ["oracle"], timing=NO_KICK)
    assert format_table(big).splitlines()[2].startswith("| oracle | 1,146.86 |")  # cents from $1 up, as ever


def test_a_plot_of_a_replay_that_cost_nothing_draws_cost_on_a_linear_axis_without_a_warning(tmp_path):
    """The oracle of 0-s items costs $0: a log axis has nothing to show and matplotlib warns."""
    import warnings

    from tidefleet.sim.plot import plot_report

    report = simulate(make_env(), "p", [TraceItem(0, 0, 1)], ["oracle"], timing=NO_KICK)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plot_report(report, tmp_path / "free.png")
    assert (tmp_path / "free.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_plot_that_cannot_be_written_is_one_line_not_a_traceback(tmp_path, monkeypatch):
    trace = write(tmp_path, "submit_s,duration_s,gpus\n0,10,1\n")
    (tmp_path / "a-file").write_text("")

    def plot(path: str) -> str:
        out = CliRunner().invoke(simulate_command, [str(trace), "--env", "bench", "--pool", "gpu", "--plot", path])
        assert out.exit_code != 0 and isinstance(out.exception, SystemExit), out.output
        return out.output

    assert f"--plot: cannot write {tmp_path}/a-file/x.png (" in plot(str(tmp_path / "a-file" / "x.png"))
    # before the replay (hours on a long trace), not after its table; a usage error (exit 2), as every flag's
    assert plot(str(tmp_path / "a-file" / "x.png")).splitlines()[-1:] == [
        f"Error: --plot: cannot write {tmp_path}/a-file/x.png ({tmp_path}/a-file is a file, not a folder); give a writable path"
    ]
    (tmp_path / "a-folder.png").mkdir()
    assert plot(str(tmp_path / "a-folder.png")).splitlines()[-1:] == [
        f"Error: --plot: cannot write {tmp_path}/a-folder.png (a folder of that name exists); give a writable path"
    ]
    # matplotlib would write tmp_path.png and the line would name tmp_path
    assert f"--plot: give a file name ending .png, .svg, .pdf (got '{tmp_path}')" in plot(str(tmp_path))
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # the base install, without the dev extra
    assert "--plot needs matplotlib, which the base install leaves out: pip install matplotlib" in plot(
        str(tmp_path / "x.png")
    )


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--boot-s", "nan"], 2, "--boot-s: must be a finite number >= 0 (got nan)"),  # the replay never ended
        (["--boot-s", "inf"], 2, "--boot-s: must be a finite number >= 0 (got inf)"),
        (["--notice-s", "nan"], 2, "--notice-s: must be a finite number >= 0 (got nan)"),
        (["--resume-s", "inf"], 2, "--resume-s: must be a finite number >= 0 (got inf)"),
        (["--interruption-rate", "nan"], 2, "--interruption-rate: must be a finite number >= 0 (got nan)"),
        # A replay past these models no cloud and gives up after a week of nothing: refused, not replayed.
        (["--boot-s", "1e12"], 2, "--boot-s: at most 86400 (s, a day; real boots take 25-60 s) (got 1e+12)"),
        (["--notice-s", "86401"], 2, "--notice-s: at most 86400 (s, a day; real spot notices are 30-120 s) (got 86401)"),
        (["--interruption-rate", "1e9"], 2, "--interruption-rate: at most 60 (notices per spot node-hour, one a minute"),
        (["--window", "nan:5"], 2, "--window: START and END must be numbers of seconds, e.g. 0:86400 (got 'nan:5')"),
    ],
)
def test_a_number_the_replay_cannot_use_is_refused_with_one_line(tmp_path, args, code, message):
    trace = write(tmp_path, "submit_s,duration_s,gpus\n0,10,1\n")
    out = CliRunner().invoke(simulate_command, [str(trace), "--env", "bench", "--pool", "gpu", *args])
    assert (out.exit_code, out.exception.__class__) == (code, SystemExit) and message in out.output


@pytest.mark.parametrize("preemptible", [False, True])
def test_a_higher_priority_item_preempts_preemptible_work_on_a_pool_at_its_max(preemptible):
    """One 2-slot node (the pool's max) runs two 10,000-s batch items; a 2-slot urgent item comes at
    t=1000. With batch preemptible both attempts checkpoint at the kicked tick and resume after the
    urgent item, with the work they had left plus resume_s; without, the urgent item waits them out."""
    env = make_env(slots_per_unit=2)
    pool = env.pools["p"].model_copy(update={"max": 1})
    queues = {"urgent": env.queues["q"].model_copy(update={"priority": 50, "slots_per_item": 2}),
              "batch": env.queues["q"].model_copy(update={"priority": 1, "preemptible": preemptible})}  # fmt: skip
    env = env.model_copy(update={"pools": {"p": pool}, "queues": queues})
    outcome = Simulation(env, "p", [TraceItem(0, 10_000, 1), TraceItem(0, 10_000, 1), TraceItem(1000, 100, 2)],
                         TidefleetPolicy(env, 0.0), NO_KICK).run()  # fmt: skip
    if not preemptible:
        assert (outcome.first_start[2], outcome.interruptions) == (BOOT + 10_000, 0)
        return
    resumed = 1100 + (10_000 - (1000 - BOOT)) + NO_KICK.resume_s
    assert (outcome.first_start[2], outcome.finished[2]) == (1000, 1100)
    assert (outcome.finished[:2], outcome.interruptions, outcome.redone_s) == ([resumed, resumed], 2, 2 * NO_KICK.resume_s)


def test_the_calibration_command_explains_itself_rather_than_running_a_sandbox(capsys):
    from tidefleet.sim import calibration

    with pytest.raises(SystemExit) as done:
        calibration.main(["--help"])
    assert done.value.code == 0 and "through the sandbox (real agents on a moto" in capsys.readouterr().out.replace("\n", " ")


def test_calibration_turnaround_is_an_end_to_the_next_waiting_items_start_on_that_node():
    """First come, first served per node; an item sent after the end was not waiting for that
    slot, and a moved item (resumed: its last attempt began after its first) was not waiting at all."""
    from tidefleet.sim.calibration import turnarounds

    runs = {
        "a": {"node": "n1", "start": 1.0, "began": 1.0, "end": 4.0},
        "b": {"node": "n1", "start": 4.2, "began": 4.2, "end": 7.0},  # waited: sent at 0
        "c": {"node": "n1", "start": 9.0, "began": 9.0, "end": 10.0},  # sent at 8, after b's end
        "d": {"node": "n2", "start": 1.0, "began": 1.5, "end": 3.0},  # moved here
        "e": {"node": "n2", "start": 3.1, "began": 3.1, "end": 5.0},  # waited for d's slot
    }
    sent = {"a": 0.0, "b": 0.0, "c": 8.0, "d": 0.0, "e": 0.0}
    assert turnarounds(runs, sent) == pytest.approx([0.2, 0.1])


def test_a_launch_before_the_submit_call_returned_is_a_kick_of_no_delay_not_a_negative_one():
    """The kicked tick may launch before submit returns (a loaded machine printed kick -0.6 s)."""
    from tidefleet.sim.calibration import agent_timing

    assert agent_timing({}, {"i-1": 99.4}, {}, 100.0, [], {}).kick_s == 0.0


def test_a_calibration_that_disagrees_says_what_load_does_and_to_run_it_again(monkeypatch, capsys):
    from tidefleet.sim import calibration

    class Apart:
        def agrees(self) -> bool:
            return False

    monkeypatch.setattr(calibration, "calibrate", lambda folder: [Apart()])
    monkeypatch.setattr(calibration, "format_rows", lambda rows: "| table |")
    assert calibration.main([]) == 1
    assert "run it again on an idle machine" in capsys.readouterr().err
