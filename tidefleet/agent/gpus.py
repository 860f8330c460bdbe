"""A node's GPUs: which exist and work, which item holds which, and what each item used.

Slots map to devices: a node of `gpus` GPUs and `slots` slots gives each slot gpus // slots
whole GPUs, or, with GPU sharing (`gpu_sharing = true`, more slots than GPUs), each GPU
slots // gpus slots. An item needing a GPU's slots or more gets whole GPUs of its own; a
smaller one shares a GPU with others, packed onto the fullest GPU it fits. The workload sees only its own devices
(`CUDA_VISIBLE_DEVICES`, `NVIDIA_VISIBLE_DEVICES`; containers `--gpus "device=…"`).

Everything here is pure but `query`, which runs `nvidia-smi` (the driver's own CLI, present
wherever the driver is) and turns any failure into a `GpuProblem`.
"""

from __future__ import annotations

import math
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

NVIDIA_SMI = "nvidia-smi"
QUERY_TIMEOUT_S = 20


class GpuProblem(Exception):
    """The node's GPUs are not usable: it must not take items (one line says why)."""


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    memory_mb: int | None  # None: the driver does not say


Runner = Callable[[Sequence[str]], str]
Reading = tuple[float | None, float | None]  # (utilisation %, memory used MB); None: the GPU has no such reading


def run_nvidia_smi(args: Sequence[str]) -> str:
    """stdout of `nvidia-smi ARGS`; a GpuProblem when it is missing, hangs or fails. A byte that is
    not UTF-8 (a driver message in another encoding) reads as U+FFFD: only a row it is in can fail
    to parse (`_rows`, `_number`), never the whole output."""
    try:
        done = subprocess.run([NVIDIA_SMI, *args], capture_output=True, text=True, encoding="utf-8", errors="replace",
                              timeout=QUERY_TIMEOUT_S, check=False)  # fmt: skip
    except FileNotFoundError:
        raise GpuProblem(f"{NVIDIA_SMI} not found: the NVIDIA driver is not installed (use a GPU image)") from None
    except (OSError, subprocess.TimeoutExpired) as err:
        raise GpuProblem(f"{NVIDIA_SMI} did not answer ({err}): the driver is not working") from None
    if done.returncode != 0:
        why = (done.stderr or done.stdout).strip().splitlines()
        raise GpuProblem(f"{NVIDIA_SMI} failed ({why[0] if why else f'exit {done.returncode}'}): the driver is not working")
    return done.stdout


def _rows(text: str, width: int) -> list[list[str]]:
    """The CSV rows of `width` cells. Other lines are skipped: the driver prints warnings on stdout
    too ("WARNING: infoROM is corrupted at gpu ...") and a GPU's readings must not be lost to one."""
    rows = [[cell.strip() for cell in line.split(",")] for line in text.splitlines() if line.strip()]
    good = [r for r in rows if len(r) == width]
    if rows and not good:
        raise GpuProblem(f"{NVIDIA_SMI} printed something unexpected ({', '.join(rows[0])!r})")
    return good


def _number(cell: str) -> float | None:
    """A reading, or None where nvidia-smi prints "[N/A]" or "[Not Supported]": the GPU has no such
    reading (a MIG-enabled GPU reports no utilisation). Unknown, never 0, which reads as idle."""
    try:
        return float(cell)
    except ValueError:
        return None


def query(expected: int, run: Runner = run_nvidia_smi) -> list[Gpu]:
    """The node's GPUs, checked against the `expected` count its instance type has."""
    rows = _rows(run(["--query-gpu=index,uuid,memory.total", "--format=csv,noheader,nounits"]), 3)
    # An index is what CUDA_VISIBLE_DEVICES names: plain digits (-1 there hides every GPU).
    if bad := next((index for index, _, _ in rows if not (index.isascii() and index.isdigit())), None):
        raise GpuProblem(f"{NVIDIA_SMI} printed an index that is not a GPU's number ({bad!r})")
    gpus = [Gpu(int(index), uuid, int(total) if (total := _number(memory)) is not None and math.isfinite(total) else None)
            for index, uuid, memory in rows]  # fmt: skip
    if len(gpus) < expected:
        raise GpuProblem(f"{len(gpus)} of the {expected} GPUs of this instance type are visible to the driver")
    return gpus[:expected]


@dataclass
class Devices:
    """Which item holds which slots of which GPU. Not thread-safe: the agent holds its lock."""

    gpus: list[Gpu]
    slots_per_gpu: int = 1
    gpus_per_slot: int = 1
    held: dict[str, dict[int, int]] = field(default_factory=dict)  # holder -> {gpu index: slots}
    missing: set[int] = field(default_factory=set)  # listed at start, absent from the last readings (`seen`)

    @classmethod
    def for_node(cls, gpus: list[Gpu], slots: int) -> Devices:
        """The node's GPUs split among its slots (config validation makes one divide the other)."""
        n = len(gpus)
        return cls(gpus, slots_per_gpu=max(1, slots // n), gpus_per_slot=max(1, n // slots))

    def free(self, index: int) -> int:
        return self.slots_per_gpu - sum(h.get(index, 0) for h in self.held.values())

    def seen(self, readings: dict[int, Reading]) -> tuple[list[Gpu], list[Gpu]]:
        """The node's GPUs that went missing from nvidia-smi's readings since the last ones, and
        those back in them. A missing GPU (fallen off the bus) would fail every item given it:
        while it is missing, items fit on the others only."""
        now = {g.index for g in self.gpus if g.index not in readings}
        gone = [g for g in self.gpus if g.index in now - self.missing]
        back = [g for g in self.gpus if g.index in self.missing - now]
        self.missing = now
        return gone, back

    def fits(self, slots: int) -> bool:
        return self._pick(slots, [g for g in self.gpus if g.index not in self.missing]) is not None

    def take(self, holder: str, slots: int) -> list[int]:
        """The GPU indices `holder` gets for an item of `slots` slots (sorted); [] if it does not fit.
        GPUs not missing first; one that went missing since the caller's `fits` is still given
        rather than none, which would let the workload see every GPU."""
        picked = self._pick(slots, [g for g in self.gpus if g.index not in self.missing])
        if picked is None:
            picked = self._pick(slots, self.gpus)
        if picked is None:
            return []
        self.held[holder] = picked
        return sorted(picked)

    def give_back(self, holder: str) -> None:
        self.held.pop(holder, None)

    def _pick(self, slots: int, gpus: list[Gpu]) -> dict[int, int] | None:
        per = self.slots_per_gpu
        if slots >= per:  # whole GPUs, untouched by anyone
            whole = -(-slots // per) * self.gpus_per_slot
            empty = [g.index for g in gpus if self.free(g.index) == per]
            return {i: per for i in empty[:whole]} if len(empty) >= whole else None
        # Part of one GPU: the fullest one it fits, so whole GPUs stay free for big items.
        fitting = sorted((self.free(g.index), g.index) for g in gpus if self.free(g.index) >= slots)
        return {fitting[0][1]: slots} if fitting else None


def visible_env(indices: list[int]) -> dict[str, str]:
    """What tells CUDA (and the NVIDIA container runtime) which devices are the item's. The indices
    are nvidia-smi's, in PCI bus order; CUDA's own order puts the fastest first, which on a node
    of mixed GPUs would hand the item another device than the one its usage is read from."""
    devices = ",".join(str(i) for i in indices)
    return {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": devices, "NVIDIA_VISIBLE_DEVICES": devices}


def docker_gpu_args(indices: list[int]) -> list[str]:
    """`docker run` arguments giving a container exactly these devices (the quotes keep the commas)."""
    return ["--gpus", f'"device={",".join(str(i) for i in indices)}"'] if indices else []


@dataclass
class Usage:
    """What one item's GPUs did while it ran: mean utilisation and peak memory, each over the
    samples that had that reading (None: unknown)."""

    samples: int = 0
    util_samples: int = 0
    util_sum: float = 0.0
    memory_peak_mb: float | None = None

    def add(self, util_pct: float | None, memory_mb: float | None) -> None:
        self.samples += 1
        if util_pct is not None:
            self.util_samples += 1
            self.util_sum += util_pct
        if memory_mb is not None:
            self.memory_peak_mb = max(self.memory_peak_mb or 0.0, memory_mb)

    def record(self) -> dict:
        """The attempt's fields for the item's record: a reading no sample had is None (unknown,
        and a previous attempt's value is cleared), never 0."""
        if not self.samples:
            return {}
        util = round(self.util_sum / self.util_samples, 1) if self.util_samples else None
        peak = None if self.memory_peak_mb is None else round(self.memory_peak_mb, 1)
        return {"gpu_util_pct": util, "gpu_mem_peak_mb": peak}


def sample(run: Runner = run_nvidia_smi) -> dict[int, Reading]:
    """Per GPU index: its reading now."""
    rows = _rows(run(["--query-gpu=index,utilization.gpu,memory.used", "--format=csv,noheader,nounits"]), 3)
    return {int(index): (_number(util), _number(used)) for index, util, used in rows
            if index.isascii() and index.isdigit()}


def account(usages: dict[str, Usage], held: dict[str, list[int]], readings: dict[int, Reading]) -> None:
    """Add one reading to each holder's usage: the mean utilisation and summed memory of its GPUs,
    each unknown unless every one of them has it (a partial sum would understate it). A shared GPU's
    reading is the whole GPU's: with sharing it is an upper bound, said so in the README."""
    for holder, indices in held.items():
        mine = [readings[i] for i in indices if i in readings]
        if mine:
            utils, memory = [u for u, _ in mine], [m for _, m in mine]
            usages.setdefault(holder, Usage()).add(None if None in utils else sum(utils) / len(utils),
                                                   None if None in memory else sum(memory))  # fmt: skip
