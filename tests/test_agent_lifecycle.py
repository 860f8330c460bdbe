"""Real agent processes against the moto server: items succeed, fail into the dead-letter
queue, time out, are cancelled; a spot notice, SIGTERM and kill -9 never lose an item and
never finish one twice."""

from __future__ import annotations

import os
import signal
import time
from collections import Counter

import boto3
import pytest
from agent_harness import Harness, Imds, wait_until

from tidefleet import naming
from tidefleet.cloud.aws.dynamodb import DynamoStore
from tidefleet.cloud.aws.imds import Metadata
from tidefleet.jobs import sdk
from tidefleet.records import FINAL

pytestmark = pytest.mark.moto


@pytest.fixture
def make_harness(tmp_path, aws, request):
    """Harness(tmp_path, aws, **options); its agents and workloads are killed whatever the outcome."""

    def make(**options) -> Harness:
        h = Harness(tmp_path, aws, **options)
        request.addfinalizer(h.stop_agents)
        return h

    return make


@pytest.fixture
def harness(make_harness):
    return make_harness()


def _all_final(h: Harness, job_id: str, n: int):
    items = h.items(job_id)
    return len(items) == n and all(i.status in FINAL for i in items.values()) and items


def test_items_succeed_fail_into_the_dead_letter_queue_time_out_and_come_back_with_retry_failed(harness, tmp_path):
    h = harness
    gate = tmp_path / "gate"
    job = sdk.submit(h.env, "lifecycle", "work", sdk.read_items(
        [["steps=2"], ["steps=2"], ["steps=2", "exit=0"], {"id": "flaky", "args": [f"fail_until={gate}"]}]
    ), kick=False).job_id
    slow = sdk.submit(h.env, "slow", "short", sdk.read_items([["hang=1"]]), kick=False).job_id
    h.start_agent("node-a")

    items = wait_until(lambda: _all_final(h, job, 4), 60, "the job to finish")
    assert [items[i].status for i in ("000000", "000001", "000002")] == ["succeeded"] * 3
    flaky = items["flaky"]
    assert (flaky.status, flaky.failures, flaky.attempts, flaky.exit_code) == ("failed", 3, 3, 3)
    assert "exit code 3; last output: not yet" in flaky.reason and "gave up after 3" in flaky.reason
    assert h.queue_depth("work", dead_letter=True) == 1
    wait_until(lambda: h.queue_depth("work") == 0, 5, "the batched deletes (worker.Acks)")
    done = items["000000"]
    assert done.history[-1]["outcome"] == "succeeded" and done.history[-1]["cpu_s"] > 0
    assert done.peak_rss_mb > 5 and done.cpu_s > 0  # a Python interpreter's own footprint

    hung = wait_until(lambda: _all_final(h, slow, 1), 30, "the hung item to time out")["000000"]
    assert hung.status == "failed" and hung.reason.startswith("timed out after 2s") and hung.exit_code == -9

    lines = [line for _, line in sdk.log_lines(h.env, job, "000000")]
    assert lines == [f"item 000000 attempt 1 job {job} from step 0"]
    assert len({s for s, _ in sdk.log_lines(h.env, job, "flaky")}) == 3  # one stream per attempt

    gate.touch()
    assert sdk.retry_failed(h.env, job) == 1
    flaky = wait_until(lambda: h.items(job)["flaky"].status == "succeeded" and h.items(job)["flaky"], 30, "the retry")
    assert flaky.attempts == 4 and flaky.failures == 0
    assert h.queue_depth("work", dead_letter=True) == 0
    assert Counter(e["item"] for e in h.events("done")) == {"000000": 1, "000001": 1, "000002": 1, "flaky": 1}

    # Idle is reported by the next heartbeat after the last item, not at once.
    store = DynamoStore(h.env.name, h.env.region)
    hb = wait_until(lambda: (b := store.heartbeats("cpu")["node-a"]).busy_slots == 0 and b, 15, "an idle heartbeat")
    assert (hb.slots, hb.busy_slots, hb.instance_type) == (2, 0, "c6i.large") and hb.idle_since is not None


def test_cancel_stops_running_items_and_skips_queued_ones(harness):
    h = harness
    job = sdk.submit(h.env, "to-cancel", "work", sdk.read_items([["steps=600"]] * 6), kick=False).job_id
    h.start_agent("node-a")
    wait_until(lambda: len(h.events("start")) == 2, 30, "two items running")
    assert sdk.cancel(h.env, job) == 4  # the waiting ones, at once
    # Within a heartbeat (0.5 s) and a workload's exit; 60 s, as a loaded CI worker once took over 30.
    try:
        items = wait_until(lambda: _all_final(h, job, 6), 60, "the running items to stop")
    except AssertionError as err:  # what the agent did, for the next time it happens
        raise AssertionError(f"{err}; items {sorted((i.item_id, i.status) for i in h.items(job).values())}; "
                             f"agent log tail:\n{h.agent_log('node-a')[-3000:]}") from None
    assert {i.status for i in items.values()} == {"cancelled"}
    wait_until(lambda: h.queue_depth("work") == 0, 15, "the skipped messages to be deleted")
    assert len(h.events("start")) == 2 and not h.events("done")


def test_spot_notice_hands_every_item_back_and_another_agent_finishes_them(harness):
    h, imds = harness, Imds()
    try:
        job = sdk.submit(h.env, "spot", "work", sdk.read_items([["steps=40"]] * 4), kick=False).job_id
        first = h.start_agent("node-spot", imds.url)
        wait_until(lambda: len(h.events("start")) == 2, 30, "two items running on the spot node")
        imds.spot_action = {"action": "terminate", "time": "2030-01-01T00:00:00Z"}
        assert first.wait(timeout=30) == 0
        assert len(h.events("checkpoint")) == 2
        assert "handed back 2 item(s) (spot interruption notice: terminate" in h.agent_log("node-spot")
        # Nothing may stay invisible on the dead node: every item is waiting again, at once.
        assert h.queue_depth("work") == 4 and {i.status for i in h.items(job).values()} == {"queued"}

        h.start_agent("node-b")
        items = wait_until(lambda: _all_final(h, job, 4), 60, "the other agent to finish the job")
        assert {i.status for i in items.values()} == {"succeeded"}
        assert sorted(i.interruptions for i in items.values()) == [0, 0, 1, 1]
        # An interrupted attempt cost node time too: it records how long and on what (tidefleet cost).
        interrupted = [e for i in items.values() for e in i.history if e["outcome"] == "interrupted"]
        assert [(e["instance_type"], e["spot"], e["node_slots"]) for e in interrupted] == [("c6i.large", True, 2)] * 2
        assert all(e["seconds"] > 0 for e in interrupted)
        assert all(i.failures == 0 for i in items.values())
        resumed = [e for e in h.events("start") if e["resumed_from"] > 0]
        assert len(resumed) == 2  # the interrupted ones resumed from their checkpoints
        assert Counter(e["item"] for e in h.events("done")) == {i: 1 for i in items}
    finally:
        imds.close()


def test_an_item_interrupted_five_times_is_not_dead_lettered(make_harness):
    h = make_harness(max_retries=0)  # a single failure would dead-letter it
    job = sdk.submit(h.env, "often-interrupted", "work", sdk.read_items([["steps=100"]]), kick=False).job_id
    for n in range(1, 6):
        agent = h.start_agent(f"node-{n}")
        wait_until(lambda n=n: len(h.events("start")) == n, 30, f"attempt {n} to start")
        agent.send_signal(signal.SIGTERM)  # the agent's own drain path
        assert agent.wait(timeout=30) == 0
    item = h.items(job)["000000"]
    assert (item.status, item.interruptions, item.failures) == ("queued", 5, 0)
    h.start_agent("node-last")
    item = wait_until(lambda: h.items(job)["000000"].status in FINAL and h.items(job)["000000"], 60, "the finish")
    assert item.status == "succeeded" and h.queue_depth("work", dead_letter=True) == 0


def test_kill_9_mid_item_redelivers_it_to_another_agent_which_finishes_it(make_harness):
    h = make_harness(visibility_s=3)
    job = sdk.submit(h.env, "killed", "work", sdk.read_items([["steps=30"]]), kick=False).job_id
    doomed = h.start_agent("node-doomed")
    started = wait_until(lambda: h.events("start"), 30, "the item to start")[0]
    doomed.kill()  # the node dies: agent and workload together, no word to anyone
    os.killpg(started["pid"], signal.SIGKILL)
    h.start_agent("node-b")
    item = wait_until(lambda: h.items(job)["000000"].status in FINAL and h.items(job)["000000"], 60, "redelivery")
    # A lost node is not the item's failure: it is counted apart, on its own budget (worker.py).
    assert (item.status, item.failures, item.lost) == ("succeeded", 0, 1)
    assert item.history[0]["outcome"] == "lost" and "node lost" in item.history[0]["reason"]
    assert Counter(e["item"] for e in h.events("done")) == {"000000": 1}
    wait_until(lambda: h.queue_depth("work") == 0, 5, "the batched delete (worker.Acks)")


def test_a_busy_agent_protects_its_instance_from_scale_in_and_an_idle_one_lifts_it(harness):
    """The agent's own calls, on a member of the pool's group on the moto server."""
    h = harness
    instance = h.group_instance()
    assert not h.protected(instance)
    sdk.submit(h.env, "protected", "work", sdk.read_items([["steps=40"]]), kick=False)
    h.start_agent(instance)
    wait_until(lambda: h.events("start") and not h.events("done") and h.protected(instance), 20,
               "scale-in protection while the item runs")
    wait_until(lambda: h.events("done") and not h.protected(instance), 20, "the protection lifted once idle")


def _in_group(h: Harness) -> list[str]:
    group = boto3.client("autoscaling", region_name=h.env.region).describe_auto_scaling_groups(
        AutoScalingGroupNames=[naming.group(h.env.name, h.pool)])["AutoScalingGroups"][0]
    return [i["InstanceId"] for i in group["Instances"]] + [f"desired={group['DesiredCapacity']}"]


def test_an_idle_agent_leaves_its_group_only_on_a_leave_grant_given_before_it_went_idle(harness):
    """Rule 4 between ticks, on a member of the pool's group on the moto server: no grant, it
    stays idle; a grant from a tick before it went idle whose first unit going idle stays, it
    stays once; the next time it goes idle it terminates itself with a decrement and takes
    nothing more."""
    h = harness
    instance = h.group_instance()
    store = DynamoStore(h.env.name, h.env.region)
    sdk.submit(h.env, "first", "work", sdk.read_items([["steps=1"]]), kick=False)
    h.start_agent(instance)
    wait_until(lambda: h.events("done"), 20, "the first item")
    time.sleep(3)  # three empty long polls, no grant
    assert _in_group(h) == [instance, "desired=1"]
    store.grant_leave("cpu", 1, time.time(), time.time() + 60, stay=1)
    time.sleep(3)  # idle since before the grant: the tick that granted saw it idle and kept it
    assert _in_group(h) == [instance, "desired=1"]
    sdk.submit(h.env, "second", "work", sdk.read_items([["steps=1"]]), kick=False)
    wait_until(lambda: len(h.events("done")) == 2, 20, "the second item")
    time.sleep(3)  # idle after the grant, the first to: it stays, warm, for the next tick to judge
    assert _in_group(h) == [instance, "desired=1"]
    sdk.submit(h.env, "third", "work", sdk.read_items([["steps=1"]]), kick=False)
    wait_until(lambda: _in_group(h) == ["desired=0"], 20, "the node out of its group after its item")
    assert len(h.events("done")) == 3 and "leaving the group: idle since" in h.agent_log(instance)
    sdk.submit(h.env, "fourth", "work", sdk.read_items([["steps=1"]]), kick=False)
    time.sleep(3)
    assert len(h.events("start")) == 3 and h.queue_depth("work") == 1  # left for the nodes that stay


def test_an_agent_whose_group_refuses_to_let_it_go_stays_and_takes_items(harness):
    h = harness
    store = DynamoStore(h.env.name, h.env.region)
    store.grant_leave("cpu", 1, time.time(), time.time() + 60)
    h.start_agent("node-x")  # no such instance in the group: the terminate is refused (moto: a 500)
    wait_until(lambda: "could not leave the group (" in h.agent_log("node-x"), 20, "the refusal logged")
    sdk.submit(h.env, "after", "work", sdk.read_items([["steps=1"]]), kick=False)
    wait_until(lambda: h.events("done"), 20, "an item run after the refusal")
    assert "Traceback" not in h.agent_log("node-x")


def test_metadata_reports_a_spot_notice_and_a_terminating_group():
    imds = Imds()
    try:
        metadata = Metadata(imds.url)
        assert metadata.notice() is None and metadata.get("/latest/meta-data/instance-id") == "i-0test"
        imds.lifecycle = "Terminated"
        assert metadata.notice().lifecycle
        imds.spot_action = {"action": "stop", "time": "t"}
        assert metadata.notice().reason == "spot interruption notice: stop at t"
    finally:
        imds.close()
    assert Metadata("http://127.0.0.1:9").notice() is None  # no metadata service: no notice
