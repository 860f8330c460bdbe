"""`invoke bench`'s write phase (tidefleet.sim.bench.run_bench) on replays made up front: the table,
the JSON and a plot per workload land together, and a Ctrl-C while they are written leaves none of
them, old plots untouched (it left a truncated PNG, exit 1, and the previous table pointing at it)."""

from __future__ import annotations

import json

import pytest

from tidefleet.config import load_environment
from tidefleet.sim import bench
from tidefleet.sim.run import simulate
from tidefleet.sim.trace import TraceItem


@pytest.fixture(scope="module")
def done():
    """Every run bench makes, each answered with one small replay of the right policy."""
    env = load_environment(bench.ENV)
    reports = {}

    def replay(run: bench.Run):
        key = (run.workload.pool, run.policy)
        if key not in reports:
            items = [TraceItem(submit_s=60.0 * i, duration_s=300.0, slots=1) for i in range(4)]
            reports[key] = simulate(env, run.workload.pool, items, [run.policy], trace_name=run.workload.name)
        return reports[key], 0.1

    runs = [bench.Run(w, 1, name) for w in bench.WORKLOADS for name in bench.POLICY_NAMES]
    runs += [bench.Run(w, 1, "tidefleet", tuned=True) for w in bench.WORKLOADS]
    runs += [bench.Run(w, 1, "tidefleet", moved=True) for w in bench.WORKLOADS if bench.MOVED in bench.row_names(w)]
    return {run: replay(run) for run in runs}


def test_bench_writes_the_table_the_json_and_a_plot_per_workload(tmp_path, monkeypatch, done):
    monkeypatch.setattr(bench, "_execute", lambda runs, traces_dir, workers: done)
    table = bench.run_bench(tmp_path, workers=1)
    assert table == tmp_path / "bench.md" and "## README table" in table.read_text()
    assert len(json.loads((tmp_path / "bench.json").read_text())) == len(bench.WORKLOADS)
    assert sorted(p.name for p in tmp_path.glob("*.png")) == sorted(f"{w.name.rsplit('.', 1)[0]}.png"
                                                                      for w in bench.WORKLOADS)  # fmt: skip
    assert not list(tmp_path.glob(".*partial*"))


def test_ctrl_c_while_bench_writes_leaves_nothing_written_and_older_plots_as_they_were(tmp_path, monkeypatch, capsys,
                                                                                        done):  # fmt: skip
    from tidefleet.sim import plot

    older = tmp_path / f"{bench.WORKLOADS[0].name.rsplit('.', 1)[0]}.png"
    older.write_bytes(b"an older plot")
    monkeypatch.setattr(bench, "_execute", lambda runs, traces_dir, workers: done)
    drawn, real = [], plot.plot_report

    def plot_report(report, out):
        drawn.append(out)
        if len(drawn) == 3:
            raise KeyboardInterrupt
        real(report, out)

    monkeypatch.setattr(plot, "plot_report", plot_report)
    with pytest.raises(SystemExit) as stopped:
        bench.run_bench(tmp_path, workers=1)
    assert stopped.value.code == 130
    assert "bench: interrupted while writing its results; nothing written" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == [older.name] and older.read_bytes() == b"an older plot"
