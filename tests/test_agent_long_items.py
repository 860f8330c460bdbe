"""Items that run longer than a queue can keep a message hidden, in-process against the moto
server: SQS hides a received message at most 12 hours after its receipt (ChangeMessageVisibility
refuses more), scaled here to seconds. Such an item keeps a message that another node can take
if its node dies, none of its message's receives counts toward the queue's redrive, and it runs
once."""

from __future__ import annotations

import json
import logging
import os
import signal
import time

import boto3
import pytest
from agent_harness import Harness, wait_until
from botocore.exceptions import EndpointConnectionError

from tidefleet import naming
from tidefleet.agent import worker
from tidefleet.agent.worker import Agent, Settings
from tidefleet.cloud.aws.imds import Metadata
from tidefleet.jobs import sdk

pytestmark = pytest.mark.moto

HEARTBEAT_S = 0.25
LIMIT_S = 8  # SQS's 12 hours, scaled: a handle is refreshed halfway, after 4 s
VISIBILITY_S = 3  # longer than a claim (2 s): a dead node's message comes back after its claim lapsed


class HoldLimit:
    """What moto does not enforce (it counts from the send, and 12 h): a handle keeps its message
    hidden at most `limit_s` after the receive that gave it, on the work queues of every node
    given to `enforce`, whichever node received it."""

    def __init__(self, limit_s: int):
        self.limit_s = limit_s
        self.received: dict[str, float] = {}  # handle -> when it was received

    def enforce(self, node: Agent) -> None:
        queues = node.cloud.queues
        queues.max_hold_s = self.limit_s
        receive, extend = queues.receive, queues.extend

        def receiving(*args, **kwargs):
            got = receive(*args, **kwargs)
            self.received |= {d.handle: time.time() for d in got}
            return got

        def extending(queue, handles, seconds):
            now = time.time()
            late = {h: f"Value {seconds} for parameter VisibilityTimeout is invalid. Reason: Total VisibilityTimeout "
                       f"for the message is beyond the limit [{self.limit_s} seconds]"
                    for h in handles if now + seconds - self.received.get(h, now) > self.limit_s}  # fmt: skip
            rest = [h for h in handles if h not in late]
            return {**(extend(queue, rest, seconds) if rest else {}), **late}

        queues.receive, queues.extend = receiving, extending


class Gone:
    """The cloud as a killed node sees it: nothing it would still do gets there."""

    def __getattr__(self, name):
        def refused(*args, **kwargs):
            raise EndpointConnectionError(endpoint_url="http://killed-node")

        return refused


@pytest.fixture
def h(tmp_path, aws, monkeypatch):
    monkeypatch.setattr(worker, "MIN_LEASE_S", 2.0)  # claims of 2 s (8 heartbeats): a dead node's lapses soon
    harness = Harness(tmp_path, aws, max_retries=0, visibility_s=VISIBILITY_S)
    # The redrive scaled too: a message received a third time goes to the dead-letter queue.
    sqs = boto3.client("sqs", region_name=harness.env.region)
    dlq = sqs.get_queue_url(QueueName=naming.dead_letter_queue(harness.env.name, "work"))["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    sqs.set_queue_attributes(QueueUrl=sqs.get_queue_url(QueueName=naming.queue(harness.env.name, "work"))["QueueUrl"],
                             Attributes={"RedrivePolicy": json.dumps({"deadLetterTargetArn": arn, "maxReceiveCount": "2"})})  # fmt: skip
    yield harness
    harness.stop_agents()  # the workloads the in-process agents started


def agent(h: Harness, node_id: str, limit: HoldLimit, *, spot: bool = False, **queue_changes) -> Agent:
    env = h.env
    if queue_changes:
        env = env.model_copy(update={"queues": {**env.queues, "work": env.queues["work"].model_copy(update=queue_changes)}})
    node = Agent(env, "cpu", Settings(node_id=node_id, instance_type="c6i.large", spot=spot,
                                      work_dir=h.tmp / "work" / node_id, checkpoint_root=h.tmp / "checkpoints",
                                      heartbeat_s=HEARTBEAT_S, wait_s=0),
                 metadata=Metadata("http://127.0.0.1:9"))  # fmt: skip
    node._prepare()
    limit.enforce(node)
    return node


def beat(nodes: list[Agent], receiving: list[Agent]) -> None:
    """One heartbeat of each node and its batches' flush, then a receive by each idle node."""
    for node in nodes:
        node._beat()
        node.records.flush()
        node.acks.flush()
    for node in receiving:
        node._receive("work", node.env.queues["work"], wait_s=0)
    time.sleep(HEARTBEAT_S)


def status(h: Harness, job: str) -> str:
    return h.items(job)["000000"].status


@pytest.mark.parametrize("taker", ["the holder", "another node"])
def test_an_item_running_past_the_queues_hold_limit_keeps_its_message_and_runs_once(h, caplog, taker):
    caplog.set_level(logging.INFO, "tidefleet.agent")
    limit = HoldLimit(LIMIT_S)
    job = sdk.submit(h.env, "long", "work", sdk.read_items([["steps=120"]]), kick=False).job_id  # 12 s: 1.5 limits
    a, b = agent(h, "node-a", limit), agent(h, "node-b", limit)
    assert a._receive("work", h.env.queues["work"], wait_s=1) == 1
    if taker == "another node":  # its long poll is first to the fresh copy, every time
        a.cloud.queues.receive = lambda *args, **kwargs: []
    wait_until(lambda: beat([a, b], [b]) or status(h, job) == "succeeded", 40, "the long item to succeed")
    item = h.items(job)["000000"]
    assert (item.attempts, [e["outcome"] for e in item.history]) == (1, ["succeeded"])
    assert len(h.events("start")) == 1, "run once: the fresh copies were never claimed"
    assert h.queue_depth("work", dead_letter=True) == 0, "no receive of its message reached the redrive"
    wait_until(lambda: beat([a, b], [b]) or h.queue_depth("work") == 0, 10, "its last message to go")
    refreshed = [r.getMessage() for r in caplog.records if "fresh copy" in r.getMessage()]
    assert len(refreshed) >= 2 and all(line.startswith(f"{job}/000000") for line in refreshed), refreshed
    assert "could not extend" not in caplog.text and "Traceback" not in caplog.text


def test_a_long_item_whose_node_dies_after_its_message_was_replaced_finishes_on_another_node(h):
    limit = HoldLimit(LIMIT_S)
    job = sdk.submit(h.env, "long", "work", sdk.read_items([["steps=100"]]), kick=False).job_id
    a, b = agent(h, "node-a", limit), agent(h, "node-b", limit)
    assert a._receive("work", h.env.queues["work"], wait_s=1) == 1
    first = a.runs[0].receipt
    a.cloud.queues.receive = lambda *args, **kwargs: []  # the other node takes the fresh copy and hands it over
    wait_until(lambda: beat([a, b], [b]) or (a.runs and a.runs[0].receipt not in ("", first)), 20,
               "the node to hold a fresh copy of its message")  # fmt: skip
    for group in h._workload_groups():  # the node dies with its workload
        os.killpg(group, signal.SIGKILL)
    a.store = a.cloud.queues = Gone()
    wait_until(lambda: beat([b], [b]) or status(h, job) == "succeeded", 40, "another node to finish the item")
    item = h.items(job)["000000"]
    assert [e["outcome"] for e in item.history] == ["lost", "succeeded"]
    assert [e["attempt"] for e in h.events("start")] == [1, 3] and len(h.events("done")) == 1
    assert h.queue_depth("work", dead_letter=True) == 0


@pytest.mark.parametrize("taker", ["a cordoned node", "a spot node that leaves the item to on-demand nodes"])
def test_a_running_items_message_that_a_node_will_not_start_goes_back_to_its_holder_not_out_as_a_copy(h, taker):
    """Sent out again as a copy, a claim would drop it as a duplicate (the record names the held
    one), and the item would have no message if its node then died."""
    limit = HoldLimit(LIMIT_S)
    job = sdk.submit(h.env, "long", "work", sdk.read_items([["steps=100"]]), kick=False).job_id
    sqs = boto3.client("sqs", region_name=h.env.region)
    url = sqs.get_queue_url(QueueName=naming.queue(h.env.name, "work"))["QueueUrl"]
    sqs.purge_queue(QueueUrl=url)  # the item comes back from a spot node: interrupted once
    sqs.send_message(QueueUrl=url, MessageBody=sdk.ItemMessage(job, "000000", ["steps=100"], interruptions=1).body())
    a = agent(h, "node-a", limit)
    b = agent(h, "node-b", limit, spot=True, on_demand_after_interruptions=1)
    b.cordoned = taker == "a cordoned node"
    assert a._receive("work", h.env.queues["work"], wait_s=1) == 1
    first = a.runs[0].receipt
    a.cloud.queues.release("work", [first])  # its visibility ran out (or it replaced the message)
    assert b._receive("work", b.env.queues["work"], wait_s=1) == 1
    assert not b.deferred and not b.runs
    a._beat()
    assert a.runs[0].receipt != first, "the holder took the handle of the node that received its message"
    assert a.runs[0].receipt == h.items(job)["000000"].receipt
    assert a.cloud.queues.extend("work", [a.runs[0].receipt], VISIBILITY_S) == {}
    assert h.queue_depth("work") == 1
