"""A spot agent leaves an item of a queue with on_demand_after_interruptions to on-demand nodes by
hiding its message again, and sends it out afresh just before the queue's own redrive would
dead-letter it. On GCP that redrive is Pub/Sub's max_delivery_attempts, clamped to 100: with
max_retries 96 to 100 the agent counted to the unclamped max_receive_count (101 to 105), so the
message was dead-lettered before the resend (the audit's s8_defer_threshold.py)."""

from __future__ import annotations

import pytest

from tests.test_gcp_jobs import ENV, SUB, calls, gcp, published  # noqa: F401 - gcp is a fixture
from tidefleet.agent.worker import Agent, Settings
from tidefleet.jobs import sdk
from tidefleet.jobs.sdk import ItemMessage
from tidefleet.ports import Delivery
from tidefleet.resources import redrive_receives


def deferring(max_retries: int):
    queue = ENV.queues["default"].model_copy(update={"max_retries": max_retries, "on_demand_after_interruptions": 1})
    return ENV.model_copy(update={"queues": {**ENV.queues, "default": queue}})


@pytest.mark.parametrize("max_retries", [3, 94, 96, 100])
def test_a_deferred_message_is_sent_afresh_the_delivery_before_pubsub_dead_letters_it(gcp, tmp_path, max_retries):  # noqa: F811
    env = deferring(max_retries)
    queue = env.queues["default"]
    assert redrive_receives("gcp", queue) == min(queue.max_receive_count, 100)
    job = sdk.submit(env, "deferred", "default", sdk.read_items([["x"]]), kick=False).job_id
    agent = Agent(env, "cpu", Settings(node_id="tidefleet-gcp-dev-cpu-aaaa", instance_type="n2-standard-4", spot=True,
                                       work_dir=tmp_path), metadata=object())  # fmt: skip
    last = redrive_receives("gcp", queue)  # Pub/Sub's last delivery before the dead-letter topic
    body = ItemMessage(job, "000000", ["x"], interruptions=1).body()
    before = len(calls(gcp, "POST", f"/topics/{SUB}:publish"))
    agent._accept("default", queue, Delivery("ack-1", body, deliveries=last - 1, message_id="m-1"))
    resent = calls(gcp, "POST", f"/topics/{SUB}:publish")[before:]
    assert [m["item"] for c in resent for m in published(c)] == ["000000"], "sent afresh, delivery count 1"
    assert calls(gcp, "POST", f"/subscriptions/{SUB}:acknowledge"), "the old message acked"
