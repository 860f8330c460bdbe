"""README's "Training on spot" script on a real NVIDIA GPU: its CUDA branch (nccl, the model on
cuda:LOCAL_RANK, DDP device_ids, the checkpoint loaded onto the GPU) runs as written under the README
pool's torchrun, through the shipped agent on the moto server, as test_readme_training.py runs its CPU
branch. One GPU cannot hold two NCCL ranks, so the item runs on one node of a one-GPU pool (the agent
gives it device 0): torchrun's defaults, one process, `rank 0 of 1`. It trains and saves its model from
cuda:0, and a spot notice mid-run stops it at a step, it resumes there on the GPU and succeeds once.

Skipped where no real driver and CUDA-capable torch answer; the tests/fakes nvidia-smi never counts."""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from agent_harness import Harness, Imds, wait_until
from test_readme_training import SCRIPT, pool_command

from tidefleet.jobs import sdk

ROOT = Path(__file__).resolve().parent.parent
FAKE_SMI = Path(__file__).parent / "fakes" / "nvidia-smi"
STEPS = 2000  # a few seconds on a GPU: checkpoints at 500, 1000, 1500 and the final one at 2000
RESUMED_STEPS = 30_000  # the spot notice comes once step 500 is saved; the rest is the window to stop in
SAVE_EVERY = 500  # the README script's checkpoint interval


def _why_no_gpu() -> str | None:
    """One line saying why this machine has no usable NVIDIA GPU, or None."""
    found = shutil.which("nvidia-smi")
    if found is None:
        return "no NVIDIA GPU here: no nvidia-smi on PATH"
    try:
        with open(found, "rb") as f:
            elf = f.read(4) == b"\x7fELF"
    except OSError:
        elf = False
    if Path(found).resolve() == FAKE_SMI.resolve() or not elf:
        return f"no NVIDIA GPU here: the nvidia-smi on PATH ({found}) is a stand-in (tests/fakes), not NVIDIA's"
    try:
        done = subprocess.run([found, "-L"], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"no NVIDIA GPU here: nvidia-smi -L did not answer ({err})"
    if done.returncode != 0 or not re.search(r"^GPU \d+: .*\(UUID: GPU-", done.stdout, re.MULTILINE):
        why = (done.stderr or done.stdout).strip().splitlines()
        return f"no NVIDIA GPU here: nvidia-smi -L: {why[0] if why else f'exit {done.returncode}'}"
    try:
        import torch
    except ImportError:
        return "PyTorch is not installed for this interpreter"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA device (torch.cuda.is_available() is False)"
    return None


_WHY_NOT = _why_no_gpu()
pytestmark = [pytest.mark.moto, pytest.mark.skipif(_WHY_NOT is not None, reason=(_WHY_NOT or "")[:300])]

# A one-GPU node (g5.xlarge: 1 GPU; with capacity_unit 'gpus' the weight is the GPU count; no image:
# a GPU pool gets the driver image), one slot: the item holds the GPU, the agent shows it device 0.
ENV_TOML = """
region = "us-east-1"

[pools.gpu]
capacity_unit = "gpus"
max = 2
command = "@COMMAND@"
env = {{ LEDGER = "{ledger}" }}
instance_types = [{{ type = "g5.xlarge", weight = 1, gpus = 1 }}]

[queues.train]
pool = "gpu"
max_retries = {max_retries}
item_timeout_s = 300
"""


@pytest.fixture
def gpu_node(tmp_path, aws, request) -> Harness:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    h = Harness(tmp_path, aws, env_toml=ENV_TOML.replace("@COMMAND@", pool_command(script)), workload="",
                max_retries=0, pool="gpu")  # fmt: skip
    request.addfinalizer(h.stop_agents)
    return h


def _agent(h: Harness, node: str, imds_url: str = "http://127.0.0.1:9"):
    # The workload runs in the agent's work dir: it imports tidefleet.agent.checkpoint from this checkout.
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return h.start_agent(node, imds_url, PYTHONPATH=path)


def _told(h: Harness, job: str) -> str:
    logs = "\n".join(line for _, line in sdk.log_lines(h.env, job))
    agents = "".join(f"\nagent {p.stem[6:]}:\n{p.read_text()[-3000:]}" for p in sorted(h.tmp.glob("agent-*.log")))
    return f"\nitem log:\n{logs[-6000:]}{agents}"


def _summary(h: Harness, job: str, item) -> str:
    """What a passing run shows with -rP: the item's log less tracebacks (torchrun's own, on the
    notice's SIGTERM), and what the agent saw its GPU do."""
    lines = [line for _, line in sdk.log_lines(h.env, job) if not line.startswith((" ", "Traceback"))]
    return (f"item log:\n{chr(10).join(lines)[-2500:]}\nitem on GPU: {item.gpu_util_pct}% busy, "
            f"{item.gpu_mem_peak_mb} MB peak, node {item.node}")  # fmt: skip


def _starts(h: Harness, job: str) -> list[tuple[int, int, int]]:
    """(rank, world size, step) of each `rank R of W starts at step S` the script printed, in order."""
    logs = "\n".join(line for _, line in sdk.log_lines(h.env, job))
    return [tuple(map(int, m)) for m in re.findall(r"rank (\d+) of (\d+) starts at step (\d+)", logs)]


def _saved(h: Harness) -> tuple[int, set[str]]:
    """The step of the item's checkpoint and where its tensors lived when saved (map_location sees
    torch's own tag, e.g. 'cuda:0', and keeps the storage on the CPU: this process never touches CUDA)."""
    import torch

    (path,) = (h.tmp / "checkpoints").rglob("train.pt")
    where: set[str] = set()
    state = torch.load(io.BytesIO(path.read_bytes()), map_location=lambda storage, tag: where.add(tag) or storage)
    return state["step"], where


def _ended(h: Harness, job: str, timeout_s: float, what: str):
    try:
        return wait_until(lambda: (i := h.items(job)["000000"]).status in ("succeeded", "failed") and i, timeout_s, what)
    except AssertionError as err:
        raise AssertionError(f"{err}{_told(h, job)}") from None


def test_the_readme_training_script_trains_on_the_gpu_with_nccl_under_torchrun(gpu_node):
    h = gpu_node
    job = sdk.submit(h.env, "train", "train", sdk.read_items([[str(STEPS)]]), kick=False).job_id
    _agent(h, "gpu-node")
    item = _ended(h, job, 180, "the item to finish on the GPU")
    told = _told(h, job)
    print(_summary(h, job, item))
    assert (item.status, item.attempts, item.interruptions, item.failures) == ("succeeded", 1, 0, 0), told
    assert _starts(h, job) == [(0, 1, 0)], told
    # Rank 0's last checkpoint: every step done, its model saved from the GPU (the script's `gpu` branch,
    # which also chose nccl: the same flag picks both).
    assert _saved(h) == (STEPS, {"cuda:0"}), told


def test_the_readme_training_script_on_the_gpu_stops_on_a_spot_notice_and_resumes_there_once(gpu_node):
    h, imds = gpu_node, Imds("i-0gpu")
    try:
        job = sdk.submit(h.env, "train", "train", sdk.read_items([[str(RESUMED_STEPS)]]), kick=False).job_id
        first = _agent(h, "gpu-a", imds.url)
        try:
            wait_until(lambda: list((h.tmp / "checkpoints").rglob("train.pt")), 120, "the first checkpoint (step 500)")
        except AssertionError as err:
            raise AssertionError(f"{err}{_told(h, job)}") from None
        imds.spot_action = {"action": "terminate", "time": "2030-01-01T00:00:00Z"}
        assert first.wait(timeout=60) == 0, _told(h, job)
        item = wait_until(lambda: (i := h.items(job)["000000"]).attempts and i.status != "running" and i, 60,
                          "the item back after the notice")  # fmt: skip
        assert item.interruptions == 1, f"not handed back (done before the notice? raise RESUMED_STEPS): {item}"
        assert item.failures == 0 and item.history[0]["outcome"] == "interrupted", (item, _told(h, job))
        _agent(h, "gpu-b")
        item = _ended(h, job, 180, "the resumed item to finish on the GPU")
        told = _told(h, job)
        print(_summary(h, job, item))
        assert (item.status, item.attempts, item.interruptions, item.failures) == ("succeeded", 2, 1, 0), told
        # The second attempt started where the first stopped: after the checkpoint that let the notice go.
        (_, _, zero), (rank, world, resumed) = _starts(h, job)
        assert (rank, world, zero) == (0, 1, 0) and SAVE_EVERY <= resumed < RESUMED_STEPS, told
        assert _saved(h) == (RESUMED_STEPS, {"cuda:0"}), told
    finally:
        imds.close()
