"""GPUs on a real NVIDIA driver, where one answers (skipped elsewhere, and where the nvidia-smi on
PATH is the tests/fakes stand-in): `gpus.query` and `gpus.sample` parse what the real nvidia-smi
prints, and the shipped agent (on the moto server, as in test_agent_gpus.py) gives each item the
device it holds and records what the item did on it, from a workload that really uses the GPU
through torch (run with this test's own interpreter)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from agent_harness import Harness, wait_until

from tidefleet.agent import gpus
from tidefleet.cloud.aws.dynamodb import DynamoStore
from tidefleet.jobs import sdk

FAKE_SMI = Path(__file__).parent / "fakes" / "nvidia-smi"
GPU_LINE = re.compile(r"^GPU (\d+): (.+) \(UUID: (GPU-[0-9a-fA-F-]+)\)")

ALLOC_MB = 2048  # what each workload holds on its GPU
COMPUTE_S = 7  # matmuls at least this long: the agent samples nvidia-smi every heartbeat (0.5 s here)


def _nvidia_smi_list() -> tuple[list[str], str | None]:
    """The GPU lines of `nvidia-smi -L`, or why there is no real driver here."""
    found = shutil.which("nvidia-smi")
    if found is None:
        return [], "no NVIDIA driver on this machine"
    if Path(found).resolve() == FAKE_SMI.resolve():
        return [], "no NVIDIA driver on this machine (the nvidia-smi on PATH is the tests/fakes stand-in)"
    try:
        done = subprocess.run([found, "-L"], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        return [], f"no NVIDIA driver on this machine (nvidia-smi -L: {err})"
    lines = [line for line in done.stdout.splitlines() if GPU_LINE.match(line)]
    if done.returncode != 0 or not lines or "fake" in done.stdout.lower():
        why = (done.stderr or done.stdout).strip().splitlines()
        return [], f"no NVIDIA driver on this machine (nvidia-smi -L: {why[0] if why else f'exit {done.returncode}'})"
    return lines, None


def _cuda_torch() -> tuple[str, str | None]:
    """torch's versions and CUDA devices as this interpreter (the workloads' too) sees them."""
    probe = ("import torch; assert torch.cuda.is_available(), 'torch.cuda.is_available() is False'; "
             "print(torch.__version__, 'cuda', torch.version.cuda, 'devices', torch.cuda.device_count())")  # fmt: skip
    try:
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        return "", f"no CUDA-capable torch for {sys.executable} ({err})"
    if done.returncode != 0:
        last = (done.stderr or done.stdout).strip().splitlines()
        return "", f"no CUDA-capable torch for {sys.executable} ({last[-1] if last else f'exit {done.returncode}'})"
    return done.stdout.strip(), None


LISTED, _NO_DRIVER = _nvidia_smi_list()
TORCH, _NO_TORCH = _cuda_torch() if _NO_DRIVER is None else ("", None)
_WHY_NOT = _NO_DRIVER or _NO_TORCH
pytestmark = pytest.mark.skipif(_WHY_NOT is not None, reason=(_WHY_NOT or "").replace("\n", " ")[:300])


def test_query_and_sample_parse_the_real_driver():
    print(*LISTED, f"torch {TORCH}", sep="\n")
    listed = {int(m[1]): m[3] for m in map(GPU_LINE.match, LISTED)}
    found = gpus.query(len(listed))
    assert {g.index: g.uuid for g in found} == listed, (found, LISTED)
    assert all(g.uuid.startswith("GPU-") and g.memory_mb > 1000 for g in found), found
    # The readings themselves are numbers: `_number` turns "[N/A]" into 0, which would pass silently.
    raw = gpus.run_nvidia_smi(["--query-gpu=index,utilization.gpu,memory.used", "--format=csv,noheader,nounits"])
    print(raw)
    for row in gpus._rows(raw, 3):
        assert all(re.fullmatch(r"\d+(\.\d+)?", cell) for cell in row), f"not a number in {row} (MIG mode?)"
    readings = gpus.sample()
    assert set(readings) == set(listed), readings
    total = {g.index: g.memory_mb for g in found}
    for index, (util, used) in readings.items():
        assert 0 <= util <= 100 and 0 <= used <= total[index], (index, util, used)


# One GPU per node (g5.xlarge: 1 A10G; the weight is the GPU count with capacity_unit 'gpus').
# <slots> slots on it: 1, or 2 with gpu_sharing (both items on device 0 at once).
REAL_GPU_ENV = """
region = "us-east-1"

[pools.gpu]
capacity_unit = "gpus"
max = 2
command = "{python} {workload}"
env = {{ LEDGER = "{ledger}", PEERS = "<slots>", ALLOC_MB = "<alloc>", COMPUTE_S = "<compute>" }}
instance_types = [{{ type = "g5.xlarge", weight = 1, gpus = 1 }}]
slots_per_unit = <slots>
gpu_sharing = <sharing>

[queues.train]
pool = "gpu"
max_retries = {max_retries}
item_timeout_s = 240
"""

# Records what it was given and what torch sees, holds ALLOC_MB on the GPU, and multiplies
# matrices for COMPUTE_S seconds once PEERS items hold theirs (so shared ones overlap); any error
# goes to the ledger with its traceback (the workload's own output is in the moto logs).
TORCH_WORKLOAD = r'''
import json, os, sys, time, traceback
ledger, item = os.environ["LEDGER"], os.environ["TIDEFLEET_ITEM_ID"]

def record(event, **extra):
    with open(ledger, "a") as f:
        f.write(json.dumps({"event": event, "item": item, "at": time.time(), **extra}) + "\n")

def events(event):  # whole lines only: another item may be writing one
    with open(ledger) as f:
        return [row for row in (json.loads(line) for line in f if line.endswith("\n")) if row["event"] == event]

try:
    import torch
    props = torch.cuda.get_device_properties(0)
    record("start", cuda=os.environ.get("CUDA_VISIBLE_DEVICES"), nvidia=os.environ.get("NVIDIA_VISIBLE_DEVICES"),
           count=torch.cuda.device_count(), name=props.name, uuid=str(getattr(props, "uuid", "")))
    hold = torch.empty(int(os.environ["ALLOC_MB"]) << 20, dtype=torch.uint8, device="cuda")
    hold.fill_(1)
    torch.cuda.synchronize()
    record("holding", reserved_mb=torch.cuda.memory_reserved() >> 20)
    a = torch.randn(4096, 4096, device="cuda")
    b = torch.randn(4096, 4096, device="cuda")
    waited_until = time.time() + 60
    while len(events("holding")) < int(os.environ["PEERS"]) and time.time() < waited_until:
        a = (a @ b).tanh_()
        torch.cuda.synchronize()
    began, steps = time.time(), 0
    while time.time() - began < float(os.environ["COMPUTE_S"]):
        for _ in range(20):
            a = (a @ b).tanh_()
        torch.cuda.synchronize()
        steps += 20
    record("done", began=began, steps=steps, peak_reserved_mb=torch.cuda.max_memory_reserved() >> 20)
except BaseException:
    record("error", trace=traceback.format_exc())
    raise
'''


def _node(tmp_path, aws, slots: int) -> Harness:
    env = (REAL_GPU_ENV.replace("<slots>", str(slots)).replace("<sharing>", "true" if slots > 1 else "false")
           .replace("<alloc>", str(ALLOC_MB)).replace("<compute>", str(COMPUTE_S)))
    return Harness(tmp_path, aws, max_retries=0, env_toml=env, workload=TORCH_WORKLOAD, pool="gpu")


@pytest.fixture
def one_slot(tmp_path, aws):
    h = _node(tmp_path, aws, 1)
    yield h
    h.stop_agents()


@pytest.fixture
def two_slots(tmp_path, aws):
    h = _node(tmp_path, aws, 2)
    yield h
    h.stop_agents()


def _run_two(h: Harness) -> tuple[dict[str, list[dict]], list]:
    job = sdk.submit(h.env, "real", "train", sdk.read_items(["a", "b"]), kick=False).job_id
    h.start_agent("gpu-node")

    def told() -> str:
        ledger = h.ledger.read_text() if h.ledger.exists() else "(no ledger)"
        return f"\nagent log:\n{h.agent_log('gpu-node')[-4000:]}\nledger:\n{ledger[-4000:]}"

    try:
        wait_until(lambda: sdk.status(h.env, job).done, 200, "both items done")
    except AssertionError as err:
        raise AssertionError(f"{err}{told()}") from None
    rows = [json.loads(line) for line in h.ledger.read_text().splitlines()]
    by_event: dict[str, list[dict]] = {}
    for row in rows:
        by_event.setdefault(row["event"], []).append(row)
    items = DynamoStore(h.env.name, h.env.region).items(job)
    print(*rows, *items, sep="\n")
    assert "error" not in by_event, told()
    assert {i.status for i in items} == {"succeeded"}, (items, told())
    return by_event, items


def _same_gpu(seen: dict) -> None:
    """The workload's device 0 is nvidia-smi's index 0 (by UUID, where this torch tells it)."""
    index0 = gpus.query(1)[0]
    if re.fullmatch(r"[0-9a-fA-F-]{36}", seen["uuid"]):
        assert f"GPU-{seen['uuid']}".lower() == index0.uuid.lower(), (seen, index0)


def test_an_item_on_a_one_gpu_node_sees_device_0_and_its_usage_is_recorded(one_slot):
    by_event, items = _run_two(one_slot)
    seen = by_event["start"]
    assert sorted(s["item"] for s in seen) == sorted(i.item_id for i in items), (seen, items)
    assert all(s["cuda"] == "0" and s["nvidia"] == "0" and s["count"] == 1 for s in seen), seen
    first, second = sorted(by_event["done"], key=lambda d: d["at"])
    assert min(s["at"] for s in seen if s["item"] == second["item"]) >= first["at"], "one slot: one at a time"
    for item in items:
        assert item.gpu_mem_peak_mb is not None and item.gpu_mem_peak_mb >= ALLOC_MB, items
        assert item.gpu_util_pct is not None and item.gpu_util_pct > 0, items
    for s in seen:
        _same_gpu(s)


def test_two_items_share_the_one_gpu_at_once_with_gpu_sharing(two_slots):
    by_event, items = _run_two(two_slots)
    seen = by_event["start"]
    assert all(s["cuda"] == "0" and s["nvidia"] == "0" and s["count"] == 1 for s in seen), seen
    done = by_event["done"]
    assert max(d["began"] for d in done) < min(d["at"] for d in done), f"the two did not compute at once: {done}"
    for item in items:
        # A shared GPU's reading is the whole GPU's: both items' memory, for each of them.
        assert item.gpu_mem_peak_mb is not None and item.gpu_mem_peak_mb >= 2 * ALLOC_MB, items
        assert item.gpu_util_pct is not None and item.gpu_util_pct > 0, items
