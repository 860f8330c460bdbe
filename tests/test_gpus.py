"""A node's GPUs: found through the driver (a fake nvidia-smi on PATH here), refused when the
driver is broken, handed out per item without overlap, and each item's usage recorded."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidefleet.agent.gpus import (
    Devices,
    Gpu,
    GpuProblem,
    Usage,
    account,
    docker_gpu_args,
    query,
    sample,
    visible_env,
)

FAKES = Path(__file__).parent / "fakes"


@pytest.fixture
def fake_driver(monkeypatch):
    monkeypatch.setenv("PATH", f"{FAKES}:/usr/bin:/bin")
    return monkeypatch


def test_the_driver_lists_the_node_s_gpus(fake_driver):
    fake_driver.setenv("FAKE_GPUS", "4")
    assert [g.index for g in query(4)] == [0, 1, 2, 3]
    assert query(4)[2] == Gpu(2, "GPU-fake-2", 81920)


@pytest.mark.parametrize(("setup", "expected"), [
    ({"FAKE_GPUS": "1"}, "1 of the 2 GPUs of this instance type are visible to the driver"),
    ({"FAKE_NVIDIA_FAIL": "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver"},
     "nvidia-smi failed (NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver)"),
    ({"PATH": "/nonexistent"}, "nvidia-smi not found: the NVIDIA driver is not installed"),
])  # fmt: skip
def test_a_node_whose_driver_does_not_work_is_unhealthy(fake_driver, setup, expected):
    for key, value in setup.items():
        fake_driver.setenv(key, value)
    with pytest.raises(GpuProblem, match=expected.replace("(", r"\(").replace(")", r"\)")):
        query(2)


def test_garbage_from_the_driver_is_a_problem_not_a_crash():
    with pytest.raises(GpuProblem, match="unexpected"):
        query(1, run=lambda args: "0, GPU-x\n")
    with pytest.raises(GpuProblem, match="not a GPU's number"):
        query(1, run=lambda args: "zero, GPU-x, 100\n")
    # CUDA_VISIBLE_DEVICES=-1 would hide every GPU from the item given it
    with pytest.raises(GpuProblem, match=r"index that is not a GPU's number \('-1'\)"):
        query(1, run=lambda args: "-1, GPU-x, 100\n")
    assert query(1, run=lambda args: "0, GPU-x, inf\n") == [Gpu(0, "GPU-x", None)]  # int(inf) raised OverflowError


def test_a_driver_warning_among_the_rows_loses_no_gpu():
    warned = "WARNING: infoROM is corrupted at gpu 0000:00:1E.0\n0, GPU-a, 81920\n1, GPU-b, 81920\n"
    assert [g.uuid for g in query(2, run=lambda args: warned)] == ["GPU-a", "GPU-b"]
    assert sample(run=lambda args: "WARNING: infoROM is corrupted\n0, 40, 1000\n") == {0: (40.0, 1000.0)}


def gpus(n: int) -> list[Gpu]:
    return [Gpu(i, f"GPU-{i}", 80000) for i in range(n)]


def test_one_slot_items_on_a_two_gpu_node_get_disjoint_devices():
    devices = Devices(gpus(2), slots_per_gpu=1)
    assert devices.take("a", 1) == [0] and devices.take("b", 1) == [1]
    assert not devices.fits(1) and devices.take("c", 1) == []
    devices.give_back("a")
    assert devices.take("c", 1) == [0]


def test_a_multi_gpu_item_gets_whole_free_gpus_only():
    devices = Devices(gpus(4), slots_per_gpu=2)
    assert devices.take("small", 1) == [0]
    assert devices.take("big", 4) == [1, 2]
    assert devices.take("big2", 4) == []  # GPU 0 is shared, 3 alone is not enough
    assert devices.take("half", 2) == [3]


def test_sharing_packs_small_items_onto_the_fullest_gpu_that_fits():
    devices = Devices(gpus(2), slots_per_gpu=4)
    assert [devices.take(h, 1) for h in "abc"] == [[0], [0], [0]]
    assert devices.take("d", 2) == [1]  # GPU 0 has one slot left
    assert devices.take("e", 1) == [0]
    assert devices.take("f", 4) == []


def test_no_two_holders_ever_share_a_slot():
    import random

    rng = random.Random(7)
    devices = Devices(gpus(8), slots_per_gpu=2)
    for step in range(2000):
        if devices.held and rng.random() < 0.45:
            devices.give_back(rng.choice(sorted(devices.held)))
        else:
            devices.take(f"h{step}", rng.choice([1, 1, 2, 3, 4, 8]))
        assert all(0 <= devices.free(g.index) <= 2 for g in devices.gpus)


def test_the_workload_sees_only_its_own_devices():
    assert visible_env([1, 3]) == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "1,3",
                                   "NVIDIA_VISIBLE_DEVICES": "1,3"}  # fmt: skip
    assert docker_gpu_args([1, 3]) == ["--gpus", '"device=1,3"']
    assert docker_gpu_args([]) == []


def test_each_item_s_usage_is_the_mean_utilisation_and_peak_memory_of_its_gpus(fake_driver):
    fake_driver.setenv("FAKE_GPU_UTIL", "50")
    usages: dict[str, Usage] = {}
    account(usages, {"a": [0], "b": [1]}, sample())
    account(usages, {"a": [0], "b": [1]}, {0: (100.0, 500.0), 1: (0.0, 9000.0)})
    assert usages["a"].record() == {"gpu_util_pct": 75.0, "gpu_mem_peak_mb": 1000.0}
    assert usages["b"].record() == {"gpu_util_pct": 25.0, "gpu_mem_peak_mb": 9000.0}
    assert Usage().record() == {}


def test_a_reading_the_driver_does_not_have_is_unknown_not_zero(fake_driver):
    """A MIG-enabled GPU reports no utilisation ("[N/A]"): 0 would read as an idle GPU."""
    fake_driver.setenv("FAKE_GPU_UTIL", "[N/A]")
    usages: dict[str, Usage] = {}
    account(usages, {"a": [0], "b": [1]}, sample())
    assert usages["a"].record() == {"gpu_util_pct": None, "gpu_mem_peak_mb": 1000.0}
    assert usages["b"].record() == {"gpu_util_pct": None, "gpu_mem_peak_mb": 1001.0}
    no_memory = "0, 40, [Not Supported]\n1, 60, 500\n"
    account(usages, {"a": [0], "pair": [0, 1]}, sample(run=lambda args: no_memory))
    assert usages["a"].record() == {"gpu_util_pct": 40.0, "gpu_mem_peak_mb": 1000.0}, "each over the samples that had it"
    assert usages["pair"].record() == {"gpu_util_pct": 50.0, "gpu_mem_peak_mb": None}, "a part of a sum is no sum"


def test_a_gpu_whose_driver_does_not_say_its_memory_is_found_with_its_memory_unknown():
    assert query(2, run=lambda args: "0, GPU-a, [N/A]\n1, GPU-b, 81920\n") == [Gpu(0, "GPU-a", None), Gpu(1, "GPU-b", 81920)]


def test_a_node_with_more_gpus_than_slots_gives_each_slot_its_share():
    devices = Devices.for_node(gpus(8), slots=2)
    assert devices.take("a", 1) == [0, 1, 2, 3] and devices.take("b", 1) == [4, 5, 6, 7]
    assert Devices.for_node(gpus(2), slots=8).slots_per_gpu == 4


def _driver(tmp_path, monkeypatch, script: str) -> None:
    """An nvidia-smi of this shell script first on PATH."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\n{script}\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")


def test_a_byte_that_is_not_utf8_costs_only_its_own_row_s_reading(tmp_path, monkeypatch):
    """A driver's Latin-1 byte (0xe9, 0xa5) is read as U+FFFD: the node keeps its GPUs, and only
    the reading that does not parse is unknown (a UnicodeDecodeError had refused the node)."""
    _driver(tmp_path, monkeypatch, r"""case "$1" in
  *uuid*) printf 'WARNING: d\351faut\n0, GPU-a, 81920\n1, GPU-\351, 81920\n' ;;
  *) printf '0, 40, 1000\n1, 4\2450, 2000\n' ;;
esac""")
    assert [(g.index, g.memory_mb) for g in query(2)] == [(0, 81920), (1, 81920)]
    assert sample() == {0: (40.0, 1000.0), 1: (None, 2000.0)}


def test_a_gpu_missing_from_the_readings_is_given_to_no_item_until_it_is_back():
    """A GPU that fell off the bus fails every item given it: while nvidia-smi does not list it,
    items fit on the others only; `seen` says which went missing and which came back, once each."""
    devices = Devices(gpus(2), slots_per_gpu=1)
    assert devices.seen({0: (40.0, 1000.0)}) == ([Gpu(1, "GPU-1", 80000)], [])
    assert devices.seen({0: (40.0, 1000.0)}) == ([], []), "said once"
    assert devices.take("a", 1) == [0]
    assert not devices.fits(1), "GPU 1 is free but missing"
    assert devices.seen({0: (40.0, 1000.0), 1: (0.0, 0.0)}) == ([], [Gpu(1, "GPU-1", 80000)])
    assert devices.fits(1) and devices.take("b", 1) == [1]


def test_a_gpu_that_went_missing_after_the_fit_check_is_still_handed_out_not_none():
    """The agent checks `fits` before the claim and `take`s after it; a GPU that went missing
    in between is given as it would have been, never no device (the workload would see them all)."""
    devices = Devices(gpus(2), slots_per_gpu=1)
    devices.take("a", 1)
    assert devices.fits(1)
    devices.seen({0: (40.0, 1000.0)})
    assert devices.take("b", 1) == [1]
