"""Items that run longer than a queue can keep a message hidden, in-process against the moto
server: SQS hides a received message at most 12 hours after its receipt (ChangeMessageVisibility
refuses more), scaled here to seconds. Such an item keeps a message that another node can take
if its node dies, none of its message's receives counts toward the queue's redrive, and it runs
once."""

from __future__ import annotations

import itertools
import json
import logging
import os
import signal
import threading
import time

import boto3
import pytest
from agent_harness import Gone, Harness, wait_until
from agent_harness import beat as harness_beat
from botocore.exceptions import ClientError, EndpointConnectionError

from tidefleet import naming
from tidefleet.agent import worker
from tidefleet.agent.worker import Agent, Settings
from tidefleet.cloud.aws.imds import Metadata
from tidefleet.jobs import sdk

pytestmark = pytest.mark.moto

HEARTBEAT_S = 0.25
# Scaled to survive a loaded machine, where a heartbeat may come seconds late: claims of 3 s (12
# heartbeats; `MIN_LEASE_S`), SQS's 12 hours as 16 s. A handle is refreshed halfway, after 8 s, and
# its last extension (VISIBILITY_S) must end within the limit: the refresh may come 4 s late.
CLAIM_S = 3.0
LIMIT_S = 16
VISIBILITY_S = 4  # longer than a claim: a dead node's message comes back after its claim lapsed


class HoldLimit:
    """What moto does not enforce (it counts from the send, and 12 h): a handle keeps its message
    hidden at most `limit_s` after the receive that gave it, on the work queues of every node
    given to `enforce`, whichever node received it."""

    def __init__(self, limit_s: int):
        self.limit_s = limit_s
        self.received: dict[str, float] = {}  # handle -> when it was received

    @property
    def last(self) -> str:
        """The handle of the last receive, by any node."""
        return next(reversed(self.received))

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


@pytest.fixture
def h(tmp_path, aws, monkeypatch):
    monkeypatch.setattr(worker, "MIN_LEASE_S", CLAIM_S)  # a dead node's claim lapses soon
    harness = Harness(tmp_path, aws, max_retries=0, visibility_s=VISIBILITY_S)
    redrive(harness, 2)  # scaled too: a message received a third time goes to the dead-letter queue
    yield harness
    harness.stop_agents()  # the workloads the in-process agents started


def redrive(h: Harness, receives: int) -> None:
    sqs = boto3.client("sqs", region_name=h.env.region)
    dlq = sqs.get_queue_url(QueueName=naming.dead_letter_queue(h.env.name, "work"))["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    policy = json.dumps({"deadLetterTargetArn": arn, "maxReceiveCount": str(receives)})
    sqs.set_queue_attributes(QueueUrl=queue_url(h), Attributes={"RedrivePolicy": policy})


def queue_url(h: Harness) -> str:
    return boto3.client("sqs", region_name=h.env.region).get_queue_url(QueueName=naming.queue(h.env.name, "work"))[
        "QueueUrl"]


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
    harness_beat(nodes, receiving, "work")


def status(h: Harness, job: str) -> str:
    return h.items(job)["000000"].status


@pytest.mark.parametrize("taker", ["the holder", "another node"])
def test_an_item_running_past_the_queues_hold_limit_keeps_its_message_and_runs_once(h, caplog, taker):
    caplog.set_level(logging.INFO, "tidefleet.agent")
    limit = HoldLimit(LIMIT_S)
    job = sdk.submit(h.env, "long", "work", sdk.read_items([["steps=240"]]), kick=False).job_id  # 24 s: 1.5 limits
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
    job = sdk.submit(h.env, "long", "work", sdk.read_items([["steps=200"]]), kick=False).job_id
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
    sqs, url = boto3.client("sqs", region_name=h.env.region), queue_url(h)
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


def refresh(node: Agent, run) -> None:
    """Its message's refresh, due now."""
    run.held_since -= LIMIT_S
    node._refresh_due([run])


def kill(h: Harness, node: Agent) -> None:
    """The node dies with its workload."""
    for group in h._workload_groups():
        os.killpg(group, signal.SIGKILL)
    node.store = node.cloud.queues = Gone()


def finish(h: Harness, job: str, nodes: list[Agent], receiving: list[Agent], timeout_s: float = 40) -> None:
    wait_until(lambda: beat(nodes, receiving) or status(h, job) == "succeeded", timeout_s, "the item to succeed")


def test_a_fresh_copy_received_by_another_node_before_its_id_is_recorded_goes_to_its_holder(h, caplog):
    """The holder records its copy's name before it sends the copy: an idle node's long poll that
    gets the copy at once, before a slow store write records its id, hands it over. Compared with
    the recorded id alone it was dropped as a duplicate, and the item was left with no message:
    once its node died, nothing brought it back."""
    caplog.set_level(logging.INFO, "tidefleet.agent")
    limit = HoldLimit(LIMIT_S)
    job = sdk.submit(h.env, "race", "work", sdk.read_items([["steps=60"]]), kick=False).job_id
    a, b = agent(h, "node-a", limit), agent(h, "node-b", limit)
    assert a._receive("work", h.env.queues["work"], wait_s=1) == 1
    run = a.runs[0]
    real = a.store.update_item

    def slow(*args, **kwargs):  # one slow write of the copy's id (a throttled first try, a slow link)
        if kwargs.get("message_id"):
            time.sleep(0.5)
        return real(*args, **kwargs)

    a.store.update_item = slow
    poll = threading.Thread(target=b._receive, args=("work", b.env.queues["work"], 5))  # b idle, long-polling
    poll.start()
    time.sleep(0.3)
    refresh(a, run)
    poll.join()
    a.store.update_item = real
    for node in (a, b):
        node.acks.flush()
    assert "dropping" not in caplog.text and h.queue_depth("work") == 1, "the copy is kept, the old message gone"
    item = h.items(job)["000000"]
    assert (item.copy, item.receipt) == ("1.1", limit.last), "named on the record, handed over by b"
    a._beat()
    assert run.receipt == item.receipt and run.message.copy == "1.1", "the holder took the handle b received"
    kill(h, a)
    finish(h, job, [b], [b])
    assert [e["outcome"] for e in h.items(job)["000000"].history] == ["lost", "succeeded"]
    assert h.queue_depth("work", dead_letter=True) == 0


def test_a_handle_the_holder_received_itself_is_not_swapped_back_for_an_older_handed_over_one(h, caplog):
    """The record keeps a handed-over handle; the holder takes it only if it was received after
    the one it holds (`Item.receipt_at`). Taking it whenever it differed, the holder went back to
    a stale handle after each of its own receives, whose hold ran out: "could not extend", and the
    message came back until the queue's redrive dead-lettered a running item's message."""
    caplog.set_level(logging.INFO, "tidefleet.agent")
    redrive(h, 5)  # it is received three times here, on purpose
    limit = HoldLimit(LIMIT_S)
    job = sdk.submit(h.env, "stale", "work", sdk.read_items([["steps=150"]]), kick=False).job_id
    a, b = agent(h, "node-a", limit), agent(h, "node-b", limit)
    b.cordoned = True  # starts nothing: hands the message over
    assert a._receive("work", h.env.queues["work"], wait_s=1) == 1
    a.cloud.queues.release("work", [a.runs[0].receipt])  # a's visibility ran out once ...
    assert b._receive("work", b.env.queues["work"], wait_s=1) == 1  # ... and b handed the message over
    handed = h.items(job)["000000"].receipt
    a._beat()
    assert a.runs[0].receipt == handed
    for _ in range(4):  # a second passes (its lease renewed)
        time.sleep(HEARTBEAT_S)
        a._beat()
    a.cloud.queues.release("work", [handed])  # and again: a receives it itself this time
    assert a._receive("work", h.env.queues["work"], wait_s=1) == 1
    own = a.runs[0].receipt
    assert own != handed and h.items(job)["000000"].receipt == handed
    a._beat()
    assert a.runs[0].receipt == own, "the newer handle is kept"
    assert a.runs[0].held_since >= limit.received[own] - 0.5
    finish(h, job, [a], [])
    assert h.queue_depth("work", dead_letter=True) == 0
    assert "could not extend" not in caplog.text


def test_a_handle_handed_over_for_a_message_the_holder_replaced_meanwhile_never_lands(h, caplog):
    """A node received the holder's message (its visibility ran out) and read the record; the
    holder replaced that message before the node wrote its handle. Fenced on the attempt alone,
    the late handle overwrote the copy's, and the holder swapped its live handle for one of a
    deleted message: it could extend nothing, and a running item's message was dead-lettered."""
    caplog.set_level(logging.INFO, "tidefleet.agent")
    limit = HoldLimit(LIMIT_S)
    job = sdk.submit(h.env, "late", "work", sdk.read_items([["steps=150"]]), kick=False).job_id
    a, b = agent(h, "node-a", limit), agent(h, "node-b", limit)
    b.cordoned = True
    assert a._receive("work", h.env.queues["work"], wait_s=1) == 1
    run = a.runs[0]
    a.cloud.queues.release("work", [run.receipt])
    real_extend = b.cloud.queues.extend

    def extend(queue, handles, seconds):  # b hides the message, about to hand it over; meanwhile a refreshes
        out = real_extend(queue, handles, seconds)
        refresh(a, run)
        return out

    b.cloud.queues.extend = extend
    assert b._receive("work", b.env.queues["work"], wait_s=1) == 1
    b.cloud.queues.extend = real_extend
    copy = run.receipt
    assert copy and h.items(job)["000000"].receipt == "", "b's handle of the replaced message did not land"
    assert "its record no longer names this message" in caplog.text
    a._beat()
    assert run.receipt == copy
    finish(h, job, [a, b], [b])
    assert h.queue_depth("work", dead_letter=True) == 0
    assert "could not extend" not in caplog.text


@pytest.mark.parametrize("fails", ["the copy's name", "the copy's id"])
def test_a_refresh_the_store_refuses_sends_one_copy_at_most_and_backs_off(h, caplog, fails):
    """Recorded first, a refresh whose record write fails sends nothing; one whose copy's id is
    not recorded is done all the same (the copy's name says whose it is). Before, a store that
    refused the write after the send made every heartbeat send one more copy."""
    caplog.set_level(logging.INFO, "tidefleet.agent")
    limit = HoldLimit(LIMIT_S)
    job = sdk.submit(h.env, "throttled", "work", sdk.read_items([["steps=120"]]), kick=False).job_id
    a = agent(h, "node-a", limit)
    assert a._receive("work", h.env.queues["work"], wait_s=1) == 1
    run, real, failing, tries = a.runs[0], a.store.update_item, [True], []

    def update_item(*args, **kwargs):
        ours = "copy" in kwargs if fails == "the copy's name" else bool(kwargs.get("message_id"))
        if failing[0] and ours and "fence" in kwargs and kwargs["fence"].claim_at is None:
            tries.append(time.time())
            raise ClientError({"Error": {"Code": "ProvisionedThroughputExceededException", "Message": "throttled"}},
                              "UpdateItem")  # fmt: skip
        return real(*args, **kwargs)

    a.store.update_item = update_item
    run.held_since -= LIMIT_S / 2  # the refresh is due
    for _ in range(8):  # 2 s of heartbeats while the store refuses that write
        a._beat()
        time.sleep(HEARTBEAT_S)
    failing[0] = False
    a.acks.flush()
    copies = h.queue_depth("work")
    assert copies == 1, f"{copies} messages for one item"
    if fails == "the copy's name":
        gaps = [b - a for a, b in itertools.pairwise(tries)]
        assert len(tries) >= 2 and all(gap >= min(HEARTBEAT_S * 2**n, LIMIT_S / 16) - 0.05 for n, gap in
                                       enumerate(gaps)), f"tries {gaps} apart: backing off, doubling"  # fmt: skip
        wait_until(lambda: beat([a], []) or run.message.copy, 10, "the refresh to succeed once the store answers")
    else:
        assert run.message.copy.startswith("1.") and run.receipt, "replaced, and received back"
    finish(h, job, [a], [])
    assert h.queue_depth("work", dead_letter=True) == 0 and "could not extend" not in caplog.text


def test_a_copy_the_holders_own_intake_adopts_during_the_refresh_keeps_its_handle(h, caplog):
    """The heartbeat clears the handle of a refreshed run only if it is still the replaced one:
    the intake thread may have received the copy and adopted its handle meanwhile."""
    caplog.set_level(logging.INFO, "tidefleet.agent")
    limit = HoldLimit(LIMIT_S)
    job = sdk.submit(h.env, "adopted", "work", sdk.read_items([["steps=120"]]), kick=False).job_id
    a = agent(h, "node-a", limit)
    assert a._receive("work", h.env.queues["work"], wait_s=1) == 1
    run, real_send = a.runs[0], a.cloud.queues.send

    def send(queue, bodies, *, dead_letter=False):
        ids = real_send(queue, bodies, dead_letter=dead_letter)
        assert a._receive("work", a.env.queues["work"], wait_s=1) == 1  # the intake gets the copy at once
        return ids

    a.cloud.queues.send = send
    refresh(a, run)
    a.cloud.queues.send = real_send
    assert run.receipt and run.receipt == limit.last, "the copy's handle, kept"
    a.acks.flush()
    assert h.queue_depth("work") == 1
    finish(h, job, [a], [])
    assert h.queue_depth("work", dead_letter=True) == 0 and "could not extend" not in caplog.text


def test_a_copy_not_received_back_at_once_is_received_back_at_a_later_heartbeat(h, caplog):
    """A failed or empty receive-back is tried again at the next heartbeats; the refresh itself
    is reported done, and a receive error as what it is."""
    caplog.set_level(logging.INFO, "tidefleet.agent")
    limit = HoldLimit(LIMIT_S)
    job = sdk.submit(h.env, "back", "work", sdk.read_items([["steps=100"]]), kick=False).job_id
    a = agent(h, "node-a", limit)
    assert a._receive("work", h.env.queues["work"], wait_s=1) == 1
    run, real_receive = a.runs[0], a.cloud.queues.receive

    def receive(queue, most, wait_s, **kwargs):
        a.cloud.queues.receive = real_receive
        raise EndpointConnectionError(endpoint_url="http://sqs.blip")

    a.cloud.queues.receive = receive
    run.held_since -= LIMIT_S / 2
    a._beat()
    assert run.receipt == "" and "replaced its message with a fresh copy" in caplog.text
    assert "receive back its fresh copy failed" in caplog.text and "message refresh failed" not in caplog.text
    wait_until(lambda: beat([a], []) or run.receipt, 5, "the copy to be received back")
    finish(h, job, [a], [])
    assert h.queue_depth("work", dead_letter=True) == 0 and "could not extend" not in caplog.text


def test_another_items_message_a_receive_back_gets_is_made_visible_again_not_sent_again(h):
    """Sent again, a lost node's message would start at receive count 1: its claim would not
    look for the lost node (`claim.node_lost`), and the loss would go uncounted."""
    redrive(h, 5)  # the other message is received a few times here
    limit = HoldLimit(LIMIT_S)
    long_job = sdk.submit(h.env, "long", "work", sdk.read_items([["steps=100"]]), kick=False).job_id
    a = agent(h, "node-a", limit)
    assert a._receive("work", h.env.queues["work"], wait_s=1) == 1
    other = sdk.submit(h.env, "other", "work", sdk.read_items([["steps=1"]]), kick=False).job_id
    sqs, url = boto3.client("sqs", region_name=h.env.region), queue_url(h)
    (sent,) = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1)["Messages"]  # a node took it and died
    a.store.update_item(other, "000000", status="running", node="node-dead", lease_until=1.0, add={"attempts": 1})
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=sent["ReceiptHandle"], VisibilityTimeout=0)
    refresh(a, a.runs[0])  # its receive-back gets the older message first (moto answers in order)
    assert h.queue_depth("work") == 2, "the copy and the other item's message"
    got = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1, MaxNumberOfMessages=10,
                              MessageSystemAttributeNames=["ApproximateReceiveCount"])["Messages"]  # fmt: skip
    (back,) = [m for m in got if other in m["Body"]]
    assert back["MessageId"] == sent["MessageId"], "the same message, not sent again"
    assert back["Attributes"]["ApproximateReceiveCount"] == "3", "the dead node's receive, the receive-back's, ours"
    assert status(h, long_job) == "running"


def test_an_item_message_from_before_fresh_copies_parses_and_a_copys_body_round_trips():
    old = '{"job":"j-1","item":"000000","args":["x"],"failures":0,"interruptions":0,"lost":0,"seq":2}'
    assert sdk.ItemMessage.parse(old) == sdk.ItemMessage("j-1", "000000", ["x"], seq=2)
    assert sdk.ItemMessage.parse(old).body() == old, "a message that is no copy says nothing of copies"
    copy = sdk.ItemMessage("j-1", "000000", ["x"], seq=2, copy="3.1")
    assert sdk.ItemMessage.parse(copy.body()) == copy
    with pytest.raises(ValueError, match="copy: must be"):
        sdk.ItemMessage.parse(old[:-1] + ',"copy":"../x"}')
