"""A simulation report in words, alike wherever it is shown (`tidefleet simulate`'s table, its plot,
the bench's files): the policies' table, a column of dollars to one precision, and which replay it was."""

from __future__ import annotations

import math

from tidefleet.costs import usd
from tidefleet.sim.run import Report, too_long_fix


def usd_column(costs: list[float]) -> list[str]:
    """Dollar amounts of one column, all to the decimals `usd` gives the one that needs most
    (`0.8183` beside `1.6700`, not `1.67`): a column reads as one precision."""
    decimals = max((len(text) - text.index(".") - 1 for text in map(usd, costs) if "." in text), default=2)
    return [f"{x:,.{decimals}f}" for x in costs]


def replay_title(report: Report) -> str:
    """`TRACE on ENV/POOL`, then `, window START:END s` as --window was given (an open END left out)."""
    title = f"{report.trace} on {report.env}/{report.pool}"
    if report.window is None:
        return title
    start, end = (f"{x:.15g}" if math.isfinite(x) else "" for x in report.window)
    return f"{title}, window {start}:{end} s"


def ratio(x: float) -> str:
    """A cost over a bound, or - where the bound is $0 (every item 0 s long): no multiple of it."""
    return f"{x:.2f}" if math.isfinite(x) else "-"


def _span(seconds: float) -> str:
    """A duration as read at a glance: seconds, hours past two, days past two."""
    return f"{seconds / 86400:,.1f} days" if seconds >= 2 * 86400 else f"{seconds / 3600:,.1f} h" if seconds >= 7200 else f"{seconds:,.0f} s"


def too_long_line(too_long: dict) -> str:
    """What `run.split_too_long` left out, and the fix, in one line; "" when nothing was."""
    if not too_long["count"]:
        return ""
    queues = "; ".join(f"{name}: {row['count']:,} over {_span(row['item_timeout_s'])}, the longest {_span(row['longest_s'])}"
                       for name, row in too_long["by_queue"].items())  # fmt: skip
    n = too_long["count"]
    return (f"not replayed: {n:,} item{'s' * (n != 1)} {'run' if n != 1 else 'runs'} longer than {'their' if n != 1 else 'its'} "
            f"queue's item_timeout_s ({queues}); the agent kills an attempt at it, so deployed as configured "
            f"{'each' if n != 1 else 'it'} would fail max_retries + 1 attempts and be dead-lettered ({too_long['attempts']:,} "
            f"attempts, each killed at the timeout: at least ${usd(too_long['attempts_usd'])} of node time): {too_long_fix(too_long)}")


def format_table(report: Report) -> str:
    """A markdown table, one row per policy."""
    head = (
        "| policy | cost $ | ÷ lower bound | ÷ zero-wait bound | node-h | idle node-h | wait p50/p95/p99/max s | makespan h "
        "| interrupted (by scale-in) | redone h | unfinished (dead-lettered) |"
    )
    rows = [head, "|" + "---|" * (head.count("|") - 1)]
    costs = usd_column([r.cost_usd for r in report.results])
    for r, cost in zip(report.results, costs):
        w = r.wait_s
        rows.append(
            f"| {r.policy} | {cost} | {ratio(r.cost_vs_lower_bound)} | {ratio(r.cost_vs_zero_wait)} | {r.node_hours:,.1f} | "
            f"{r.idle_node_hours:,.1f} | {w['p50']:,.0f}/{w['p95']:,.0f}/{w['p99']:,.0f}/{w['max']:,.0f} | "
            f"{r.makespan_s / 3600:,.1f} | {r.items_interrupted:,} ({r.busy_items_killed_by_scale_in:,}) | "
            f"{r.work_redone_s / 3600:,.1f} | {r.items_unfinished:,} ({r.items_dead_lettered:,}) |"
        )
    return "\n".join(rows)
