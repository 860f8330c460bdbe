"""Fault injection into the agent, in-process against the moto server: whatever breaks while an
attempt runs, it ends in exactly one recorded outcome and the node goes idle; a message that can
never be an item goes to the dead-letter queue once, with its reason, and creates no record."""

from __future__ import annotations

import json
import logging
import os
import threading
import time

import boto3
import pytest
from agent_harness import Harness, wait_until
from botocore.exceptions import ClientError

from tidefleet import naming
from tidefleet.agent import runner, worker
from tidefleet.agent.worker import Agent, Settings
from tidefleet.cloud.aws.imds import Metadata
from tidefleet.jobs import sdk
from tidefleet.records import FINAL, ItemWrite

pytestmark = pytest.mark.moto


@pytest.fixture
def h(tmp_path, aws):
    return Harness(tmp_path, aws)


def agent(h: Harness, item_user: str | None = None, heartbeat_s: float = 0.5, **pool_changes) -> Agent:
    env = h.env
    if pool_changes:
        pools = {**env.pools, "cpu": env.pools["cpu"].model_copy(update=pool_changes)}
        env = env.model_copy(update={"pools": pools})
    node = Agent(env, "cpu", Settings(node_id="node-x", instance_type="c6i.large", spot=True, work_dir=h.tmp / "work",
                                      checkpoint_root=h.tmp / "checkpoints", heartbeat_s=heartbeat_s, wait_s=0,
                                      item_user=item_user),
                 metadata=Metadata("http://127.0.0.1:9"))  # fmt: skip
    node._prepare()
    return node


def run_one(node: Agent) -> None:
    assert node._receive("work", node.env.queues["work"], wait_s=1) == 1
    wait_until(lambda: not node.runs, 30, "the attempt to settle")
    assert node.idle_since is not None, "the node is idle again"
    node.records.flush()  # what the agent's flush thread does within ACK_FLUSH_S


def throttle_records(node: Agent, times: int) -> None:
    """The job store refuses the node's next `times` record flushes (DynamoDB throttling)."""
    real, down = node.store.update_items, [times]

    def update_items(writes):
        if down[0]:
            down[0] -= 1
            raise ClientError({"Error": {"Code": "ThrottlingException", "Message": "Rate exceeded"}},
                              "TransactWriteItems")  # fmt: skip
        return real(writes)

    node.store.update_items = update_items


def dead_letters(h: Harness) -> list[str]:
    sqs = boto3.client("sqs", region_name="us-east-1")
    url = sqs.get_queue_url(QueueName=naming.dead_letter_queue(h.env.name, "work"))["QueueUrl"]
    return [m["Body"] for m in sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", [])]


FAULTS = [
    ("a command with an unclosed quote", {"command": "python -c 'print(1)"}, ["x"], "No closing quotation"),
    ("a program that does not exist", {"command": "/no/such/program"}, ["x"], "could not start '/no/such/program'"),
]


@pytest.mark.parametrize(("case", "pool", "args", "reason"), FAULTS, ids=[f[0] for f in FAULTS])
def test_a_runner_failure_fails_that_item_with_its_reason_and_the_node_goes_idle(h, case, pool, args, reason):
    job = sdk.submit(h.env, "faults", "work", sdk.read_items([args]), kick=False).job_id
    node = agent(h, **pool)
    run_one(node)
    item = h.items(job)["000000"]
    assert item.status == "queued" and item.failures == 1 and reason in item.reason, item.reason
    assert [e["outcome"] for e in item.history] == ["failed"]


def test_an_exception_anywhere_in_the_runner_is_one_failed_outcome(h, monkeypatch):
    job = sdk.submit(h.env, "raises", "work", sdk.read_items([["steps=1"]]), kick=False).job_id
    node = agent(h)
    monkeypatch.setattr(runner, "workload_command", lambda *a: (_ for _ in ()).throw(KeyError("boom")))
    run_one(node)
    item = h.items(job)["000000"]
    assert item.status == "queued" and "could not run the item: KeyError" in item.reason


def test_a_failing_log_endpoint_never_fails_the_item(h):
    job = sdk.submit(h.env, "no logs", "work", sdk.read_items([["steps=1"]]), kick=False).job_id
    node = agent(h)
    node.cloud.logs.logs = boto3.client("logs", region_name="us-east-1", endpoint_url="http://127.0.0.1:9")
    run_one(node)
    assert h.items(job)["000000"].status == "succeeded"


POISON = [
    ("not JSON", lambda job: "{{{", "not JSON"),
    ("not an item message", lambda job: json.dumps({"hello": 1}), "not a tidefleet item message"),
    ("an argument that is not a string", lambda job: json.dumps({"job": job, "item": "000000", "args": [1]}), "args"),
    ("an argument with a NUL byte", lambda job: json.dumps({"job": job, "item": "000000", "args": ["a\0b"]}), "NUL"),
    # JSON's "\ud800" reads as a str no queue or store can carry: submit refuses it, so must the agent.
    ("an argument with a lone surrogate", lambda job: json.dumps({"job": job, "item": "000000",
                                                                  "args": ["steps=1", "x\ud800y"]}),
     "args[1] is not valid text (a lone surrogate '\\ud800' at character 2)"),
    # json.loads raises RecursionError, not ValueError, for nesting this deep (3 KB of brackets).
    ("JSON nested too deeply", lambda job: "[" * 1500 + "]" * 1500, "not JSON (nested too deeply"),
    ("an item id that climbs out of its folder", lambda job: json.dumps({"job": job, "item": "../x", "args": []}),
     "item: not a valid id"),
    ("a negative counter", lambda job: json.dumps({"job": job, "item": "000000", "args": [], "failures": -1}),
     "failures"),
    ("a counter that is a string", lambda job: json.dumps({"job": job, "item": "000000", "args": [], "seq": "1"}),
     "seq"),
    ("a counter too big for the store", lambda job: json.dumps({"job": job, "item": "000000", "args": [],
                                                                "seq": 2**200}), "seq: must be a whole number from 0"),
    ("a job that was never submitted", lambda job: json.dumps({"job": "nope-1", "item": "000000", "args": []}),
     "job 'nope-1' is not in the job store"),
    ("an item the job does not have", lambda job: json.dumps({"job": job, "item": "999999", "args": []}),
     "is not in the job store"),
]


@pytest.mark.parametrize(("case", "body", "reason"), POISON, ids=[p[0] for p in POISON])
def test_a_poison_message_goes_to_the_dead_letter_queue_once_with_its_reason(h, case, body, reason):
    job = sdk.submit(h.env, "poison", "work", sdk.read_items([["steps=1"]]), kick=False).job_id
    sqs = boto3.client("sqs", region_name="us-east-1")
    url = sqs.get_queue_url(QueueName=naming.queue(h.env.name, "work"))["QueueUrl"]
    sqs.purge_queue(QueueUrl=url)
    sqs.send_message(QueueUrl=url, MessageBody=body(job))
    node = agent(h)
    assert node._receive("work", h.env.queues["work"], wait_s=1) == 1
    assert not node.runs
    (dead,) = dead_letters(h)
    envelope = json.loads(dead)
    assert reason in envelope["tidefleet_poison"] and envelope["body"] == body(job)
    assert h.queue_depth("work") == 0
    item = h.items(job)["000000"]
    assert set(h.items(job)) == {"000000"} and (item.status, item.attempts) == ("queued", 0), "no record created or touched"
    assert h.items("nope-1") == {}


AGENT_SECONDS = {"--heartbeat-s": "TIDEFLEET_AGENT_HEARTBEAT_S", "--imds-poll-s": "TIDEFLEET_IMDS_POLL_S",
                 "--grace-s": "TIDEFLEET_AGENT_GRACE_S", "--wait-s": "TIDEFLEET_AGENT_WAIT_S"}


# nan passes click's FloatRange (no comparison holds for it): a heartbeat of nan dead-lettered every
# item as "not in the job store", each loop thread spun, and a grace of nan handed items back at once.
@pytest.mark.parametrize("given", ["flag", "env"])
@pytest.mark.parametrize(("flag", "value"), [("--heartbeat-s", "0"), ("--heartbeat-s", "-5"), ("--imds-poll-s", "0"),
                                             ("--grace-s", "-1"), *[(f, v) for f in AGENT_SECONDS
                                                                    for v in ("nan", "inf", "-inf")]])
def test_a_zero_negative_or_nan_agent_interval_is_refused_with_its_name(flag, value, given):
    from click.testing import CliRunner

    from tidefleet.cli import main

    args, env = ([flag, value], {}) if given == "flag" else ([], {AGENT_SECONDS[flag]: value})
    result = CliRunner().invoke(main, ["agent", "--env", "sandbox", "--pool", "cpu", *args], env=env)
    assert result.exit_code == 2 and flag in result.output and value in result.output, result.output
    assert "Traceback" not in result.output


def _died_after_completing(h, marker_text: str, **record) -> tuple[str, Agent]:
    """An item whose first attempt claimed it, left the marker (checkpoint.complete() writes its
    attempt; an older agent's is empty) and whose node died before recording the end (`record`:
    or what it recorded instead)."""
    from tidefleet.agent.checkpoint import COMPLETE_MARKER
    from tidefleet.records import Fence

    job = sdk.submit(h.env, "completed", "work", sdk.read_items([["steps=1"]]), kick=False).job_id
    node = agent(h)
    node.store.update_item(job, "000000", **{"status": "running", "node": "node-dead", "lease_until": 1.0, **record},
                           add={"attempts": 1}, fence=Fence(claim_at=0.0))  # fmt: skip
    marker = h.tmp / "checkpoints" / naming.checkpoint_prefix("work") / job / "000000" / COMPLETE_MARKER
    marker.parent.mkdir(parents=True)
    marker.write_text(marker_text)
    return job, node


@pytest.mark.parametrize(("marker_text", "record"), [
    ("1", {}), ("", {}),
    ("1", {"status": "queued", "node": "", "append": {"history": {"attempt": 1, "outcome": "interrupted"}}}),
], ids=["the lost attempt's marker", "an older agent's marker", "a handed-back attempt's marker"])  # fmt: skip
def test_an_item_completed_by_an_attempt_whose_node_died_is_recorded_not_run_again(h, marker_text, record):
    job, node = _died_after_completing(h, marker_text, **record)
    assert node._receive("work", h.env.queues["work"], wait_s=1) == 1
    item = h.items(job)["000000"]
    assert item.status == "succeeded" and item.attempts == 2 and "earlier attempt" in item.history[-1]["reason"]
    node.acks.flush()  # deletes are batched (worker.Acks)
    assert h.events("start") == [] and h.queue_depth("work") == 0


def test_an_attempt_that_fails_after_complete_is_a_failure_and_its_retry_runs(tmp_path, aws, request):
    h = Harness(tmp_path, aws, workload="""
import os, sys
from tidefleet.agent import checkpoint
print("attempt", checkpoint.attempt(), flush=True)
checkpoint.complete()
if checkpoint.attempt() == 1:
    raise SystemExit("upload of the results failed after complete()")
""")
    request.addfinalizer(h.stop_agents)
    job = sdk.submit(h.env, "complete then fail", "work", sdk.read_items([["a"]]), kick=False).job_id
    h.start_agent("node-a")
    wait_until(lambda: h.items(job)["000000"].status in FINAL, 60, "the item's end")
    item = h.items(job)["000000"]
    assert item.status == "succeeded" and item.failures == 1 and item.attempts == 2
    assert [e["outcome"] for e in item.history] == ["failed", "succeeded"]
    assert "earlier attempt" not in item.history[-1].get("reason", "")


@pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root, as the agent on a node has")
def test_items_run_as_the_unprivileged_item_user_not_as_the_agent(h):
    import pwd

    nobody = pwd.getpwnam("nobody")
    job = sdk.submit(h.env, "as nobody", "work", sdk.read_items([["-u"]]), kick=False).job_id
    run_one(agent(h, item_user="nobody", command="id"))
    assert h.items(job)["000000"].status == "succeeded"
    assert [line for _, line in sdk.log_lines(h.env, job)] == [str(nobody.pw_uid)]


def test_a_retry_received_before_its_sender_recorded_the_failure_is_kept_not_dropped(h):
    """The sender sends the retry (seq + 1), deletes its message, then records: another node may
    receive the retry in between, while the record still says running under the sender's lease."""
    from tidefleet.records import Fence

    job = sdk.submit(h.env, "race", "work", sdk.read_items([["steps=1"]]), kick=False).job_id
    node = agent(h)
    sqs = boto3.client("sqs", region_name="us-east-1")
    url = sqs.get_queue_url(QueueName=naming.queue(h.env.name, "work"))["QueueUrl"]
    sqs.purge_queue(QueueUrl=url)
    node.store.update_item(job, "000000", status="running", node="node-a", lease_until=4e9, add={"attempts": 1},
                           fence=Fence(claim_at=0.0))  # fmt: skip
    retry = sdk.ItemMessage(job, "000000", ["steps=1"], failures=1, seq=1)
    sqs.send_message(QueueUrl=url, MessageBody=retry.body())
    assert node._receive("work", h.env.queues["work"], wait_s=1) == 1
    assert not node.runs and h.queue_depth("work") == 1, "the retry stays in the queue"
    node.store.update_item(job, "000000", status="queued", seq=1, lease_until=None, fence=Fence(attempt=1))
    wait_until(lambda: node._receive("work", h.env.queues["work"], wait_s=1), 10, "the retry to come back")
    wait_until(lambda: not node.runs, 30, "the retry to run")
    node.records.flush()  # what the agent's flush thread does within ACK_FLUSH_S
    assert h.items(job)["000000"].status == "succeeded"


def test_an_attempt_whose_claim_another_node_took_is_killed_and_records_nothing(h):
    from tidefleet.records import Fence

    job = sdk.submit(h.env, "taken", "work", sdk.read_items([["steps=300"]]), kick=False).job_id
    node = agent(h)
    assert node._receive("work", h.env.queues["work"], wait_s=1) == 1
    wait_until(lambda: h.events("start"), 30, "the workload to start")
    # This node stalled past its lease; another node claimed the item (attempt 2).
    taken = node.store.update_item(job, "000000", status="running", node="node-b", lease_until=4e9, add={"attempts": 1},
                                   fence=Fence(claim_at=4e9))  # fmt: skip
    assert taken.attempts == 2
    node._beat()  # the lease renewal finds attempt 2: this attempt is stopped at once
    wait_until(lambda: not node.runs, 30, "the superseded attempt to end")
    item = h.items(job)["000000"]
    assert (item.status, item.node, item.attempts, item.history) == ("running", "node-b", 2, []), "nothing recorded"


def test_a_store_that_fails_to_grant_a_leave_leaves_the_node_idle_and_asks_once_per_idle_period(h, monkeypatch, caplog):
    node = agent(h)
    calls = []

    def take_leave(*args):
        calls.append(args)
        raise ConnectionError("store unreachable")

    monkeypatch.setattr(node.store, "take_leave", take_leave)
    node._leave_if_granted()
    node._leave_if_granted()  # the same idle period: not asked again
    assert len(calls) == 1 and not node.retiring and not node.stopping.is_set()
    assert "could not leave the group (ConnectionError: store unreachable)" in caplog.text
    sdk.submit(h.env, "after", "work", sdk.read_items([["steps=1"]]), kick=False)
    run_one(node)  # it still takes items


def test_a_store_outage_at_a_success_record_keeps_it_and_its_message_until_it_lands_never_running_it_again(
        h, monkeypatch, caplog):  # fmt: skip
    """Successes are recorded a flush at a time (`worker.Records`); a store failure there keeps
    them for the next flush, their messages hidden meanwhile: one line, and the item runs once."""
    caplog.set_level(logging.INFO, "tidefleet.agent")
    job = sdk.submit(h.env, "flush fails", "work", sdk.read_items([["steps=1"]]), kick=False).job_id
    node = agent(h)
    throttle_records(node, times=2)
    extended, protected = [], []
    real_extend = node.cloud.queues.extend
    monkeypatch.setattr(node.cloud.queues, "extend", lambda q, handles, s: extended.append(list(handles))
                        or real_extend(q, handles, s))  # fmt: skip
    monkeypatch.setattr(node, "_protect", protected.append)
    run_one(node)  # its flush fails
    receipt = node.records.waiting()["work"][0]
    node._beat()
    assert [receipt] in extended, "its message is kept hidden while the record waits"
    assert protected == [True], "a node with an unrecorded success is not idle"
    node.records.flush()  # fails again: no second line
    node.records.flush()
    node.acks.flush()
    assert h.items(job)["000000"].status == "succeeded" and node.records.waiting() == {}
    assert h.queue_depth("work") == 0 and len(h.events("start")) == 1
    lines = [r.getMessage() for r in caplog.records if "ended item" in r.getMessage()]
    assert len(lines) == 2 and "Rate exceeded" in lines[0] and "retrying" in lines[0], lines
    assert "Traceback" not in caplog.text


def test_a_store_outage_at_a_cancelled_record_keeps_it_until_it_lands_instead_of_leaving_the_item_running(h, caplog):
    """A cancelled attempt's record goes through `worker.Records` too: before, one failed write
    left the item shown running, its message held until its visibility timeout."""
    caplog.set_level(logging.INFO, "tidefleet.agent")
    job = sdk.submit(h.env, "cancel, store down", "work", sdk.read_items([["steps=600"]]), kick=False).job_id
    node = agent(h)
    assert node._receive("work", node.env.queues["work"], wait_s=1) == 1
    wait_until(lambda: h.events("start"), 30, "the item to start")
    sdk.cancel(h.env, job)
    throttle_records(node, times=2)
    # Its heartbeat's cancel check (the job is read once a beat) stops the workload.
    wait_until(lambda: node._beat() or not node.runs, 30, "the cancelled attempt to settle")
    node.records.flush()  # fails
    assert list(node.records.waiting()) == ["work"], "kept, its message hidden"
    node.records.flush()  # fails again
    node.records.flush()
    node.acks.flush()
    item = h.items(job)["000000"]
    assert (item.status, item.history[-1]["outcome"]) == ("cancelled", "cancelled")
    assert node.records.waiting() == {} and h.queue_depth("work") == 0
    assert not h.events("done") and "Traceback" not in caplog.text


@pytest.mark.parametrize("retries", [0, 1], ids=["dead-lettered", "retried"])
def test_a_store_outage_at_a_failure_record_keeps_its_message_hidden_until_it_lands_never_a_lost_node(
        tmp_path, aws, caplog, retries):  # fmt: skip
    """Its retry (or dead letter) is sent before the record: before, one failed write left the
    held message to come back, read as a node lost mid-attempt, and sent the item once more (an
    item with no retries left ran twice, with two dead letters)."""
    caplog.set_level(logging.INFO, "tidefleet.agent")
    h = Harness(tmp_path, aws, max_retries=retries)
    job = sdk.submit(h.env, "record fails", "work", sdk.read_items([["exit=3"]]), kick=False).job_id
    node = agent(h)
    real, refused = node.store.update_item, []

    def update_item(*args, **kwargs):
        if kwargs.get("status") in ("failed", "queued") and not refused:
            refused.append(kwargs["status"])
            raise ClientError({"Error": {"Code": "ThrottlingException", "Message": "Rate exceeded"}}, "UpdateItem")
        return real(*args, **kwargs)

    node.store.update_item = update_item
    assert node._receive("work", node.env.queues["work"], wait_s=1) == 1
    wait_until(lambda: not node.runs, 30, "the attempt to settle")
    assert refused and list(node.records.waiting()) == ["work"], "kept, its message hidden"
    node.records.flush()
    node.acks.flush()
    item = h.items(job)["000000"]
    assert (item.status, item.failures, item.lost) == ("failed" if retries == 0 else "queued", 1, 0)
    assert [e["outcome"] for e in item.history] == ["failed"] and item.history[0]["exit_code"] == 3
    assert node.records.waiting() == {} and len(dead_letters(h)) == (retries == 0)
    assert h.queue_depth("work") == retries, "the held message is gone; only a retry waits"
    assert "Rate exceeded" in caplog.text and "Traceback" not in caplog.text


def test_an_end_recorded_while_the_heartbeat_keeps_it_hidden_is_no_warning(h, monkeypatch, caplog):
    """The heartbeat keeps unrecorded ends hidden while the flush thread records them and deletes
    their messages: the refusal of a message deleted meanwhile (an invalid receipt) said "could not
    keep 1 unrecorded end(s) hidden" in healthy runs."""
    caplog.set_level(logging.WARNING, "tidefleet.agent")
    sdk.submit(h.env, "flush races the beat", "work", sdk.read_items([["steps=1"]]), kick=False)
    node = agent(h)
    throttle_records(node, times=1)
    run_one(node)  # its flush fails: the end waits
    assert node.records.waiting()
    real = node.cloud.queues.extend

    def extend(queue, handles, seconds):
        node.records.flush()  # the flush thread, between the beat's read and its extend
        node.acks.flush()
        return real(queue, handles, seconds)

    monkeypatch.setattr(node.cloud.queues, "extend", extend)
    node._beat()
    assert node.records.waiting() == {} and h.queue_depth("work") == 0
    assert "could not keep" not in caplog.text


def test_a_success_whose_record_cannot_land_for_long_is_given_up_and_its_message_comes_back(h, monkeypatch, caplog):
    caplog.set_level(logging.WARNING, "tidefleet.agent")
    job = sdk.submit(h.env, "flush fails", "work", sdk.read_items([["steps=1"]]), kick=False).job_id
    node = agent(h)
    node.store.update_items = lambda writes: (_ for _ in ()).throw(ConnectionError("store unreachable"))
    monkeypatch.setattr(worker, "RECORD_KEEP_S", 0.0)
    run_one(node)
    assert node.records.waiting() == {}
    assert h.items(job)["000000"].status == "running", "not recorded, not lost: its lease lapses, it runs again"
    assert h.queue_depth("work") == 1, "its message is not deleted: it comes back"
    assert "giving up" in caplog.text and "store unreachable" in caplog.text


def test_a_success_another_attempt_already_recorded_is_not_recorded_twice_and_its_message_goes(h, caplog):
    caplog.set_level(logging.WARNING, "tidefleet.agent")
    job = sdk.submit(h.env, "raced", "work", sdk.read_items([["steps=1"]]), kick=False).job_id
    node = agent(h)
    real = node.store.update_items

    def other_node_first(writes):
        real([ItemWrite(job, "000000", {"status": "succeeded", "node": "node-b"})])  # another node, first
        return real(writes)

    node.store.update_items = other_node_first
    run_one(node)
    node.acks.flush()
    item = h.items(job)["000000"]
    assert (item.status, item.node, len(item.history)) == ("succeeded", "node-b", 0)
    assert sdk.status(h.env, job).counts["succeeded"] == 1, "counted once"
    assert h.queue_depth("work") == 0
    assert any("already final" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("stopped", ["cordoned", "retiring", "held"])
def test_a_message_received_after_the_node_stopped_taking_items_goes_back_unstarted(h, stopped):
    """The long poll began while the node took items; the scaler's cordon (or a hold, or the
    group letting it go) arrived with a heartbeat meanwhile: the message goes back to the queue
    for another node, not counted as an interruption, and nothing starts here."""
    node = agent(h)
    job = sdk.submit(h.env, "j", "work", sdk.read_items([["x"]]), kick=False).job_id
    if stopped == "held":
        node.held = {"work"}
    else:
        setattr(node, stopped, True)
    assert node._receive("work", node.env.queues["work"], wait_s=1) == 1
    assert not node.runs and not h.events("start")
    assert h.queue_depth("work") == 1
    item = h.items(job)["000000"]
    assert (item.status, item.interruptions, item.attempts) == ("queued", 0, 0)


# A workload that starts a child in its own session holding its stdout (out of reach of its
# process group's signals), then exits ("exit") or hangs in its own group ("hang").
LEAVES_A_DAEMON = """
setsid sh -c 'echo $$ > "$0"; exec sleep 600' "$1" &
echo started
[ "$2" = hang ] && exec sleep 600
printf 'last words'
"""


@pytest.fixture
def daemon(h):
    """The workload script and the pid file its daemon writes; the daemon is killed by its pid."""
    script, pid_file = h.tmp / "daemon.sh", h.tmp / "daemon.pid"
    script.write_text(LEAVES_A_DAEMON)
    yield f"sh {script} {pid_file}", pid_file
    if pid_file.exists() and pid_file.read_text().strip():
        try:
            os.kill(int(pid_file.read_text()), 9)
        except ProcessLookupError:
            pass


def _run_until_settled(node: Agent, queue: str, within_s: float) -> float:
    began = time.monotonic()
    assert node._receive(queue, node.env.queues[queue], wait_s=1) == 1
    wait_until(lambda: not node.runs, within_s, "the attempt to settle")
    seconds = time.monotonic() - began
    node.records.flush()  # what the agent's flush thread does within ACK_FLUSH_S
    return seconds


def test_a_workload_that_exits_while_its_daemon_holds_its_output_open_settles_with_its_exit_code(h, daemon):
    command, pid_file = daemon
    job = sdk.submit(h.env, "daemon", "work", sdk.read_items([["exit"]]), kick=False).job_id
    seconds = _run_until_settled(agent(h, command=command), "work", 10)
    assert pid_file.exists() and os.path.exists(f"/proc/{pid_file.read_text().strip()}"), "the daemon still runs"
    assert seconds < 6, seconds
    item = h.items(job)["000000"]
    assert (item.status, item.exit_code, item.attempts) == ("succeeded", 0, 1)
    assert [line for _, line in sdk.log_lines(h.env, job)] == ["started", "last words"]


def test_a_hung_workload_whose_daemon_holds_its_output_open_times_out(h, daemon):
    command, _ = daemon
    job = sdk.submit(h.env, "daemon", "short", sdk.read_items([["hang"]]), kick=False).job_id
    _run_until_settled(agent(h, command=command), "short", 10)  # item_timeout_s = 2
    item = h.items(job)["000000"]
    assert item.status == "failed" and item.reason.startswith("timed out after 2s") and item.exit_code == -9


def test_a_node_that_cannot_make_its_work_folder_hands_the_item_back_unspent_and_stops_taking_items(h, caplog):
    """A full or read-only disk (here: a file where the work folder goes) is the node's fault:
    failing each item it receives would dead-letter them all within a second."""
    caplog.set_level(logging.INFO, "tidefleet.agent")
    job = sdk.submit(h.env, "no disk", "work", sdk.read_items([["steps=1"]]), kick=False).job_id
    (h.tmp / "work").write_text("not a folder")
    node = agent(h)
    assert node._receive("work", node.env.queues["work"], wait_s=1) == 1
    wait_until(lambda: not node.runs, 30, "the attempt to settle")
    item = h.items(job)["000000"]
    assert (item.status, item.failures, item.interruptions) == ("queued", 0, 1), "no retry spent"
    assert [e["outcome"] for e in item.history] == ["interrupted"]
    assert h.queue_depth("work") == 1 and not h.events("start")
    assert node.stopping.is_set(), "it takes no more items; its heartbeat says draining"
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(errors) == 1 and "cannot prepare" in errors[0] and "NotADirectoryError" in errors[0], errors
    assert "Traceback" not in caplog.text


def test_an_agent_that_stops_lifts_its_scale_in_protection_as_it_leaves(h, monkeypatch):
    """Stopped by SIGTERM or the store's draining flag, the instance lives on: it must not stay
    protected from scale-in with no agent on it (an idle node counts as busy for a beat)."""
    sdk.submit(h.env, "then stop", "work", sdk.read_items([["steps=1"]]), kick=False)
    # "Just idle" is idle for less than a heartbeat: a beat of 60 s, not 0.5 s, holds the node that
    # window however slowly a loaded machine runs the attempt's end, its flush and the beat.
    node = agent(h, heartbeat_s=60.0)
    calls = []
    monkeypatch.setattr(node.node, "protect", lambda pool, node_id, on: calls.append(on))
    run_one(node)
    node._beat()
    assert calls == [True], "just idle: still protected"
    node.request_stop("SIGTERM to the agent")
    node._drain()
    node._leave()
    assert calls == [True, False]


def test_an_agent_that_leaves_waits_for_its_attempts_last_log_lines_to_go_out(h):
    """Its threads are daemons: returning from `_leave` ends the process, and with it a runner
    still sending an attempt's last lines (a slow log service) as it closes the stream."""
    node = agent(h)
    closing = object()  # an attempt's stream whose close takes a second
    node.streams.add(closing)

    def closed():
        with node.lock:
            node.streams.discard(closing)

    threading.Timer(1.0, closed).start()
    node.request_stop("SIGTERM to the agent")
    node._leave()
    assert not node.streams


def refusing_oversize(node: Agent, refuse_all: bool = False):
    """SQS refuses a message over 262,144 bytes (moto does not)."""
    real = node.cloud.queues.send

    def send(queue, bodies, dead_letter=False):
        if refuse_all or any(len(b.encode()) > 262_144 for b in bodies):
            raise RuntimeError("SQS refused 1 message(s): Message must be shorter than 262144 bytes.")
        return real(queue, bodies, dead_letter=dead_letter)

    node.cloud.queues.send = send


@pytest.mark.parametrize("refuse_all", [False, True], ids=["envelope cut to fit", "dead-letter queue refuses"])
def test_a_poison_body_too_big_to_wrap_is_cut_to_fit_and_never_stops_the_rest_of_its_batch(h, caplog, refuse_all):
    """200,000 quotes fit SQS, but JSON-escaped in the envelope they would not."""
    caplog.set_level(logging.INFO, "tidefleet.agent")
    job = sdk.submit(h.env, "with poison", "work", sdk.read_items([["steps=1"]]), kick=False).job_id
    sqs = boto3.client("sqs", region_name="us-east-1")
    url = sqs.get_queue_url(QueueName=naming.queue(h.env.name, "work"))["QueueUrl"]
    sqs.purge_queue(QueueUrl=url)
    sqs.send_message(QueueUrl=url, MessageBody='"' * 200_000)
    sqs.send_message(QueueUrl=url, MessageBody=sdk.ItemMessage(job, "000000", ["steps=1"]).body())
    node = agent(h)
    refusing_oversize(node, refuse_all)
    assert node._receive("work", h.env.queues["work"], wait_s=1) == 2
    wait_until(lambda: h.events("done"), 30, "the valid item of the batch to run")
    assert "Traceback" not in caplog.text
    if refuse_all:
        assert "could not move a poison message of work to the dead-letter queue" in caplog.text
        return
    (dead,) = dead_letters(h)
    envelope = json.loads(dead)
    assert "not JSON" in envelope["tidefleet_poison"] and "of 200000 characters" in envelope["body_truncated"]
    assert '"' * 1000 in envelope["body"] and len(dead.encode()) <= 262_144


def test_a_poison_envelope_of_any_body_fits_sqs():
    for body in ('"' * 300_000, "\U0001f600" * 70_000, "\x01" * 250_000, "short"):
        text = worker.poison_envelope("why" * 1000, body)
        envelope = json.loads(text)
        assert len(text.encode()) <= worker.POISON_ENVELOPE_MAX and body.startswith(envelope["body"])
        assert ("body_truncated" in envelope) == (envelope["body"] != body)


def refuse_sends(node: Agent, times: int = 1) -> None:
    """SQS answers the node's next `times` SendMessageBatch calls with every entry refused, as it
    may under load (a transient InternalError): the call itself succeeds."""
    sqs, left = node.cloud.queues.sqs, [times]
    real = sqs.send_message_batch

    def send_message_batch(**request):
        if not left[0]:
            return real(**request)
        left[0] -= 1
        return {"Successful": [], "Failed": [{"Id": e["Id"], "SenderFault": False, "Code": "InternalError",
                                              "Message": "We encountered an internal error. Please try again."}
                                             for e in request["Entries"]]}  # fmt: skip

    sqs.send_message_batch = send_message_batch


def test_a_cordoned_node_whose_hand_back_sqs_refuses_leaves_the_queued_item_its_message_not_dead_lettered(h, caplog):
    """A cordoned node gives back what its long poll received; SQS refusing that send is the
    cloud's passing trouble, not a message that breaks the agent."""
    caplog.set_level(logging.INFO, "tidefleet.agent")
    job = sdk.submit(h.env, "cordoned", "work", sdk.read_items([["steps=1"]]), kick=False).job_id
    node = agent(h)
    node.cordoned = True
    refuse_sends(node)
    assert node._receive("work", h.env.queues["work"], wait_s=1) == 1
    assert dead_letters(h) == [] and h.queue_depth("work") == 1, "its message is kept, not dead-lettered"
    item = h.items(job)["000000"]
    assert (item.status, item.attempts) == ("queued", 0)
    assert "could not hand back 1 item(s) of work (An error occurred (InternalError)" in caplog.text
    assert "poison" not in caplog.text


@pytest.mark.parametrize("fault", ["SQS refuses the retry's send", "the store raises an error of its own"])
def test_a_message_whose_claim_landed_is_never_dead_lettered_for_what_fails_after_it(h, monkeypatch, caplog, fault):
    """A lost node's item: the claim lands, then recording the loss fails. The record says running
    on this node, so the message is a running item's: hidden until the claim lapses, then claimed
    again (a loss, not a failure), never poison."""
    from tidefleet.records import Fence

    monkeypatch.setattr(worker, "MIN_LEASE_S", 1.0)  # a claim of 3 s (6 heartbeats)
    caplog.set_level(logging.INFO, "tidefleet.agent")
    job = sdk.submit(h.env, "lost", "work", sdk.read_items([["steps=1"]]), kick=False).job_id
    sqs = boto3.client("sqs", region_name="us-east-1")
    url = sqs.get_queue_url(QueueName=naming.queue(h.env.name, "work"))["QueueUrl"]
    (gone,) = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1)["Messages"]  # a node received it ...
    node = agent(h)
    node.store.update_item(job, "000000", status="running", node="node-dead", lease_until=1.0, add={"attempts": 1},
                           fence=Fence(claim_at=0.0))  # fmt: skip
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=gone["ReceiptHandle"], VisibilityTimeout=0)  # ... and died
    if fault == "SQS refuses the retry's send":
        refuse_sends(node)
    else:
        real, failing = node.store.update_item, [1]

        def update_item(*args, **kwargs):
            if failing[0] and kwargs.get("append"):  # the lost attempt's record: a bug, none of the cloud's errors
                failing[0] -= 1
                raise RuntimeError("the store adapter broke")
            return real(*args, **kwargs)

        monkeypatch.setattr(node.store, "update_item", update_item)
    assert node._receive("work", h.env.queues["work"], wait_s=1) == 1
    assert dead_letters(h) == [] and h.queue_depth("work") >= 1, "not dead-lettered"  # (the retry may be out too)
    item = h.items(job)["000000"]
    assert (item.status, item.node, item.attempts) == ("running", "node-x", 2)
    assert "could not start attempt 2 after claiming it" in caplog.text and "comes back in 4s" in caplog.text

    def settled() -> bool:
        node._receive("work", h.env.queues["work"], wait_s=1)
        node.records.flush()
        return h.items(job)["000000"].status == "succeeded"

    wait_until(settled, 40, "the item to run once its claim lapsed")
    item = h.items(job)["000000"]
    outcomes = [e["outcome"] for e in item.history]  # the dead node's loss and the stranded claim's: one or both
    assert item.failures == 0 and outcomes[-1] == "succeeded" and set(outcomes[:-1]) == {"lost"}, outcomes
    assert dead_letters(h) == [] and "poison" not in caplog.text


def test_a_hand_back_sqs_refuses_as_the_agent_stops_still_lets_the_node_go(h, monkeypatch, caplog):
    """The items it could not hand back keep their messages (they come back after their visibility
    timeout); the agent still records what ended, completes the lifecycle action and lifts its
    scale-in protection, and returns, with no traceback."""
    caplog.set_level(logging.INFO, "tidefleet.agent")
    job = sdk.submit(h.env, "drain", "work", sdk.read_items([["steps=300"]]), kick=False).job_id
    node = agent(h)
    assert node._receive("work", h.env.queues["work"], wait_s=1) == 1
    wait_until(lambda: h.events("start"), 30, "the workload to start")
    left, protected = [], []
    monkeypatch.setattr(node.node, "leave", lambda pool, node_id: left.append(node_id))
    monkeypatch.setattr(node.node, "protect", lambda pool, node_id, on: protected.append(on))
    monkeypatch.setattr(node, "_prepare", lambda: None)
    monkeypatch.setattr(node, "_intake", lambda: node.request_stop("spot notice"))
    node.lifecycle_terminating = True
    refuse_sends(node)
    assert node.run() == 0
    assert left == ["node-x"] and protected[-1] is False and node.finished.is_set()
    item = h.items(job)["000000"]
    assert (item.status, item.node, item.interruptions) == ("running", "node-x", 0), "not recorded as handed back"
    assert h.queue_depth("work") == 1 and dead_letters(h) == []
    assert "could not hand back 1 item(s) of work" in caplog.text and "Traceback" not in caplog.text


# -- a tick letting an idle node go while it takes an item (`Agent._claim_work`, `let_idle_go`) --
def test_an_idle_node_the_scaler_lets_go_starts_nothing_it_receives_hands_it_back_whole_and_stops(h, caplog):
    """The tick saw the node idle and marked it draining; the node received an item before its
    next heartbeat read the mark. Started, the item would be interrupted by the termination that
    follows (a gang's whole attempt)."""
    caplog.set_level(logging.INFO, "tidefleet.agent")
    node = agent(h)
    node._beat()  # its heartbeat shows it idle
    shown = node.store.heartbeat("cpu", "node-x").idle_since
    assert node.store.let_idle_go("cpu", "node-x", shown) is True  # the tick, as the node receives
    job = sdk.submit(h.env, "late", "work", sdk.read_items([["steps=1"]]), kick=False).job_id
    assert node._receive("work", h.env.queues["work"], wait_s=1) == 1
    assert not node.runs and node.stopping.is_set() and "letting this idle node go" in node.stop_reason
    item = h.items(job)["000000"]
    assert (item.status, item.attempts, item.interruptions) == ("queued", 0, 0)
    assert h.queue_depth("work") == 1 and not h.events("start"), "its message is back, and nothing ran"


def test_a_node_that_claimed_work_is_not_let_go_by_a_tick_that_saw_it_idle(h):
    node = agent(h)
    node._beat()
    shown = node.store.heartbeat("cpu", "node-x").idle_since
    sdk.submit(h.env, "taken", "work", sdk.read_items([["steps=1"]]), kick=False)
    run_one(node)
    assert node.store.let_idle_go("cpu", "node-x", shown) is False  # the tick that saw it idle comes too late
    assert not node.store.heartbeat("cpu", "node-x").draining and not node.stopping.is_set()


def test_a_node_claims_work_once_per_idle_period_its_heartbeat_showed_and_not_otherwise(h, monkeypatch):
    """The claim is one more write, only where a tick could be letting the node go."""
    node = agent(h)
    claims = []
    real = node.store.claim_work
    monkeypatch.setattr(node.store, "claim_work", lambda *a: claims.append(a) or real(*a))
    sdk.submit(h.env, "unseen", "work", sdk.read_items([["steps=1"]]), kick=False)
    run_one(node)  # idle since it started, but no heartbeat showed it: no tick can have seen it idle
    assert claims == []
    node._beat()
    sdk.submit(h.env, "seen", "work", sdk.read_items([["steps=1"], ["steps=1"]]), kick=False)
    assert node._receive("work", h.env.queues["work"], wait_s=1) == 2  # both slots: one claim for both
    wait_until(lambda: not node.runs, 30, "the attempts to settle")
    assert [c[:2] for c in claims] == [("cpu", "node-x")]


def test_a_claim_that_starts_nothing_leaves_the_node_idle_from_then_for_a_tick_to_let_go(h):
    """A claim, then nothing to start (the item's claim refused, a gang already full): kept
    forever otherwise, its claim newer than the idle time its heartbeats went on showing."""
    node = agent(h)
    node._beat()
    shown = node.store.heartbeat("cpu", "node-x").idle_since
    assert node._claim_work() and not node.runs
    assert node.store.let_idle_go("cpu", "node-x", shown) is False
    node._beat()
    again = node.store.heartbeat("cpu", "node-x").idle_since
    assert again > shown and node.store.let_idle_go("cpu", "node-x", again) is True
