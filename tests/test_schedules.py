"""The pure decisions of scheduled jobs and dependencies: when a cron fires, what one fire does
(submit, skip, cancel the overdue run) and what the watch does with a waiting or running job."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from tidefleet import schedules
from tidefleet.schedules import (
    SUBMIT_STALLED_S,
    Cron,
    JobView,
    fire,
    fire_time,
    fire_time_for,
    run_id,
    submit_began,
    watch,
)


def at(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


@pytest.mark.parametrize(("cron", "now", "latest"), [
    ("0 3 * * *", "2025-05-10 02:59", "2025-05-09 03:00"),
    ("0 3 * * *", "2025-05-10 03:00", "2025-05-10 03:00"),
    ("*/15 * * * *", "2025-05-10 10:44", "2025-05-10 10:30"),
    ("5/20 8-9 * * *", "2025-05-10 12:00", "2025-05-10 09:45"),
    ("0 0 * * 1", "2025-05-10 12:00", "2025-05-05 00:00"),  # Mondays; the 10th is a Saturday
    ("0 0 * * 7", "2025-05-10 12:00", "2025-05-04 00:00"),  # 7 is Sunday too
    ("0 0 * * 5-7", "2025-05-10 12:00", "2025-05-10 00:00"),  # ...in a range: Friday to Sunday
    ("0 0 * * */7", "2025-05-10 12:00", "2025-05-04 00:00"),  # ...and a step of 7 is Sundays, not step 0
    ("0 0 1 * 1", "2025-05-10 12:00", "2025-05-05 00:00"),  # day of month OR day of week
    ("30 6 29 2 *", "2025-05-10 12:00", "2024-02-29 06:30"),  # leap day, last year
])  # fmt: skip
def test_a_cron_fires_at_its_latest_matching_minute(cron, now, latest):
    assert Cron.parse(cron).latest(at(now) + 12.5) == at(latest)


def test_a_rate_fires_on_whole_periods_and_names_one_run_per_fire():
    fired = fire_time(None, "10 hours", at("2025-05-10 12:34") + 7)
    assert fired == at("2025-05-10 08:00")  # 48524 whole periods of 10 h since the epoch
    assert run_id("merge", fired) == "merge-20250510t0800"


@pytest.mark.parametrize(("said", "fired"), [
    (None, "2025-05-10 12:00"),  # no fire time sent (Cloud Scheduler): the fire's own
    ("2025-05-10 10:59", "2025-05-10 10:00"),  # delivered late (a retry): the time it was sent for
    ("2025-05-10 13:00", "2025-05-10 13:00"),  # ahead by under a minute: clocks' skew
    ("2025-05-10 15:00", "2025-05-10 12:00"),  # hours ahead: no scheduler's
    ("9998-05-10 12:00", "2025-05-10 12:00"),  # a typo of a year, in the range a run id can hold
])  # fmt: skip
def test_a_fire_time_after_the_fire_runs_is_replaced_by_the_time_it_runs(said, fired):
    now = at("2025-05-10 12:59") + 30
    assert fire_time_for(None, "1 hour", said=at(said) if said else None, now=now) == at(fired)


def view(job_id: str, **kw) -> JobView:
    return JobView(job_id, **{"done": False, "failed": False, "cancelled": False, **kw})


T = at("2025-05-10 10:00")


@pytest.mark.parametrize(("case", "admission", "runs", "submit", "cancelled", "reason"), [
    ("first run", "skip", [], "m-20250510t1000", [], "submit m-20250510t1000"),
    ("previous still going, skip", "skip", [view("m-1", deadline=T + 60)], None, [], "skipped: m-1 still running"),
    ("previous still going, queue", "queue", [view("m-1")], "m-20250510t1000", [], "queued behind m-1"),
    ("previous finished", "skip", [view("m-1", done=True)], "m-20250510t1000", [], "submit"),
    ("previous overdue: cancelled, then run", "skip", [view("m-1", deadline=T - 1)], "m-20250510t1000", ["m-1"], "submit"),
    ("a retried delivery of the same fire", "skip", [view("m-20250510t1000")], "m-20250510t1000", [], "submit"),
])  # fmt: skip
def test_one_fire_submits_skips_or_cancels_the_overdue_run(case, admission, runs, submit, cancelled, reason):
    decided = fire("m", admission=admission, timeout_s=3600, fired_at=T, now=T + 5, runs=runs)
    assert decided.submit == submit
    assert [c.job_id for c in decided.cancel] == cancelled
    assert reason in decided.reason
    assert decided.deadline == (T + 3600 if submit else 0.0)
    assert all("timed out" in c.reason for c in decided.cancel)


@pytest.mark.parametrize(("case", "job", "parent", "action", "reason"), [
    ("parent still running", view("b", waiting=True, after="a"), view("a"), "keep", "waiting for a"),
    ("parent succeeded", view("b", waiting=True, after="a"), view("a", done=True), "release", "a succeeded"),
    ("parent failed", view("b", waiting=True, after="a"), view("a", done=True, failed=True), "cancel", "a failed"),
    ("parent failed, after finished", view("b", waiting=True, after="a", after_finished=True),
     view("a", done=True, failed=True), "release", "a finished"),
    ("parent cancelled", view("b", waiting=True, after="a"), view("a", cancelled=True), "cancel", "was cancelled"),
    ("parent gone", view("b", waiting=True, after="a"), None, "cancel", "does not exist"),
    ("still being recorded", view("b", waiting=True, after="a", submitting=True), view("a", done=True), "keep", "recorded"),
    ("run past its deadline", view("r", schedule="m", deadline=T - 1), None, "cancel", "timed out"),
    ("run before its deadline", view("r", schedule="m", deadline=T + 1), None, "keep", "running"),
    ("run without a deadline", view("r", schedule="m"), None, "keep", "running"),
    ("run finished", view("r", schedule="m", deadline=T - 1, done=True), None, "forget", "finished"),
    ("released, no deadline", view("b", after="a"), view("a", done=True), "forget", "running"),
])  # fmt: skip
def test_the_watch_releases_waits_cancels_or_forgets(case, job, parent, action, reason):
    decided = watch(job, now=T, parent=parent)
    assert (decided.action, reason in decided.reason) == (action, True), decided


def test_a_queued_run_is_held_behind_the_latest_run_still_going():
    runs = [view("m-20250510t0800", done=True), view("m-20250510t0900", waiting=True, after="m-20250510t0800"),
            view("m-20250510t0830")]  # fmt: skip
    decided = fire("m", admission="queue", timeout_s=None, fired_at=T, now=T + 5, runs=runs)
    assert (decided.submit, decided.after) == ("m-20250510t1000", "m-20250510t0900")
    assert decided.reason == "submit m-20250510t1000; queued behind m-20250510t0900"
    assert fire("m", admission="queue", timeout_s=None, fired_at=T, now=T + 5, runs=runs[:1]).after == ""


# A scheduled run whose submit stopped part-way (an error after its job record was written): fired
# at T - 1 h, recorded then, still `submitting`.
STUCK = {"schedule": "m", "submitting": True, "created_at": T - 3600}


@pytest.mark.parametrize(("case", "job", "now", "action", "reason"), [
    ("its submit may still be going", view("m-20250510t0900", **STUCK), T - 3600 + 60, "keep", "still being recorded"),
    ("stopped part-way: continued", view("m-20250510t0900", **STUCK), T, "resume", "its submit stopped part-way"),
    ("stopped part-way, past its deadline", view("m-20250510t0900", **STUCK, deadline=T - 1), T, "cancel", "timed out"),
    ("being recorded, past its deadline: its submit goes on",
     view("m-20250510t0900", **{**STUCK, "created_at": T - 30}, deadline=T - 1), T, "keep", "still being recorded"),
    # A record written on another clock than the watch's (a test's, a sandbox's): its fire time counts.
    ("record ahead of the clock, fired long ago", view("m-20250510t0900", **{**STUCK, "created_at": T + 86400}), T,
     "resume", "stopped part-way"),
    ("record ahead of the clock, fired just now", view("m-20250510t1000", **{**STUCK, "created_at": T + 86400}),
     T + 60, "keep", "still being recorded"),
    ("a submit --after of a user's: theirs to re-run", view("b", submitting=True, waiting=True, after="a"), T + 86400,
     "keep", "still being recorded"),
])  # fmt: skip
def test_the_watch_continues_a_scheduled_run_whose_submit_stopped_part_way(case, job, now, action, reason):
    decided = watch(job, now=now, parent=view("a"))
    assert (decided.action, reason in decided.reason) == (action, True), decided


def test_a_run_is_called_stopped_part_way_only_past_any_submits_time():
    job = view("m-20250510t0900", **STUCK)
    assert watch(job, now=job.created_at + SUBMIT_STALLED_S - 1, parent=None).action == "keep"
    assert watch(job, now=job.created_at + SUBMIT_STALLED_S, parent=None).action == "resume"


def test_a_continuation_that_began_holds_off_the_next_for_as_long_as_a_submit_could_go():
    """A continuation of a stopped submit claims the run (`resumed_at`, `claim_resume`): another
    only once it too may have stopped, as for the first submit."""
    job = view("m-20250510t0900", **STUCK, resumed_at=T)
    assert submit_began(job, T + 60) == T, "the later of the record's time and its continuation's"
    assert watch(job, now=T + SUBMIT_STALLED_S - 1, parent=None).action == "keep"
    assert watch(job, now=T + SUBMIT_STALLED_S, parent=None).action == "resume"
    fired_ahead = view("m-20250510t0900", **{**STUCK, "created_at": T + 86400}, resumed_at=T)
    assert submit_began(fired_ahead, T + 60) == T, "a record ahead of the clock: its fire time, or a later continuation"


@pytest.mark.parametrize(
    "cron, rate, after_slot, stale",
    [
        ("0 2 * * *", None, 5, False),  # published seconds after its slot
        ("0 2 * * *", None, schedules.STALE_FIRE_S - 1, False),  # the scheduler's own retries
        ("0 2 * * *", None, 3600, True),  # 03:00: no slot of "0 2 * * *"
        (None, "5 minutes", 299, False),  # a rate's slot is never further back than its period
        (None, "1 hour", 1800, True),
    ],
)
def test_a_fire_whose_time_is_no_slot_of_the_schedule_is_stale(cron, rate, after_slot, stale):
    slot = 1_800_000_000 - 1_800_000_000 % 86400 + 2 * 3600
    assert schedules.stale_fire(cron, rate, said=slot + after_slot, now=slot + 7200) is stale
    assert not schedules.stale_fire(cron, rate, said=None, now=slot + after_slot), "no time said: the fire's run time"
