"""Scheduled jobs and dependencies end to end, on the moto server with real agents: the schedule
function's handler and the same fire / watch code driven on a fast clock (a scheduled "day"
passes in a test step). A run runs, the next fire skips while it still goes (or, queued, is held
behind it until it finished), a run past its timeout is cancelled and recorded as timed out; a job
submitted --after another waits for it."""

from __future__ import annotations

import json

import pytest
from agent_harness import Harness, wait_until
from click.testing import CliRunner

from tidefleet.cli import main
from tidefleet.cloud import for_env
from tidefleet.config import load_environment
from tidefleet.jobs import sdk
from tidefleet.triggers import parse, run_jobs

SCHEDULE = """
[schedules.merge]
rate = "1 day"
queue = "work"
items = ["steps=1", ["steps=2"]]
admission = "skip"
timeout_s = 172800  # two days: longer than the period, so a fire can find its previous run going

[schedules.queued]
rate = "1 day"
queue = "work"
items = ["steps=1", ["steps=2"]]
admission = "queue"
"""
DAY = 86400.0
T0 = 1_750_000_000.0 - 1_750_000_000.0 % DAY  # a fire time: midnight UTC


@pytest.fixture
def h(tmp_path, aws):
    harness = Harness(tmp_path, aws)
    harness.env_path.write_text(harness.env_path.read_text() + SCHEDULE)
    harness.env = load_environment(str(harness.env_path))
    yield harness
    harness.stop_agents()


def fire(h, at: float, schedule: str = "merge") -> dict:
    """What EventBridge Scheduler sends at `at`, run as the function runs it, on the test's clock."""
    return run_jobs(parse({"tidefleet": "fire", "schedule": schedule}), h.env, for_env(h.env), at)


def watch(h, at: float) -> dict:
    return run_jobs(parse({"tidefleet": "watch"}), h.env, for_env(h.env), at)


def test_a_scheduled_job_runs_skips_while_its_previous_run_goes_and_times_out(h):
    first = fire(h, T0 + 30)
    assert first["decision"] == "submit merge-20250615t0000"
    assert fire(h, T0 + 40)["decision"] == "submit merge-20250615t0000", "a repeated delivery submits nothing twice"
    assert sdk.status(h.env, "merge-20250615t0000").job.total == 2

    # The run runs: an agent takes its items.
    h.start_agent("node-a")
    wait_until(lambda: sdk.status(h.env, "merge-20250615t0000").done, 60, "the first run to finish")
    h.stop_agents()
    assert watch(h, T0 + 60) == {"trigger": "watch", "env": h.env.name,
                                 "watched": {"merge-20250615t0000": "forget: finished"}}  # fmt: skip

    # The next day's run starts; nobody works on it, so at the third fire it is still going: skipped.
    assert fire(h, T0 + DAY + 5)["decision"] == "submit merge-20250616t0000"
    assert watch(h, T0 + DAY + 60)["watched"] == {"merge-20250616t0000": "keep: running"}
    assert fire(h, T0 + 2 * DAY + 5)["decision"] == "skipped: merge-20250616t0000 still running (admission 'skip')"

    # Its timeout (two days after its fire) passes: the watch cancels it, recorded as timed out.
    cancelled = watch(h, T0 + 3 * DAY)["watched"]
    assert cancelled == {"merge-20250616t0000": "cancel: timed out: past its deadline 2025-06-18 00:00:00 UTC"}
    timed_out = sdk.status(h.env, "merge-20250616t0000")
    assert timed_out.job.cancelled and timed_out.counts["cancelled"] == 2
    assert timed_out.job.cancel_reason == "timed out: past its deadline 2025-06-18 00:00:00 UTC"
    assert {i.reason for i in sdk.status(h.env, "merge-20250616t0000", items=True).items} == {timed_out.job.cancel_reason}
    shown = CliRunner().invoke(main, ["status", "--env", str(h.env_path), "merge-20250616t0000"]).output
    assert "[cancelled job]" in shown and "cancelled: timed out: past its deadline 2025-06-18 00:00:00 UTC" in shown
    assert fire(h, T0 + 3 * DAY + 5)["decision"] == "submit merge-20250618t0000", "nothing is going any more"


def test_a_queued_run_is_held_behind_the_previous_one_and_sent_once_that_finished_however(h):
    store = for_env(h.env).store
    first, second, third = "queued-20250615t0000", "queued-20250616t0000", "queued-20250617t0000"
    assert fire(h, T0 + 5, "queued")["decision"] == f"submit {first}"
    assert h.queue_depth("work") == 2

    # The next fire finds the first run going: its run is recorded, held behind it, nothing sent.
    assert fire(h, T0 + DAY + 5, "queued")["decision"] == f"submit {second}; queued behind {first}"
    held = store.job(second)
    assert (held.waiting, held.after, held.after_finished) == (True, first, True)
    assert h.queue_depth("work") == 2, "the held run's items are recorded, not sent"
    # A third fire queues behind the second, not beside it: one run at a time, in fire order.
    assert fire(h, T0 + 2 * DAY + 5, "queued")["decision"] == f"submit {third}; queued behind {second}"
    assert store.job(third).after == second
    assert watch(h, T0 + 2 * DAY + 60)["watched"] == {
        first: "keep: running", second: f"keep: waiting for {first}", third: f"keep: waiting for {second}"}

    # The first run ends with a failed item: a queued run waits for its predecessor to finish, however.
    one, two = (i.item_id for i in store.items(first))
    store.update_item(first, one, status="succeeded")
    store.update_item(first, two, status="failed", reason="boom")
    assert watch(h, T0 + 2 * DAY + 120)["watched"] == {
        first: "forget: finished", second: f"released 2 item(s): {first} finished",
        third: f"keep: waiting for {second}"}  # fmt: skip
    assert h.queue_depth("work") == 4 and not store.job(second).waiting
    assert store.job(third).waiting, "still behind the second run, which has only just been sent"


def test_the_schedule_function_takes_eventbridge_schedulers_fire_and_ignores_the_rest(h, monkeypatch):
    from lambdas.schedule.handler import handler, runtime

    monkeypatch.setenv("TIDEFLEET_ENV", str(h.env_path))
    runtime.cache_clear()
    try:
        fired = handler({"tidefleet": "fire", "schedule": "merge", "at": "2025-06-15T00:00:07Z"})
        assert fired["decision"] == "submit merge-20250615t0000"
        assert handler({"tidefleet": "fire", "schedule": "nope"})["ignored"].startswith("fire for schedule 'nope'")
        assert "ignored" in handler({"source": "aws.events", "detail-type": "Scheduled Event"})
        assert "ignored" in handler("not an event")
    finally:
        runtime.cache_clear()


def test_a_job_submitted_after_another_waits_for_it_then_runs(h):
    first = sdk.submit(h.env, "prepare", "work", sdk.read_items(["steps=5"]), kick=False).job_id
    then = sdk.submit(h.env, "train", "work", sdk.read_items(["steps=1", "steps=1"]), kick=False, after=first)
    assert (then.total, then.sent) == (2, 0)
    assert h.queue_depth("work") == 1, "only the first job's item is in the queue"
    shown = CliRunner().invoke(main, ["status", "--env", str(h.env_path), then.job_id])
    assert f"waiting for {first} to succeed" in shown.output, shown.output
    assert sdk.status(h.env, then.job_id).sent == 0, "recorded, held: none sent"
    assert watch(h, 0)["watched"] == {then.job_id: f"keep: waiting for {first}"}

    h.start_agent("node-a")
    wait_until(lambda: sdk.status(h.env, first).done, 60, "the first job")
    assert watch(h, 0)["watched"] == {then.job_id: f"released 2 item(s): {first} succeeded"}
    wait_until(lambda: sdk.status(h.env, then.job_id).done, 60, "the dependent job")
    assert watch(h, 0)["watched"] == {then.job_id: "forget: finished"}
    assert watch(h, 0)["watched"] == {}


def test_a_job_after_a_failed_one_is_cancelled_unless_it_runs_after_any_outcome(h):
    failed = sdk.submit(h.env, "bad", "short", sdk.read_items(["exit=3"]), kick=False).job_id
    strict = sdk.submit(h.env, "strict", "work", sdk.read_items(["steps=1"]), kick=False, after=failed).job_id
    lenient = sdk.submit(h.env, "lenient", "work", sdk.read_items(["steps=1"]), kick=False, after=failed,
                         after_finished=True).job_id  # fmt: skip
    h.start_agent("node-a")
    wait_until(lambda: sdk.status(h.env, failed).done, 60, "the failing job")
    decided = watch(h, 0)["watched"]
    assert decided[strict] == f"cancel: {failed} failed; submit with --after-finished to run after any outcome"
    assert decided[lenient] == f"released 1 item(s): {failed} finished"
    assert sdk.status(h.env, strict).counts["cancelled"] == 1
    as_json = json.loads(CliRunner().invoke(main, ["status", "--env", str(h.env_path), "--json", strict]).output)
    assert (as_json["sent"], as_json["waiting_for"]) == (0, None), "never sent, and waiting for nothing once cancelled"
    wait_until(lambda: sdk.status(h.env, lenient).counts["succeeded"] == 1, 60, "the lenient job")


def test_a_submit_after_a_running_job_reads_its_counters_not_its_pools_heartbeats(h, monkeypatch):
    """Whether the parent can still succeed is in its counters: a submit does not read what every
    node of its pool says runs now (1,000 records on a 1,000-node pool)."""
    from tidefleet.cloud.aws.dynamodb import DynamoStore

    parent = sdk.submit(h.env, "running", "work", sdk.read_items(["steps=1", "steps=2"]), kick=False).job_id
    DynamoStore(h.env.name, h.env.region).update_item(parent, "000000", status="succeeded")
    monkeypatch.setattr(DynamoStore, "heartbeats", lambda *_: pytest.fail("read the pool's heartbeats"))
    then = sdk.submit(h.env, "then", "work", sdk.read_items(["steps=1"]), kick=False, after=parent)
    assert (then.total, then.sent) == (1, 0)


def test_after_a_job_that_does_not_exist_is_refused_before_anything_is_written(h):
    with pytest.raises(sdk.JobError, match="after: job 'ghost' not found in environment .*give the id its submit printed"):
        sdk.submit(h.env, "x", "work", sdk.read_items(["a"]), kick=False, after="ghost")
    assert h.queue_depth("work") == 0


def test_the_watch_reads_a_finished_jobs_counters_not_its_items(h, monkeypatch):
    """Every minute's watch looks at each watched job: whether it is done and failed is in its
    record's settled-item counters, so a big job with failures is not read item by item each time."""
    from tidefleet.cloud.aws.dynamodb import DynamoStore
    from tidefleet.jobs.scheduled import view

    store = DynamoStore(h.env.name, h.env.region)
    job_id = sdk.submit(h.env, "big", "work", sdk.read_items(["steps=1", "steps=2"]), kick=False).job_id
    store.update_item(job_id, "000000", status="failed", reason="exit 3")
    store.update_item(job_id, "000001", status="succeeded")
    monkeypatch.setattr(DynamoStore, "items", lambda *_: pytest.fail("read every item of a watched job"))
    seen = view(h.env, for_env(h.env), store.job(job_id))
    assert seen.done and seen.failed


def test_the_watch_reads_no_heartbeats_for_a_job_still_running(h, monkeypatch):
    """Whether a job is done is in its counters: the pool's heartbeats (what runs now) are not read
    for it, every minute, for each watched job."""
    from tidefleet.cloud.aws.dynamodb import DynamoStore
    from tidefleet.jobs.scheduled import view

    store = DynamoStore(h.env.name, h.env.region)
    job_id = sdk.submit(h.env, "running", "work", sdk.read_items(["steps=1", "steps=2"]), kick=False).job_id
    store.update_item(job_id, "000000", status="succeeded")
    monkeypatch.setattr(DynamoStore, "heartbeats", lambda *_: pytest.fail("read the pool's heartbeats"))
    seen = view(h.env, for_env(h.env), store.job(job_id))
    assert not seen.done and not seen.failed


def test_a_watched_job_whose_read_fails_never_stops_the_watch_of_the_others(h, monkeypatch):
    """Its reads were outside the per-job guard: one throttled read ended the pass, the jobs after
    it unwatched for a minute, and the function's run failed."""
    from botocore.exceptions import ClientError

    from tidefleet.cloud.aws.dynamodb import DynamoStore

    first = sdk.submit(h.env, "prepare", "work", sdk.read_items(["steps=5"]), kick=False).job_id
    a = sdk.submit(h.env, "a", "work", sdk.read_items(["steps=1"]), kick=False, after=first).job_id
    b = sdk.submit(h.env, "b", "work", sdk.read_items(["steps=1"]), kick=False, after=first).job_id
    real = DynamoStore.job

    def job(self, job_id):
        if job_id == a:
            raise ClientError({"Error": {"Code": "ThrottlingException", "Message": "Rate exceeded"}}, "GetItem")
        return real(self, job_id)

    monkeypatch.setattr(DynamoStore, "job", job)
    decided = watch(h, 0)["watched"]
    assert decided == {a: "failed: An error occurred (ThrottlingException) when calling the GetItem operation: "
                          "Rate exceeded", b: f"keep: waiting for {first}"}  # fmt: skip
