"""The real agent loop on GCP ports, in-process: Pub/Sub, Firestore and Cloud Logging through the
real clients against tests/gcp_fake.py, the GCE preemption notice from a metadata server on
loopback, and a real workload process."""

from __future__ import annotations

import json
import os
import sys
import threading
import time

import pytest

from tests.gcp_fake import FakeVm
from tests.test_gcp_agent_metadata import metadata_server  # noqa: F401 - a fixture
from tests.test_gcp_jobs import DLQ, ENV, SUB, calls, gcp  # noqa: F401 - gcp is a fixture
from tidefleet.agent.worker import Agent, Settings
from tidefleet.cloud import for_env
from tidefleet.cloud.gcp.metadata import GceMetadata
from tidefleet.jobs import sdk

WORKLOAD = """
import os, sys, time
from tidefleet.agent import checkpoint
print("checkpoints at", checkpoint.checkpoint_uri(), flush=True)
deadline = time.monotonic() + 20
if sys.argv[1] == "forever":  # until the agent stops it: a cancel, a timeout
    with open(os.environ["RELEASE"] + ".pid", "w") as f:
        f.write(str(os.getpid()))
    while True:
        time.sleep(0.05)
if sys.argv[1] == "wait-once" and checkpoint.attempt() == 1:
    while not checkpoint.should_stop():
        time.sleep(0.05)
    checkpoint.exit_interrupted()
while not os.path.exists(os.environ["RELEASE"]):  # the test's go, e.g. once the item's lease was extended
    if time.monotonic() > deadline:
        sys.exit("never released")
    time.sleep(0.05)
"""


@pytest.fixture
def env(tmp_path):
    script = tmp_path / "workload.py"
    script.write_text(WORKLOAD)
    pool = ENV.pools["cpu"].model_copy(
        update={"command": f"{sys.executable} {script}", "env": {"RELEASE": str(tmp_path / "release")}}
    )
    return ENV.model_copy(update={"pools": {**ENV.pools, "cpu": pool}})


def run_agent(env, tmp_path, node: str, metadata_url: str, until) -> Agent:
    """Run the agent in this (the main) thread until `until(store)` holds, then stop it."""
    settings = Settings(node_id=node, instance_type="n2-standard-4", spot=True, work_dir=tmp_path / node,
                        heartbeat_s=0.2, imds_poll_s=0.1, grace_s=5, wait_s=1)  # fmt: skip
    agent = Agent(env, "cpu", settings, GceMetadata(metadata_url))

    def watch():
        deadline = time.monotonic() + 30
        while not agent.finished.is_set() and not until(agent.store) and time.monotonic() < deadline:
            time.sleep(0.05)
        agent.request_stop("test over")

    threading.Thread(target=watch, daemon=True).start()
    assert agent.run() == 0
    return agent


def test_an_item_is_received_run_acked_and_marked_succeeded(gcp, env, tmp_path, metadata_server):  # noqa: F811
    url, _ = metadata_server
    job = sdk.submit(env, "one", "default", sdk.read_items([["ok"]]), kick=False).job_id

    def release_once_extended(store):
        if calls(gcp, "POST", f"{SUB}:modifyAckDeadline"):  # a heartbeat ran while the item did
            (tmp_path / "release").touch()
        return store.item(job, "000000").status == "succeeded"

    run_agent(env, tmp_path, "tidefleet-gcp-dev-cpu-aaaa", url, release_once_extended)
    item = for_env(env).store.item(job, "000000")
    assert (item.status, item.attempts, item.failures, item.node) == ("succeeded", 1, 0, "tidefleet-gcp-dev-cpu-aaaa")
    assert item.history[-1]["outcome"] == "succeeded" and item.cpu_s is not None
    assert gcp.bodies(SUB) == [], "acknowledged"
    assert any(c["body"]["ackDeadlineSeconds"] == 600 for c in calls(gcp, "POST", f"{SUB}:modifyAckDeadline")), \
        "the ack deadline is extended by the subscription's own while the item runs"
    assert list(sdk.log_lines(env, job)) == [
        (f"{job}/000000/1", f"checkpoints at gs://tidefleet-gcp-dev-artifacts-acme-ml-dev/checkpoints/default/{job}/000000/")]
    (outcome,) = [e["jsonPayload"] for e in gcp.log_entries if "jsonPayload" in e]
    assert {k: outcome[k] for k in ("outcome", "queue", "job", "item", "attempt")} == {
        "outcome": "succeeded", "queue": "default", "job": job, "item": "000000", "attempt": 1}
    assert outcome["seconds"] == item.history[-1]["seconds"]
    beat = for_env(env).store.heartbeat("cpu", "tidefleet-gcp-dev-cpu-aaaa")
    assert (beat.busy_slots, beat.slots, beat.spot) == (0, 2, True)


def test_a_preemption_hands_the_item_back_without_a_failure_and_another_node_finishes_it(
    gcp, env, tmp_path, metadata_server  # noqa: F811
):
    url, state = metadata_server
    (tmp_path / "release").touch()  # the second attempt runs straight through
    job = sdk.submit(env, "preempted", "default", sdk.read_items([["wait-once"]]), kick=False).job_id

    def preempt_once_running(store):
        if store.item(job, "000000").status == "running":
            state["preempted"] = "TRUE"
        return False  # the notice stops the agent, not the test

    first = run_agent(env, tmp_path, "tidefleet-gcp-dev-cpu-aaaa", url, preempt_once_running)
    assert first.stop_reason.startswith("spot preemption notice")
    item = for_env(env).store.item(job, "000000")
    assert (item.status, item.interruptions, item.failures) == ("queued", 1, 0)
    assert item.history[-1]["outcome"] == "interrupted"
    (body,) = gcp.bodies(SUB)
    assert json.loads(body)["interruptions"] == 1 and gcp.bodies(DLQ) == []

    state["preempted"] = "FALSE"  # another VM
    run_agent(env, tmp_path, "tidefleet-gcp-dev-cpu-bbbb", url, lambda s: s.item(job, "000000").status == "succeeded")
    item = for_env(env).store.item(job, "000000")
    assert (item.status, item.attempts, item.failures, item.interruptions, item.node) == (
        "succeeded", 2, 0, 1, "tidefleet-gcp-dev-cpu-bbbb")
    assert gcp.bodies(SUB) == []


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_cancelling_the_job_stops_its_running_item_and_records_it_cancelled(gcp, env, tmp_path, metadata_server):  # noqa: F811
    url, _ = metadata_server
    job = sdk.submit(env, "cancelled mid-run", "default", sdk.read_items([["forever"]]), kick=False).job_id
    pid_file = tmp_path / "release.pid"

    def cancel_once_running(store):
        if pid_file.exists() and not for_env(env).store.job(job).cancelled:
            assert sdk.cancel(env, job) == 0, "nothing waiting: the one item is running"
        return store.item(job, "000000").status == "cancelled"

    run_agent(env, tmp_path, "tidefleet-gcp-dev-cpu-aaaa", url, cancel_once_running)
    item = for_env(env).store.item(job, "000000")
    assert (item.status, item.reason, item.failures, item.history[-1]["outcome"]) == ("cancelled", "job cancelled", 0, "cancelled")
    assert gone(int(pid_file.read_text())), "the workload was terminated"
    assert gcp.bodies(SUB) == [] and gcp.bodies(DLQ) == [], "acknowledged, not retried nor dead-lettered"


def test_an_item_over_its_queues_timeout_is_killed_and_recorded_failed(gcp, env, tmp_path, metadata_server):  # noqa: F811
    url, _ = metadata_server
    queue = env.queues["default"].model_copy(update={"item_timeout_s": 1, "max_retries": 0})
    env = env.model_copy(update={"queues": {**env.queues, "default": queue}})
    job = sdk.submit(env, "hangs", "default", sdk.read_items([["forever"]]), kick=False).job_id
    run_agent(env, tmp_path, "tidefleet-gcp-dev-cpu-aaaa", url, lambda s: s.item(job, "000000").status == "failed")
    item = for_env(env).store.item(job, "000000")
    assert (item.status, item.exit_code, item.failures) == ("failed", -9, 1)
    assert item.reason.startswith("timed out after 1s") and "gave up after 1 failed attempt" in item.reason
    assert gone(int((tmp_path / "release.pid").read_text())), "the workload was killed"
    assert gcp.bodies(SUB) == [] and len(gcp.bodies(DLQ)) == 1


def test_an_idle_agent_deletes_itself_from_its_group_on_the_leave_grant(gcp, env, tmp_path, metadata_server):  # noqa: F811
    """Rule 4 between ticks on GCP: the grant in Firestore, deleteInstances on the fake's group."""
    url, _ = metadata_server
    group, node = "tidefleet-gcp-dev-cpu", "tidefleet-gcp-dev-cpu-aaaa"
    gcp.groups[group], gcp.vms[group] = 1, [FakeVm(node)]
    (tmp_path / "release").touch()
    store = for_env(env).store
    store.grant_leave("cpu", 1, time.time(), time.time() + 60)
    job = sdk.submit(env, "one", "default", sdk.read_items([["ok"]]), kick=False).job_id
    agent = run_agent(env, tmp_path, node, url, lambda _: gcp.groups[group] == 0)
    assert (gcp.groups[group], gcp.vms[group][0].action, agent.retiring) == (0, "DELETING", True)
    assert store.item(job, "000000").status == "succeeded"
    assert not store.take_leave("cpu", 1, time.time(), time.time())  # its unit taken


def test_a_gce_agent_waits_at_most_two_seconds_a_receive_so_a_stop_leaves_time_to_hand_items_back(gcp, tmp_path):  # noqa: F811
    """GCE gives a Spot VM ~30 s; the agent acts on a stop once its receive in flight returns, and a
    10-s pull (the default wait) left the hand-back no time after the 15-s grace."""
    from tidefleet.cloud.gcp import GRACE_S

    defaults = Settings(node_id="vm-1", instance_type="n2-standard-4", spot=True, work_dir=tmp_path)
    agent = Agent(ENV, "cpu", defaults, GceMetadata("http://127.0.0.1:9"))
    assert (defaults.wait_s, agent.s.wait_s, agent.s.grace_s) == (10, 2, GRACE_S)
    assert defaults.imds_poll_s + agent.s.wait_s + GRACE_S + 5 < 30  # notice lag, pull, grace, settle
