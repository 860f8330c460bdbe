"""Preemption end to end on the moto server: a real agent runs a preemptible low-priority item on
the pool's only node (the pool at its max); a high-priority item arrives; the real control tick
marks the running attempt; the agent asks it to checkpoint and hands it back (an interruption,
not a failure), runs the high-priority item, then resumes the preempted one from its checkpoint."""

from __future__ import annotations

import time
from collections import Counter

import pytest
from agent_harness import Harness, wait_until

from tidefleet import control
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
    assert (item.status, item.interruptions, item.failures) == ("succeeded", 1, 0)
    assert item.history[0]["outcome"] == "interrupted" and "preempted by the scaler" in item.history[0]["reason"]
    assert [e["resumed_from"] > 0 for e in h.events("start") if e["item"] == "000000" and e["attempt"] == 2] == [True]
    assert Counter(e["item"] for e in h.events("done")) == {"000000": 2}  # each job's one item, once
    # The mark goes once the attempt has: the next tick clears it.
    control.tick(h.env, ports, time.time())
    assert for_env(h.env).store.heartbeat("cpu", node).preempt == []
