"""How long a decision stays what deciding again would give, while only the clock moves.

A steady fleet (every node busy, nothing waiting) is decided again every tick with the same
answer: the simulator replays ~10^5 such ticks a trace and skips those this module shows
change nothing (`unchanged_until`). "Only the clock moves": the same nodes, each reporting
what it reports now (its agent keeps beating), the same backlog and item times; the agents'
intake rates decay towards zero, as they do with no item taken.

Why the answer then holds: with no idle node and nothing waiting, the intake rate reaches the
decision in two places only, both monotone as it decays. Rule 4's leave grant is given once
the next item is expected later than a relaunch (later still at a lower rate), and rule 9
cordons a longer prefix of the same candidates as expected demand falls. So if the decision
at zero intake is this one, every rate in between gives it too. What else reads the clock
(the scale-out cooldown, the spot failure window) changes it at a known time; booting, idle,
draining or waiting work reads it in ways this module does not follow: no promise then.
"""

from __future__ import annotations

import math
from dataclasses import replace

from tidefleet.config import Environment
from tidefleet.policy.model import FleetView, PoolDecision, PoolView
from tidefleet.policy.scaling import decide

# Deadlines are kept this much early: float rounding never lets a skipped tick pass a boundary.
MARGIN_S = 0.001


def unchanged_until(env: Environment, fleet: FleetView, decisions: tuple[PoolDecision, ...], now: float) -> float:
    """The time before which `decide(env, fleet', t)` acts as `decisions` (from `decide(env, fleet,
    now)`) does, for `fleet'` this fleet with only the clock moved on (see the module docstring);
    `now` when this cannot be shown."""
    if any(q.visible or q.oldest_age_s is not None or q.waiting_ages or q.on_demand_wanted for q in fleet.queues):
        return now
    if any(d.terminate for d in decisions):  # a node leaves (one silent past the boot timeout, say)
        return now
    until = math.inf
    for view in fleet.pools:
        steady = all(n.state == "running" and n.busy_slots > 0 and n.last_heartbeat is not None
                     and not n.runs and not n.preempting for n in view.nodes)  # fmt: skip
        if not steady or view.faults or view.name not in env.pools:  # rule 14's hold reads the clock
            return now
        until = min(until, _clock_deadline(env, view, now))
    at_rest = replace(fleet, queues=tuple(replace(q, intake_per_s=0.0) if q.intake_per_s else q for q in fleet.queues))
    if list(map(actions, decide(env, at_rest, now))) != list(map(actions, decisions)):
        return now
    return max(now, until - MARGIN_S)


def actions(decision: PoolDecision) -> tuple:
    """What applying a decision does (its reasons are words about it)."""
    d = decision
    return (d.pool, d.desired, d.terminate, d.on_demand_base, d.cordon, d.uncordon, d.hold, d.release,
            d.preempt, d.leave, d.stay_first)  # fmt: skip


def _clock_deadline(env: Environment, view: PoolView, now: float) -> float:
    """When the pool's scale-out cooldown ends or a spot launch failure leaves its window, if before."""
    scaler = env.scaler
    times = [t + scaler.spot_failure_window_s for t in view.spot_failures if now - t <= scaler.spot_failure_window_s]
    last_launch = max((n.launched_at for n in view.nodes), default=None)
    if last_launch is not None and now - last_launch < scaler.scale_out_cooldown_s:
        times.append(last_launch + scaler.scale_out_cooldown_s)
    return min(times, default=math.inf)
