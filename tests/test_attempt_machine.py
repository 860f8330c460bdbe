"""One attempt's state machine (`tidefleet.agent.attempt`): event sequences -> decisions, and the
property that every way an attempt can end records exactly one outcome."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidefleet.agent.attempt import (
    Attempt,
    Crashed,
    Exited,
    GraceOver,
    LateSuccess,
    Outcome,
    Record,
    Signal,
    Started,
    Stop,
    StopAsked,
    Tick,
    after_failure,
    handed_back,
    outcome,
)
from tidefleet.jobs.sdk import ItemMessage

GO, GRACE_OVER = Started(), GraceOver()
STOP, KILL, LATE = Signal.STOP, Signal.KILL, LateSuccess()
HANDED_BACK = Record(Outcome.HANDED_BACK)


def ask(why: Stop, at: float = 0.0) -> StopAsked:
    return StopAsked(why, at)


def decisions(*events) -> list:
    state = Attempt(timeout_s=60, cancel_grace_s=10)
    return [d for event in events for d in state.on(event)]


CASES = [
    ("a workload that exits 0 succeeds",
     [GO, Exited(0, False)], [Record(Outcome.SUCCEEDED, "", 0)]),
    ("a failing workload fails with its exit code and last line",
     [GO, Exited(3, False, "not yet")], [Record(Outcome.FAILED, "exit code 3; last output: not yet", 3)]),
    ("a failure without output names the exit code alone",
     [GO, Exited(1, False)], [Record(Outcome.FAILED, "exit code 1", 1)]),
    ("a timeout kills it and fails it as timed out",
     [GO, ask(Stop.TIMEOUT), Exited(-9, False)], [KILL, Record(Outcome.FAILED, "timed out after 60s", -9)]),
    ("a timeout's kill that came after it exited 0 changes nothing",
     [GO, ask(Stop.TIMEOUT), Exited(0, False)], [KILL, Record(Outcome.SUCCEEDED, "", 0)]),
    ("a cancel asks it to stop and kills it once, after the cancel grace",
     [GO, ask(Stop.CANCEL, 100), Tick(105), Tick(110), Tick(111), Exited(-9, False)],
     [STOP, KILL, Record(Outcome.CANCELLED, "job cancelled", -9)]),
    ("a cancelled workload that leaves in time is not killed",
     [GO, ask(Stop.CANCEL, 100), Exited(0, False), Tick(200)], [STOP, Record(Outcome.CANCELLED, "job cancelled", 0)]),
    ("a drain asks it to stop; its checkpointed exit is handed back when the grace is over",
     [GO, ask(Stop.INTERRUPT), Exited(75, False), GRACE_OVER], [STOP, HANDED_BACK]),
    ("stopping midway and exiting 0 is handed back, not success",
     [GO, ask(Stop.INTERRUPT), Exited(0, False), GRACE_OVER], [STOP, HANDED_BACK]),
    ("an interrupted workload that declared completion succeeds, and the grace changes nothing",
     [GO, ask(Stop.INTERRUPT), Exited(0, True), GRACE_OVER], [STOP, Record(Outcome.SUCCEEDED, "", 0)]),
    ("a workload still running when the grace is over is killed and handed back",
     [GO, ask(Stop.INTERRUPT), GRACE_OVER, Exited(-9, False)], [STOP, KILL, HANDED_BACK]),
    ("one that declares completion after its hand-back is marked succeeded late",
     [GO, ask(Stop.INTERRUPT), GRACE_OVER, Exited(0, True)], [STOP, KILL, HANDED_BACK, LATE]),
    ("a superseded attempt is killed and records nothing, through a drain too",
     [GO, ask(Stop.SUPERSEDED), ask(Stop.INTERRUPT), GRACE_OVER, Exited(-9, False)],
     [KILL, Record(Outcome.DROPPED, "", -9)]),
    ("the first reason to stop wins",
     [GO, ask(Stop.CANCEL), ask(Stop.TIMEOUT), ask(Stop.SUPERSEDED), ask(Stop.INTERRUPT), Exited(0, False)],
     [STOP, Record(Outcome.CANCELLED, "job cancelled", 0)]),
    ("a stop asked before the process exists makes the stop file and is signalled once it does",
     [ask(Stop.CANCEL, 0), Tick(20), GO, Tick(21)], [STOP, STOP, KILL]),
    ("a process that starts after its hand-back is killed at once",
     [ask(Stop.INTERRUPT), GRACE_OVER, GO], [STOP, KILL, HANDED_BACK, KILL]),
    ("a runner that crashes kills what is left and fails the item with why",
     [GO, Crashed("tidefleet: could not run the item: KeyError: 'x'")],
     [KILL, Record(Outcome.FAILED, "exit code 127; last output: tidefleet: could not run the item: KeyError: 'x'", 127)]),
    ("a runner that crashes during a drain leaves the item to the hand-back",
     [GO, ask(Stop.INTERRUPT), Crashed("boom"), GRACE_OVER], [STOP, KILL, HANDED_BACK]),
    ("nothing after the outcome moves it",
     [GO, Exited(0, False), ask(Stop.CANCEL), Tick(99), GRACE_OVER, Exited(1, False)],
     [Record(Outcome.SUCCEEDED, "", 0)]),
]  # fmt: skip


@pytest.mark.parametrize(("case", "events", "expected"), CASES, ids=[c[0] for c in CASES])
def test_an_attempt_decides(case, events, expected):
    assert decisions(*events) == expected


def test_the_drain_waits_only_for_attempts_still_running():
    state = Attempt(timeout_s=60, cancel_grace_s=10)
    for event, running in [(GO, True), (ask(Stop.INTERRUPT), True), (Exited(0, False), False),
                           (GRACE_OVER, False)]:  # fmt: skip
        state.on(event)
        assert state.running is running, event


# -- every exit path records exactly one outcome --------------------------------------------
ENDS = st.one_of(
    st.builds(Exited, st.sampled_from([0, 1, 75, -9, -15]), st.booleans(), st.sampled_from(["", "last"])),
    st.builds(Crashed, st.just("tidefleet: boom"), st.booleans()),
)
EVENTS = st.one_of(
    st.just(GO), st.just(GRACE_OVER),
    st.builds(StopAsked, st.sampled_from(list(Stop)), st.floats(0, 100)),
    st.builds(Tick, st.floats(0, 200)),
)  # fmt: skip
EXAMPLES = settings(deadline=None)


@st.composite
def lives(draw):
    """Events in any order, the workload's one end among them."""
    events = draw(st.lists(EVENTS, max_size=8))
    events.insert(draw(st.integers(0, len(events))), draw(ENDS))
    return events


def records(events) -> list[Record]:
    return [d for d in decisions(*events) if isinstance(d, Record)]


@EXAMPLES
@given(lives())
def test_once_the_workload_ended_and_the_drain_is_over_exactly_one_outcome_is_recorded(events):
    assert len(records([*events, GRACE_OVER])) == 1


@EXAMPLES
@given(lives())
def test_an_attempt_never_records_twice_and_only_a_drain_makes_it_wait(events):
    state = Attempt(timeout_s=60, cancel_grace_s=10)
    got = [d for e in events for d in state.on(e) if isinstance(d, Record)]
    assert len(got) <= 1
    assert len(got) == 1 or (state.stop is Stop.INTERRUPT and state.exited), "ended, not waiting for a drain"


@EXAMPLES
@given(lives())
def test_an_attempt_asked_to_stop_succeeds_only_if_it_declared_completion(events):
    state = Attempt(timeout_s=60, cancel_grace_s=10)
    for event in [*events, GRACE_OVER]:
        stop_before = state.stop
        succeeded = [d for d in state.on(event) if d == LATE or d == Record(Outcome.SUCCEEDED, "", 0)]
        if succeeded:
            assert isinstance(event, Exited) and event.code == 0, event
            assert stop_before in (None, Stop.TIMEOUT) or event.completed, (stop_before, event)


@EXAMPLES
@given(lives())
def test_a_superseded_attempt_is_killed_and_records_nothing(events):
    state = Attempt(timeout_s=60, cancel_grace_s=10)
    got = [d for e in [*events, GRACE_OVER] for d in state.on(e)]
    if state.stop is Stop.SUPERSEDED:
        assert KILL in got and [d.outcome for d in got if isinstance(d, Record)] == [Outcome.DROPPED]


def test_the_state_machine_agrees_with_the_contract_table():
    """The README's table is `outcome`; the machine records what it says for every stop and end."""
    for stop in [None, *Stop]:
        for code in (0, 1, -9):
            for completed in (False, True):
                asked = [ask(stop)] if stop else []
                (record,) = records([GO, *asked, Exited(code, completed), GRACE_OVER])
                assert record.outcome is outcome(stop, code, completed), (stop, code, completed)


# -- what a failure and a hand-back send ----------------------------------------------------
MSG = ItemMessage("job-1", "000007", ["x"], failures=1, interruptions=2, lost=0, seq=4)
FAILURES = [
    ("a failure within max_retries is retried", {"max_retries": 2}, (2, 0, 5, False, "exit code 3")),
    ("the failure past max_retries is dead-lettered", {"max_retries": 1},
     (2, 0, 5, True, "exit code 3 (gave up after 2 failed attempt(s); max_retries = 1)")),
    ("a lost node spends no retry", {"max_retries": 1, "lost": True}, (1, 1, 5, False, "exit code 3")),
    ("losses past the tolerated are dead-lettered", {"max_retries": 9, "lost": True, "losses_tolerated": 0},
     (1, 1, 5, True, "exit code 3 (gave up after its node was lost 1 times; 0 tolerated)")),
]  # fmt: skip


@pytest.mark.parametrize(("case", "options", "expected"), FAILURES, ids=[f[0] for f in FAILURES])
def test_after_a_failure_the_item_is(case, options, expected):
    options = {"losses_tolerated": 3, **options}
    retry = after_failure(MSG, "exit code 3", **options)
    failures, lost, seq, dead_letter, reason = expected
    assert (retry.message.failures, retry.message.lost, retry.message.seq) == (failures, lost, seq)
    assert (retry.dead_letter, retry.reason, retry.status) == (dead_letter, reason, "failed" if dead_letter else "queued")
    assert retry.message.interruptions == MSG.interruptions


def test_a_hand_back_counts_an_interruption_and_a_message_never_started_goes_back_as_it_was():
    back = handed_back(MSG, interrupted=True)
    assert (back.interruptions, back.seq, back.failures) == (3, 5, 1)
    assert handed_back(MSG, interrupted=False) == MSG


def test_a_hand_back_the_scalers_mark_asked_for_counts_no_interruption():
    """A preemption or a checkpoint-and-move is the policy's choice, not spot's: it goes back as a
    new message (seq + 1) with its counts as they were, so on_demand_after_interruptions counts only
    spot reclaims and drains."""
    back = handed_back(MSG, interrupted=True, preempted=True)
    assert (back.interruptions, back.seq, back.failures, back.copy) == (2, 5, 1, "")
