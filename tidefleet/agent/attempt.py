"""What one finished attempt means: the workload contract as a pure function.

A workload is told to stop (a spot notice, a drain, a cancel) by its stop file and SIGTERM.
Stopping is not success: an attempt that was asked to stop and exits 0 is handed back unless
it declared completion by writing its done file (`tidefleet.agent.checkpoint.complete()`).
README's "Writing a workload" prints this rule as a table; a test reads that table and checks
every row against `outcome`.
"""

from __future__ import annotations

from enum import Enum


class Stop(str, Enum):
    """Why the agent stopped a running attempt (None: it did not)."""

    INTERRUPT = "interrupt"  # spot notice, drain, SIGTERM to the agent: hand the item back
    CANCEL = "cancel"  # the job was cancelled
    TIMEOUT = "timeout"  # the queue's item_timeout_s ran out: SIGKILL
    SUPERSEDED = "superseded"  # another attempt holds the item now (its lease lapsed here)


class Outcome(str, Enum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # counts toward max_retries: retried, or dead-lettered when they run out
    HANDED_BACK = "handed back"  # re-queued as it is; never counts toward max_retries
    CANCELLED = "cancelled"
    DROPPED = "dropped"  # nothing recorded: the attempt that superseded this one records the item


def outcome(stop: Stop | None, exit_code: int, completed: bool) -> Outcome:
    """The recorded outcome of an attempt whose workload exited with `exit_code` (negative: the
    signal that ended it), after the agent asked it to stop for `stop`, with (`completed`) or
    without its done file."""
    if stop is Stop.SUPERSEDED:
        return Outcome.DROPPED
    if stop is Stop.CANCEL:
        return Outcome.CANCELLED
    if exit_code == 0 and (stop is None or completed or stop is Stop.TIMEOUT):
        return Outcome.SUCCEEDED  # a timeout's SIGKILL came too late: it had finished
    if stop is Stop.INTERRUPT:
        return Outcome.HANDED_BACK
    return Outcome.FAILED

