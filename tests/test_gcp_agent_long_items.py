"""Items that run longer than Pub/Sub keeps a message, in-process on GCP ports against
tests/gcp_fake.py: Pub/Sub drops a message its subscription's retention (7 days) after its
publish, leased or not, scaled here to seconds with the agent's refresh (a day is a second). Such
an item keeps a message that another node can take if its node dies, and runs once (the
Pub/Sub side of tests/test_agent_long_items.py)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
import time

import pytest

from tests.agent_harness import Gone, wait_until
from tests.agent_harness import beat as harness_beat
from tests.test_gcp_jobs import DLQ, ENV, SUB, calls, gcp  # noqa: F401 - gcp is a fixture
from tidefleet.agent import worker
from tidefleet.agent.worker import Agent, Settings
from tidefleet.cloud import for_env
from tidefleet.cloud.gcp.metadata import GceMetadata
from tidefleet.cloud.gcp.pubsub import PubSubWorkQueues
from tidefleet.jobs import sdk
from tidefleet.resources import PUBSUB_RETENTION_S

DAY_S = 1.0  # a day, scaled
SCALE = DAY_S / 86400
RETENTION_S = PUBSUB_RETENTION_S * SCALE  # 7 s from the publish
HEARTBEAT_S = 0.25
ACK_DEADLINE_S = 3  # longer than a claim (2 s): a dead node's message comes back after its claim lapsed
AGENTS: list[Agent] = []  # this test's, for the teardown

WORKLOAD = """
import json, os, sys, time
def record(event):
    with open(os.environ["LEDGER"], "a") as f:
        f.write(json.dumps({"event": event, "attempt": int(os.environ["TIDEFLEET_ATTEMPT"])}) + "\\n")
record("start")
time.sleep(float(sys.argv[1]))
record("done")
"""


@pytest.fixture
def env(gcp, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setattr(worker, "MIN_LEASE_S", 2.0)  # claims of 2 s (8 heartbeats): a dead node's lapses soon
    sub = gcp.subscriptions[SUB]
    sub.retention_s, sub.ack_deadline_s = RETENTION_S, ACK_DEADLINE_S
    sub.max_delivery_attempts = 2  # the redrive scaled too: a message received a third time is dead-lettered
    script = tmp_path / "workload.py"
    script.write_text(WORKLOAD)
    pool = ENV.pools["cpu"].model_copy(update={"command": f"{sys.executable} {script}",
                                               "env": {"LEDGER": str(tmp_path / "ledger.jsonl")}})  # fmt: skip
    yield ENV.model_copy(update={"pools": {**ENV.pools, "cpu": pool}})
    for node in AGENTS:  # the workloads the in-process agents left running
        for run in node.runs:
            if run.workload.proc and run.workload.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(run.workload.proc.pid, signal.SIGKILL)
    AGENTS.clear()


def agent(env, tmp_path, node_id: str) -> Agent:
    node = Agent(env, "cpu", Settings(node_id=node_id, instance_type="n2-standard-4", spot=False,
                                      work_dir=tmp_path / node_id, heartbeat_s=HEARTBEAT_S, wait_s=0),
                 metadata=GceMetadata("http://127.0.0.1:9", timeout_s=0.2))  # fmt: skip
    node._prepare()
    # Pub/Sub's hold, scaled as its retention: on code that sets none the item outlives its message.
    hold = PubSubWorkQueues.max_hold_s
    node.cloud.queues.max_hold_s = None if hold is None else hold * SCALE
    AGENTS.append(node)
    return node


def beat(nodes: list[Agent], receiving: list[Agent]) -> None:
    harness_beat(nodes, receiving, "default")


def ledger(tmp_path, event: str) -> list[int]:
    path = tmp_path / "ledger.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return [r["attempt"] for r in rows if r["event"] == event]


def item(env, job: str):
    return for_env(env).store.item(job, "000000")


def submit(env, seconds: float) -> str:
    return sdk.submit(env, "long", "default", sdk.read_items([[str(seconds)]]), kick=False).job_id


@pytest.mark.parametrize("taker", ["the holder", "another node"])
def test_an_item_that_waited_then_runs_past_pubsubs_retention_keeps_its_message_and_runs_once(
    gcp, env, tmp_path, caplog, taker  # noqa: F811
):
    caplog.set_level(logging.INFO, "tidefleet.agent")
    job = submit(env, 8 * DAY_S)  # ends 9 days after its publish, 2 past its message's retention
    time.sleep(DAY_S)  # a day waiting
    a, b = agent(env, tmp_path, "tidefleet-gcp-dev-cpu-aaaa"), agent(env, tmp_path, "tidefleet-gcp-dev-cpu-bbbb")
    assert a._receive("default", env.queues["default"], wait_s=1) == 1
    first = (a.runs[0].receipt, item(env, job).message_id)
    if taker == "another node":  # its pull is first to the fresh copy, every time
        a.cloud.queues.receive = lambda *args, **kwargs: []
    wait_until(lambda: beat([a, b], [b]) or item(env, job).status == "succeeded", 40, "the long item to succeed")
    done = item(env, job)
    assert (done.attempts, [e["outcome"] for e in done.history]) == (1, ["succeeded"])
    assert ledger(tmp_path, "start") == [1], "run once: the fresh copies were never claimed"
    # Its last copy may be out (or with the other node) as it ends: a claim drops it then.
    wait_until(lambda: beat([a, b], [b]) or gcp.bodies(SUB) == [], 10, "its last message to go")
    assert gcp.expired == [], "no message of the item outlived Pub/Sub's retention"
    assert done.message_id != first[1], "a fresh copy recorded as the attempt's message"
    acked = [i for c in calls(gcp, "POST", f"{SUB}:acknowledge") for i in c["body"]["ackIds"]]
    assert first[0] in acked, "the replaced message acknowledged"
    assert gcp.bodies(DLQ) == [], "no receive of its message reached the dead-letter policy"
    refreshed = [r.getMessage() for r in caplog.records if "fresh copy" in r.getMessage()]
    assert len(refreshed) >= 2 and all(line.startswith(f"{job}/000000") for line in refreshed), refreshed
    assert "could not extend" not in caplog.text and "Traceback" not in caplog.text


def test_a_long_item_whose_node_dies_after_its_first_message_would_have_expired_finishes_on_another_node(
    gcp, env, tmp_path  # noqa: F811
):
    job = submit(env, 9 * DAY_S)
    published = time.monotonic()
    a, b = agent(env, tmp_path, "tidefleet-gcp-dev-cpu-aaaa"), agent(env, tmp_path, "tidefleet-gcp-dev-cpu-bbbb")
    assert a._receive("default", env.queues["default"], wait_s=1) == 1
    a.cloud.queues.receive = lambda *args, **kwargs: []  # the other node takes the fresh copies and hands them over
    wait_until(lambda: beat([a, b], [b]) or time.monotonic() - published > RETENTION_S + HEARTBEAT_S, 20,
               "the item's first message to pass its retention")  # fmt: skip
    assert item(env, job).status == "running" and a.runs
    os.killpg(a.runs[0].workload.proc.pid, signal.SIGKILL)  # the node dies with its workload
    a.store = a.cloud.queues = Gone()
    wait_until(lambda: beat([b], [b]) or item(env, job).status == "succeeded", 40, "another node to finish the item")
    done = item(env, job)
    assert [e["outcome"] for e in done.history] == ["lost", "succeeded"]
    assert len(ledger(tmp_path, "start")) == 2 and len(ledger(tmp_path, "done")) == 1
    assert done.node == "tidefleet-gcp-dev-cpu-bbbb" and gcp.bodies(DLQ) == [] and gcp.expired == []
