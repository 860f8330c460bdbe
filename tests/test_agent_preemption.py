"""Preemption end to end on the moto server: a real agent runs a preemptible low-priority item on
the pool's only node (the pool at its max); a high-priority item arrives; the real control tick
marks the running attempt; the agent asks it to checkpoint and hands it back (an interruption,
not a failure), runs the high-priority item, then resumes the preempted one from its checkpoint."""

from __future__ import annotations

import time
from collections import Counter

import boto3
import pytest
from agent_harness import WORKLOAD, Harness, Imds, wait_until

from tidefleet import control, naming
from tidefleet.cloud import for_env
from tidefleet.jobs import sdk
from tidefleet.records import FINAL

pytestmark = pytest.mark.moto

ENV = """
region = "us-east-1"

[pools.cpu]
max = 1
command = "{python} {workload}"
env = {{ LEDGER = "{ledger}" }}
instance_types = [{{ type = "c6i.large", weight = 1 }}]

[queues.urgent]
pool = "cpu"
priority = 50
max_retries = {max_retries}
item_timeout_s = 60

[queues.batch]
pool = "cpu"
priority = 1
preemptible = true
min_runtime_s = 0
max_retries = {max_retries}
item_timeout_s = 120
"""


@pytest.fixture
def h(tmp_path, aws, request) -> Harness:
    harness = Harness(tmp_path, aws, env_toml=ENV, max_retries=1)
    request.addfinalizer(harness.stop_agents)
    return harness


def _final(h: Harness, job: str):
    item = h.items(job)["000000"]
    return item.status in FINAL and item


def test_a_high_priority_item_preempts_a_running_preemptible_one_which_resumes_and_succeeds_once(h):
    node = h.group_instance()  # the pool's one node: its group is at max
    batch = sdk.submit(h.env, "batch", "batch", sdk.read_items([["steps=150"]]), kick=False).job_id
    h.start_agent(node)
    wait_until(lambda: h.events("start"), 30, "the batch item to start")
    urgent = sdk.submit(h.env, "urgent", "urgent", sdk.read_items([["steps=5"]]), kick=False).job_id
    ports = for_env(h.env).control_ports()
    (decision,) = wait_until(lambda: (d := control.tick(h.env, ports, time.time())) and d[0].preempt and d, 30,
                             "the tick to see the running attempt and preempt it")  # fmt: skip
    assert decision.preempt == ((node, (f"{batch}/000000/1",)),)
    assert any(r.startswith(f"preempt {batch}/000000/1 on {node} (queue batch, priority 1") for r in decision.reasons)
    assert _final(h, urgent) or wait_until(lambda: _final(h, urgent), 60, "the urgent item to run")
    assert _final(h, urgent).status == "succeeded"
    item = wait_until(lambda: _final(h, batch), 90, "the preempted item to resume and finish")
    assert (item.status, item.interruptions, item.failures) == ("succeeded", 0, 0)  # the scaler's, not spot's
    assert item.history[0]["outcome"] == "preempted" and "preempted by the scaler for a higher-priority" in item.history[0]["reason"]
    assert [e["resumed_from"] > 0 for e in h.events("start") if e["item"] == "000000" and e["attempt"] == 2] == [True]
    assert Counter(e["item"] for e in h.events("done")) == {"000000": 2}  # each job's one item, once
    # The mark goes once the attempt has: the next tick clears it.
    control.tick(h.env, ports, time.time())
    assert for_env(h.env).store.heartbeat("cpu", node).preempt == []


# Break-even scale-in (the default): the tick that moves grants idle nodes no leave (scaling rule
# 9b), so idle node B, the move's room, is still there when A hands the attempt back.
MOVE_ENV = """
region = "us-east-1"

[pools.cpu]
max = 2
slots_per_unit = 2
checkpoint_and_move = true
command = "{python} {workload}"
env = {{ LEDGER = "{ledger}" }}
instance_types = [{{ type = "c6i.large", weight = 1 }}]

[queues.batch]
pool = "cpu"
preemptible = true
min_runtime_s = 0
max_retries = {max_retries}
item_timeout_s = 120
"""


def test_a_cordoned_nodes_attempt_moves_to_a_node_with_room_and_resumes_there_from_its_checkpoint(tmp_path, aws):
    """Checkpoint-and-move on real agents: node A runs the only item and is cordoned (a past
    tick's consolidation); node B is idle. The real tick marks A's attempt; A's agent asks it to
    checkpoint and hands it back; B resumes it from its checkpoint; A is left idle."""
    h = Harness(tmp_path, aws, env_toml=MOVE_ENV, max_retries=1)
    try:
        group = naming.group(h.env.name, "cpu")
        autoscaling = boto3.client("autoscaling", region_name=h.env.region)
        autoscaling.set_desired_capacity(AutoScalingGroupName=group, DesiredCapacity=2)
        a, b = sorted(i["InstanceId"] for i in autoscaling.describe_auto_scaling_groups(
            AutoScalingGroupNames=[group])["AutoScalingGroups"][0]["Instances"])  # fmt: skip
        job = sdk.submit(h.env, "batch", "batch", sdk.read_items([["steps=150"]]), kick=False).job_id
        h.start_agent(a)
        wait_until(lambda: h.events("start"), 30, "the item to start on node A")
        ports = for_env(h.env).control_ports()
        ports.nodes.set_cordon("cpu", a, True)
        h.start_agent(b)
        store = for_env(h.env).store
        wait_until(lambda: store.heartbeat("cpu", b) is not None and store.heartbeat("cpu", a).runs, 30,
                   "both agents to report, A with its attempt")  # fmt: skip
        key = f"{job}/000000/1"
        (decision,) = wait_until(lambda: (d := control.tick(h.env, ports, time.time())) and d[0].preempt and d, 30,
                                 "the tick to move the cordoned node's attempt")  # fmt: skip
        assert decision.preempt == ((a, (key,)),)
        assert any(r.startswith(f"move {key} off {a}: cordoned") for r in decision.reasons), decision.reasons
        assert decision.leave == 0, decision.reasons  # B, the move's room, may not leave meanwhile
        item = wait_until(lambda: _final(h, job), 90, "the moved item to resume and finish")
        assert (item.status, item.interruptions, item.failures) == ("succeeded", 0, 0)  # the scaler's, not spot's
        assert item.history[0]["outcome"] == "preempted" and "moved off this cordoned node" in item.history[0]["reason"]
        assert item.history[-1]["node"] == b
        assert [e["resumed_from"] > 0 for e in h.events("start") if e["attempt"] == 2] == [True]
        assert len(h.events("done")) == 1
        assert store.heartbeat("cpu", a).busy_slots == 0
    finally:
        h.stop_agents()


# Two slots, both running batch items; one urgent item waits and the pool is at its max.
TWO_SLOTS_ENV = ENV.replace('instance_types = [{{ type = "c6i.large", weight = 1 }}]',
                            'slots_per_unit = 2\ninstance_types = [{{ type = "c6i.large", weight = 1 }}]')
# A workload whose checkpoint takes `stop_s` seconds after it is asked to stop (a large model's).
SLOW_CHECKPOINT = WORKLOAD.replace(
    "    if checkpoint.should_stop():\n",
    "    if checkpoint.should_stop():\n        record(\"stopping\")\n        time.sleep(float(args.get(\"stop_s\", 0)))\n",
)


def test_an_attempt_checkpointing_after_its_mark_stays_listed_and_marked_so_the_next_tick_stops_no_other(tmp_path, aws):
    """The agent stopped listing an attempt once asked to stop: over a checkpoint longer than a
    tick, the next tick saw neither the marked attempt nor the room it makes (its slot still busy),
    cleared its mark and preempted the node's other attempt for the same waiting item (a move's
    node, likewise, stopped counting as moving and its room went to another node). It stays
    listed, marked, until it is handed back."""
    assert SLOW_CHECKPOINT != WORKLOAD
    h = Harness(tmp_path, aws, env_toml=TWO_SLOTS_ENV, workload=SLOW_CHECKPOINT, max_retries=1)
    try:
        node = h.group_instance()
        batch = sdk.submit(h.env, "batch", "batch", sdk.read_items([["steps=150", "stop_s=6"]] * 2), kick=False).job_id
        h.start_agent(node, TIDEFLEET_AGENT_GRACE_S="20")
        wait_until(lambda: len(h.events("start")) == 2, 30, "both batch items to start")
        store, ports = for_env(h.env).store, for_env(h.env).control_ports()
        wait_until(lambda: len(store.heartbeat("cpu", node).runs) == 2, 30, "the heartbeat to list both attempts")
        sdk.submit(h.env, "urgent", "urgent", sdk.read_items([["steps=5"]]), kick=False)
        (decision,) = wait_until(lambda: (d := control.tick(h.env, ports, time.time())) and d[0].preempt and d, 30,
                                 "the tick to preempt one attempt for the urgent item")  # fmt: skip
        ((marked_node, (key,)),) = decision.preempt
        assert marked_node == node
        wait_until(lambda: h.events("stopping"), 10, "the marked attempt to begin its checkpoint")
        time.sleep(1.5)  # three heartbeats into a six-second checkpoint
        beat = store.heartbeat("cpu", node)
        assert (beat.busy_slots, beat.preempt) == (2, [key])
        assert key in [r["key"] for r in beat.runs], beat.runs
        (again,) = control.tick(h.env, ports, time.time())
        assert again.preempt == (), again.reasons  # the mark stays, and nothing else is stopped
        assert store.heartbeat("cpu", node).preempt == [key]
        assert len(h.events("stopping")) == 1
        wait_until(lambda: all(i.status == "succeeded" for i in h.items(batch).values()), 90, "both batch items to finish")
        assert len(h.events("stopping")) == 1
    finally:
        h.stop_agents()


def test_a_preempted_item_counts_no_interruption_so_a_spot_node_still_takes_it(tmp_path, aws):
    """batch's items go to on-demand nodes after one interruption. Preempted on the pool's only
    node (spot) for the urgent item, its item went back counted as one, and that spot node then left
    it to an on-demand node the pool did not have. A preemption (or a move) is the scaler's choice,
    not spot's: it counts no interruption, and the spot node resumes it."""
    env_toml = ENV.replace("min_runtime_s = 0\n", "min_runtime_s = 0\non_demand_after_interruptions = 1\n")
    assert env_toml != ENV
    h = Harness(tmp_path, aws, env_toml=env_toml, max_retries=1)
    try:
        node = h.group_instance()
        imds = Imds(node, spot=True)
        batch = sdk.submit(h.env, "batch", "batch", sdk.read_items([["steps=100"]]), kick=False).job_id
        h.start_agent(node, imds.url)
        wait_until(lambda: h.events("start"), 30, "the batch item to start")
        urgent = sdk.submit(h.env, "urgent", "urgent", sdk.read_items([["steps=5"]]), kick=False).job_id
        ports = for_env(h.env).control_ports()
        wait_until(lambda: (d := control.tick(h.env, ports, time.time())) and d[0].preempt, 30,
                   "the tick to preempt the batch attempt")  # fmt: skip
        wait_until(lambda: _final(h, urgent), 60, "the urgent item to run")
        item = wait_until(lambda: _final(h, batch), 60, "the spot node to resume the preempted item and finish it")
        assert (item.status, item.interruptions, item.failures) == ("succeeded", 0, 0)
        assert [e["outcome"] for e in item.history] == ["preempted", "succeeded"]
        assert "preempted by the scaler for a higher-priority" in item.history[0]["reason"]
        assert "left to an on-demand node" not in h.agent_log(node)
    finally:
        h.stop_agents()
