"""Plots of a simulation report; matplotlib is imported here only (dev extra)."""

from __future__ import annotations

from pathlib import Path

from tidefleet.sim.run import Report


def plot_report(report: Report, out: Path) -> None:
    """Left: cost against p95 wait per policy. Right: queue depth and running capacity over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (costs, timeline) = plt.subplots(1, 2, figsize=(13, 4.8))
    for r in report.results:
        costs.scatter(r.wait_s["p95"], r.cost_usd, s=40)
        costs.annotate(r.policy, (r.wait_s["p95"], r.cost_usd), textcoords="offset points", xytext=(5, 4))
    costs.set_xlabel("p95 wait, submit to start (s)")
    costs.set_ylabel("cost (USD)")
    costs.set_title(f"{report.trace} on {report.env}/{report.pool}")
    costs.grid(alpha=0.3)
    for name, samples in report.timelines.items():
        if not samples:
            continue
        hours = [s.t / 3600 for s in samples]
        line = timeline.plot(hours, [s.capacity_slots for s in samples], lw=0.8, label=f"{name} capacity (slots)")[0]
        timeline.plot(hours, [s.queued for s in samples], lw=0.6, ls=":", color=line.get_color(), label=f"{name} queued")
    timeline.set_xlabel("hours into the trace")
    timeline.set_ylabel("slots / items")
    timeline.set_title("capacity (solid) and queue depth (dotted)")
    timeline.legend(fontsize=7)
    timeline.grid(alpha=0.3)
    fig.tight_layout()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
