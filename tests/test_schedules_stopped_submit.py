"""A scheduled run whose submit stopped part-way (an error after its job record was written: a
throttled send, a function cut off) must not hold its schedule: on the moto server, the fire's
SQS send made to throw once. The watch (or the next fire) continues the run's submit from the
schedule once no submit can still be going, and the schedule goes on; a run that cannot be
continued (its schedule's items changed since) is cancelled, saying why."""

from __future__ import annotations

import sys

import pytest
from agent_harness import Harness
from botocore.exceptions import ClientError

from tidefleet.cloud import for_env
from tidefleet.cloud.aws.dynamodb import DynamoStore
from tidefleet.cloud.aws.sqs import SqsWorkQueues
from tidefleet.config import load_environment
from tidefleet.jobs import scheduled, sdk
from tidefleet.schedules import SUBMIT_STALLED_S
from tidefleet.triggers import parse, run_jobs

SCHEDULE = """
[schedules.nightly]
rate = "1 day"
queue = "work"
items = ["steps=1", ["steps=2"]]
admission = "{admission}"
"""
DAY = 86400.0
T0 = 1_750_000_000.0 - 1_750_000_000.0 % DAY  # a fire time: midnight UTC (2025-06-15)
RUN, NEXT = "nightly-20250615t0000", "nightly-20250616t0000"
LATER = T0 + 30 + SUBMIT_STALLED_S  # past any submit's time: none is still going


def harness(tmp_path, aws, admission: str = "skip") -> Harness:
    h = Harness(tmp_path, aws)
    h.env_path.write_text(h.env_path.read_text() + SCHEDULE.format(admission=admission))
    h.env = load_environment(str(h.env_path))
    return h


def fire(h, at: float) -> dict:
    return run_jobs(parse({"tidefleet": "fire", "schedule": "nightly"}), h.env, for_env(h.env), at)


def watch(h, at: float) -> dict:
    return run_jobs(parse({"tidefleet": "watch"}), h.env, for_env(h.env), at)["watched"]


def throttled(self, queue, bodies, **kwargs):
    if not bodies:  # nothing to send makes no call
        return []
    raise ClientError({"Error": {"Code": "ThrottlingException", "Message": "Rate exceeded"}}, "SendMessageBatch")


def fire_failing_after_its_record(h, monkeypatch) -> None:
    with monkeypatch.context() as m:
        m.setattr(SqsWorkQueues, "send", throttled)
        with pytest.raises(ClientError, match="Rate exceeded"):
            fire(h, T0 + 30)
    stuck = sdk.status(h.env, RUN)
    assert stuck.submitting and stuck.unrecorded == 2


def sent(h) -> int:
    return len(for_env(h.env).queues.receive("work", 10, 0))


def test_the_watch_continues_a_run_whose_submit_stopped_part_way_and_the_schedule_goes_on(tmp_path, aws, monkeypatch):
    h = harness(tmp_path, aws)
    fire_failing_after_its_record(h, monkeypatch)
    assert watch(h, T0 + 90) == {RUN: "keep: still being recorded by its submit"}, "its submit may still be going"
    assert watch(h, LATER) == {RUN: "resumed: its submit stopped part-way (unfinished 15 min after it began); "
                                    "continued it from schedule 'nightly': 2 item(s) sent, 2 in all"}  # fmt: skip
    run = sdk.status(h.env, RUN)
    assert (run.submitting, run.unrecorded, run.sent, run.counts["queued"]) == (False, 0, 2, 2)
    assert sent(h) == 2, "every item of the run was sent, once"
    assert watch(h, LATER + 60) == {RUN: "keep: running"}
    # The run now really runs: the next fire counts it as any run still going, no longer a stuck one.
    assert fire(h, T0 + DAY + 30)["decision"] == f"skipped: {RUN} still running (admission 'skip')"


def test_the_next_fire_continues_it_and_queues_its_own_run_behind(tmp_path, aws, monkeypatch):
    h = harness(tmp_path, aws, admission="queue")
    fire_failing_after_its_record(h, monkeypatch)
    assert fire(h, T0 + DAY + 30)["decision"] == (
        f"resumed {RUN}: its submit stopped part-way (unfinished 1 day after it began); continued it from "
        f"schedule 'nightly': 2 item(s) sent, 2 in all; submit {NEXT}; queued behind {RUN}")  # fmt: skip
    assert (sdk.status(h.env, RUN).counts["queued"], sdk.status(h.env, NEXT).job.after) == (2, RUN)


def test_a_run_that_cannot_be_continued_is_cancelled_saying_why_and_the_schedule_goes_on(tmp_path, aws, monkeypatch):
    h = harness(tmp_path, aws)
    fire_failing_after_its_record(h, monkeypatch)
    h.env_path.write_text(h.env_path.read_text().replace('items = ["steps=1", ["steps=2"]]', 'items = ["steps=3"]'))
    h.env = load_environment(str(h.env_path))  # redeployed with other items: not the ones the run was fired with
    said = watch(h, LATER)[RUN]
    assert said.startswith("cancelled: its submit stopped part-way (unfinished 15 min after it began) and "
                           "cannot be continued from schedule 'nightly': job 'nightly-20250615t0000' already "
                           "exists with different items"), said  # fmt: skip
    run = sdk.status(h.env, RUN)
    assert run.job.cancelled and run.job.cancel_reason.startswith("its submit stopped part-way"), run.job
    assert sent(h) == 0
    assert watch(h, LATER + 60) == {}
    assert fire(h, T0 + DAY + 30)["decision"] == f"submit {NEXT}"


def test_continuing_it_fails_on_a_cloud_error_and_the_next_watch_tries_again(tmp_path, aws, monkeypatch):
    h = harness(tmp_path, aws)
    fire_failing_after_its_record(h, monkeypatch)
    with monkeypatch.context() as m:
        m.setattr(SqsWorkQueues, "send", throttled)
        said = watch(h, LATER)[RUN]
    assert said.startswith("failed to continue its submit, stopped part-way: An error occurred (ThrottlingException)")
    assert said.endswith("; the next watch tries again"), said
    assert watch(h, LATER + 60)[RUN].startswith("resumed: its submit stopped part-way")
    assert sent(h) == 2


def test_a_run_whose_submit_stopped_before_it_was_watched_is_still_found(tmp_path, aws, monkeypatch):
    h = harness(tmp_path, aws)
    real = DynamoStore.watch

    def watch_once(self, job_id):  # the submit's own watch write fails, after its job record landed
        if sys._getframe(1).f_code is sdk.submit.__wrapped__.__code__:
            raise ClientError({"Error": {"Code": "InternalServerError", "Message": "blip"}}, "PutItem")
        return real(self, job_id)

    with monkeypatch.context() as m:
        m.setattr(DynamoStore, "watch", watch_once)
        with pytest.raises(ClientError, match="blip"):
            fire(h, T0 + 30)
    assert sdk.status(h.env, RUN).submitting
    assert watch(h, LATER)[RUN].startswith("resumed: its submit stopped part-way")
    assert sent(h) == 2


def test_a_fire_that_cannot_continue_it_yet_still_queues_its_own_run_and_loses_nothing(tmp_path, aws, monkeypatch):
    h = harness(tmp_path, aws, admission="queue")
    fire_failing_after_its_record(h, monkeypatch)
    with monkeypatch.context() as m:  # still throttled: the stuck run stays, and counts as going
        m.setattr(SqsWorkQueues, "send", throttled)
        decided = fire(h, T0 + DAY + 30)["decision"]
    assert decided.startswith(f"failed to continue {RUN}, whose submit stopped part-way: An error occurred "
                              "(ThrottlingException)"), decided  # fmt: skip
    assert decided.endswith(f"; submit {NEXT}; queued behind {RUN}"), decided
    assert watch(h, T0 + DAY + 90) == {
        RUN: "resumed: its submit stopped part-way (unfinished 1 day after it began); continued it from "
             "schedule 'nightly': 2 item(s) sent, 2 in all",
        NEXT: f"keep: waiting for {RUN}"}  # fmt: skip
    assert sent(h) == 2


def beside_the_first_send(other) -> tuple[list, object]:
    """SqsWorkQueues.send that runs `other()` once, as its first send goes: another continuation
    starting while this one is still sending (what it returns is kept in the list)."""
    real, beside = SqsWorkQueues.send, []

    def send(self, queue, bodies, **kwargs):
        if not beside:
            beside.append(None)  # first, so that the other's own sends do not start a third
            beside[0] = other()
        return real(self, queue, bodies, **kwargs)

    return beside, send


def test_the_next_watch_leaves_a_run_to_the_continuation_still_going(tmp_path, aws, monkeypatch):
    """A big run's continuation takes minutes, past the next watch's tick: that watch must not start
    another beside it (two submits of one job at once write its items twice)."""
    h = harness(tmp_path, aws)
    fire_failing_after_its_record(h, monkeypatch)
    beside, send = beside_the_first_send(lambda: watch(h, LATER + 60))
    with monkeypatch.context() as m:
        m.setattr(SqsWorkQueues, "send", send)
        assert watch(h, LATER)[RUN].startswith("resumed: its submit stopped part-way")
    assert beside == [{RUN: "keep: still being recorded by its submit"}]
    assert sent(h) == 2, "every item of the run was sent, once"


def test_two_continuations_of_the_same_read_submit_once(tmp_path, aws, monkeypatch):
    """The watch and a fire (or two ticks) that both read the run stalled before either began: the
    first to claim it continues it, the other does nothing and says so."""
    h = harness(tmp_path, aws)
    fire_failing_after_its_record(h, monkeypatch)
    stalled = for_env(h.env).store.job(RUN)
    why = "its submit stopped part-way"
    beside, send = beside_the_first_send(lambda: scheduled.resume(h.env, for_env(h.env), stalled, why, LATER))
    with monkeypatch.context() as m:
        m.setattr(SqsWorkQueues, "send", send)
        assert scheduled.resume(h.env, for_env(h.env), stalled, why, LATER)[0] == "resumed"
    assert beside == [("skipped", f"{why}; another continuation of it began under 15 min ago: left to it")]
    assert sent(h) == 2, "every item of the run was sent, once"
    assert watch(h, LATER + 60) == {RUN: "keep: running"}
