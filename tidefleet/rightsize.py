"""Right-sizing from measured use: how many items a node of each type fits, which type runs an
item-hour cheapest, what that would have saved, and which items hit their memory or time limit.
Pure: it reads priced attempts (`tidefleet.costs.Charge`) and the type table in `tidefleet.prices`.

What an item needs: its p95 cores (cpu_s / seconds) and its largest peak RSS, each with
`HEADROOM`; GPUs as it was given them, on a GPU whose memory holds its largest GPU memory peak.
A node keeps `RESERVED_MEM` of its memory for the system and the agent. The saving assumes an
item runs as long on the recommended type as it did (it gets at least the cores it used).
A gang queue's item is one member per node, each taking the whole node (config validation holds
its slots_per_item to every type's slots): a node fits one, never more, whatever its size.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from tidefleet import prices
from tidefleet.config import Environment
from tidefleet.costs import Charge, hourly

HEADROOM = 1.2  # needs are measured peaks (memory) and p95s (cores) plus this
RESERVED_MEM = 0.1  # share of a node's memory the system and the agent keep
MIN_CORES = 0.05  # an item that waits on I/O still needs some CPU
MEMORY_KILLED = (137, -9)  # SIGKILL outside a timeout: the kernel's (or the container's) OOM killer
FLAGS_SHOWN = 10
TIE = 1e-9  # relative: costs this close are equal (sums of the same prices in another order)
GANG = "gang"  # limited_by where more would fit but a gang member takes the whole node
# Burstable types run a sustained load only up to their CPU credits: never suggested, only sized
# when a pool already uses them.
BURSTABLE = ("t2.", "t3.", "t3a.", "t4g.", "e2-micro", "e2-small", "e2-medium")


@dataclass(frozen=True)
class Need:
    cores: float
    mem_mb: float
    gpus: float  # per item; 0 without GPUs
    gpu_mem_mb: float  # its largest GPU memory peak (0 when not measured)


@dataclass(frozen=True)
class Fit:
    instance_type: str
    items_per_node: int
    usd_per_item_hour: float
    limited_by: str  # cores, memory, GPUs, or GANG


@dataclass(frozen=True)
class Now:
    """A type the items ran on: items per node now, what fits, and the pool's slots_per_unit for it."""

    instance_type: str
    items: int
    fits: Fit | None
    slots_per_unit: int | None


@dataclass(frozen=True)
class Advice:
    scope: str  # "queue Q" or "job J"
    attempts: int  # attempts measured
    cores_p95: float
    peak_rss_mb: float
    gpu_util_pct: float | None  # mean, when measured
    gpu_mem_peak_mb: float | None
    need: Need
    now: tuple[Now, ...]
    best: Fit | None
    spot: bool  # the lifecycle compared (the one most attempts ran on)
    item_hours: float
    spent_usd: float
    expected_usd: float | None  # the same item-hours on `best`
    hit_memory: tuple[str, ...]  # item ids
    hit_time: tuple[str, ...]
    gang: bool = False  # a gang queue's members: one per node

    @property
    def saving_usd(self) -> float:
        """0 below float rounding (a saving of $0.000000000000000003 is the same cost summed twice)."""
        saved = self.spent_usd - self.expected_usd if self.expected_usd is not None else 0.0
        return saved if saved > self.spent_usd * TIE else 0.0


def p95(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]


def need_of(found: Sequence[Charge]) -> tuple[Need, float, float, float | None, float | None]:
    """(what one item needs, p95 cores, max RSS, mean GPU util, max GPU memory) of these attempts."""
    cores = [c.entry["cpu_s"] / c.seconds for c in found if c.entry.get("cpu_s") is not None and c.seconds > 0]
    rss = [c.entry["peak_rss_mb"] for c in found if c.entry.get("peak_rss_mb") is not None]
    util = [c.entry["gpu_util_pct"] for c in found if c.entry.get("gpu_util_pct") is not None]
    gmem = [c.entry["gpu_mem_peak_mb"] for c in found if c.entry.get("gpu_mem_peak_mb") is not None]
    gpus = max((spec_of(c.instance_type)[2] * c.share for c in found), default=0.0)
    cores_p95, rss_max = (p95(cores) if cores else 0.0), max(rss, default=0.0)
    need = Need(max(MIN_CORES, cores_p95 * HEADROOM), rss_max * HEADROOM, gpus, max(gmem, default=0.0) * HEADROOM)
    return need, cores_p95, rss_max, (sum(util) / len(util) if util else None), max(gmem, default=None)


def spec_of(instance_type: str) -> tuple[int, float, int, float]:
    return prices.SPECS.get(instance_type, (0, 0.0, 0, 0.0))


def fit(instance_type: str, need: Need, usd_per_hour: float | None, *, gang: bool = False) -> Fit | None:
    """How many such items one node runs at once, and the price of an item-hour; None if none fits
    or the type's size or price is unknown. A `gang` member: one at most (it takes the node)."""
    vcpus, mem_gib, gpus, gpu_mem_gib = spec_of(instance_type)
    if not vcpus or usd_per_hour is None:
        return None
    limits = {"cores": vcpus / need.cores}
    if need.mem_mb:
        limits["memory"] = mem_gib * 1024 * (1 - RESERVED_MEM) / need.mem_mb
    if need.gpus:
        if not gpus or gpu_mem_gib * 1024 < need.gpu_mem_mb:
            return None
        limits["GPUs"] = gpus / need.gpus
    limited_by = min(limits, key=limits.get)
    n = math.floor(limits[limited_by] + 1e-9)
    if gang and n > 1:
        n, limited_by = 1, GANG
    return Fit(instance_type, n, usd_per_hour / n, limited_by) if n >= 1 else None


def candidates(env: Environment, pool: str) -> list[str]:
    """The pool's types and every sized, non-burstable type of the same cloud (AWS names have a
    dot, GCE's a dash)."""
    same_cloud = [t for t in prices.SPECS if ("." in t) == (env.cloud == "aws") and not t.startswith(BURSTABLE)]
    return list(dict.fromkeys([t.type for t in env.pools[pool].instance_types] + same_cloud))


def advise(env: Environment, scope: str, pool: str, found: Sequence[Charge]) -> Advice:
    """Advice for the attempts `found` of one queue or job (all from `pool`)."""
    need, cores_p95, rss_max, util, gmem = need_of(found)
    spot = sum(c.spot for c in found) * 2 >= len(found)
    gang = any(env.queues[c.queue].gang[1] > 1 for c in found if c.queue in env.queues)
    now = []
    for itype in dict.fromkeys(c.instance_type for c in found):
        ran = next(c for c in found if c.instance_type == itype)
        f = fit(itype, need, hourly(env, pool, itype, spot), gang=gang)
        weight = next((t.weight for t in env.pools[pool].instance_types if t.type == itype), 1)
        slots = max(1, f.items_per_node * ran.entry.get("slots", 1) // weight) if f else None
        now.append(Now(itype, round(1 / ran.share), f, slots))
    fits = [f for t in candidates(env, pool) if (f := fit(t, need, hourly(env, pool, t, spot), gang=gang)) is not None]
    # Of the cheapest (equal within float rounding: c6i.large and c6i.2xlarge cost the same per
    # item-hour), a type the items run on already: a change that saves nothing is no advice.
    cheapest = min((f.usd_per_item_hour for f in fits), default=0.0)
    running = {n.instance_type for n in now}
    best = min((f for f in fits if f.usd_per_item_hour <= cheapest * (1 + TIE)),
               key=lambda f: (f.instance_type not in running, f.instance_type), default=None)  # fmt: skip
    item_hours = sum(c.seconds for c in found) / 3600
    memory, time_ = [], []
    for c in found:
        reason = str(c.entry.get("reason", ""))
        if reason.startswith("timed out"):
            time_.append(c.item_id)
        elif c.entry.get("exit_code") in MEMORY_KILLED:
            memory.append(c.item_id)
    return Advice(scope, len(found), cores_p95, rss_max, util, gmem, need, tuple(now), best, spot, item_hours,
                  sum(c.cost_usd for c in found), best.usd_per_item_hour * item_hours if best else None,
                  tuple(dict.fromkeys(memory)), tuple(dict.fromkeys(time_)), gang)  # fmt: skip
