"""An idle node's claim of work (`JobStore.claim_work`) on Firestore while its own document keeps
changing between the store's read and conditional write (its heartbeat thread, the scaler's
cordon, preempt or leave writes land in between), against tests/gcp_fake.py.

The write is conditioned on the document's update time, so each such write loses its race. Once
the retries run out that is a write the store could not make (`firestore.GaveUp`, one of the
cloud's errors), never False: False tells the agent the scaler marked the node draining, and the
agent stops a healthy node for it. DynamoDB's conditional write looks at `draining` only, so a
heartbeat never refuses a claim there."""

from __future__ import annotations

import logging
import time

import pytest

from tests.test_gcp_agent_store_contention import rival_writer
from tests.test_gcp_jobs import DLQ, ENV, SUB, gcp  # noqa: F401 - gcp is a fixture
from tidefleet.agent.worker import Agent, Settings
from tidefleet.cloud import for_env
from tidefleet.cloud.gcp import firestore
from tidefleet.cloud.gcp.metadata import GceMetadata
from tidefleet.jobs import sdk
from tidefleet.records import Heartbeat

NODE = "tidefleet-gcp-dev-cpu-aaaa"


def test_a_claim_that_keeps_losing_to_writes_on_the_node_document_raises_and_is_never_a_drain_mark(gcp):  # noqa: F811
    store = for_env(ENV).store
    now = time.time()
    store.put_heartbeat(Heartbeat(NODE, "cpu", at=now, slots=2, busy_slots=0, idle_since=now))
    with rival_writer(gcp, f"/pools/cpu/nodes/{NODE}"), pytest.raises(firestore.GaveUp) as caught:
        store.claim_work("cpu", NODE, now + 1)
    assert isinstance(caught.value, for_env(ENV).errors), "a refused call to every caller"
    assert f"still changing after {firestore.WRITE_RACES} attempts" in str(caught.value)
    assert not store.heartbeat("cpu", NODE).draining
    # Once the document is quiet again the claim lands; a node marked draining still gets False.
    assert store.claim_work("cpu", NODE, now + 2) is True
    assert store.let_idle_go("cpu", NODE, now) is False, "the claim keeps it"
    store.mark_draining("cpu", NODE)
    assert store.claim_work("cpu", NODE, now + 3) is False


def test_a_contended_let_go_still_keeps_the_node(gcp):  # noqa: F811
    """The scaler's side of the race stays as it was: a write it could not make keeps the node."""
    store = for_env(ENV).store
    now = time.time()
    store.put_heartbeat(Heartbeat(NODE, "cpu", at=now, slots=2, busy_slots=0, idle_since=now))
    with rival_writer(gcp, f"/pools/cpu/nodes/{NODE}"):
        assert store.let_idle_go("cpu", NODE, now) is False
    assert not store.heartbeat("cpu", NODE).draining


def test_an_idle_node_whose_claim_keeps_losing_hands_the_item_back_and_keeps_running(gcp, tmp_path, caplog):  # noqa: F811
    caplog.set_level(logging.INFO, "tidefleet.agent")
    job = sdk.submit(ENV, "contended claim", "default", sdk.read_items([["ok"]]), kick=False).job_id
    node = Agent(ENV, "cpu", Settings(node_id=NODE, instance_type="n2-standard-4", spot=False,
                                      work_dir=tmp_path / "work", checkpoint_root=tmp_path / "checkpoints",
                                      heartbeat_s=0.2, wait_s=0),
                 metadata=GceMetadata("http://127.0.0.1:9", timeout_s=0.2))  # fmt: skip
    node._prepare()
    node._beat()  # its heartbeat shows it idle: the next item it takes is claimed first
    with rival_writer(gcp, f"/pools/cpu/nodes/{NODE}"):
        assert node._receive("default", ENV.queues["default"], wait_s=0) == 1
    assert not node.stopping.is_set(), f"a healthy node stopped: {node.stop_reason}"
    assert not node.runs and node.store.item(job, "000000").status == "queued", "nothing started"
    assert not node.store.heartbeat("cpu", NODE).draining
    said = [r.getMessage() for r in caplog.records if r.name == "tidefleet.agent" and r.levelno >= logging.WARNING]
    assert len(said) == 1 and "still changing" in said[0] and "redelivers it" in said[0], said
    # Its message comes back once its ack deadline passes, as after any refused call.
    gcp.clock_offset += gcp.subscriptions[SUB].ack_deadline_s + 1
    assert gcp.bodies(SUB), "the item's message is still in the queue"
    assert gcp.bodies(DLQ) == []
