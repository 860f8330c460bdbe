"""`invoke bench`: every policy over every shared trace, a markdown table and plots.

Which pool replays which trace lives in BENCH below and in environments/bench.toml: the
1-GPU traces on one-GPU nodes, Philly (1-128 GPU jobs) on eight-GPU nodes (its jobs above
eight GPUs are reported as unfittable). Tuning belongs in that file, never here.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from tidefleet.config import load_environment
from tidefleet.sim.cli import format_table
from tidefleet.sim.policies import POLICY_NAMES
from tidefleet.sim.run import default_timing, simulate
from tidefleet.sim.trace import load_trace

TRACES_DIR = Path(os.environ.get("TIDEFLEET_TRACES", Path(__file__).resolve().parents[3] / "shared" / "traces"))
BENCH = (  # trace file, environment, pool
    ("alibaba_genai_lora_2024_requests.csv", "bench", "gpu"),
    ("alibaba_openb_2023_pods.csv", "bench", "gpu"),
    ("philly_2017_jobs.csv", "bench", "gpu8"),
)


def goal_line(report) -> str:
    """Does tidefleet beat every baseline on cost at equal or better p95 wait, within 1.25x of the bound?"""
    ours = next(r for r in report.results if r.policy == "tidefleet")
    misses = [
        f"{r.policy} is cheaper (${r.cost_usd:,.2f} vs ${ours.cost_usd:,.2f})"
        for r in report.results
        if r.policy not in ("tidefleet", "oracle") and r.cost_usd <= ours.cost_usd
    ]
    misses += [
        f"{r.policy} has a lower p95 wait ({r.wait_s['p95']:.0f}s vs {ours.wait_s['p95']:.0f}s)"
        for r in report.results
        if r.policy not in ("tidefleet", "oracle") and r.wait_s["p95"] < ours.wait_s["p95"]
    ]
    if ours.cost_vs_lower_bound > 1.25:
        misses.append(f"cost is {ours.cost_vs_lower_bound:.2f}x the lower bound (> 1.25x)")
    return "goal met" if not misses else "goal NOT met: " + "; ".join(misses)


def run_bench(out: Path, traces_dir: Path = TRACES_DIR) -> Path:
    """Write bench.md, bench.json and one PNG per trace into `out`; return the table's path."""
    from tidefleet.sim.plot import plot_report

    out.mkdir(parents=True, exist_ok=True)
    sections, payload = ["# tidefleet simulate: every policy over the shared traces\n"], []
    for trace, env_name, pool in BENCH:
        env = load_environment(env_name)
        timing = default_timing(env)
        started = time.perf_counter()
        report = simulate(env, pool, load_trace(traces_dir / trace), list(POLICY_NAMES), trace_name=trace, timing=timing)
        seconds = time.perf_counter() - started
        plot = out / f"{Path(trace).stem}.png"
        plot_report(report, plot)
        unfit = report.unfittable
        sections += [
            f"## {trace} on {env_name}/{pool}\n",
            f"{report.items} items; {unfit['count']} unfittable (need more than {unfit['largest_node_slots']} slots: "
            f"{unfit['by_slots']}); boot {timing.boot_s:.0f}s, notice {timing.notice_s:.0f}s; "
            f"lower bound ${report.lower_bound_usd:,.2f}; simulated in {seconds:.1f}s\n",
            format_table(report) + "\n",
            f"**{goal_line(report)}**\n",
            f"![{trace}]({plot.name})\n",
        ]
        payload.append(report.to_json())
        print(f"{trace}: {seconds:.1f}s, {goal_line(report)}", flush=True)
    table = out / "bench.md"
    table.write_text("\n".join(sections))
    (out / "bench.json").write_text(json.dumps(payload, indent=2))
    print(f"table: {table}")
    return table
