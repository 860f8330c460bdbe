"""`tidefleet simulate --target-wait-s`: tidefleet replayed again with each wait target on every queue
of the pool, one row each, as the environment would run with that `target_wait_s` set; a target the
config refuses is a usage error naming the rule, before anything is replayed."""

from __future__ import annotations

import json
from dataclasses import asdict, replace

import pytest
from click.testing import CliRunner

from tidefleet.config import ConfigError, parse_environment
from tidefleet.sim import Timing, TraceItem, simulate
from tidefleet.sim.cli import simulate as simulate_command
from tidefleet.sim.run import with_target_wait

TIMING = Timing(45.0, 120.0, kick_s=0.0)
# One node runs A for 600 s; B comes 30 s later. Without a wait it gets a node of its own (a boot
# away); allowed 900 s, it waits for A's node and the pool pays for one node only.
ITEMS = [TraceItem(0.0, 600.0, 1), TraceItem(30.0, 600.0, 1)]


def env_of(queues=("q",)):
    return parse_environment({"region": "us-east-1", "scaler": {"tick_s": 60, "scale_in_delay_s": 60},
                              "pools": {"p": {"max": 2, "command": "run", "instance_types": [{"type": "c6i.large"}]}},
                              "queues": {q: {"pool": "p", "target_wait_s": 0} for q in queues}}, name="tw")  # fmt: skip


def test_each_wait_target_is_a_tidefleet_row_replayed_as_the_environment_with_it_would_run():
    env = env_of()
    report = simulate(env, "p", ITEMS, ["tidefleet", "oracle"], timing=TIMING, target_waits=(900, 0, 900))
    rows = {r.policy: r for r in report.results}
    assert list(rows) == ["tidefleet", "oracle", "tidefleet, target_wait_s=900", "tidefleet, target_wait_s=0"]
    for seconds in (900, 0):
        (alone,) = simulate(with_target_wait(env, "p", seconds), "p", ITEMS, ["tidefleet"], timing=TIMING).results
        assert replace(rows[f"tidefleet, target_wait_s={seconds}"], policy="tidefleet") == alone
    waited, at_once = rows["tidefleet, target_wait_s=900"], rows["tidefleet, target_wait_s=0"]
    assert asdict(replace(at_once, policy="tidefleet")) == asdict(rows["tidefleet"])  # the file's own target is 0
    assert waited.cost_usd < at_once.cost_usd and waited.node_hours < at_once.node_hours
    assert waited.wait_s["max"] > 500 > at_once.wait_s["max"]
    assert list(report.timelines) == ["tidefleet", "oracle"]  # a wait target's row is a point, not a timeline


def test_with_target_wait_sets_the_pools_queues_only_and_checks_them_as_the_file_would():
    env = parse_environment({"region": "us-east-1",
                             "pools": {n: {"max": 2, "command": "run", "instance_types": [{"type": "c6i.large"}]} for n in "pr"},
                             "queues": {"q": {"pool": "p"}, "s": {"pool": "r"}}}, name="tw")  # fmt: skip
    changed = with_target_wait(env, "p", 600)
    assert (changed.queues["q"].target_wait_s, changed.queues["s"].target_wait_s) == (600, env.queues["s"].target_wait_s)
    with pytest.raises(ConfigError, match=r"--target-wait-s 1800: queues.q.target_wait_s: must be below max_wait_s \(got 1800 >= 1800\)"):
        with_target_wait(env, "p", 1800)


def _cli(tmp_path, *args):
    env = tmp_path / "tw.toml"
    env.write_text('region = "us-east-1"\n[pools.p]\nmax = 2\ncommand = "run"\ninstance_types = [{ type = "c6i.large" }]\n'
                   '[queues.q]\npool = "p"\n[queues.r]\npool = "p"\n')  # fmt: skip
    trace = tmp_path / "t.csv"
    trace.write_text("submit_s,duration_s,gpus\n0,600,1\n30,600,1\n")
    return CliRunner().invoke(simulate_command, [str(trace), "--env", str(env), *args])


def test_the_command_prints_a_row_per_wait_target_and_draws_them_as_one_curve(tmp_path):
    out = _cli(tmp_path, "--json", "--target-wait-s", "0", "--target-wait-s", "900")
    assert out.exit_code == 0, out.output
    policies = [r["policy"] for r in json.loads(out.stdout)["results"]]
    assert policies == ["tidefleet", "tidefleet, target_wait_s=0", "tidefleet, target_wait_s=900"]
    assert "[3/3] tidefleet, target_wait_s=900: " in out.stderr
    plot = tmp_path / "tw.png"
    out = _cli(tmp_path, "--target-wait-s", "900", "--plot", str(plot))
    assert out.exit_code == 0 and plot.stat().st_size > 0, out.output
    assert "| tidefleet, target_wait_s=900 | " in out.stdout


def test_the_curve_is_drawn_only_with_wait_targets():
    import matplotlib.pyplot as plt

    from tidefleet.sim.plot import draw

    for waits, curve in (((), False), ((900,), True)):
        figure = draw(simulate(env_of(), "p", ITEMS, ["tidefleet"], timing=TIMING, target_waits=waits))
        labels = [text.get_text() for text in figure.axes[0].get_legend().get_texts()]
        assert ("tidefleet by target_wait_s" in labels) == curve, labels
        plt.close(figure)


@pytest.mark.parametrize("seconds, says", [
    ("1800", ("Error: --target-wait-s 1800: queues.q.target_wait_s: must be below max_wait_s (got 1800 >= 1800); the "
              "oldest-item alarm would fire and escalate the queue to on-demand before the scaler means to launch; "
              "lower target_wait_s or raise max_wait_s (the pool's 1 other queue alike)")),
    ("-1", "Error: --target-wait-s -1: queues.q.target_wait_s: Input should be greater than or equal to 0 (got -1) (the pool's 1 other queue alike)"),
    ("2h", "Error: Invalid value for '--target-wait-s': '2h' is not a valid integer."),
])  # fmt: skip
def test_a_wait_target_the_config_refuses_is_a_usage_error_before_the_replay(tmp_path, seconds, says):
    out = _cli(tmp_path, "--target-wait-s", seconds)
    assert out.exit_code == 2 and "Traceback" not in out.output, out.output
    assert [line for line in out.output.splitlines() if line.startswith("Error:")] == [says]
    assert "replaying" not in out.output
