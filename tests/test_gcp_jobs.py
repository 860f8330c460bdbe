"""The job SDK's and the agent's GCP ports through the real clients (Pub/Sub and Firestore GAPIC
clients over REST, google-auth sessions for Cloud Logging), against tests/gcp_fake.py, which
asserts the exact requests and models Pub/Sub's delivery attempts and dead-letter policy and
Firestore's preconditions."""

from __future__ import annotations

import base64
import json

import google.auth
import pytest
import responses
from google.auth.credentials import AnonymousCredentials

from tests.gcp_fake import FakeGcp, FakeVm
from tidefleet.agent.worker import Agent, Held, Settings
from tidefleet.cloud import for_env
from tidefleet.config import load_environment
from tidefleet.jobs import sdk
from tidefleet.jobs.sdk import ItemMessage
from tidefleet.logstream import cut_line
from tidefleet.records import AttemptOutcome, Heartbeat, Item, Job
from tidefleet.resources import redrive_receives

ENV = load_environment("gcp-dev")
SUB = "tidefleet-gcp-dev-default"
DLQ = "tidefleet-gcp-dev-default-dlq"
DOCS = f"/v1/projects/{ENV.project}/databases/tidefleet-gcp-dev/documents"


@pytest.fixture
def gcp(monkeypatch):
    # Application default credentials are the only thing not real: no Google account here.
    monkeypatch.setattr(google.auth, "default", lambda *a, **k: (AnonymousCredentials(), ENV.project))
    fake = FakeGcp(ENV.project, ENV.region)
    fake.add_queue(SUB, ack_deadline_s=600, max_delivery_attempts=5)
    fake.add_topic("tidefleet-gcp-dev-kick")
    with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
        fake.install(mock)
        yield fake


def calls(gcp: FakeGcp, method: str, suffix: str) -> list[dict]:
    return [c for m, path, c in gcp.calls if m == method and path.endswith(suffix)]


def published(call: dict) -> list[dict]:
    return [json.loads(base64.b64decode(m["data"])) for m in call["body"]["messages"]]


def agent(tmp_path) -> Agent:
    settings = Settings(node_id="tidefleet-gcp-dev-cpu-aaaa", instance_type="n2-standard-4", spot=True, work_dir=tmp_path)
    return Agent(ENV, "cpu", settings, metadata=object())


# -- submit, status, cancel, retry-failed, logs ---------------------------------------------
def test_submit_records_the_job_publishes_its_items_and_kicks_the_scaler_topic(gcp):
    done = sdk.submit(ENV, "nightly eval", "default", sdk.read_items(["gs://b/1", "gs://b/2"]))
    assert (done.new_items, done.sent, done.total) == (2, 2, 2)
    assert done.kick == "kicked tidefleet-gcp-dev-kick"
    job_create, job_end = calls(gcp, "PATCH", f"/jobs/{done.job_id}")
    assert job_create["query"] == {"currentDocument.exists": "false"}, "a job is created only if new"
    assert job_create["body"]["fields"]["submitting"] == {"booleanValue": True}
    assert job_end["query"]["updateMask.fieldPaths"] == ["total", "submitting"]
    (items,) = calls(gcp, "POST", "/documents:batchWrite")  # one batch, each item created only if new
    assert [w["currentDocument"] for w in items["body"]["writes"]] == [{"exists": False}] * 2
    assert calls(gcp, "PATCH", f"/jobs/{done.job_id}/sent/00000000"), "the chunk is marked sent"
    (publish,) = calls(gcp, "POST", f"/topics/{SUB}:publish")
    assert published(publish) == [
        {"job": done.job_id, "item": "000000", "args": ["gs://b/1"], "failures": 0, "interruptions": 0, "lost": 0, "seq": 0},
        {"job": done.job_id, "item": "000001", "args": ["gs://b/2"], "failures": 0, "interruptions": 0, "lost": 0, "seq": 0},
    ]
    (kick,) = calls(gcp, "POST", "/topics/tidefleet-gcp-dev-kick:publish")
    assert published(kick) == [{"tidefleet": "kick", "env": "gcp-dev", "reason": f"submit {done.job_id}"}]
    assert sdk.status(ENV, done.job_id).counts == {"succeeded": 0, "running": 0, "queued": 2, "failed": 0, "cancelled": 0}


def test_submitting_the_same_job_again_creates_and_sends_nothing_twice(gcp):
    items = sdk.read_items(["a", "b", "c"])
    first = sdk.submit(ENV, "same", "default", items)
    again = sdk.submit(ENV, "same", "default", items)
    assert (again.job_id, again.new_items, again.sent, again.kick) == (first.job_id, 0, 0, "not needed")
    assert len(gcp.bodies(SUB)) == 3


def test_a_kick_that_cannot_be_published_is_a_warning_not_an_error(gcp):
    del gcp.published["tidefleet-gcp-dev-kick"]
    done = sdk.submit(ENV, "no kick topic", "default", sdk.read_items(["a"]))
    assert done.kick.startswith("warning: could not kick the scaler") and "within 60s" in done.kick


def test_cancel_cancels_waiting_items_and_flags_the_job(gcp):
    job = sdk.submit(ENV, "to cancel", "default", sdk.read_items(["a", "b"])).job_id
    for_env(ENV).store.update_item(job, "000001", status="succeeded")
    assert sdk.cancel(ENV, job) == 1
    assert for_env(ENV).store.job(job).cancelled
    assert sdk.status(ENV, job).counts["cancelled"] == 1 and sdk.status(ENV, job).counts["succeeded"] == 1


def test_retry_failed_moves_only_this_jobs_dead_letters_back_and_releases_the_others(gcp):
    job = sdk.submit(ENV, "flaky", "default", sdk.read_items(["a"]), kick=False).job_id
    cloud = for_env(ENV)
    cloud.queues.delete("default", [d.handle for d in cloud.queues.receive("default", 10, 0)])
    cloud.store.update_item(job, "000000", status="failed", failures=4, reason="exit code 1")
    sdk.send_messages(cloud, "default", [ItemMessage(job, "000000", ["a"], failures=4)], dead_letter=True)
    sdk.send_messages(cloud, "default", [ItemMessage("other-job", "x", [], failures=4)], dead_letter=True)
    assert sdk.retry_failed(ENV, job) == 1
    assert [json.loads(b) for b in gcp.bodies(SUB)] == [
        {"job": job, "item": "000000", "args": ["a"], "failures": 0, "interruptions": 0, "lost": 0, "seq": 0}]
    assert [json.loads(b)["job"] for b in gcp.bodies(DLQ)] == ["other-job"]
    assert cloud.store.item(job, "000000").status == "queued"
    hold, release = calls(gcp, "POST", f"/subscriptions/{DLQ}:modifyAckDeadline")
    assert hold["body"]["ackDeadlineSeconds"] == 120 and "ackDeadlineSeconds" not in release["body"]  # 0: nack


def test_item_output_goes_to_the_stacks_log_with_labels_and_reads_back_per_attempt(gcp):
    logs = for_env(ENV).logs
    for attempt, text in ((2, "second"), (1, "first")):
        stream = logs.stream("default", "job-1", "item-a", attempt)
        stream.write(f"{text} line")
        stream.write(f"{text} done")
        stream.close()  # sends what it holds (flush only asks the sender thread to)
    logs.stream("default", "job-1", "item-b", 1).write("other item")
    logs.record_outcomes("default", [AttemptOutcome("job-1", "item-a", 2, "succeeded", 1.5, 1.0)])  # not output
    gcp.log_page = 1  # several pages
    (write, *_) = calls(gcp, "POST", "/entries:write")
    assert write["body"]["logName"] == f"projects/{ENV.project}/logs/tidefleet-gcp-dev-items"
    assert write["body"]["labels"] == {"job": "job-1", "item": "item-a", "attempt": "2"}
    assert [e["textPayload"] for e in write["body"]["entries"]] == ["second line", "second done"]
    assert list(logs.lines("default", "job-1", "item-a")) == [
        ("job-1/item-a/1", "first line"), ("job-1/item-a/1", "first done"),
        ("job-1/item-a/2", "second line"), ("job-1/item-a/2", "second done"),
    ]


def test_a_log_read_over_the_read_quota_waits_and_goes_on(gcp, monkeypatch):
    """The logs audit: a 429 mid-read (Cloud Logging's read quota is per minute) ended `tidefleet logs`
    in 'wait a minute and run it again', and a rerun of a big job met the same wall."""
    logs = for_env(ENV).logs
    stream = logs.stream("default", "job-1", "item-a", 1)
    for line in ("one", "two", "three"):
        stream.write(line)
    stream.close()
    slept: list[float] = []
    monkeypatch.setattr("time.sleep", slept.append)
    gcp.log_page, gcp.read_refusals = 1, 3
    assert [line for _, line in logs.lines("default", "job-1")] == ["one", "two", "three"]
    assert len(slept) == 3 and all(0 < s <= 16 for s in slept), slept  # api_core's backoff, jittered


def test_a_batch_sent_again_after_a_write_that_landed_carries_the_same_insert_ids(gcp, monkeypatch):
    """The logs audit: entries had no insertId, so a write that landed but timed out, sent again,
    stored its lines twice (Cloud Logging drops an entry whose timestamp and insertId it has), and
    lines of one timestamp could read out of order."""
    import requests

    from tidefleet.cloud.gcp import cloud_logging

    logs = for_env(ENV).logs
    stream = logs.stream("default", "job-1", "item-a", 1)
    real, landed = cloud_logging.CloudLoggingItemLogs._write, []

    def lands_then_times_out(self, entries, labels=None):
        real(self, entries, labels)
        if not landed:
            landed.append(True)
            raise requests.Timeout("no answer")

    monkeypatch.setattr(cloud_logging.CloudLoggingItemLogs, "_write", lands_then_times_out)
    batch = [(1_800_000_000.0, "one"), (1_800_000_000.0, "two")]  # one timestamp: the order is the ids'
    with pytest.raises(requests.Timeout):
        stream._send(batch)
    stream._send(batch)  # BufferedStream's retry
    stream._send([(1_800_000_001.0, "three")])
    ids = [(e["textPayload"], e["insertId"]) for e in gcp.log_entries]
    assert ids[:2] == ids[2:4], "the batch sent again names its lines as the first send did"
    assert [i for _, i in ids[2:]] == sorted({i for _, i in ids}), "one id per line, in the stream's order"


def test_long_non_ascii_output_goes_in_entries_write_requests_under_10_mb(gcp):
    stream = for_env(ENV).logs.stream("default", "job-1", "item-a", 1)
    lines = [f"{n:03d}" + "\U0001F600" * 16_000 for n in range(100)]  # JSON-escaped: ~192 KB a line
    for line in lines:
        stream.write(line)
    stream.close()
    writes = calls(gcp, "POST", "/entries:write")
    assert max(len(json.dumps(w["body"])) for w in writes) <= 10_000_000  # the API's request limit
    sent = [e["textPayload"] for w in writes for e in w["body"]["entries"]]
    assert sent == [cut_line(line, 16_000) for line in lines]  # each cut, its end saying how much


def test_a_receive_is_a_pull_whose_client_timeout_is_the_wait_and_a_held_empty_pull_is_nothing(gcp):
    queues = for_env(ENV).queues
    gcp.pull_hold_s = 30  # an empty subscription holds the pull longer than the caller waits
    assert queues.receive("default", 10, wait_s=0) == []
    gcp.publish(SUB, b"x")
    assert [d.body for d in queues.receive("default", 10, wait_s=20)] == ["x"]
    assert [c["body"] for c in calls(gcp, "POST", f"{SUB}:pull")] == [{"maxMessages": 10}] * 2  # no returnImmediately
    assert gcp.pull_timeouts == [1, 20]


def test_finished_attempts_write_one_structured_entry_each_in_one_request_for_the_outcome_metric(gcp):
    for_env(ENV).logs.record_outcomes("default", [AttemptOutcome("job-1", "item-a", 3, "failed", 12.5, 1.0),
                                                  AttemptOutcome("job-2", "item-b", 1, "succeeded", 2.0, 2.0)])
    (write,) = calls(gcp, "POST", "/entries:write")
    first, second = write["body"]["entries"]
    assert write["body"]["logName"] == f"projects/{ENV.project}/logs/tidefleet-gcp-dev-items"
    assert first["labels"] == {"job": "job-1", "item": "item-a", "attempt": "3"}
    assert first["jsonPayload"] == {"outcome": "failed", "queue": "default", "job": "job-1", "item": "item-a",
                                    "attempt": 3, "seconds": 12.5}  # fmt: skip
    assert second["labels"] == {"job": "job-2", "item": "item-b", "attempt": "1"}
    assert second["jsonPayload"]["outcome"] == "succeeded"
    assert "textPayload" not in first  # the stack's item-outcomes metric filters on jsonPayload.outcome
    for_env(ENV).logs.record_outcomes("default", [])
    assert len(calls(gcp, "POST", "/entries:write")) == 1  # nothing to say: no request


# -- the Firestore store's conditional writes -------------------------------------------------
def test_a_write_that_lost_a_race_reads_again_and_loses_no_update(gcp):
    store = for_env(ENV).store
    store.put_item_if_new(Item("j", "i", ["x"], status="running", attempts=1))
    # Another node counts an attempt between this update's read and its write.
    gcp.before_write.append(lambda: for_env(ENV).store.update_item("j", "i", add={"attempts": 1}))
    item = store.update_item("j", "i", add={"attempts": 1}, append={"history": {"outcome": "interrupted"}})
    assert item.attempts == 3 and store.item("j", "i").attempts == 3
    assert "currentDocument.updateTime" in calls(gcp, "PATCH", "/items/i")[-1]["query"], "written only over what was read"


def test_a_value_of_none_removes_the_field(gcp):
    store = for_env(ENV).store
    store.put_item_if_new(Item("j", "i", ["x"], exit_code=3))
    assert store.update_item("j", "i", exit_code=None).exit_code is None
    assert "exit_code" not in gcp.docs[f"{DOCS.removeprefix('/v1/')}/jobs/j/items/i"]


def test_jobs_since_queries_created_at_instead_of_listing_every_job(gcp):
    """`jobs --since` read the whole jobs collection and filtered here: a year of jobs for a day's."""
    store = for_env(ENV).store
    for job_id, created in (("old", 100.0), ("new", 200.0), ("newer", 300)):  # an integer too: numbers compare alike
        store.put_job(Job(job_id, job_id, "default", created, 1))
    gcp.calls.clear()
    assert [j.job_id for j in store.jobs(since=200.0)] == ["new", "newer"]
    (query,) = calls(gcp, "POST", "/documents:runQuery")
    assert query["body"]["structuredQuery"]["where"]["fieldFilter"]["field"] == {"fieldPath": "created_at"}
    assert not calls(gcp, "GET", "/jobs"), "no listing of the jobs collection"
    assert [j.job_id for j in store.jobs("default")] == ["old", "new", "newer"]  # no `since`: the listing
    assert calls(gcp, "GET", "/jobs"), "the check above sees a listing when there is one"


def test_a_gang_members_parts_are_kept_beside_the_item_by_attempt_and_node(gcp):
    store = for_env(ENV).store
    store.put_item_if_new(Item("j", "i.1", ["x"], status="running", attempts=1))
    part = {"attempt": 1, "node": "tidefleet-gcp-dev-cpu-bbbb", "rank": 1, "seconds": 12.5, "spot": True, "gpu_util_pct": None}
    store.record_part("j", "i.1", part)
    store.record_part("j", "i.1", {**part, "seconds": 13.0})  # the same attempt and node again: replaced
    store.record_part("j", "i.1", {**part, "attempt": 2})
    assert store.parts("j") == {"i.1": [{**part, "seconds": 13.0}, {**part, "attempt": 2}]}
    assert store.item("j", "i.1").history == [] and [i.item_id for i in store.items("j")] == ["i.1"]
    assert store.parts("other") == {}


# -- the agent's queue rules on Pub/Sub -----------------------------------------------------------
def test_an_item_handed_back_many_times_is_never_dead_lettered_by_pubsub(gcp, tmp_path):
    """A nack would raise the delivery attempt and Pub/Sub would dead-letter the item after
    max_delivery_attempts (5); handing back publishes a fresh message instead."""
    job = sdk.submit(ENV, "preempted a lot", "default", sdk.read_items(["a"]), kick=False).job_id
    node = agent(tmp_path)
    for _ in range(7):
        (delivery,) = node.cloud.queues.receive("default", 10, 0)
        assert delivery.deliveries == 1
        claimed = node.store.update_item(job, "000000", status="running", node=node.s.node_id, add={"attempts": 1})
        held = Held("default", delivery.handle, ItemMessage.parse(delivery.body), attempt=claimed.attempts)
        node._requeue([held], interrupted=True)
    assert gcp.bodies(DLQ) == []
    (body,) = gcp.bodies(SUB)
    assert json.loads(body)["interruptions"] == 7 and json.loads(body)["failures"] == 0
    item = node.store.item(job, "000000")
    assert (item.status, item.interruptions, item.failures) == ("queued", 7, 0)


def take_and_die(node, job: str) -> None:
    """A node receives the item, claims it (running, under a lease) and vanishes: its lease lapses."""
    from tidefleet.records import Fence

    node.cloud.queues.receive("default", 10, 0)
    node.store.update_item(job, "000000", status="running", node="node-dead", lease_until=1.0, add={"attempts": 1},
                           fence=Fence(claim_at=0.0))  # fmt: skip


def test_a_message_redelivered_after_its_ack_deadline_counts_as_a_lost_node(gcp, tmp_path):
    job = sdk.submit(ENV, "node died", "default", sdk.read_items(["a"]), kick=False).job_id
    node = agent(tmp_path)
    take_and_die(node, job)
    gcp.clock_offset += 601
    node._receive("default", ENV.queues["default"], wait_s=0)
    node.acks.flush()  # what the agent's ack thread does within ACK_FLUSH_S
    item = node.store.item(job, "000000")
    assert (item.status, item.failures, item.lost) == ("queued", 0, 1)
    assert item.history[-1]["reason"].startswith("node lost mid-attempt")
    (body,) = gcp.bodies(SUB)
    assert (json.loads(body)["failures"], json.loads(body)["lost"]) == (0, 1)


def test_the_agent_keeps_the_subscriptions_ack_deadline_and_checkpoints_to_the_artifacts_bucket(gcp, tmp_path):
    node = agent(tmp_path)
    node._prepare()
    assert node.visibility == {"default": 600}
    msg = ItemMessage("job-1", "item-a", [])
    assert node._checkpoint_uri("default", msg) == "gs://tidefleet-gcp-dev-artifacts-acme-ml-dev/checkpoints/default/job-1/item-a/"
    assert node.s.grace_s == 15.0 and type(node.node).__name__ == "GceNode"  # no scale-in protection to set


def test_nodes_lists_each_pools_managed_groups_and_heartbeats(gcp):
    gcp.groups |= {"tidefleet-gcp-dev-cpu": 1, "tidefleet-gcp-dev-cpu-od": 1}
    gcp.vms["tidefleet-gcp-dev-cpu"] = [FakeVm("tidefleet-gcp-dev-cpu-aaaa")]
    gcp.vms["tidefleet-gcp-dev-cpu-od"] = [FakeVm("tidefleet-gcp-dev-cpu-od-bbbb")]
    for_env(ENV).store.put_heartbeat(Heartbeat("tidefleet-gcp-dev-cpu-aaaa", "cpu", at=100.0, slots=2, busy_slots=1,
                                             idle_since=None, instance_type="n2-standard-4"))  # fmt: skip
    rows = {row.pool: row for row in sdk.nodes(ENV, now=130.0)}
    assert (rows["cpu"].desired, rows["cpu"].instances) == (2, 2)
    assert [(n.node_id, n.busy_slots, n.heartbeat_age_s, n.gone) for n in rows["cpu"].nodes] == [
        ("tidefleet-gcp-dev-cpu-aaaa", 1, 30.0, False)]  # fmt: skip
    assert (rows["gpu"].desired, rows["gpu"].instances, rows["gpu"].nodes) == (None, None, [])


def test_an_item_that_keeps_losing_its_node_is_dead_lettered_after_the_tolerated_losses(gcp, tmp_path):
    from tidefleet.config import NODE_LOSSES_TOLERATED

    job = sdk.submit(ENV, "node killer", "default", sdk.read_items(["a"]), kick=False).job_id
    node = agent(tmp_path)
    for _ in range(NODE_LOSSES_TOLERATED + 1):
        take_and_die(node, job)
        gcp.clock_offset += 601
        node._receive("default", ENV.queues["default"], wait_s=0)  # the next node sees it redelivered
        node.acks.flush()
        assert not gcp.bodies(DLQ) or node.store.item(job, "000000").status == "failed"
    item = node.store.item(job, "000000")
    assert (item.status, item.failures, item.lost) == ("failed", 0, NODE_LOSSES_TOLERATED + 1)
    assert f"its node was lost {NODE_LOSSES_TOLERATED + 1} times" in item.reason
    assert len(gcp.bodies(DLQ)) == 1 and not gcp.bodies(SUB)


# -- bad input and dead letters on GCP ----------------------------------------------------------
def test_a_job_name_keeps_its_items_in_firestore_too(gcp):
    first = sdk.submit(ENV, "kept", "default", sdk.read_items(["a", "b"]), kick=False)
    assert for_env(ENV).store.job(first.job_id).items_digest == sdk.items_digest(sdk.read_items(["a", "b"]))
    with pytest.raises(sdk.JobError, match="already exists with different items"):
        sdk.submit(ENV, "kept", "default", sdk.read_items(["a", "c"]), kick=False)
    assert len(gcp.bodies(SUB)) == 2


def test_an_item_pubsub_dead_lettered_after_its_delivery_attempts_is_failed_and_kept_for_retry(gcp):
    job = sdk.submit(ENV, "nodes keep dying", "default", sdk.read_items(["a"]), kick=False).job_id
    queues = for_env(ENV).queues
    for _ in range(5):  # five nodes take it and die; Pub/Sub then moves it to the dead-letter topic
        queues.receive("default", 10, 0)
        gcp.clock_offset += 601
    assert queues.receive("default", 10, 0) == [] and len(gcp.bodies(DLQ)) == 1
    (item,) = sdk.status(ENV, job).items
    receives = redrive_receives("gcp", ENV.queues["default"])
    assert (item.status, item.reason) == ("failed", f"moved to the dead-letter queue by the queue's redrive after {receives} receives")
    hold, release = calls(gcp, "POST", f"/subscriptions/{DLQ}:modifyAckDeadline")
    assert hold["body"]["ackDeadlineSeconds"] == sdk.REDRIVE_HOLD_S and "ackDeadlineSeconds" not in release["body"]
    assert sdk.retry_failed(ENV, job) == 1 and for_env(ENV).store.item(job, "000000").status == "queued"


def test_retry_failed_confirms_an_empty_pull_of_the_dead_letters_with_a_longer_one(gcp, monkeypatch):
    # A pull answers nothing when none came back before its timeout, messages or not (PullResponse:
    # "empty if there are no more messages available in the backlog, or if no messages could be
    # returned before the request timeout"); Pub/Sub has no count to ask instead.
    from tidefleet.cloud.gcp.pubsub import PubSubWorkQueues

    job = sdk.submit(ENV, "slow pull", "default", sdk.read_items(["a"]), kick=False).job_id
    cloud = for_env(ENV)
    cloud.queues.delete("default", [d.handle for d in cloud.queues.receive("default", 10, 0)])
    cloud.store.update_item(job, "000000", status="failed", failures=4, reason="exit code 1")
    sdk.send_messages(cloud, "default", [ItemMessage(job, "000000", ["a"], failures=4)], dead_letter=True)
    real = PubSubWorkQueues.receive

    def timed_out_short(self, queue, max_messages, wait_s, *, dead_letter=False, hold_s=None):
        if dead_letter and not wait_s:
            return []  # the 1-s pull's timeout came first
        return real(self, queue, max_messages, wait_s, dead_letter=dead_letter, hold_s=hold_s)

    monkeypatch.setattr(PubSubWorkQueues, "receive", timed_out_short)
    assert sdk.retry_failed(ENV, job) == 1
    assert cloud.store.item(job, "000000").status == "queued" and gcp.bodies(DLQ) == []


def test_a_retry_failed_whose_publish_fails_nacks_its_dead_letters_and_a_rerun_sends_them(gcp, monkeypatch):
    from google.api_core import exceptions as gexc

    from tidefleet.cloud.gcp.pubsub import PubSubWorkQueues

    job = sdk.submit(ENV, "throttled", "default", sdk.read_items(["a"]), kick=False).job_id
    cloud = for_env(ENV)
    cloud.queues.delete("default", [d.handle for d in cloud.queues.receive("default", 10, 0)])
    cloud.store.update_item(job, "000000", status="failed", failures=4, reason="exit code 1")
    sdk.send_messages(cloud, "default", [ItemMessage(job, "000000", ["a"], failures=4)], dead_letter=True)
    real = PubSubWorkQueues.send

    def refused(self, queue, bodies, *, dead_letter=False):
        if not dead_letter:
            raise gexc.TooManyRequests("quota exceeded")
        return real(self, queue, bodies, dead_letter=dead_letter)

    monkeypatch.setattr(PubSubWorkQueues, "send", refused)
    with pytest.raises(gexc.TooManyRequests):
        sdk.retry_failed(ENV, job)
    hold, release = calls(gcp, "POST", f"/subscriptions/{DLQ}:modifyAckDeadline")
    assert hold["body"]["ackDeadlineSeconds"] == sdk.RETRY_HOLD_S and "ackDeadlineSeconds" not in release["body"]
    monkeypatch.setattr(PubSubWorkQueues, "send", real)
    assert sdk.retry_failed(ENV, job) == 1, "nacked: the rerun finds it at once"
    assert cloud.store.item(job, "000000").status == "queued" and gcp.bodies(DLQ) == [] and len(gcp.bodies(SUB)) == 1


def test_status_pulls_an_empty_dead_letter_subscription_once(gcp):
    job = sdk.submit(ENV, "quick", "default", sdk.read_items(["a"]), kick=False).job_id
    assert sdk.status(ENV, job).counts["queued"] == 1
    assert len(calls(gcp, "POST", f"{DLQ}:pull")) == 1, "interactive: no longer pull to confirm"


def test_a_queue_whose_subscription_is_not_deployed_is_named_and_leaves_no_job(gcp):
    del gcp.subscriptions[SUB]
    with pytest.raises(sdk.JobError) as err:
        sdk.submit(ENV, "no queue", "default", sdk.read_items(["a"]), kick=False)
    assert str(err.value).startswith(f"queues.default: Pub/Sub subscription '{SUB}' does not exist in project "
                                     f"{ENV.project}; it was added after the last deploy")  # fmt: skip
    assert for_env(ENV).store.job(sdk.job_id_for("no queue")) is None
