"""Preemption: when a pool cannot grow, a higher-priority queue's waiting items may take the slots
of lower-priority running items of queues that opted in (`preemptible = true`). Pure.

A preempted attempt is asked to checkpoint and is handed back whole (never a failed attempt, nor
an interruption for `on_demand_after_interruptions`, which counts spot's: the agent's stop file
and SIGTERM, as on a spot notice; "preempted" in the item's history); its item waits in its queue
again. Rules:
  * only queues whose items wait because capacity is capped (`starved`), highest priority first;
  * only attempts of preemptible, single-node queues of strictly lower priority that ran
    `min_runtime_s` or more, on nodes that take items (running, not cordoned);
  * for each waiting item, the node where the fewest slots are taken from teams within their
    quota (a team running on lent quota gives first), then the fewest slots (free slots and
    attempts already being preempted first), then the fewest attempts, then the least run time stopped
    (what may be lost since their last checkpoint); on a node, the lowest-priority, most
    recently started attempts go first; no node, no preemption;
  * an attempt already marked stays marked while it runs, and counts as room already made, so
    a waiting item never preempts twice over consecutive ticks.
"""

from __future__ import annotations

from dataclasses import dataclass

from tidefleet.config import Queue
from tidefleet.policy.model import NodeView, QueueView, RunView


@dataclass(frozen=True)
class Preemption:
    marks: dict[str, tuple[str, ...]]  # node id -> every attempt it must stop (old marks kept)
    reasons: tuple[str, ...]


NO_MOVES = Preemption({}, ())


def choose(queues: dict[str, Queue], starved: list[QueueView], nodes: list[NodeView], now: float,
           borrowing: frozenset[str] = frozenset()) -> Preemption:  # fmt: skip
    """The attempts to preempt on these nodes for the starved queues' waiting items; those of
    `borrowing` queues (their team runs on quota others lent) before any other."""
    takers = [n for n in nodes if n.state == "running" and not n.cordoned]
    marked = {n.id: {r.key for r in n.runs if r.key in n.preempting} for n in takers}
    # Room already being made on each node: free slots, plus what marked attempts will free.
    room = {n.id: n.slots - n.busy_slots + sum(r.slots for r in n.runs if r.key in marked[n.id]) for n in takers}
    reasons = []
    for queue in sorted(starved, key=lambda q: (-q.priority, q.name)):
        for _ in range(queue.visible):
            best = None
            for node in takers:
                victims = _victims(node, queue, queues, marked[node.id], room[node.id], now, borrowing)
                if victims is not None and (best is None or _cost(victims, now, borrowing) < _cost(best[1], now, borrowing)):
                    best = (node, victims)
            if best is None:
                break  # nothing more to take for this queue; lower ones may still find some
            node, victims = best
            room[node.id] += sum(r.slots for r in victims) - queue.slots_per_item
            marked[node.id] |= {r.key for r in victims}
            reasons += [_reason(r, node, queue, queues, now) for r in victims]
    return Preemption({n.id: tuple(sorted(marked[n.id])) for n in takers if marked[n.id]}, tuple(reasons))


def _victims(node: NodeView, queue: QueueView, queues: dict[str, Queue], marked: set[str], room: int,
             now: float, borrowing: frozenset[str] = frozenset()) -> list[RunView] | None:  # fmt: skip
    """The attempts to stop on `node` so one item of `queue` fits ([] if it fits already); None:
    it cannot be made to fit there."""
    if room >= queue.slots_per_item:
        return []
    candidates = sorted(
        (r for r in node.runs if r.key not in marked and _preemptible(r, queue, queues, now)),
        key=lambda r: (r.queue not in borrowing, queues[r.queue].priority, -r.since, r.key),
    )
    chosen = []
    for run in candidates:
        chosen.append(run)
        room += run.slots
        if room >= queue.slots_per_item:
            return chosen
    return None


def _preemptible(run: RunView, queue: QueueView, queues: dict[str, Queue], now: float) -> bool:
    own = queues.get(run.queue)  # a gang's lead alone is never stopped: config refuses preemptible gangs
    return bool(own and own.preemptible and own.gang == (1, 1) and own.priority < queue.priority
                and now - run.since >= own.min_runtime_s)  # fmt: skip


def _cost(victims: list[RunView], now: float, borrowing: frozenset[str] = frozenset()) -> tuple[int, int, int, float]:
    """Fewer slots taken from teams within their quota first (a borrower's go before), then fewer
    slots taken from running work, then fewer attempts stopped, then less run time interrupted
    (what may be lost since their last checkpoint)."""
    return (sum(r.slots for r in victims if r.queue not in borrowing), sum(r.slots for r in victims), len(victims),
            sum(now - r.since for r in victims))  # fmt: skip


def _reason(run: RunView, node: NodeView, queue: QueueView, queues: dict[str, Queue], now: float) -> str:
    own = queues[run.queue]
    return (f"preempt {run.key} on {node.id} (queue {run.queue}, priority {own.priority}, ran {now - run.since:.0f}s "
            f">= min_runtime_s {own.min_runtime_s}): queue {queue.name} (priority {queue.priority}) has items waiting "
            "and the pool cannot grow; it checkpoints and goes back to its queue, not a failed attempt")  # fmt: skip


def moves(queues: dict[str, Queue], cordoned: list[NodeView], room: list[int], waiting_slots: int,
          now: float, held: frozenset[str] = frozenset()) -> Preemption:  # fmt: skip
    """Checkpoint-and-move (scaling rule 9b, pools with `checkpoint_and_move`): a cordoned node
    whose every busy slot is an attempt of a preemptible, single-node queue that ran its
    `min_runtime_s` has them all stopped (checkpoint, back to the queue) when the free slots of
    the nodes that take items (`room`, one entry per node) hold them after the `waiting_slots`
    already waiting: the node is idle now rather than when its longest item ends. Least busy
    first; a node already moving counts as waiting, so two ticks never send two nodes' attempts
    to the same slots. An attempt of a `held` queue (its team at its share) stays: back in its
    queue, no agent would take it until the hold ends."""
    room = sorted(room)
    waiting_slots += sum(n.busy_slots for n in cordoned if moving(n))
    marks, reasons = {}, []
    for node in sorted((n for n in cordoned if not moving(n) and n.busy_slots),
                       key=lambda n: (n.busy_slots, n.id)):  # fmt: skip
        runs = node.runs
        if sum(r.slots for r in runs) != node.busy_slots or not all(_movable(r, queues, held, now) for r in runs):
            continue
        left = _fit(room, sorted((r.slots for r in runs), reverse=True))
        if left is None or sum(left) < waiting_slots:
            continue
        room = left
        marks[node.id] = tuple(sorted(r.key for r in runs))
        reasons.append(
            f"move {', '.join(marks[node.id])} off {node.id}: cordoned, every busy slot an attempt of a preemptible "
            f"queue past its min_runtime_s, with room on the other nodes; they checkpoint and resume there, and "
            f"{node.id} is idle now, not when its longest item ends"
        )
    return Preemption(marks, tuple(reasons))


def running_marks(node: NodeView) -> tuple[str, ...]:
    """The node's marks whose attempts still run there (its heartbeat lists them): a mark for an
    attempt that has ended is room made already, not a preemption or move under way."""
    running = {r.key for r in node.runs}
    return tuple(key for key in node.preempting if key in running)


def moving(node: NodeView) -> bool:
    """A move (or preemption) under way on the node: marked attempts still listed (since 21aac44 the
    agent lists a marked attempt until it is handed back, its checkpoint included), or, from an
    agent of an older version that stops listing it while it checkpoints, busy slots its listed
    attempts do not explain: not a mark left from an attempt that ended."""
    return bool(running_marks(node) or node.preempting and node.busy_slots > sum(r.slots for r in node.runs))


def _movable(run: RunView, queues: dict[str, Queue], held: frozenset[str], now: float) -> bool:
    own = queues.get(run.queue)
    return bool(own and own.preemptible and own.gang == (1, 1) and run.queue not in held
                and now - run.since >= own.min_runtime_s)  # fmt: skip


def _fit(room: list[int], sizes: list[int]) -> list[int] | None:
    """`room` (sorted free slots per node) after placing `sizes` best fit, largest first; None if
    one does not fit."""
    room = list(room)
    for size in sizes:
        at = next((i for i, free in enumerate(room) if free >= size), None)
        if at is None:
            return None
        room[at] -= size
        room.sort()
    return room
