"""retry-failed and status's dead-letter check against the moto server: a send that fails or a
run that dies strands nothing, a rerun within an earlier run's hold says so instead of "nothing to
do", and an empty short poll is not taken for an empty dead-letter queue."""

from __future__ import annotations

import pytest
from agent_harness import Harness
from botocore.exceptions import ClientError
from click.testing import CliRunner

from tidefleet.cli import main
from tidefleet.cloud import for_env
from tidefleet.cloud.aws.sqs import SqsWorkQueues
from tidefleet.jobs import sdk


@pytest.fixture
def h(tmp_path, aws):
    return Harness(tmp_path, aws)


def run(h: Harness, *args: str):
    env = {"TIDEFLEET_ENV": str(h.env_path), "TIDEFLEET_KICK_URL": "http://127.0.0.1:9/"}
    return CliRunner().invoke(main, list(args), env=env)


def failed_job(h: Harness, name: str, n: int = 2) -> str:
    """A job whose n items the agent gave up on: recorded failed, their messages in the dead-letter queue."""
    cloud = for_env(h.env)
    job = sdk.submit(h.env, name, "work", sdk.read_items([f"s3://b/{i}" for i in range(n)]), kick=False).job_id
    cloud.queues.delete("work", [d.handle for d in cloud.queues.receive("work", 10, 0)])
    for i in range(n):
        item = f"{i:06d}"
        cloud.store.update_item(job, item, status="failed", failures=3, reason="exit code 1")
        sdk.send_messages(cloud, "work", [sdk.ItemMessage(job, item, [f"s3://b/{i}"], failures=3)], dead_letter=True)
    return job


def throttled_sends(monkeypatch):
    real = SqsWorkQueues.send

    def send(self, queue, bodies, *, dead_letter=False):
        if not dead_letter:
            raise ClientError({"Error": {"Code": "ThrottlingException", "Message": "Rate exceeded"}}, "SendMessageBatch")
        return real(self, queue, bodies, dead_letter=dead_letter)

    monkeypatch.setattr(SqsWorkQueues, "send", send)
    return real


# -- 1. nothing stranded ------------------------------------------------------------------
def test_a_retry_failed_whose_send_fails_releases_its_messages_and_a_rerun_sends_them_back(h, monkeypatch):
    job = failed_job(h, "throttled")
    real = throttled_sends(monkeypatch)
    out = run(h, "retry-failed", job)
    assert out.exit_code == 1 and "Traceback" not in out.output, out.output
    assert h.queue_counts("work", dead_letter=True) == (2, 0), "released at once, not hidden for the hold"
    monkeypatch.setattr(SqsWorkQueues, "send", real)
    out = run(h, "retry-failed", job)  # at once, as the error advises
    assert out.exit_code == 0 and f"job {job}: 2 item(s) sent back" in out.output, out.output
    assert h.queue_counts("work") == (2, 0) and h.queue_counts("work", dead_letter=True) == (0, 0)
    assert {i.status for i in h.items(job).values()} == {"queued"}


def test_a_rerun_while_an_earlier_run_holds_the_dead_letters_says_when_to_run_again(h):
    job = failed_job(h, "held")
    queues = for_env(h.env).queues
    # An earlier run that died after receiving them: hidden for its hold, not released.
    held = queues.receive("work", 10, 0, dead_letter=True, hold_s=120)
    assert len(held) == 2
    with pytest.raises(sdk.JobError) as err:
        sdk.retry_failed(h.env, job)
    assert "2 message(s)" in str(err.value) and "earlier" in str(err.value) and "run it again" in str(err.value)
    out = run(h, "retry-failed", job)
    assert out.exit_code == 1 and "nothing to do" not in out.output and len(out.output.strip().splitlines()) == 1
    queues.release("work", [d.handle for d in held], dead_letter=True)  # the hold ran out
    assert sdk.retry_failed(h.env, job) == 2


def test_a_finished_job_is_told_nothing_to_do_whatever_other_runs_hold(h):
    job = sdk.submit(h.env, "fine", "work", sdk.read_items(["a"]), kick=False).job_id
    cloud = for_env(h.env)
    cloud.queues.delete("work", [d.handle for d in cloud.queues.receive("work", 10, 0)])
    cloud.store.update_item(job, "000000", status="succeeded")
    other = failed_job(h, "other", 1)
    cloud.queues.receive("work", 10, 0, dead_letter=True, hold_s=120)  # another job's, held by another run
    out = run(h, "retry-failed", job)
    assert out.exit_code == 0 and "0 item(s) sent back; nothing to do" in out.output, out.output
    assert other


def test_failed_items_whose_dead_letters_expired_are_told_how_to_rerun_not_nothing_to_do(h):
    """The logs/cost audit: dead letters go after the queue's retention (14 days on SQS); a user back
    from a week off was told "nothing to do" (exit 0) while `status` listed the failed items."""
    job = failed_job(h, "expired")
    cloud = for_env(h.env)
    cloud.queues.delete("work", [d.handle for d in cloud.queues.receive("work", 10, 0, dead_letter=True)], dead_letter=True)
    out = run(h, "retry-failed", job)
    assert out.exit_code == 1 and "nothing to do" not in out.output and "Traceback" not in out.output, out.output
    said = " ".join(out.output.split())
    assert f"job {job}: its 2 failed item(s) have no dead letter left to send back (a dead letter is kept 14 days" in said
    assert "submit them again as a new job" in said and "--failed" in said


# -- a dead letter of an item that runs -----------------------------------------------------
def test_a_dead_letter_of_an_item_running_under_a_live_lease_is_left_to_its_holder(h):
    """On Pub/Sub a running item's message is redelivered, and may be dead-lettered, while its
    holder's ack-deadline extensions fail. status must not mark such an item failed (its holder's
    next renewal would then stop the workload), nor retry-failed queue it and send it again (a
    second node would run it beside the first)."""
    import time

    from tidefleet.records import Fence

    cloud = for_env(h.env)
    job = sdk.submit(h.env, "one-runs", "work", sdk.read_items(["s3://b/0", "s3://b/1"]), kick=False).job_id
    cloud.queues.delete("work", [d.handle for d in cloud.queues.receive("work", 10, 0)])
    cloud.store.update_item(job, "000000", status="failed", failures=3, reason="exit code 1")
    sdk.send_messages(cloud, "work", [sdk.ItemMessage(job, "000000", ["s3://b/0"], failures=3),  # its agent gave up
                                      sdk.ItemMessage(job, "000001", ["s3://b/1"])], dead_letter=True)  # the redrive's
    now = time.time()
    claimed = cloud.store.update_item(job, "000001", status="running", node="node-a", lease_until=now + 300,
                                      add={"attempts": 1}, fence=Fence(claim_at=now))  # fmt: skip
    assert claimed is not None and claimed.status == "running"
    sdk.status(h.env, job)
    assert h.items(job)["000001"].status == "running", "status marked a running item failed"
    assert sdk.retry_failed(h.env, job) == 1, "only the failed item goes back"
    items = h.items(job)
    assert (items["000000"].status, items["000001"].status, items["000001"].node) == ("queued", "running", "node-a")
    assert h.queue_counts("work") == (1, 0), "one message sent: the failed item's"
    assert h.queue_counts("work", dead_letter=True) == (1, 0), "the running item's dead letter stays, visible again"
    cloud.store.update_item(job, "000001", status="succeeded", fence=Fence(attempt=1))
    assert sdk.retry_failed(h.env, job) == 0
    assert h.queue_counts("work", dead_letter=True) == (0, 0), "a finished item's dead letter is spent: deleted, not sent"
    assert h.queue_counts("work") == (1, 0)


def test_retry_failed_gives_an_item_dead_lettered_for_node_losses_a_fresh_loss_budget(h):
    """Before, its failures were reset and its losses not: the first node loss after the retry
    (a spot reclaim without notice) dead-lettered it again ("lost 7 times; 5 tolerated")."""
    cloud = for_env(h.env)
    job = sdk.submit(h.env, "lossy", "work", sdk.read_items(["s3://b/0"]), kick=False).job_id
    cloud.queues.delete("work", [d.handle for d in cloud.queues.receive("work", 10, 0)])
    cloud.store.update_item(job, "000000", status="failed", lost=6, reason="node lost mid-attempt (gave up ...)")
    sdk.send_messages(cloud, "work", [sdk.ItemMessage(job, "000000", ["s3://b/0"], lost=6, seq=6)], dead_letter=True)
    assert sdk.retry_failed(h.env, job) == 1
    (delivery,) = cloud.queues.receive("work", 10, 0)
    sent = sdk.ItemMessage.parse(delivery.body)
    assert (sent.failures, sent.lost) == (0, 0)
    item = cloud.store.item(job, "000000")
    assert (item.status, item.failures, item.lost) == ("queued", 0, 0)
