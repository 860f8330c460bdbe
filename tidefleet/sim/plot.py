"""Plots of a simulation report; matplotlib is imported here only (dev extra)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from tidefleet.sim.run import TARGET_WAIT_ROW, Report
from tidefleet.sim.words import replay_title, usd_column


def partial_file(plot: Path) -> Path:
    """A new empty file beside `plot` to draw it into, then put in its place: named after it (a few
    characters of it: a name the OS takes may be too long with `.partial` added) and the format."""
    fd, name = tempfile.mkstemp(dir=plot.parent, prefix=f".{plot.stem[:32]}.", suffix=f".partial{plot.suffix}")
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(name, 0o666 & ~umask)  # as a plain open() makes it: mkstemp's 0600 would hide the plot from others
    return Path(name)


def plot_report(report: Report, out: Path) -> None:
    """`draw` the report into the file `out` (its suffix names the format)."""
    import matplotlib.pyplot as plt

    fig = draw(report)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def draw(report: Report):
    """Left: cost against p95 wait per policy. Right: queue depth and running capacity over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    fig, (costs, timeline) = plt.subplots(1, 2, figsize=(13, 4.8))
    for r, cost in zip(report.results, usd_column([r.cost_usd for r in report.results])):
        # Log axes: the oracle waits 0 s and a baseline may wait days; a wait under 1 s is drawn at
        # 1 s, and its label says so.
        p95 = max(1.0, r.wait_s["p95"])
        label = r.policy + (f" ({r.items_unfinished:,} unfinished)" if r.items_unfinished else "")
        label += " (p95 < 1 s, drawn at 1 s)" if r.wait_s["p95"] < 1.0 else ""
        costs.scatter(p95, r.cost_usd, s=40, label=f"{label}: ${cost}, {r.cost_vs_lower_bound:.2f}x")
    # tidefleet under each --target-wait-s with its own: one curve of cost against wait.
    curve = sorted((max(1.0, r.wait_s["p95"]), r.cost_usd) for r in report.results
                   if r.policy == "tidefleet" or r.policy.startswith(TARGET_WAIT_ROW))  # fmt: skip
    if len(curve) > 1 and any(r.policy.startswith(TARGET_WAIT_ROW) for r in report.results):
        costs.plot(*zip(*curve), lw=0.8, color="grey", zorder=0, label="tidefleet by target_wait_s")
    costs.set_xscale("log")
    # A log axis leaves out a cost of $0 (an oracle of 0-s items), and warns when all are.
    log_cost = all(r.cost_usd > 0 for r in report.results)
    costs.set_yscale("log" if log_cost else "linear")
    costs.set_xlabel("p95 wait, submit to start (s, log)")
    costs.set_ylabel("cost (USD, log)" if log_cost else "cost (USD)")
    # Dollars, not matplotlib's log labels (3.75x10^3); a narrow log range labels its minor ticks too.
    dollars = FuncFormatter(lambda value, _: f"${value:,.0f}" if value >= 100 else f"${value:.3g}")
    costs.yaxis.set_major_formatter(dollars)
    costs.yaxis.set_minor_formatter(dollars if log_cost else FuncFormatter(lambda *_: ""))
    costs.set_title(replay_title(report))
    costs.grid(alpha=0.3)
    costs.legend(title="policy: cost, x lower bound", fontsize=8)
    queued = timeline.twinx()  # items waiting are few next to the slots serving: own scale
    for name, samples in report.timelines.items():
        if not samples:
            continue
        hours = [s.t / 3600 for s in samples]
        line = timeline.plot(hours, [s.capacity_slots for s in samples], lw=0.8, label=f"{name} capacity")[0]
        queued.plot(
            hours, [s.queued for s in samples], lw=0.6, ls=":", color=line.get_color(), label=f"{name} queued"
        )
    timeline.set_xlabel("hours into the trace")
    timeline.set_ylabel("capacity running (slots, solid)")
    queued.set_ylabel("queue depth (items, dotted)")
    timeline.set_title("capacity and queue depth over time")
    for counts in (timeline, queued):  # slots and items: whole numbers, not 0.25 of a slot
        counts.yaxis.set_major_locator(MaxNLocator(integer=True))
    timeline.grid(alpha=0.3)
    lines = timeline.get_lines() + queued.get_lines()
    if lines:
        timeline.legend(lines, [line.get_label() for line in lines], fontsize=8, loc="upper right")
    fig.tight_layout()
    return fig
