"""GPUs on a real agent (a fake nvidia-smi on PATH; the agent is the shipped one, on the moto
server): items on one node get disjoint devices and their usage is recorded; a node whose
driver is broken takes nothing and asks to be replaced."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path

import pytest
from agent_harness import Harness, wait_until

from tidefleet.cloud.aws.dynamodb import DynamoStore
from tidefleet.jobs import sdk

FAKES = Path(__file__).parent / "fakes"

GPU_ENV = """
region = "us-east-1"

[pools.gpu]
capacity_unit = "gpus"
max = 4
command = "{python} {workload}"
env = {{ LEDGER = "{ledger}" }}
# g3.8xlarge: two GPUs (two fakes); the price table lacks it
instance_types = [{{ type = "g3.8xlarge", weight = 2, gpus = 2, on_demand_price = 2.28, spot_price = 0.68 }}]

[queues.train]
pool = "gpu"
max_retries = {max_retries}
item_timeout_s = 60

[queues.wide]
pool = "gpu"
max_retries = 0
item_timeout_s = 60
nodes_per_item = 2
slots_per_item = 2
"""

# Records what devices it was given, then holds them long enough for the other item to start.
SEE_DEVICES = r'''
import json, os, sys, time
with open(os.environ["LEDGER"], "a") as f:
    f.write(json.dumps({"item": os.environ["TIDEFLEET_ITEM_ID"], "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
                        "nvidia": os.environ.get("NVIDIA_VISIBLE_DEVICES"), "at": time.time()}) + "\n")
time.sleep(3)
'''


@pytest.fixture
def gpu_node(tmp_path, aws):
    h = Harness(tmp_path, aws, env_toml=GPU_ENV, workload=SEE_DEVICES, pool="gpu")
    yield h
    h.stop_agents()


def _path_with_fake_driver() -> str:
    return f"{FAKES}{os.pathsep}{os.environ['PATH']}"


@pytest.mark.parametrize(("util", "recorded"), [("60", 60.0), ("[N/A]", None)],
                         ids=["measured", "no utilisation reading (MIG): unknown, not 0"])  # fmt: skip
def test_two_items_on_a_two_gpu_node_see_disjoint_devices_and_their_usage_is_recorded(gpu_node, util, recorded):
    job = sdk.submit(gpu_node.env, "see", "train", sdk.read_items(["a", "b"]), kick=False).job_id
    gpu_node.start_agent("gpu-node", PATH=_path_with_fake_driver(), FAKE_GPUS="2", FAKE_GPU_UTIL=util)
    wait_until(lambda: sdk.status(gpu_node.env, job).done, 60, "both items done")
    seen = [json.loads(line) for line in gpu_node.ledger.read_text().splitlines()]
    assert sorted(s["cuda"] for s in seen) == ["0", "1"] and all(s["cuda"] == s["nvidia"] for s in seen)
    assert abs(seen[0]["at"] - seen[1]["at"]) < 2.5, "the two ran at the same time"
    items = DynamoStore(gpu_node.env.name, gpu_node.env.region).items(job)
    assert {i.status for i in items} == {"succeeded"}
    assert all(i.gpu_util_pct == recorded and i.gpu_mem_peak_mb >= 1000 for i in items), items
    assert "Traceback" not in gpu_node.agent_log("gpu-node")


def test_a_gang_members_gpu_usage_is_recorded_on_its_part(gpu_node):
    """The lead's usage lands on the item; each member's, on its part (`JobStore.parts`)."""
    job = sdk.submit(gpu_node.env, "wide", "wide", sdk.read_items(["a"]), kick=False).job_id
    for node in ("gpu-a", "gpu-b"):
        gpu_node.start_agent(node, PATH=_path_with_fake_driver(), FAKE_GPUS="2", FAKE_GPU_UTIL="60")
    store = DynamoStore(gpu_node.env.name, gpu_node.env.region)
    item = wait_until(lambda: (i := store.item(job, "000000")).status == "succeeded" and i, 60, "the gang to succeed")
    [part] = wait_until(lambda: store.parts(job).get("000000"), 10, "the member's part")
    entries = [*item.history, part]
    assert [e["node"] for e in entries] == [item.history[0]["node"], {"gpu-a": "gpu-b", "gpu-b": "gpu-a"}[item.history[0]["node"]]]
    assert all(e["gpu_util_pct"] == 60.0 and e["gpu_mem_peak_mb"] >= 2000 for e in entries), entries
    assert sorted(s["cuda"] for s in map(json.loads, gpu_node.ledger.read_text().splitlines())) == ["0,1", "0,1"]


def test_a_node_whose_driver_is_broken_takes_nothing_and_is_marked_draining(gpu_node):
    sdk.submit(gpu_node.env, "none", "train", sdk.read_items(["a"]), kick=False)
    proc = gpu_node.start_agent("broken", PATH=_path_with_fake_driver(), FAKE_NVIDIA_FAIL="NVIDIA-SMI has failed")
    assert proc.wait(30) == 1
    log = gpu_node.agent_log("broken")
    assert "this node's GPUs are not usable: nvidia-smi failed (NVIDIA-SMI has failed)" in log
    assert "Traceback" not in log
    beat = DynamoStore(gpu_node.env.name, gpu_node.env.region).heartbeat("gpu", "broken")
    assert beat.draining and beat.busy_slots == 0
    assert gpu_node.queue_depth("train") == 1 and not gpu_node.ledger.exists()


def _driver(tmp_path: Path, usage: str) -> str:
    """PATH with an nvidia-smi first that lists two GPUs and answers the usage query with the
    shell line `usage`."""
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text(f"""#!/bin/sh
case "$1" in
  *uuid*) printf '0, GPU-a, 81920\\n1, GPU-b, 81920\\n' ;;
  *) {usage} ;;
esac
""")
    smi.chmod(0o755)
    return f"{smi.parent}{os.pathsep}{os.environ['PATH']}"


def test_a_hung_nvidia_smi_does_not_hold_up_the_heartbeat(gpu_node, tmp_path):
    """The usage sample waits up to 20 s on a hung driver; in the heartbeat it had stretched the
    beats (and the claim's renewals) from 0.5 s to 20 s apart."""
    pids = tmp_path / "hung.pids"
    path = _driver(tmp_path, f"echo $$ >> {pids}; exec sleep 30")
    job = sdk.submit(gpu_node.env, "hung", "train", sdk.read_items(["a"]), kick=False).job_id
    store = DynamoStore(gpu_node.env.name, gpu_node.env.region)
    try:
        gpu_node.start_agent("gpu-node", PATH=path)
        wait_until(lambda: gpu_node.ledger.exists(), 30, "the item started")
        beats: list[float] = []
        while not sdk.status(gpu_node.env, job).done:
            beat = store.heartbeat("gpu", "gpu-node")
            if beat is not None and (not beats or beat.at != beats[-1]):
                beats.append(beat.at)
            assert time.time() - beats[-1] < 3, f"no heartbeat for 3 s while the item ran: {beats}"
            time.sleep(0.1)
        assert len(beats) >= 4, beats
        assert {i.status for i in store.items(job)} == {"succeeded"}
        assert "Traceback" not in gpu_node.agent_log("gpu-node")
    finally:
        gpu_node.stop_agents()
        for pid in pids.read_text().split() if pids.exists() else []:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)


def test_a_gpu_that_goes_missing_is_warned_of_and_given_to_no_item_until_it_is_back(gpu_node, tmp_path):
    """Listed at start, then missing from every usage read (fallen off the bus): one warning,
    items run on the other GPU only, and one line when it is back."""
    back = tmp_path / "back"
    path = _driver(tmp_path, f"printf '0, 40, 1000\\n'; [ ! -e {back} ] || printf '1, 50, 2000\\n'")
    gpu_node.start_agent("gpu-node", PATH=path)
    missing = "GPU 1 (GPU-b) is missing from nvidia-smi's readings"
    wait_until(lambda: missing in gpu_node.agent_log("gpu-node"), 15, "the missing GPU warned of")
    job = sdk.submit(gpu_node.env, "one", "train", sdk.read_items(["a", "b"]), kick=False).job_id
    wait_until(lambda: sdk.status(gpu_node.env, job).done, 60, "both items done")
    seen = [json.loads(line) for line in gpu_node.ledger.read_text().splitlines()]
    assert [s["cuda"] for s in seen] == ["0", "0"], seen
    back.touch()
    wait_until(lambda: "GPU 1 (GPU-b) is back" in gpu_node.agent_log("gpu-node"), 15, "the GPU back")
    log = gpu_node.agent_log("gpu-node")
    assert log.count(missing) == 1 and log.count("GPU 1 (GPU-b) is back") == 1, log
    assert "Traceback" not in log
