"""Interruption-aware placement end to end on the moto server: a real spot agent's item is
interrupted once (a spot notice); the next spot agent leaves it to on-demand nodes and says so in its
heartbeat; the real control tick raises the group's on-demand base for it; a real agent on an
on-demand node takes it and finishes it from its checkpoint; the base then returns to the configured one."""

from __future__ import annotations

import time

import pytest
from agent_harness import Harness, Imds, wait_until

from tidefleet import control
from tidefleet.cloud import for_env
from tidefleet.jobs import sdk

pytestmark = pytest.mark.moto

ENV = """
region = "us-east-1"

[pools.cpu]
max = 2
command = "{python} {workload}"
env = {{ LEDGER = "{ledger}" }}
instance_types = [{{ type = "c6i.large", weight = 1 }}]

[queues.train]
pool = "cpu"
max_retries = {max_retries}
item_timeout_s = 120
on_demand_after_interruptions = 1
"""


@pytest.fixture
def h(tmp_path, aws, request) -> Harness:
    harness = Harness(tmp_path, aws, env_toml=ENV, max_retries=1)
    request.addfinalizer(harness.stop_agents)
    return harness


def test_an_interrupted_item_is_left_by_spot_nodes_and_runs_next_on_an_on_demand_node(h):
    imds = {name: Imds(name, spot=name != "on-demand") for name in ("spot-a", "spot-b", "on-demand")}
    job = sdk.submit(h.env, "train", "train", sdk.read_items([["steps=100"]]), kick=False).job_id
    first = h.start_agent("spot-a", imds["spot-a"].url)
    wait_until(lambda: h.events("start"), 30, "the item to start on the first spot node")
    imds["spot-a"].spot_action = {"action": "terminate", "time": "2030-01-01T00:00:00Z"}
    wait_until(lambda: h.items(job)["000000"].interruptions == 1, 30, "the spot notice to hand the item back")
    first.wait(30)

    h.start_agent("spot-b", imds["spot-b"].url)
    store = for_env(h.env).store
    key = f"{job}/000000"
    wait_until(lambda: (b := store.heartbeat("cpu", "spot-b")) and b.on_demand_wanted == {"train": [key]}, 30,
               "the second spot node to leave the item to on-demand nodes")  # fmt: skip
    assert "left to an on-demand node" in h.agent_log("spot-b")

    ports = for_env(h.env).control_ports()
    (decision,) = control.tick(h.env, ports, time.time())
    assert decision.on_demand_base == 1 and decision.desired == 1, decision.reasons
    assert ("1 item(s) of queue train interrupted >= 1 times wait for on-demand capacity: on-demand base 0 -> 1 units "
            "so 1 unit(s) to launch come on demand") in decision.reasons  # fmt: skip
    assert ports.fleet.groups(["cpu"], since=0.0)["cpu"].on_demand_base == 1

    h.start_agent("on-demand", imds["on-demand"].url)
    item = wait_until(lambda: (i := h.items(job)["000000"]).status == "succeeded" and i, 90,
                      "the on-demand node to take the item once its hiding ends, and finish it")  # fmt: skip
    assert (item.interruptions, item.failures) == (1, 0)
    assert [(e["node"], e["outcome"], e["spot"]) for e in item.history] == [
        ("spot-a", "interrupted", True), ("on-demand", "succeeded", False)]  # fmt: skip
    assert [e["resumed_from"] > 0 for e in h.events("start") if e["attempt"] == 2] == [True]
    wait_until(lambda: store.heartbeat("cpu", "spot-b").on_demand_wanted == {}, 10,
               "the spot node to stop asking once the item is taken")  # fmt: skip
    (after,) = control.tick(h.env, ports, time.time())
    assert after.on_demand_base == 0, after.reasons
    assert "spot healthy: on-demand base 1 -> 0 units (configured)" in after.reasons
