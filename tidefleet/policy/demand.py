"""How many new slots a pool's queues need, beyond counting slots (rules 1a and 1b of scaling.py).

Both functions walk the queues highest priority first, so what a prefix of queues needs never
depends on the queues after it: the environment budget is shared by those prefixes, and more
waiting items never lower what is needed (each rule is monotone in demand).

1a. Boot horizon. A new node is ready only `boot_estimate_s` after launch. A serving slot whose
    queue finishes items every `mean_item_s` seconds starts about 1 + floor(horizon / mean)
    items within a horizon (the one it runs or takes now, then one per mean). Only the items
    beyond that need new slots. The horizon is the boot estimate (a covered item starts no later
    than a new node could start it), or longer when the queue's wait target allows it: the
    oldest item may still wait `target_wait_s - oldest_age_s`, and every waiting item is
    younger, so items the serving slots start within that need no node (`wait_horizon`). Once
    the oldest item's remaining wait at the next tick is below a boot, the horizon is the boot
    again: this tick is the last whose launch is in time, and waiting work that turnover does
    not cover launches at once. The floor keeps the expected wait of a
    covered item within the horizon; an unknown mean or one longer than the horizon gives 1 item
    per slot: plain slot counting. Before any item finished, a queue with a target (not a gang's)
    is taken to run items of two boots (`item_mean`); otherwise its mean is unknown. Once every busy slot
    of the queue turned over within the last rate window, or while the wait target leaves more than
    a boot and its agents take items, the warm slots pool their turnover instead (`pooled_mean`). Booting
    slots are used first, as they serve every queue alike, the soonest ready first: each starts
    1 + floor((horizon - its boot left) / mean). New slots alike, a whole boot away: within a
    wait target, a burst gets a node per few items, not one per item (1 each once the oldest
    item has only a boot left). Waiting items come in cohorts by age (`cohorts`, from the tick's
    waiting marks), first in, first out: each cohort's horizon is its own, and the slots started
    by it must cover it and every older one (items in flight first): younger items may wait for
    slots older ones leave. Turnover is an estimate from the items that finished, and busy slots
    may run items far longer (heavy tails: what finishes is short, what runs is long): items
    that waited a boot and would now miss their target, while the queue's agents took fewer
    items over the last rate window than are late (`late_items`), get the slots free now (kept
    from scale-in; a drained, cordoned node is uncordoned for them) or booting, else new ones,
    whatever turnover promises. Without this, a Philly item waited 40 minutes on an uncapped
    pool behind 29 busy slots of a 24-minute mean.
1b. Packing. An item of k > 1 slots starts only on one node with k free slots. Waiting items
    of such queues, and the members forming gangs still wait for (each a whole node: slots
    scattered over busy nodes take none), are placed on the serving nodes' free slots (booting
    nodes are all free), biggest first within a priority, each on the node with the fewest free
    slots that fit it.
    Items that fit nowhere need new nodes of the pool's smallest type (every type fits the
    queue's items: a config rule), unless their wait target lets them wait for the slots the
    queue's items free (`deferred`: the slots of each item in flight or placed now take 1 item
    per mean within a horizon, as in 1a, those placed on a booting node once it is up; the
    youngest unplaced items wait, the oldest launch once due). New nodes turn over alike: each
    slot group starts 1 item once booted, then 1 per mean within the oldest launching item's
    horizon (`rounds_per_new_slot`), so a burst of short multi-slot items gets a node per few
    items, as 1-slot ones do. Nodes holding a placement are kept from scale-in.
13. Items only on-demand nodes take (scaling rule 13) are placed the same way, first, on the free
    slots of the on-demand nodes that take items, items of one slot included; packing then sees
    what they leave.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tidefleet.policy.model import RATE_WINDOW_S, NodeView, QueueView

if TYPE_CHECKING:
    from collections.abc import Iterable

    from tidefleet.config import Queue


def gang_counts(queue: Queue, visible: int, in_flight: int) -> tuple[int, int]:
    """A queue's (visible, in flight) messages as demand: a gang item counts its gang's `max`
    members (an elastic gang grows to it), each a whole node of slots_per_item, so the policy
    counts nodes' worth of items unchanged. The tick and the simulator's baselines both use it."""
    nodes = queue.gang[1]
    return visible * nodes, in_flight * nodes


def demand_slots(queue: QueueView) -> int:
    return (queue.visible + queue.in_flight) * queue.slots_per_item


@dataclass(frozen=True, slots=True)
class Horizon:
    """Rule 1a for one pool: slots each queue still needs, and what turnover covered."""

    uncovered: tuple[int, ...]  # per queue, in the given order
    waiting: int  # items waiting in queues whose serving slots turn over within the boot
    started: int  # of them, items serving slots start before a new node would be ready
    means: tuple[float, ...]  # the mean run times that turned over
    stalled: tuple[tuple[str, int], ...] = ()  # (queue, items) past their target that launched nodes
    guessed: tuple[str, ...] = ()  # queues whose mean is `item_mean`'s guess: none of their items finished


def wait_horizon(queue: QueueView, boot_s: int, age_s: float | None = None) -> float:
    """How long waiting items of this age (default: the oldest's) may wait for serving slots
    before a node must launch for them: what is left of their target, while the next tick could
    still launch a node in time for it (`QueueView.next_tick_s`); else a boot, this tick being the
    last that can. Without it, 4 items left at 71 s of a 120-s target waited for turnover that
    did not come, and the next tick, at 81 s, launched nodes ready at 126 s."""
    age_s = queue.oldest_age_s if age_s is None else age_s
    if queue.target_wait_s is None or age_s is None:
        return boot_s
    left = queue.target_wait_s - age_s
    return left if left - queue.next_tick_s >= boot_s else boot_s


def cohorts(queue: QueueView) -> list[tuple[float, int]]:
    """The queue's waiting items as (horizon-defining age, items) oldest first, `visible` in all:
    the marks' cohorts (`QueueView.waiting_ages`), items beyond them the youngest (age 0), fewer
    waiting than they hold taken from the oldest (the queue is about first in, first out).
    Without cohorts, every item is as old as the oldest: the most a tick can know from counts."""
    if not queue.waiting_ages:
        return [(queue.oldest_age_s, queue.visible)] if queue.visible else []
    extra = queue.visible - sum(n for _, n in queue.waiting_ages)
    out = drop_oldest(queue.waiting_ages, max(0, -extra))
    if extra > 0:
        out.append((0.0, extra))
    return out


def drop_oldest(cohorts: Iterable[tuple[float, int]], items: int) -> list[tuple[float, int]]:
    """(when or age, items) cohorts, oldest first, less `items` taken from the oldest first (a
    queue is about first in, first out); emptied cohorts are left out."""
    out = []
    for key, n in cohorts:
        taken = min(n, items)
        items -= taken
        if n > taken:
            out.append((key, n - taken))
    return out


def boot_horizon(queues: list[QueueView], warm_slots: int, booting: list[float], boot_s: int,
                 free_slots: int = 0, late: list[int] | None = None) -> Horizon:  # fmt: skip
    """`booting`: per booting slot, the seconds until its node is expected ready; `free_slots`: of
    the warm slots, those free now; `late`: per queue, its `late_items` (when the caller has them)."""
    late = [late_items(q, boot_s) for q in queues] if late is None else late
    warm_left, boot_left = warm_slots, sorted(booting)
    room = free_slots + len(booting)  # what items past their target may have without turnover
    uncovered, waiting, started, means, stalled, guessed = [], 0, 0, [], [], []
    for q, q_late in zip(queues, late, strict=True):
        mean, due = item_mean(q, boot_s), _deadlines(q, boot_s)
        if not due:
            uncovered.append(0)
            continue
        nb = _booting_used(due, mean, boot_left)
        used, boot_left = boot_left[:nb], boot_left[nb:]
        short = [(h, max(0, need - _starts(mean, used, h))) for h, need in due]
        # Warm slots each start one item now and then one per mean (pooled: see `pooled_mean`).
        pooled = [pooled_mean(q, h, boot_s) for h, _ in short]  # per cohort: its horizon decides
        nw = min(warm_left, max(_warm_needed(n, mean, p, h) for (h, n), p in zip(short, pooled, strict=True)))
        warm_left -= nw
        left = [(h, max(0, n - _warm_starts(nw, mean, p, h))) for (h, n), p in zip(short, pooled, strict=True)]
        # New slots, a whole boot away, each turning over within what is left of its cohort's wait.
        new = max(math.ceil(n / (1 + turns(mean, h - boot_s))) for h, n in left)
        # Items still waiting past their target were counted on turnover that did not come (busy
        # slots run items far longer than the mean of those that finished): they get free slots
        # or new ones, whatever turnover promises.
        uncovered.append(max(new, q_late * q.slots_per_item - room))
        if q_late * q.slots_per_item - room > new:
            stalled.append((q.name, q_late))
        room = max(0, room - q_late * q.slots_per_item)
        if mean and q.visible and (any(pooled) or any(turns(mean, h) for h, _ in due)):
            waiting += q.visible
            started += max(0, q.visible - math.ceil(max(n for _, n in left) / q.slots_per_item))
            means.append(mean)
            if not q.mean_item_s:
                guessed.append(q.name)
    return Horizon(tuple(uncovered), waiting, started, tuple(means), tuple(stalled), tuple(guessed))


def late_items(q: QueueView, boot_s: int) -> int:
    """Waiting items of the queue that turnover is not reaching: each waited a boot and can no
    longer make its wait target even if a node launched now (without a target: waited a boot),
    while the queue's agents took fewer items over the last rate window (their smoothed intake x
    `RATE_WINDOW_S`) than are late. As old as that, an item with a target is decided as one
    without (the target only ever delays launches)."""
    since = boot_s if q.target_wait_s is None else max(boot_s, q.target_wait_s - boot_s)
    if not q.visible or (q.oldest_age_s is not None and q.oldest_age_s < since):
        return 0  # the oldest is younger: none is late
    late = sum(n for age, n in cohorts(q) if age is not None and age >= since)
    return late if q.intake_per_s * RATE_WINDOW_S < late else 0


def _deadlines(q: QueueView, boot_s: int) -> list[tuple[float, int]]:
    """(horizon, slots that must have started by it), one per cohort, oldest first: items in
    flight run now; the waiting ones after them, first in, first out."""
    out, due = [], q.in_flight * q.slots_per_item
    if due:
        out.append((wait_horizon(q, boot_s), due))
    for age, n in cohorts(q):
        due += n * q.slots_per_item
        out.append((wait_horizon(q, boot_s, age), due))
    return out


def pooled_mean(q: QueueView, horizon_s: float, boot_s: int) -> float | None:
    """The mean item time to pool the queue's warm slots' turnover on within a horizon, or None to
    count it per slot. Per slot, each starts 1 + floor(h / mean) items within a horizon h: a slot's
    fraction of a mean counts for nothing, right when the busy slots started together (a batch) or
    run far longer items than those that finished. Pooled, s slots start s + floor(s x h / mean)
    items together, the mean no shorter than the intake shows (in flight / intake):
    - once the queue's agents took at least as many items over the last rate window as it has in
      flight, every busy slot turned over in it, so they finish at spread-out times. Without it a
      saturated stream of ~2-minute items counted 13 busy slots as starting none within a boot,
      launched, and let the nodes go again as turnover kept up: 2,854 launches for 6,001 items;
    - while the horizon is longer than a boot (the wait target leaves time) and the agents take
      items at all. Pooling then only delays a launch until a node launched then would start the
      item by its target (from a boot's horizon on, the rule above decides; ticks may add up to a
      tick): a stream of items longer than the rate window (13 busy slots of ~11
      minutes take ~6 items in 5 minutes) had every item pay a boot on a node of its own
      while others finished within its wait (dev shapes unseen/1000-1099 and 2000-2099: mean
      cost -0.16 % and -0.14 %; p95 waits up to 102 s, within the 120-s target)."""
    mean, intake = q.mean_item_s, q.intake_per_s
    if not mean or intake <= 0 or (intake * RATE_WINDOW_S < q.in_flight and horizon_s <= boot_s):
        return None
    return max(mean, q.in_flight / intake)


def _warm_starts(slots: int, mean: float | None, pooled: float | None, horizon_s: float) -> int:
    """Items (slots) these warm slots start within the horizon: per slot, or pooled if larger."""
    per_slot = slots * (1 + turns(mean, horizon_s))
    return per_slot if pooled is None else max(per_slot, math.floor(slots * (1 + horizon_s / pooled)))


def _warm_needed(items: int, mean: float | None, pooled: float | None, horizon_s: float) -> int:
    """The fewest warm slots that start `items` within the horizon (`_warm_starts` >= items)."""
    per_slot = math.ceil(items / (1 + turns(mean, horizon_s)))
    if pooled is None:
        return per_slot
    together = math.ceil(items / (1 + horizon_s / pooled))
    while math.floor(together * (1 + horizon_s / pooled)) < items:  # float rounding: a step at most
        together += 1
    while together > 1 and math.floor((together - 1) * (1 + horizon_s / pooled)) >= items:
        together -= 1
    return min(per_slot, together)


def _starts(mean: float | None, booting: list[float], horizon_s: float) -> int:
    """Items these booting slots (seconds to ready) start within the horizon: one once ready,
    then one per mean."""
    return sum(1 + turns(mean, max(0.0, horizon_s - ready)) for ready in booting)


def _booting_used(deadlines: list[tuple[float, int]], mean: float | None, booting: list[float]) -> int:
    """The fewest of the booting slots, the soonest ready first, that start every deadline's
    slots in time (a bisection: more never start fewer); all of them if none suffice."""
    low, high = 0, len(booting)
    while low < high:
        middle = (low + high) // 2
        if all(need <= _starts(mean, booting[:middle], h) for h, need in deadlines):
            high = middle
        else:
            low = middle + 1
    return low


def item_mean(q: QueueView, boot_s: int) -> float | None:
    """The mean run time turnover is counted on: the queue's; before any of its items finished,
    two boots if it has a wait target, else None (slot counting). The guess lets a first batch
    start on a few nodes instead of a node per item (8 GPUs each, kept alive by their longest
    item) while its target allows; it promises no turnover within a horizon under two boots, so
    if the items run longer, the rest launch while a node launched then still starts them within
    the target. Not for gangs: their members wait for whole free nodes, which no guessed
    turnover of other items' slots gives them."""
    if q.mean_item_s:
        return q.mean_item_s
    return None if q.target_wait_s is None or q.gang else 2.0 * boot_s


def turns(mean_item_s: float | None, horizon_s: float) -> int:
    """Items one slot finishes and starts again within the horizon (0: unknown mean)."""
    if not mean_item_s or mean_item_s <= 0:
        return 0
    return int(horizon_s // mean_item_s)


@dataclass(slots=True)
class Packing:
    """Rule 1b for one pool: per queue, waiting items that fit no node and the nodes they need."""

    unplaced: list[int] = field(default_factory=list)  # per queue, in the given order
    new_nodes: list[int] = field(default_factory=list)
    deferred: list[int] = field(default_factory=list)  # of the unplaced, those waiting for turnover
    reserved: set[str] = field(default_factory=set)  # nodes a waiting item was placed on
    taken: dict[str, int] = field(default_factory=dict)  # slots placed, per node


def on_demand(queues: list[QueueView], serving: list[NodeView], node_slots: int) -> Packing:
    """Place the items only on-demand nodes take (`QueueView.on_demand_wanted`) on those nodes."""
    return _place(queues, [q.on_demand_wanted for q in queues], [n for n in serving if not n.spot], node_slots, {})


def packing(queues: list[QueueView], serving: list[NodeView], node_slots: int, boot_s: int,
            taken: dict[str, int] | None = None) -> Packing:  # fmt: skip
    """Place waiting items of multi-slot queues and the members forming gangs still wait for;
    `queues` in priority order (ties: biggest first).
    Items left to on-demand nodes are `on_demand`'s, whose placements `taken` (slots per node) holds:
    a deferred item is often visible (no spot agent has room to receive it), and counted once."""
    counts = [(max(0, q.visible - q.on_demand_wanted) if q.slots_per_item > 1 else 0) + q.forming_short
              for q in queues]  # fmt: skip
    return _place(queues, counts, serving, node_slots, taken or {}, boot_s)


def deferred(q: QueueView, unplaced: int, boot_s: int, placed: int = 0, placed_booting: int = 0) -> int:
    """Of `unplaced` waiting items of the queue that fit no free slots (the youngest: the oldest
    are placed first), those that wait for the slots its items free instead of a new node: within
    an item's wait horizon (`wait_horizon`, longer than a boot), each item in flight or `placed` on
    free slots now frees its slots for 1 item per mean (`turns`), each placed on a booting node
    once a boot has passed, shared first in, first out. Without a target or a known mean, none
    wait. Members of forming gangs never do (they are not among the visible items: a forming gang
    holds its other members' nodes)."""
    mean = item_mean(q, boot_s)
    starting_now = q.in_flight + placed
    if not unplaced or not (starting_now or placed_booting) or not mean or q.target_wait_s is None:
        return 0
    out = 0
    for age, n in drop_oldest(cohorts(q), q.visible - unplaced):
        horizon = wait_horizon(q, boot_s, age)
        if horizon > boot_s:
            room = starting_now * turns(mean, horizon) + placed_booting * turns(mean, horizon - boot_s)
            out += min(n, max(0, room - out))
    return out


def rounds_per_new_slot(q: QueueView, unplaced: int, boot_s: int) -> int:
    """Items each new slot group starts within the wait horizon of the oldest of the `unplaced`
    (youngest) waiting items, which launch first: the one it starts once booted, then 1 per mean
    (as new slots in rule 1a); 1 without a target or a known mean, or once that item has only a
    boot left."""
    oldest = drop_oldest(cohorts(q), max(0, q.visible - unplaced))
    return 1 + turns(item_mean(q, boot_s), wait_horizon(q, boot_s, oldest[0][0] if oldest else None) - boot_s)


def _place(queues: list[QueueView], counts: list[int], serving: list[NodeView], node_slots: int,
           taken: dict[str, int], boot_s: int | None = None) -> Packing:  # fmt: skip
    """`boot_s` given: unplaced items may wait for turnover (`deferred`); None: all launch."""
    out = Packing()
    if not any(counts):
        out.unplaced = out.new_nodes = out.deferred = [0] * len(queues)
        return out
    by_free: dict[int, list[str]] = {}
    booting = {n.id for n in serving if n.state != "running"}
    for n in sorted(serving, key=lambda n: n.id):  # a fixed order: the same view, the same placement
        free = (n.slots - n.busy_slots if n.state == "running" else n.slots) - taken.get(n.id, 0)
        if free > 0:
            by_free.setdefault(free, []).append(n.id)
    sizes = sorted(by_free)
    for q, left in zip(queues, counts, strict=True):
        k, visible = q.slots_per_item, left - q.forming_short  # forming members are placed first
        total, on_booting = left, 0  # visible items placed on booting nodes
        while left:
            at = bisect.bisect_left(sizes, k)
            if at == len(sizes):
                break
            free = sizes[at]
            node = by_free[free].pop()
            if not by_free[free]:
                del by_free[free], sizes[at]
            out.reserved.add(node)
            out.taken[node] = out.taken.get(node, 0) + k
            on_booting += node in booting and total - left >= q.forming_short
            if free - k > 0:
                if free - k not in by_free:
                    bisect.insort(sizes, free - k)
                by_free.setdefault(free - k, []).append(node)
            left -= 1
        out.unplaced.append(left)
        items, members = min(left, visible), max(0, left - visible)
        placed = max(0, total - left - q.forming_short)  # visible items placed
        waits = 0 if boot_s is None else deferred(q, items, boot_s, placed - on_booting, on_booting)
        out.deferred.append(waits)
        # Each new node's slot groups start items one after another within the wait target (rule 1a's new slots).
        rounds = 1 if boot_s is None or items == waits else rounds_per_new_slot(q, items, boot_s)
        out.new_nodes.append(math.ceil((members + math.ceil((items - waits) / rounds)) / (node_slots // k)))
    return out
