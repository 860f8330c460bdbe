"""The sandbox's live view and summary, drawn with rich."""

from __future__ import annotations

import time
from collections import Counter

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from tidefleet.jobs import sdk
from tidefleet.sandbox.launcher import LocalNode


def node_label(node: LocalNode, busy: dict[str, int]) -> str:
    """booting / busy / idle / terminating, the words a user watches change."""
    if node.state == "up" and node.instance_id in busy:
        return "busy" if busy[node.instance_id] else "idle"
    return {"up": "starting agent"}.get(node.state, node.state)


PLAIN_EVERY_S = 2.0  # at most one plain progress line this often


class Screen:
    """The live view on a terminal. Anywhere else (a pipe, a CI log, a file) redrawing in place
    would leave cursor codes and repeated frames, so it prints one plain line whenever the
    progress changes, at most every PLAIN_EVERY_S."""

    def __init__(self, console: Console):
        self.console = console
        redraw = console.is_terminal and not console.is_dumb_terminal
        self.live = Live(console=console, refresh_per_second=4, transient=False) if redraw else None
        if self.live is not None:
            self.live.start()
        self.said, self.said_at = "", 0.0

    def show(self, **fields) -> None:
        if self.live is not None:
            self.live.update(live(**fields))
            return
        line, now = plain(**fields), time.monotonic()
        if line != self.said and now - self.said_at >= PLAIN_EVERY_S:
            elapsed = time.time() - fields["started"]
            self.console.print(f"{elapsed:5.0f}s  {line}", markup=False, highlight=False, soft_wrap=True)
            self.said, self.said_at = line, now

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()


def plain(*, status: sdk.JobStatus, queues: dict[str, tuple[int, int, int]], nodes: list[LocalNode],
          busy: dict[str, int], **_) -> str:  # fmt: skip
    """The live view's numbers on one line."""
    done = status.counts["succeeded"] + status.counts["failed"] + status.counts["cancelled"]
    live_nodes = [n for n in nodes if n.state != "gone"]
    by_state = Counter(node_label(n, busy) for n in live_nodes)
    waiting = sum(visible for visible, _, _ in queues.values())
    return (f"{done}/{status.job.total} final ({status.counts['failed']} failed)  waiting {waiting}  "
            f"nodes {len(live_nodes)}" + "".join(f", {c} {state}" for state, c in sorted(by_state.items())))


def live(
    *,
    env_name: str,
    started: float,
    status: sdk.JobStatus,
    queues: dict[str, tuple[int, int, int]],
    nodes: list[LocalNode],
    busy: dict[str, int],
    reasons: list[str],
    tick_error: str,
) -> Panel:
    done = status.counts["succeeded"] + status.counts["failed"] + status.counts["cancelled"]
    total = status.job.total
    counts = "  ".join(f"{k} {v}" for k, v in status.counts.items())
    bar = Table.grid(padding=(0, 1))
    bar.add_row(ProgressBar(total=max(total, 1), completed=done, width=40), f"{done}/{total}", counts)

    queue_table = Table("queue", "waiting", "in flight", "dead-lettered", box=None, pad_edge=False)
    for name, (visible, in_flight, dead) in queues.items():
        queue_table.add_row(name, str(visible), str(in_flight), str(dead))

    live_nodes = [n for n in nodes if n.state != "gone"]
    by_state = Counter(node_label(n, busy) for n in live_nodes)
    node_line = "  ".join(f"{state} {count}" for state, count in sorted(by_state.items())) or "none"
    node_table = Table("node", "pool", "type", "state", "busy slots", box=None, pad_edge=False)
    for n in sorted(live_nodes, key=lambda n: n.seen_at):
        node_table.add_row(
            n.instance_id, n.pool, n.instance_type, node_label(n, busy), str(busy.get(n.instance_id, "-"))
        )

    # What the scaler and workloads say is data, never markup: torch prints "[rank0]:", a path may hold "[/x]".
    scaler = [Text(f"scaler error: {tick_error}", style="red")] if tick_error else []
    scaler += [Text(r, style="dim") for r in reasons[-3:]]
    return Panel(
        Group(
            bar,
            "",
            queue_table,
            "",
            f"nodes: {len(live_nodes)} ({node_line})",
            node_table,
            "",
            *scaler,
        ),
        title=Text(f"tidefleet sandbox · env {env_name} · job {status.job.job_id} · {time.time() - started:.0f}s"),
    )


def summary_table(summary) -> Table:
    table = Table("", "", box=None, show_header=False, pad_edge=False)
    rows = [
        ("items", summary.items),
        ("succeeded", summary.succeeded),
        ("failed by design" if summary.demo_workload else "failed (the workload's reasons below)", len(summary.failed)),
        ("failed unexpectedly", len(summary.failed_unexpectedly)),
        ("unaccounted", len(summary.unaccounted)),
        (
            "ran to success twice",
            f"{len(summary.duplicate_successes)}"
            + (
                ""
                if not summary.duplicate_successes
                else " (each after its node was SIGKILLed)"
                if summary.duplicates_explained
                else " [red](NOT explained by a killed node)[/red]"
            ),
        ),
        ("items needing a second attempt", summary.redelivered),
        ("attempts handed back on a notice", summary.interruptions),
        ("attempts resumed from a checkpoint", summary.resumed),
        ("peak nodes", summary.peak_nodes),
        ("node-seconds", summary.node_seconds),
        ("submit -> first item started", _seconds(summary.submit_to_first_start_s)),
        ("last item finished -> zero nodes", _seconds(summary.last_finish_to_zero_s)),
        ("items/s (submit -> last item)", summary.items_per_s if summary.items_per_s is not None else "-"),
        ("chaos: SIGKILLs / notices / dup. messages",
         f"{summary.nodes_killed} / {summary.spot_notices} / {summary.duplicate_messages}"),
        ("fleet back at zero", "yes" if summary.fleet_at_zero else "[red]no[/red]"),
        ("time limit (--time-limit) hit", "[red]YES: the run was cut short[/red]" if summary.time_limit_hit else "no"),
        ("wall time", _seconds(summary.wall_s)),
        ("node logs, scaler log", Text(str(summary.workdir))),
    ]
    for key, value in rows:
        table.add_row(f"[bold]{key}[/bold]", value if isinstance(value, Text) else str(value))
    for item, reason in sorted(summary.failed.items()):
        table.add_row(Text(f"  {item}"), Text(reason))
    for item, reason in sorted(summary.failed_unexpectedly.items()):
        table.add_row(Text(f"  {item}", style="red"), Text(reason))
    for item, state in sorted(summary.unaccounted.items()):
        table.add_row(Text(f"  {item}", style="red"), Text(f"unaccounted: {state}"))
    for note in summary.notes:
        table.add_row("[red]note[/red]", Text(note))
    return table


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}s"
