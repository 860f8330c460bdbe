"""One attempt of one item as a pure state machine: event -> what to signal, record, hand back.

A workload is told to stop (a spot notice, a drain, a cancel) by its stop file and SIGTERM.
Stopping is not success: an attempt that was asked to stop and exits 0 is handed back unless
it declared completion by writing its done file (`tidefleet.agent.checkpoint.complete()`).
README's "Writing a workload" prints this rule (`outcome`) as a table; a test reads that table
and checks every row against `outcome`.

`Attempt.on(event)` is the whole life of one attempt: no I/O, no clock (events carry the time).
The agent (`worker.py`) feeds it events from the runner thread, the heartbeat, the item timer and
the drain, under one lock, and carries out the decisions. Whatever order the events come in,
an attempt decides exactly one `Record` (its outcome) once its workload has exited and, if the
drain asked it to stop, the drain's grace is over (tests/test_attempt_machine.py, hypothesis).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tidefleet.jobs.sdk import ItemMessage

RUNNER_FAILED = 127  # the exit code recorded when the agent could not run the workload (as a shell's)


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


# -- events ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Started:
    """The workload's process exists: a stop asked before is signalled again, now that it reaches it."""


@dataclass(frozen=True)
class StopAsked:
    why: Stop
    at: float  # monotonic seconds


@dataclass(frozen=True)
class Tick:
    """A heartbeat: a cancelled workload past its grace is killed."""

    at: float


@dataclass(frozen=True)
class Exited:
    code: int  # negative: the signal that ended it
    completed: bool  # its done file exists
    last_line: str = ""
    # When its own process was seen to have exited (monotonic), if known: a stop asked after that,
    # while what it left in its group was still being stopped, does not decide its outcome.
    exited_at: float | None = None


@dataclass(frozen=True)
class Crashed:
    """The runner itself raised (the workload could not start, or reading it failed)."""

    error: str
    completed: bool = False


@dataclass(frozen=True)
class GraceOver:
    """The drain's grace ran out: what has not ended is handed back now."""


Event = Started | StopAsked | Tick | Exited | Crashed | GraceOver


# -- decisions ------------------------------------------------------------------------------
class Signal(str, Enum):
    STOP = "stop file + SIGTERM"  # checkpoint and leave
    KILL = "SIGKILL"  # the process group, now


@dataclass(frozen=True)
class Record:
    """The attempt's one outcome. HANDED_BACK goes into the drain's batch; DROPPED writes nothing."""

    outcome: Outcome
    reason: str = ""
    exit_code: int | None = None


@dataclass(frozen=True)
class LateSuccess:
    """It finished (declared complete) after it was handed back: mark the item succeeded, so the
    handed-back copy is dropped wherever it is received instead of running to success again."""


Decision = Signal | Record | LateSuccess


@dataclass
class Attempt:
    """The state of one attempt; `on(event)` moves it and says what to do."""

    timeout_s: int  # the queue's item_timeout_s, for the reason of a timeout
    cancel_grace_s: float  # a cancelled workload's time to leave before SIGKILL
    stop: Stop | None = None  # the first reason it was asked to stop; later ones change nothing
    stop_at: float | None = None  # when (monotonic)
    started: bool = False
    exited: bool = False  # interrupted and gone: waiting for the drain to hand it back
    result: Outcome | None = None  # decided: nothing moves it any more (but a late success)
    kill_at: float | None = None

    @property
    def running(self) -> bool:
        """Neither ended nor handed back: the drain waits for these."""
        return self.result is None and not self.exited

    def on(self, event: Event) -> tuple[Decision, ...]:
        if isinstance(event, Exited | Crashed):
            return self._ended(event)
        if self.result is not None:  # decided; a process that starts after its hand-back must not run on
            return (Signal.KILL,) if isinstance(event, Started) and self.result is Outcome.HANDED_BACK else ()
        if self.exited:  # gone after the drain asked it to stop: the drain's end hands it back
            return self._handed_back() if isinstance(event, GraceOver) else ()
        if isinstance(event, Started):
            self.started = True
            return self._signal()
        if isinstance(event, StopAsked):
            if self.stop is not None:
                return ()
            self.stop, self.stop_at = event.why, event.at
            if event.why is Stop.CANCEL:
                self.kill_at = event.at + self.cancel_grace_s
            return self._signal()
        if isinstance(event, Tick):
            if self.kill_at is not None and event.at >= self.kill_at and self.started:
                self.kill_at = None
                return (Signal.KILL,)
            return ()
        # GraceOver while it runs: SIGKILL and hand back, unless another attempt holds the item
        # (then its own runner records nothing once the SIGKILL it got lands).
        if self.stop is Stop.SUPERSEDED:
            return ()
        return (Signal.KILL, *self._handed_back())

    def _signal(self) -> tuple[Decision, ...]:
        """The signal of the stop asked (also before the process exists: the stop file is made
        then, and `Started` signals it again)."""
        if self.stop is None:
            return ()
        return (Signal.STOP,) if self.stop in (Stop.INTERRUPT, Stop.CANCEL) else (Signal.KILL,)

    def _handed_back(self) -> tuple[Decision, ...]:
        self.result = Outcome.HANDED_BACK
        return (Record(Outcome.HANDED_BACK),)

    def _ended(self, event: Exited | Crashed) -> tuple[Decision, ...]:
        crashed = isinstance(event, Crashed)
        code = RUNNER_FAILED if crashed else event.code
        stop = self.stop
        if not crashed and event.exited_at is not None and self.stop_at is not None and event.exited_at < self.stop_at:
            stop = None  # it had ended on its own: its exit code and done file say how
        result = outcome(stop, code, event.completed)
        kill = (Signal.KILL,) if crashed else ()  # whatever it left running
        if self.result is Outcome.HANDED_BACK:
            return (*kill, LateSuccess()) if result is Outcome.SUCCEEDED and not self.exited else kill
        if self.result is not None or self.exited:
            return kill
        if result is Outcome.HANDED_BACK:  # the drain hands it back with the rest
            self.exited = True
            return kill
        self.result = result
        if result is Outcome.FAILED:
            last = event.error if crashed else event.last_line
            if stop is Stop.TIMEOUT:
                reason = f"timed out after {self.timeout_s}s"
            else:
                reason = f"exit code {code}" + (f"; last output: {last[:300]}" if last else "")
            return (*kill, Record(result, reason, code))
        return (*kill, Record(result, "job cancelled" if result is Outcome.CANCELLED else "", code))


# -- what a failure or a hand-back sends ----------------------------------------------------
@dataclass(frozen=True)
class Retry:
    """The message that carries the item on after a failed (or lost) attempt, and where it goes."""

    message: ItemMessage  # counts updated, seq + 1
    dead_letter: bool  # its failures (or node losses) ran out
    reason: str  # with what was spent, when dead-lettered

    @property
    def status(self) -> str:
        return "failed" if self.dead_letter else "queued"


def after_failure(msg: ItemMessage, reason: str, *, max_retries: int, losses_tolerated: int,
                  lost: bool = False) -> Retry:  # fmt: skip
    """Retry the item, or dead-letter it once its failures (or its node losses) run out. A lost
    node is not the item's failure: it spends its own budget."""
    failures, losses = msg.failures + (not lost), msg.lost + lost
    final = failures > max_retries or losses > losses_tolerated
    if final:
        spent = (f"its node was lost {losses} times; {losses_tolerated} tolerated" if lost
                 else f"{failures} failed attempt(s); max_retries = {max_retries}")
        reason = f"{reason} (gave up after {spent})"
    return Retry(replace(msg, failures=failures, lost=losses, seq=msg.seq + 1, copy=""), final, reason)


def handed_back(msg: ItemMessage, *, interrupted: bool, preempted: bool = False) -> ItemMessage:
    """The message that hands an item back: an interruption is counted (and is a new message, seq
    + 1); one the scaler's preempt mark stopped (a preemption, a checkpoint-and-move: the policy's
    choice, not spot's) is a new message with its counts as they were, so that
    `on_demand_after_interruptions` counts spot reclaims and drains only; a message received while
    stopping, never started, goes back as it was."""
    if not interrupted:
        return msg
    return replace(msg, interruptions=msg.interruptions + (not preempted), seq=msg.seq + 1, copy="")
