"""A job store that gives up on a contended write, met by the agent where it records, in-process
on GCP ports against tests/gcp_fake.py: another writer changes the item's Firestore document
between each of the store's reads and writes, so the real `FirestoreStore` gives up after its
retries (`firestore.GaveUp`). Wherever that happens (the claim, the record of an attempt's end, the
lease renewal at a heartbeat) the agent logs one line, no traceback, and the item is not lost: it
runs and succeeds, nothing dead-lettered."""

from __future__ import annotations

import contextlib
import logging
import sys

import pytest

from tests.agent_harness import wait_until
from tests.test_gcp_jobs import DLQ, ENV, SUB, gcp  # noqa: F401 - gcp is a fixture
from tidefleet.agent import worker
from tidefleet.agent.worker import Agent, Settings
from tidefleet.cloud.gcp import firestore
from tidefleet.cloud.gcp.metadata import GceMetadata
from tidefleet.jobs import sdk

# Fails its first attempt when asked to; holds until the test's go (RELEASE exists).
WORKLOAD = """
import os, sys, time
with open(os.environ["LEDGER"], "a") as f:
    f.write(os.environ["TIDEFLEET_ATTEMPT"] + "\\n")
deadline = time.monotonic() + 30
while not os.path.exists(os.environ["RELEASE"]):
    if time.monotonic() > deadline:
        sys.exit("never released")
    time.sleep(0.02)
sys.exit(3 if sys.argv[1] == "fail-first" and os.environ["TIDEFLEET_ATTEMPT"] == "1" else 0)
"""


@pytest.fixture
def env(tmp_path):
    script = tmp_path / "workload.py"
    script.write_text(WORKLOAD)
    pool = ENV.pools["cpu"].model_copy(update={
        "command": f"{sys.executable} {script}",
        "env": {"RELEASE": str(tmp_path / "release"), "LEDGER": str(tmp_path / "ledger")},
    })  # fmt: skip
    return ENV.model_copy(update={"pools": {**ENV.pools, "cpu": pool}})


@contextlib.contextmanager
def rival_writer(gcp, document: str):  # noqa: F811 - the fixture's value
    """Inside the block, another writer changes `document` between each read and conditional
    write of it (its write lands first), so every such write of the store loses its race."""
    real = gcp._precondition_failed

    def precondition_failed(name: str, query: dict):
        if name.endswith(document) and "currentDocument.updateTime" in query:
            gcp.versions[name] = gcp.versions.get(name, 0) + 1
        return real(name, query)

    gcp._precondition_failed = precondition_failed
    try:
        yield
    finally:
        del gcp._precondition_failed  # the fake's own again


PLACES = ["the claim", "the record of a failure", "the record of a success", "the lease renewal at a heartbeat"]


@pytest.mark.parametrize("place", PLACES)
def test_a_store_that_gives_up_on_a_contended_write_costs_one_line_and_never_the_item(
        gcp, env, tmp_path, monkeypatch, caplog, place):  # noqa: F811 - gcp is a fixture  # fmt: skip
    caplog.set_level(logging.INFO, "tidefleet.agent")
    monkeypatch.setattr(worker, "MIN_LEASE_S", 1.0)  # a claim of 1.2 s: one whose end went unrecorded lapses soon
    arg = "fail-first" if place == "the record of a failure" else "ok"
    job = sdk.submit(env, "contended", "default", sdk.read_items([[arg]]), kick=False).job_id
    node = Agent(env, "cpu", Settings(node_id="tidefleet-gcp-dev-cpu-aaaa", instance_type="n2-standard-4", spot=False,
                                      work_dir=tmp_path / "work", checkpoint_root=tmp_path / "checkpoints",
                                      heartbeat_s=0.2, wait_s=0),
                 metadata=GceMetadata("http://127.0.0.1:9", timeout_s=0.2))  # fmt: skip
    node._prepare()
    store, queue = node.store, env.queues["default"]
    contended = rival_writer(gcp, f"/jobs/{job}/items/000000")
    release, ledger = tmp_path / "release", tmp_path / "ledger"
    if place == "the claim":
        release.touch()
        with contended:
            assert node._receive("default", queue, wait_s=0) == 1
        assert not node.runs and store.item(job, "000000").status == "queued", "not claimed, nothing started"
        gcp.clock_offset += gcp.subscriptions[SUB].ack_deadline_s + 1  # its message comes back
    else:
        assert node._receive("default", queue, wait_s=0) == 1
        wait_until(ledger.exists, 30, "the workload to start")
        with contended:
            if place == "the lease renewal at a heartbeat":
                node._beat()
            else:
                release.touch()
                wait_until(lambda: not node.runs, 30, "the attempt to settle")
                node.records.flush()  # a success is recorded at a flush
        release.touch()

    def succeeded() -> bool:
        node._receive("default", queue, wait_s=0)
        node.records.flush()
        return store.item(job, "000000").status == "succeeded"

    wait_until(succeeded, 40, "the item to run and succeed")
    gcp.clock_offset += gcp.subscriptions[SUB].ack_deadline_s + 1  # a message left held comes back: dropped
    node._receive("default", queue, wait_s=0)
    node.acks.flush()
    assert gcp.bodies(SUB) == [] and gcp.bodies(DLQ) == [], "its messages acked, none dead-lettered"
    agent_log = [r for r in caplog.records if r.name == "tidefleet.agent"]
    said = [r.getMessage() for r in agent_log if r.levelno >= logging.WARNING]
    assert len(said) == 1 and f"still changing after {firestore.WRITE_RACES} attempts" in said[0], said
    assert "\n" not in said[0] and not any(r.exc_info for r in agent_log), "no traceback"
