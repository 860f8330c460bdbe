"""A simulation report in words, alike wherever it is shown (`tidefleet simulate`'s table, its plot):
a column of dollars to one precision, and which replay it was."""

from __future__ import annotations

import math

from tidefleet.costs import usd
from tidefleet.sim.run import Report


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
