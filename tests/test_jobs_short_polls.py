"""An empty short poll of a dead-letter queue is not an empty queue (retry-failed, status), against
the moto server: SQS answers a short poll from a sample of its servers and may answer nothing
while some messages wait ("repeat the request")."""

from __future__ import annotations

import pytest
from agent_harness import Harness
from test_jobs_dead_letters import failed_job

from tidefleet.cloud import for_env
from tidefleet.cloud.aws.sqs import SqsWorkQueues
from tidefleet.jobs import sdk


@pytest.fixture
def h(tmp_path, aws):
    return Harness(tmp_path, aws)

def empty_short_polls(monkeypatch) -> list[int]:
    """Every receive of the dead-letter queue without a wait answers nothing, as a short poll of
    a queue with few messages may (it samples a subset of SQS's servers); returns the waits asked."""
    real = SqsWorkQueues.receive
    waits: list[int] = []

    def receive(self, queue, max_messages, wait_s, *, dead_letter=False, hold_s=None):
        if dead_letter:
            waits.append(wait_s)
            if not wait_s:
                return []
        return real(self, queue, max_messages, wait_s, dead_letter=dead_letter, hold_s=hold_s)

    monkeypatch.setattr(SqsWorkQueues, "receive", receive)
    return waits


def test_retry_failed_does_not_take_an_empty_short_poll_for_an_empty_dead_letter_queue(h, monkeypatch):
    job = failed_job(h, "sampled", 3)
    empty_short_polls(monkeypatch)
    assert sdk.retry_failed(h.env, job) == 3
    assert h.queue_counts("work") == (3, 0) and h.queue_counts("work", dead_letter=True) == (0, 0)


def test_status_does_not_take_an_empty_short_poll_for_an_empty_dead_letter_queue(h, monkeypatch):
    cloud = for_env(h.env)
    job = sdk.submit(h.env, "redriven", "work", sdk.read_items(["a"]), kick=False).job_id
    moved = cloud.queues.receive("work", 10, 0)
    cloud.store.update_item(job, "000000", status="running", node="i-gone")
    sdk.send_messages(cloud, "work", [sdk.ItemMessage(job, "000000", ["a"])], dead_letter=True)  # the redrive's move
    cloud.queues.delete("work", [d.handle for d in moved])
    empty_short_polls(monkeypatch)
    assert sdk.status(h.env, job).counts["failed"] == 1


def test_status_of_a_job_with_an_empty_dead_letter_queue_never_waits_on_it(h, monkeypatch):
    job = sdk.submit(h.env, "quick", "work", sdk.read_items(["a"]), kick=False).job_id
    waits = empty_short_polls(monkeypatch)
    assert sdk.status(h.env, job).counts["queued"] == 1
    assert waits == [0], "one short poll; the queue's count says it is empty, so no long poll"
