"""`invoke bench`: every policy over every trace in traces/, a markdown table, JSON and plots.

Which pool replays which trace lives in BENCH below and in environments/bench.toml: the
1-GPU traces on one-GPU nodes, Philly (1-128 GPU jobs) on eight-GPU nodes (its jobs above
eight GPUs are reported as unfittable). Tuning belongs in that file, never here.

Each (trace, policy) run is independent, so the runs are spread over worker processes,
longest first; the results are put back in POLICY_NAMES order per trace.
"""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

from tidefleet.config import load_environment
from tidefleet.sim.cli import format_table
from tidefleet.sim.policies import POLICY_NAMES
from tidefleet.sim.run import Report, default_timing, simulate
from tidefleet.sim.trace import TraceError, load_trace
from tidefleet.sim.trace import traces_dir as default_traces_dir

TRACES_DIR = default_traces_dir()  # $TIDEFLEET_TRACES, else the project's traces/
BENCH = (  # trace file, environment, pool
    ("alibaba_genai_lora_2024_requests.csv", "bench", "gpu"),
    ("alibaba_openb_2023_pods.csv", "bench", "gpu"),
    ("philly_2017_jobs.csv", "bench", "gpu8"),
)
TIMELINE_POLICY = "tidefleet"  # the one whose queue depth and capacity are plotted over time


def goal_line(report: Report) -> str:
    """Is tidefleet cheaper than every baseline at equal or better p95 wait, within 1.25x of the bound?

    A baseline that leaves more items unfinished (dead-lettered after being killed again and
    again, or never started) did less of the work: its lower cost is named, not counted as a win.
    """
    ours = next(r for r in report.results if r.policy == "tidefleet")
    baselines = [r for r in report.results if r.policy not in ("tidefleet", "oracle")]
    misses, not_counted = [], []
    for r in baselines:
        if r.wait_s["p95"] < ours.wait_s["p95"]:
            misses.append(
                f"{r.policy} has a lower p95 wait ({r.wait_s['p95']:.0f}s vs {ours.wait_s['p95']:.0f}s)"
            )
        if r.cost_usd <= ours.cost_usd:
            line = f"{r.policy} is cheaper (${r.cost_usd:,.2f} vs ${ours.cost_usd:,.2f})"
            if r.items_unfinished > ours.items_unfinished:
                not_counted.append(f"{line} but leaves {r.items_unfinished} items unfinished")
            else:
                misses.append(line)
    if ours.cost_vs_lower_bound > 1.25:
        misses.append(f"cost is {ours.cost_vs_lower_bound:.2f}x the lower bound (> 1.25x)")
    verdict = "goal met" if not misses else "goal NOT met: " + "; ".join(misses)
    return verdict + (f" (not like for like: {'; '.join(not_counted)})" if not_counted else "")


def _run_one(job: tuple[str, str, str, str, Path]) -> tuple[Report, float]:
    trace, env_name, pool, policy, traces_dir = job
    env = load_environment(env_name)
    started = time.perf_counter()
    report = simulate(
        env, pool, load_trace(traces_dir / trace), [policy], trace_name=trace, timing=default_timing(env)
    )
    return report, time.perf_counter() - started


def _combine(runs: list[tuple[Report, float]]) -> Report:
    """One report per trace from its single-policy runs, in POLICY_NAMES order."""
    by_policy = {report.results[0].policy: report for report, _ in runs}
    first = by_policy[POLICY_NAMES[0]]
    return replace(
        first,
        results=[by_policy[name].results[0] for name in POLICY_NAMES],
        timelines={TIMELINE_POLICY: by_policy[TIMELINE_POLICY].timelines[TIMELINE_POLICY]},
    )


# Slowest first, so the long runs start at once and the short ones fill in around them.
_COST_RANK = {"tidefleet": 0, "target-tracking": 1, "keda": 2, "clearml": 3, "oracle": 4}


def check_traces(folder: Path) -> None:
    """Every BENCH trace is in `folder`, or a TraceError that names the folder, the files and the fix."""
    missing = [trace for trace, _, _ in BENCH if not (folder / trace).is_file()]
    if missing:
        what = "no such folder" if not folder.is_dir() else f"missing {', '.join(missing)}"
        raise TraceError(
            f"{folder}: {what}; point TIDEFLEET_TRACES at a folder with {', '.join(t for t, _, _ in BENCH)} "
            "(a clone of the project has them in traces/)"
        )


def run_bench(out: Path, traces_dir: Path | None = None, workers: int | None = None) -> Path:
    """Write bench.md, bench.json and one PNG per trace into `out`; return the table's path."""
    from tidefleet.sim.plot import plot_report

    traces_dir = Path(traces_dir) if traces_dir else default_traces_dir()
    check_traces(traces_dir)
    out.mkdir(parents=True, exist_ok=True)
    jobs = [(t, e, p, name, traces_dir) for t, e, p in BENCH for name in POLICY_NAMES]
    jobs.sort(key=lambda j: (_COST_RANK[j[3]], -(traces_dir / j[0]).stat().st_size))
    workers = workers or min(len(jobs), os.cpu_count() or 1)
    started = time.perf_counter()
    with ProcessPoolExecutor(workers) as pool:
        runs = dict(zip(jobs, pool.map(_run_one, jobs), strict=True))
    wall = time.perf_counter() - started
    sections = [
        "# tidefleet simulate: every policy over the project's traces\n",
        f"{len(jobs)} runs on {workers} worker process(es) in {wall:.1f}s wall.\n",
    ]
    payload = []
    for trace, env_name, pool_name in BENCH:
        mine = [runs[j] for j in jobs if j[0] == trace]
        report = _combine(mine)
        plot = out / f"{Path(trace).stem}.png"
        plot_report(report, plot)
        unfit = report.unfittable
        seconds = ", ".join(f"{r.results[0].policy} {s:.1f}s" for r, s in mine)
        sections += [
            f"## {trace} on {env_name}/{pool_name}\n",
            (
                f"{report.items} items; {unfit['count']} unfittable (need more than {unfit['largest_node_slots']} "
                f"slots: {unfit['by_slots']}); boot {report.boot_s:.0f}s, notice {report.notice_s:.0f}s; "
                f"lower bound ${report.lower_bound_usd:,.2f}; simulated in {seconds}\n"
            ),
            format_table(report) + "\n",
            f"**{goal_line(report)}**\n",
            f"![{trace}]({plot.name})\n",
        ]
        payload.append(report.to_json())
        print(f"{trace}: {goal_line(report)}", flush=True)
    table = out / "bench.md"
    table.write_text("\n".join(sections))
    (out / "bench.json").write_text(json.dumps(payload, indent=2))
    print(f"{len(jobs)} runs on {workers} worker(s): {wall:.1f}s wall; table: {table}")
    return table
