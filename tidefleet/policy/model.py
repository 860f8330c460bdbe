"""What the scaling policy sees and what it decides: plain frozen data, no SDK types.

Adapters (AWS, GCP, the sandbox, the simulator) build these views; the policy returns
decisions; the control tick applies them. Times are seconds (epoch or simulated), injected.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

NodeState = Literal["pending", "running", "draining", "terminating"]


@dataclass(frozen=True, slots=True)
class RunView:
    """An attempt of a preemptible queue running on a node (its agent's heartbeat)."""

    key: str  # job/item/attempt
    queue: str
    since: float
    slots: int


@dataclass(frozen=True, slots=True)
class NodeView:
    id: str
    instance_type: str
    weight: int  # capacity units
    slots: int  # items of one slot it runs at once
    spot: bool
    state: NodeState  # pending = launched, agent not heard from yet
    launched_at: float
    busy_slots: int = 0
    last_heartbeat: float | None = None  # None: the agent has never reported
    idle_since: float | None = None  # None: busy, or never reported
    protected: bool = False  # scale-in protection set by a busy agent
    cordoned: bool = False  # the scaler stopped its intake (consolidation): it drains, then idles
    runs: tuple[RunView, ...] = ()  # its attempts of preemptible queues
    preempting: tuple[str, ...] = ()  # keys of those the scaler already preempts (they are leaving)
    booted_at: float | None = None  # when its machine booted, as its agent said; None: not said


@dataclass(frozen=True, slots=True)
class QueueView:
    name: str
    pool: str
    priority: int
    slots_per_item: int
    visible: int  # waiting items
    in_flight: int  # items received and not yet deleted
    # Observed mean run time of the queue's recently completed items (`item_seconds_mean`);
    # None = unknown: serving slots are then not expected to start more waiting work soon.
    mean_item_s: float | None = None
    # How long the oldest waiting item has waited (SQS ApproximateAgeOfOldestMessage, Pub/Sub
    # oldest_unacked_message_age); None = unknown: the policy then launches as if it were due.
    oldest_age_s: float | None = None
    target_wait_s: int | None = None  # the queue's wait target; None = launch for waiting work at once
    # Seconds until the scaler decides again while the queue has items waiting (`control.next_tick_s`):
    # leaving an item to turnover counts on that tick to launch for it if turnover does not come.
    next_tick_s: float = 0.0
    gang: bool = False  # its items run on several whole nodes at once (nodes_per_item > 1)
    # Items per second the pool's agents take from this queue, smoothed (`RATE_WINDOW_S`), summed
    # over their heartbeats: the arrival rate while capacity keeps up.
    intake_per_s: float = 0.0
    team: str = "default"  # whose quota its items count to (`Environment.team_of`)
    held: bool = False  # its agents take no new items: its team is at its share (see quota.py)
    max_wait_s: int | None = None  # past it the queue is escalated (quota.py rule 5, scaling rule 6)
    # Of its items, those that only on-demand nodes take (interrupted `on_demand_after_interruptions`
    # times; spot agents leave them, scaling rule 13). Counted in visible + in_flight too.
    on_demand_wanted: int = 0
    # The waiting items by when the scaler first saw them, as (age s, items) oldest first
    # (`control`'s cohorts, from its waiting marks); () = only `oldest_age_s` is known, and
    # every waiting item counts as that old.
    waiting_ages: tuple[tuple[float, int], ...] = ()
    # Members its forming gangs still wait for (their leads' beacons), each one item of
    # slots_per_item that only a wholly free node takes. Counted in in_flight too (a gang item in
    # flight counts all its members).
    forming_short: int = 0


@dataclass(frozen=True, slots=True)
class NodeFault:
    """A node whose agent found at start it cannot run items (`Heartbeat.fault`)."""

    node_id: str
    at: float  # when its agent last said so (a faulted agent's restarts say it again)
    why: str
    booted_at: float | None = None  # when its machine booted: the order nodes came in


@dataclass(frozen=True, slots=True)
class PoolView:
    name: str
    nodes: tuple[NodeView, ...]
    desired: int  # the group's current desired capacity, in units
    on_demand_base: int  # the group's current on-demand base, in units
    spot_failures: tuple[float, ...] = ()  # times of recent failed spot launches
    faults: tuple[NodeFault, ...] = ()  # recent nodes that could not run items, gone ones too (rule 14)


@dataclass(frozen=True, slots=True)
class FleetView:
    pools: tuple[PoolView, ...]
    queues: tuple[QueueView, ...]


@dataclass(frozen=True, slots=True)
class PoolDecision:
    pool: str
    desired: int  # units to set on the group (after the terminations below)
    terminate: tuple[str, ...]  # exact node ids, each idle and past its delay
    on_demand_base: int | None  # new on-demand base, or None to leave it
    reasons: tuple[str, ...]  # one human line per decision taken or withheld
    starved_queues: tuple[str, ...] = ()  # queues waiting because of a cap
    cordon: tuple[str, ...] = ()  # nodes to stop taking items (consolidation), never interrupted
    uncordon: tuple[str, ...] = ()  # cordoned nodes to take items again (demand came back)
    hold: tuple[str, ...] = ()  # queues whose agents stop taking items: their team is at its share
    release: tuple[str, ...] = ()  # held queues that take items again
    # Per node whose marks change: the attempts it must stop and hand back (preemption.py); an
    # empty tuple clears the node's marks.
    preempt: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # Units of this pool's nodes that may leave on their own (terminate with a decrement) once idle
    # with nothing to receive, until the next tick: the agents take it from a grant in the job store.
    leave: int = 0
    # Of the nodes that go idle before the next tick, the first `stay_first` units stay (warm, for
    # the next tick to judge) before any may leave: scaling rule 4 between ticks.
    stay_first: int = 0

    @property
    def changes(self) -> bool:
        return bool(self.terminate or self.cordon or self.uncordon or self.hold or self.release or self.preempt) or (
            self.on_demand_base is not None
        )


# Weight of the newest completion: about the last 30 items count. Items finish in order of their
# run time within a burst, so the last ten of a burst are its longest: a ten-item mean carried a
# burst's tail (2-3x the median of log-normal items) into the next burst, which then launched for
# turnover it did not count (dev shapes unseen/1000-1099 and 2000-2099 against 0.1: mean cost -0.9 %
# and -0.4 %, up to -24 %, the goal met on one more shape each). A longer memory follows a queue
# whose items change more slowly: 10-s items turning into 600-s ones waited longer meanwhile
# (p95 86 -> 112 s on an 8-GPU pool; 0.02 and 0.01 saved more but let items miss a 120-s target).
ITEM_SECONDS_WEIGHT = 0.03


def item_seconds_mean(previous: float | None, seconds: float) -> float:
    """The exponentially weighted mean run time after one more completed item. The job store
    keeps it per queue for the AWS scaler; the simulator keeps it the same way."""
    return seconds if previous is None else previous + ITEM_SECONDS_WEIGHT * (seconds - previous)


# An agent's intake rate is an exponentially decaying count: each item taken adds 1/RATE_WINDOW_S,
# and the sum decays by e per window. Five minutes is five scheduled ticks: long enough to see a
# burst's rate, short enough that a burst that ended stops keeping nodes within minutes.
RATE_WINDOW_S = 300.0


def rate_at(rate: float, since: float, now: float) -> float:
    """A rate recorded at `since`, decayed to `now` (no item taken in between)."""
    return rate * rate_decay(since, now)


def rate_decay(since: float, now: float) -> float:
    """The factor `rate_at` multiplies by: one per record however many rates it holds."""
    return math.exp(-max(0.0, now - since) / RATE_WINDOW_S)


def rate_after(rate: float, since: float, now: float, taken: int = 1) -> float:
    """The rate at `now` after `taken` more items, from one recorded at `since`."""
    return rate_at(rate, since, now) + taken / RATE_WINDOW_S


def on_demand_units(total: int, base: int, percent: int) -> int:
    """Units of a group of `total` units bought on demand, as a mixed instances policy splits
    them: the on-demand base first, then `percent` of the units above it, rounded UP."""
    return min(total, base) + math.ceil(max(0, total - base) * percent / 100)
