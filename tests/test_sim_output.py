"""What `tidefleet simulate` prints and draws: each column of one precision, counts with separators,
the window named, and a plot that says what it cannot show."""

from __future__ import annotations

import json
import re

from click.testing import CliRunner

from tidefleet.config import parse_environment
from tidefleet.sim import Timing, TraceItem, simulate
from tidefleet.sim.cli import simulate as simulate_command

ONE_NODE_TOML = """region = "us-east-1"
[scaler]
tick_s = 60
scale_in_delay_s = 60
[pools.p]
max = 1
command = "run"
instance_types = [{ type = "c6i.large", weight = 1, on_demand_price = 2.0, spot_price = 1.0 }]
[queues.q]
pool = "p"
"""


def one_pool_env(max_nodes: int = 1):
    return parse_environment({"region": "us-east-1", "scaler": {"tick_s": 60, "scale_in_delay_s": 60},
                              "pools": {"p": {"max": max_nodes, "command": "run", "instance_types": [{"type": "c6i.large"}]}},
                              "queues": {"q": {"pool": "p"}}}, name="one")  # fmt: skip


def run(tmp_path, trace: str, *args: str):
    env = tmp_path / "one.toml"
    env.write_text(ONE_NODE_TOML)
    path = tmp_path / "t.csv"
    path.write_text("submit_s,duration_s,gpus\n" + trace)
    out = CliRunner().invoke(simulate_command, [str(path), "--env", str(env), "--pool", "p", *args])
    assert out.exit_code == 0, out.output
    return out.stdout


def test_costs_in_one_column_have_as_many_decimals_and_counts_have_separators(tmp_path):
    """Three 1,190-s items on one $1/h node: the oracle pays $0.9917, tidefleet a boot and idle time more, over $1;
    both to 4 decimals (not 1.00 beside 0.9917). 1,200 items read, with a separator as on stderr."""
    out = run(tmp_path, "0,1190,1\n" * 3 + "0,0,1\n" * 1197, "--policy", "tidefleet", "--policy", "oracle",
              "--by-team")  # fmt: skip
    head, _, _, tidefleet, oracle, *_ = out.splitlines()
    assert ": 1,200 items, lower bound $0.9917" in head
    assert tidefleet.startswith("| tidefleet | 1.0333 |") and oracle.startswith("| oracle | 0.9917 |")
    assert "| default | - | 1 | 1,200 |" in out


def test_the_json_waits_are_to_a_tenth_of_a_second(tmp_path):
    data = json.loads(run(tmp_path, "0,100,1\n", "--boot-s", "45.123456", "--json", "--by-team"))
    assert data["results"][0]["wait_s"] == {"p50": 45.1, "p95": 45.1, "p99": 45.1, "max": 45.1}
    (team,) = data["teams"]["tidefleet"]
    assert (team["wait_p50_s"], team["wait_p95_s"]) == (45.1, 45.1)


def test_the_reports_json_has_its_waits_and_durations_to_a_tenth_of_a_second():
    """`Report.to_json` rounds, so simulate --json and bench.json read alike; the report itself keeps
    the replay's times as they came out."""
    report = simulate(one_pool_env(), "p", [TraceItem(0.0, 100.0, 1)], ["tidefleet"],
                      timing=Timing(45.123456, 120.0, kick_s=0.0), by_team=True)  # fmt: skip
    data, kept = report.to_json(), report.results[0]
    (result,), (team,) = data["results"], data["teams"]["tidefleet"]
    assert result["wait_s"] == {"p50": 45.1, "p95": 45.1, "p99": 45.1, "max": 45.1} and kept.wait_s["p95"] == 45.123456
    assert (result["makespan_s"], result["work_redone_s"]) == (round(kept.makespan_s, 1), round(kept.work_redone_s, 1))
    assert (team["wait_p50_s"], team["wait_p95_s"]) == (45.1, 45.1)


def test_the_window_is_named_in_the_head_line(tmp_path):
    head = run(tmp_path, "0,100,1\n50,100,1\n", "--window", "10:3600").splitlines()[0]
    assert head.startswith("t.csv on one/p, window 10:3600 s: 1 item,")
    assert run(tmp_path, "0,100,1\n", "--window", "0:").splitlines()[0].startswith("t.csv on one/p, window 0: s:")
    assert run(tmp_path, "0,100,1\n").splitlines()[0].startswith("t.csv on one/p: 1 item,")


def test_the_plot_names_the_window_says_a_wait_under_1_s_is_drawn_at_1_s_and_counts_in_whole_numbers():
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    from tidefleet.sim.plot import draw

    env = one_pool_env(max_nodes=2)
    items = [TraceItem(0.0, 600.0, 1), TraceItem(30.0, 600.0, 1)]
    report = simulate(env, "p", items, ["tidefleet", "oracle"], timing=Timing(45.0, 120.0, kick_s=0.0),
                      window=(0.0, 86400.0))  # fmt: skip
    figure = draw(report)
    costs, timeline, queued = figure.axes
    assert "window 0:86400 s" in costs.get_title()
    labels = [text.get_text() for text in costs.get_legend().get_texts()]
    assert [label for label in labels if "< 1 s" in label] == [next(x for x in labels if x.startswith("oracle"))]
    assert not any("< 1 s" in label for label in labels if label.startswith("tidefleet"))
    figure.canvas.draw()  # tick labels are made when drawn
    cost_labels = [t.get_text() for t in costs.get_yticklabels() + costs.get_yticklabels(minor=True) if t.get_text()]
    assert cost_labels and all(re.fullmatch(r"\$[\d,]+(\.\d+)?", label) for label in cost_labels), cost_labels
    for axis in (timeline, queued):
        ticks = axis.get_yticks()
        assert isinstance(axis.yaxis.get_major_locator(), MaxNLocator)
        assert all(float(t).is_integer() for t in ticks), ticks
    plt.close(figure)
