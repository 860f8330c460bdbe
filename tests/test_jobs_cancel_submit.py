"""A cancel ends a job's submit, wherever that submit is: stopped partway (the job then reads
as done, its never-recorded items cancelled) or still running (it stops and cancels what it
recorded after the cancel looked). Also: a re-submit must wait for the same job as the record,
and counts never add up to more than the job's items. Against the moto server."""

from __future__ import annotations

import json
import threading
import time

import boto3
import pytest
from agent_harness import Harness
from click.testing import CliRunner
from rich.progress import Progress

from tidefleet import naming
from tidefleet.cli import main
from tidefleet.cloud.aws.dynamodb import DynamoStore
from tidefleet.jobs import sdk
from tidefleet.records import FINAL, Heartbeat

CHUNK = 10


@pytest.fixture
def h(tmp_path, aws, monkeypatch):
    monkeypatch.setattr(sdk, "CHUNK", CHUNK)
    return Harness(tmp_path, aws)


def run(h: Harness, *args: str, input: str | None = None):
    env = {"TIDEFLEET_ENV": str(h.env_path), "TIDEFLEET_KICK_URL": "http://127.0.0.1:9/"}
    return CliRunner().invoke(main, list(args), env=env, input=input)


def items(n: int) -> sdk.ItemList:
    return sdk.read_items([f"s3://b/{i}" for i in range(n)])


def interrupted_after_first_chunk(h: Harness, name: str, n: int, **kwargs) -> str:
    """The job of a submit stopped (Ctrl-C) once its first chunk was recorded and sent."""
    job: list = []

    def stop(_: int) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        sdk.submit(h.env, name, "work", items(n), kick=False, threads=1, progress=stop, on_job=job.append, **kwargs)
    return job[0].job_id


def test_a_cancel_ends_a_submit_that_stopped_partway(h):
    job_id = interrupted_after_first_chunk(h, "cut-short", 3 * CHUNK)
    before = sdk.status(h.env, job_id)
    assert before.submitting and before.unrecorded == 2 * CHUNK and not before.done
    assert sdk.cancel(h.env, job_id) == CHUNK
    for read in (sdk.status(h.env, job_id), sdk.status(h.env, job_id, items=True)):
        assert read.done and read.state == "done" and not read.submitting and read.unrecorded == 0
        assert read.counts == {"succeeded": 0, "running": 0, "queued": 0, "failed": 0, "cancelled": 3 * CHUNK}
    text = run(h, "status", job_id)  # exit 1: done, but cancelled (`status --watch J && next` must not go on)
    assert text.exit_code == 1 and "run the same submit" not in text.output and "[cancelled job]" in text.output
    assert "items never recorded are counted as cancelled" in text.output
    shown = json.loads(run(h, "status", job_id, "--json").output)
    assert (shown["state"], shown["done"], shown["submitting"], shown["unrecorded"]) == ("cancelled", True, False, 0)
    assert run(h, "status", job_id, "--watch", "--time-limit", "5").exit_code == 1
    assert job_id not in run(h, "jobs", "--state", "running").output
    assert f"{job_id}  work  cancelled  {3 * CHUNK}/{3 * CHUNK} final" in run(h, "jobs").output
    assert sdk.cancel_job(h.env, job_id).already == f"job {job_id} already cancelled; nothing to cancel"


def test_a_submit_that_finds_its_job_cancelled_stops_and_cancels_what_it_recorded(h):
    first = sdk.submit(h.env, "first", "work", items(1), kick=False).job_id
    cancelled: list = []
    job: list = []

    def cancel_once_a_chunk_is_in(_: int) -> None:  # the cancel lists the items of the first chunk only
        if not cancelled:
            cancelled.append(sdk.cancel(h.env, job[0].job_id))

    with pytest.raises(sdk.JobError, match=r"was cancelled while this submit ran; it stopped and cancelled the items"):
        sdk.submit(h.env, "held", "work", items(3 * CHUNK), kick=False, threads=1, after=first,
                   on_job=job.append, progress=cancel_once_a_chunk_is_in)  # fmt: skip
    job_id = job[0].job_id
    assert cancelled == [CHUNK]
    recorded = DynamoStore(h.env.name, h.env.region).items(job_id)
    assert len(recorded) == 2 * CHUNK, "the chunk written after the cancel, and no later one"
    assert all(i.status == "cancelled" for i in recorded), "none left pending for the watch to send"
    assert sdk.status(h.env, job_id).done


@pytest.mark.parametrize("waits, given", [
    ({}, "without --after"),
    ({"after_finished": True}, "with --after {first} --after-finished"),
    ({"after": "other"}, "with --after other"),
])
def test_a_resubmit_that_waits_for_something_else_is_refused_naming_both(h, waits, given):
    first = sdk.submit(h.env, "first", "work", items(1), kick=False).job_id
    sdk.submit(h.env, "other", "work", items(1), job_id="other", kick=False)
    held = sdk.submit(h.env, "held", "work", items(2), kick=False, after=first)
    assert held.held
    rerun = {"after": first, **waits} if waits else {}
    with pytest.raises(sdk.JobError) as refused:
        sdk.submit(h.env, "held", "work", items(2), kick=False, **rerun)
    assert str(refused.value) == (f"job {held.job_id!r} already exists with --after {first} (got {given.format(first=first)}); "
                                  "re-submit with the same --after and --after-finished, or use another --name or --job-id")
    out = run(h, "submit", "--name", "held", "--queue", "work", "--items", "-", input="s3://b/0\ns3://b/1\n")
    assert out.exit_code == 1 and "already exists with --after" in out.output
    assert sdk.submit(h.env, "held", "work", items(2), kick=False, after=first).already


def test_cli_held_line_names_what_the_record_waits_for(h, tmp_path):
    first = sdk.submit(h.env, "first", "work", items(1), kick=False).job_id
    listed = tmp_path / "items.txt"
    listed.write_text("s3://b/0\n")
    out = run(h, "submit", "--name", "held", "--queue", "work", "--items", str(listed), "--after", first, "--after-finished")
    assert out.exit_code == 0 and out.output.splitlines()[-1].endswith(f"held: sent once job {first} has finished")


def test_ctrl_c_says_its_last_line_once_the_bar_is_gone_and_counts_the_chunks_it_gave_up_on(h, monkeypatch):
    """A bar (1,000 items or more) was drawn again after the `interrupted` line, into it in a
    terminal; and the chunks still in flight when it stopped waiting went unsaid ('at least 0 of
    3000 item(s) sent' read as nothing done). Here chunk 0 goes out, Ctrl-C comes as it is counted,
    and the 7 others in flight never answer."""
    released, write_chunk, advance = threading.Event(), sdk._write_chunk, Progress.advance

    def first_only(cloud, job, k, *rest):
        if k:
            released.wait()
            raise RuntimeError("the test is over")
        return write_chunk(cloud, job, k, *rest)

    def counted_then_ctrl_c(bar, task, n):
        advance(bar, task, n)
        raise KeyboardInterrupt

    monkeypatch.setattr(sdk, "_write_chunk", first_only)
    monkeypatch.setattr(sdk, "STOP_WAIT_S", 0)
    monkeypatch.setattr(Progress, "advance", counted_then_ctrl_c)
    monkeypatch.setenv("TTY_COMPATIBLE", "1")  # the bar is drawn, as in a terminal
    try:
        out = run(h, "submit", "--name", "big", "--queue", "work", "--items", "-",
                  input="".join(f"s3://b/{i}\n" for i in range(100 * CHUNK)))  # fmt: skip
    finally:
        released.set()
    job_id = sdk.job_id_for("big")
    assert out.exit_code == 130 and "━━" in out.stderr, out.stderr  # the bar was up
    assert "stopping: 10 item(s) sent so far; waiting up to 0 s for 7 chunk(s) in flight" in out.stderr
    # The last thing written, after the bar's last drawing and its erasing: nothing draws over it.
    assert out.stderr.endswith(
        f"interrupted: job {job_id}: at least 10 of 1000 item(s) confirmed sent, 7 chunk(s) "
        "still in flight unconfirmed; run the same command again: it continues the job\n"
    )


def test_a_ctrl_c_while_a_chunks_thread_starts_waits_for_that_chunk_and_counts_it(h, monkeypatch):
    """The chunk's call may be out before its thread's start returns: a Ctrl-C then found no chunk
    in flight, waited for none and said none (a stalled endpoint's submit then left without the
    `stopping` line)."""
    told, start = [], threading.Thread.start

    def start_then_ctrl_c(thread):
        start(thread)
        if thread.name == "submit":
            raise KeyboardInterrupt

    monkeypatch.setattr(threading.Thread, "start", start_then_ctrl_c)
    with pytest.raises(sdk.SubmitInterrupted) as stopped:
        sdk.submit(h.env, "starting", "work", items(CHUNK), kick=False, progress=told.append,
                   on_stop=lambda chunks, _: told.append(f"stopping: {chunks} chunk(s) in flight"))  # fmt: skip
    assert told == ["stopping: 1 chunk(s) in flight", CHUNK] and stopped.value.unconfirmed == 0


def test_running_is_capped_by_the_items_not_settled(h):
    job_id = sdk.submit(h.env, "settled", "work", items(5), kick=False).job_id
    store = DynamoStore(h.env.name, h.env.region)
    for n in range(5):
        store.update_item(job_id, f"{n:06d}", status="succeeded")
    store.put_heartbeat(Heartbeat("n-1", h.env.queues["work"].pool, at=time.time(), slots=2, busy_slots=1,
                                  idle_since=None, running={job_id: 1}))  # fmt: skip  # its heartbeat lags the outcome
    status = sdk.status(h.env, job_id)
    assert status.counts == {"succeeded": 5, "running": 0, "queued": 0, "failed": 0, "cancelled": 0}
    assert sum(status.counts.values()) == status.job.total and status.done
    assert "5/5 final (0 failed, 0 running)" in run(h, "jobs").output


def test_item_env_given_twice_is_refused_naming_the_key(h):
    out = run(h, "submit", "--name", "e", "--queue", "work", "--items", "-", "--item-env", "A=1", "--item-env", "A=2")
    assert out.exit_code == 2 and "'A' given more than once; give each KEY once" in out.output


def test_counts_of_a_cancelled_job_add_up_to_its_total(h):
    job_id = interrupted_after_first_chunk(h, "partly-run", 2 * CHUNK)
    store = DynamoStore(h.env.name, h.env.region)
    store.update_item(job_id, "000000", status="succeeded")
    store.update_item(job_id, "000001", status="failed", reason="exit code 1")
    store.update_item(job_id, "000002", status="running")
    sdk.cancel(h.env, job_id)
    status = sdk.status(h.env, job_id)
    # Counted from the job's counters and the heartbeats: no node says it runs 000002 (there is no
    # agent here), so it counts as waiting; read item by item, its record says running.
    assert status.counts == {"succeeded": 1, "running": 0, "queued": 1, "failed": 1, "cancelled": 2 * CHUNK - 3}
    assert sdk.status(h.env, job_id, items=True).counts == {**status.counts, "running": 1, "queued": 0}
    assert not status.done, "its running item stops within a heartbeat"
    store.update_item(job_id, "000002", status="cancelled")
    assert sdk.status(h.env, job_id).done and all(i.status in FINAL for i in store.items(job_id))


def test_a_cancel_settles_a_big_jobs_waiting_items_many_to_a_store_call(h, monkeypatch):
    """120 held items: every one cancelled and counted, in a few transactions (the store takes up
    to 50 writes to one), not 120 round trips; one that started meanwhile is left to its agent."""
    parent = sdk.submit(h.env, "parent", "work", items(1), kick=False).job_id
    job_id = sdk.submit(h.env, "big-held", "work", items(120), kick=False, after=parent).job_id
    store = DynamoStore(h.env.name, h.env.region)
    store.update_item(job_id, "000007", only_from=("pending",), status="running")
    calls = []
    real = DynamoStore.update_items
    monkeypatch.setattr(DynamoStore, "update_items", lambda self, writes: calls.append(len(writes)) or real(self, writes))
    assert sdk.cancel(h.env, job_id) == 119
    assert calls == [119], calls
    counts = sdk.status(h.env, job_id).counts
    assert counts["cancelled"] == 119 and counts["running"] + counts["queued"] == 1, counts


def test_retry_failed_refuses_a_cancelled_job_and_keeps_its_failures(h):
    """Sent back, its items would only be cancelled by the agent, erasing why they failed."""
    job_id = sdk.submit(h.env, "failed-then-cancelled", "work", items(2), kick=False).job_id
    store = DynamoStore(h.env.name, h.env.region)
    store.update_item(job_id, "000000", status="failed", reason="exit 3: boom")
    sqs = boto3.client("sqs", region_name=h.env.region)
    sqs.send_message(QueueUrl=sqs.get_queue_url(QueueName=naming.dead_letter_queue(h.env.name, "work"))["QueueUrl"],
                     MessageBody=sdk.ItemMessage(job_id, "000000", ["s3://b/0"], failures=3).body())
    assert sdk.cancel(h.env, job_id) == 1
    refusal = (f"job {job_id} was cancelled: its failed items stay failed and are not sent back; to rerun them, "
               f"submit them again as a new job (another --name or --job-id); `tidefleet status --env {h.env_path} "
               f"{job_id} --failed` lists them")
    with pytest.raises(sdk.JobError) as refused:
        sdk.retry_failed(h.env, job_id)
    assert str(refused.value) == refusal
    out = run(h, "retry-failed", job_id)
    assert out.exit_code == 1 and out.output == f"Error: {refusal}\n", out.output
    failed = store.item(job_id, "000000")
    assert (failed.status, failed.reason) == ("failed", "exit 3: boom")
    assert h.queue_depth("work", dead_letter=True) == 1, "its dead letter stays for the record"


def test_submit_after_a_job_is_checked_from_its_counters_without_reading_its_items(h, monkeypatch):
    """Whether the job it waits for finished with failures is in that job's record: its items are
    not read (a big job's are many), nor its nodes' heartbeats once every item settled."""
    store = DynamoStore(h.env.name, h.env.region)
    parent = sdk.submit(h.env, "big-parent", "work", items(2), kick=False).job_id
    store.update_item(parent, "000000", status="failed", reason="exit 3")
    monkeypatch.setattr(DynamoStore, "items", lambda *_: pytest.fail("read every item of the job it waits for"))
    assert sdk.submit(h.env, "while-it-runs", "work", items(1), kick=False, after=parent).held, "it may still succeed"
    store.update_item(parent, "000001", status="succeeded")
    monkeypatch.setattr(DynamoStore, "heartbeats", lambda *_: pytest.fail("read the heartbeats of a finished job"))
    with pytest.raises(sdk.JobError, match=f"after: job {parent} finished with 1 failed item"):
        sdk.submit(h.env, "once-it-failed", "work", items(1), kick=False, after=parent)


def test_submit_after_a_job_that_can_no_longer_succeed_is_refused_before_anything_is_written(h):
    """The watch would cancel it within a tick: a cancelled job, or one finished with failures,
    never succeeds. With --after-finished it runs after them, so that is still taken."""
    store = DynamoStore(h.env.name, h.env.region)
    cancelled = sdk.submit(h.env, "cancelled-parent", "work", items(1), kick=False).job_id
    sdk.cancel(h.env, cancelled)
    failed = sdk.submit(h.env, "failed-parent", "work", items(1), kick=False).job_id
    store.update_item(failed, "000000", status="failed", reason="exit 3")
    why = {cancelled: "was cancelled", failed: "finished with 1 failed item(s)"}
    for parent in (cancelled, failed):
        refusal = (f"after: job {parent} {why[parent]}, so it can never succeed and this job would only be cancelled; "
                   f"submit without --after, or with --after-finished to run after {parent} whatever its outcome")
        if parent == failed:
            refusal += f", or send its failed items back first (tidefleet retry-failed --env {h.env_path} {failed})"
        with pytest.raises(sdk.JobError) as refused:
            sdk.submit(h.env, "child", "work", items(1), kick=False, after=parent)
        assert str(refused.value) == refusal
        out = run(h, "submit", "--name", "child", "--queue", "work", "--items", "-", "--after", parent, input="s3://b/0\n")
        assert out.exit_code == 1 and out.output == f"Error: {refusal}\n", out.output
        assert store.job(sdk.job_id_for("child")) is None, "nothing written"
        assert sdk.submit(h.env, f"after-{parent}", "work", items(1), kick=False, after=parent, after_finished=True).held
