"""The scaling policy: from queue depths and the fleet, one decision per pool, with reasons.

Pure: no SDK, no clock, no environment variables; `now` is injected. Every rule below is a
small function; each decision carries one human line per rule that acted or held back.

Rules
1. Demand, in slots = sum over the pool's queues of (visible + in flight) * slots_per_item.
   In-flight items count, so work that is running is never mistaken for surplus. What demand
   needs beyond the serving slots is refined by two rules (see `demand.py`):
   1a. boot horizon: waiting items that serving slots will start sooner than a new node could
       boot (from the queue's observed mean item time) launch no node, unless they waited a boot,
       would now miss their target, and the queue's agents take too few items to reach them;
   1b. packing: waiting items of several slots, and the members forming gangs still wait for,
       that fit no node's free slots need new nodes, even when the pool's free slots add up to enough,
       unless their wait target lets them wait for the slots the queue's items free; within it, a
       new node starts several in turn;
2. Capacity = slots of running and booting nodes + group units not yet materialised as
   nodes (group desired > units of its nodes: launches in progress). Draining, terminating,
   and replaced (rule 5) nodes do not count. Desired is always set absolutely, so a
   booting node or an in-progress launch is never launched twice.
3. Desired units = units of nodes that stay in the group + the units demand still needs
   (the larger of ceil(slots rule 1a leaves uncovered / slots_per_unit) and the units of the
   nodes rule 1b asks for), clamped to [min, max]. Scale-out is immediate.
   Desired never drops below the units of nodes that stay (the group would pick victims);
   launches not materialised yet are cancelled when demand no longer needs them.
4. Scale-in terminates specific nodes only (terminate with decrement): running, heartbeating,
   not protected, idle longer than the pool's idle timeout; on-demand before spot, longest
   idle first; only while the remaining slots still cover demand and the group stays at or
   above min; never within the scale-out cooldown after the newest node's launch; never a
   node whose free slots a waiting multi-slot item was placed on (rule 1b) or items past their
   wait target take (rule 1a). Idle draining nodes are released at once (they are leaving
   anyway). Busy, protected, booting and draining-with-work nodes are never scaled in (a silent
   one is replaced, rule 5).
5. A node with no heartbeat `boot_timeout_s` after launch, or silent for `boot_timeout_s`
   since its last heartbeat (agent dead or hung; busy or protected or not), is replaced:
   terminated, not capacity, and desired keeps covering demand so a new one is launched.
6. Spot shortage (a spot launch failure within `spot_failure_window_s`, or a spot node still
   without a heartbeat `spot_fallback_after_s` after launch): the on-demand base is raised so
   the units to launch (new demand, unmaterialised launches, replacements) come on demand,
   bounded by max. A slow spot node still counts as capacity until its boot timeout: a slow
   boot (GPU images) must not launch a duplicate. When spot is healthy again the base
   returns to the configured one.
7. Cost caps (pool and environment, $/hour, see `cost.py`): desired never makes a pool or the
   environment exceed its cap. Pool min is the one exception: the group refuses a desired
   below it, so a min costlier than the cap is reported, not obeyed.
8. When capacity is capped (max or a cost cap), queues are served by priority: the
   environment budget goes to pools in the order of their queues' priority, and the reason
   names the queues left waiting (also in `PoolDecision.starved_queues`).
9. Consolidation (`_consolidate`): while nothing launches, the least-loaded multi-slot nodes are
   cordoned while demand (and what intake brings within a relaunch) fits on the others; they
   drain and leave idle. 9b, pools with `checkpoint_and_move`: a cordoned node whose every busy
   slot is an attempt of a preemptible queue past its `min_runtime_s` has them preempted when the
   free slots of the other nodes hold them (`preemption.moves`), so it is idle at once. While a
   move is decided or under way (its attempts checkpointing), no idle node is let leave between
   ticks (rule 4's `leave`): its free slots may be the move's room.
10. Team quotas and fair share (`quota.py`, with `[teams]`): before rule 1, waiting items beyond
   their team's share of the pool are left out of demand, and queues of a team at its share are
   held (`PoolDecision.hold` / `release`): its agents take no new items from them.
11. Escalation: a queue whose oldest item waited past `max_wait_s` is served first in the fair
   share (rule 10), and its pool takes a spot node without heartbeat after `boot_estimate_s`
   (not `spot_fallback_after_s`) as spot being short (rule 6: launches come on demand). Not more:
   SQS and Pub/Sub give no ages, so a backlog that never empties is as old as its waiting mark,
   and buying every launch on demand for it would be for good.
12. Preemption (`preemption.py`, queues that opt in with `preemptible`): when a queue's items are
   left waiting by a cap (rule 8), attempts of lower-priority preemptible queues that ran
   `min_runtime_s` are asked to checkpoint and go back to their queue, as many as make room
   for the waiting items (`PoolDecision.preempt`).
13. Interruption-aware placement (queues with `on_demand_after_interruptions`): items interrupted
   that often are left by spot agents to on-demand nodes (`QueueView.on_demand_wanted`). They are
   placed first on the free slots of on-demand nodes that take items (`demand.on_demand`; those
   nodes are kept from scale-in and consolidation); the rest need new on-demand nodes, launched
   like any (within max and the caps), with the on-demand base raised so the group buys them on
   demand. The base is not lowered while such items wait, and returns to the configured one after.
14. Node faults (`faults.py`): after 3 nodes in a row said at start they cannot run items (GPUs,
   docker, the item user: `Heartbeat.fault`), with no healthy node booted since, the pool
   launches nothing, its min included, until the newest fault is 10 minutes old; then one node
   at a time tries, and a healthy one ends the hold. A broken image is not paid a boot per node
   for as long as work waits.
No decision both scales in and out: idle nodes go only when there is surplus, and growth
happens only when there is none.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from operator import attrgetter

from tidefleet.config import Environment, Pool
from tidefleet.policy import faults, preemption, quota
from tidefleet.policy.cost import LaunchCost, PoolPrices
from tidefleet.policy.demand import (
    Horizon,
    Packing,
    boot_horizon,
    demand_slots,
    late_items,
    on_demand,
    packing,
)
from tidefleet.policy.model import FleetView, NodeView, PoolDecision, PoolView, QueueView

QUEUES_NAMED = 3  # queues spelled out in a demand line; the rest are counted
# Sums and maxima over every node of a pool, every tick: map() over a getter is the cheap loop.
_WEIGHT, _SLOTS, _LAUNCHED_AT = attrgetter("weight"), attrgetter("slots"), attrgetter("launched_at")


@dataclass(slots=True)
class _Nodes:
    """A pool's nodes sorted by what the policy may do with them."""

    serving: list[NodeView] = field(default_factory=list)  # running or booting: capacity
    replace: list[NodeView] = field(default_factory=list)  # no heartbeat past the boot timeout
    release: list[NodeView] = field(default_factory=list)  # draining and idle
    draining_busy: list[NodeView] = field(default_factory=list)  # draining with work: kept, not capacity
    leaving: list[NodeView] = field(default_factory=list)  # already terminating: not in the group
    cordoned: list[NodeView] = field(default_factory=list)  # running, intake stopped: kept, not capacity


@dataclass(slots=True)
class _Plan:
    """One pool, worked out up to the point where the environment budget is shared."""

    name: str
    pool: Pool
    view: PoolView
    queues: list[QueueView]  # highest priority first, then biggest items first
    needs: list[int]  # per queue: units the queues up to it need beyond the serving nodes
    demand: int  # slots
    capacity: int  # slots serving or launching before this decision
    serving_slots: int  # slots of serving nodes that stay
    group_units: int  # units of nodes that stay in the group
    terminate: list[str]
    reasons: list[str]  # rule lines, in the order the rules ran
    launch_cost: LaunchCost
    wanted: int  # units demand still needs
    forced: int  # units pool min forces
    limit: int  # units allowed by max and the pool cost cap
    limited_by: str  # which of them binds: "max", "pool cost cap" or "node faults" (rule 14)
    shortage: list[str]  # spot shortage signals, empty when spot is healthy
    on_demand_items: str  # rule 13: the items that wait for on-demand nodes, in words; "" when none
    on_demand_needed: int  # rule 13: units of new on-demand nodes they need
    cordon: list[str] = field(default_factory=list)  # nodes whose intake stops (consolidation)
    uncordon: list[str] = field(default_factory=list)  # cordoned nodes taking items again
    leave: int = 0  # units of nodes that may leave on their own when idle before the next tick
    stay_first: int = 0  # of the nodes going idle before the next tick, units that stay first
    moves: dict[str, tuple[str, ...]] = field(default_factory=dict)  # rule 9b: cordoned node -> attempts to move
    granted: int = 0  # units to launch, after the environment budget
    env_limited: bool = False

    @property
    def existing_cost(self) -> float:
        """$/h of every node not terminated now (asked only where a cost cap or the pool min binds)."""
        return _existing_cost(self.launch_cost.prices, self.view.nodes, set(self.terminate))

    def target(self, index: int) -> int:
        """Units to launch so queues[:index + 1] are covered, within this pool's limit."""
        return max(self.forced, min(self.limit, self.needs[index]))


def decide(env: Environment, fleet: FleetView, now: float) -> tuple[PoolDecision, ...]:
    """One decision per pool in `fleet` (see the module docstring for the rules).

    The environment cost cap sees only the pools in `fleet`: when it is set, pass them all.
    """
    quotas = quota.apply(env, fleet)  # rule 10: demand beyond a team's share is left out
    plans = {
        view.name: _plan_pool(env, view, list(quotas[view.name].queues) if view.name in quotas else [], now)
        for view in fleet.pools
        if view.name in env.pools
    }
    _share_budget(list(plans.values()), env)
    env_cap = ""
    if env.scaler.cost_cap_usd_per_hour is not None:
        env_cost = sum(p.existing_cost + p.launch_cost(p.granted) for p in plans.values())
        env_cap = f"environment cap ({_usd(env_cost)} of {_usd(env.scaler.cost_cap_usd_per_hour)})"
    return tuple(
        _with_preemption(env, plans[view.name], _with_quota(_decision(plans[view.name], env_cap), quotas.get(view.name)),
                         quotas[view.name].borrowing if view.name in quotas else (), now)
        if view.name in plans
        else _unknown_pool(env, view)
        for view in fleet.pools
    )


def _with_preemption(env: Environment, plan: _Plan, decision: PoolDecision, borrowing: tuple[str, ...],
                     now: float) -> PoolDecision:  # fmt: skip
    """Rule 12: the marks of attempts to preempt, where they change; a cordoned node keeps the
    marks of attempts still running there (one that ended has no use for its mark) and gains rule
    9b's moves. Preempted for: the items the capped capacity leaves waiting (`_shortfall`: what
    pending nodes and granted units will take is not), of the queues as trimmed to their team's
    share (a team is never preempted for past its quota), less those waiting for on-demand nodes
    (spot nodes leave them, and a spot node freed for one would go back to its own work). Teams
    running on lent quota (`borrowing`) give their attempts first."""
    view, moves = plan.view, plan.moves
    for n in view.nodes:  # a loop, not any(genexpr): asked every tick, of every node
        if n.runs or n.preempting:
            break
    else:
        return decision
    short = _shortfall(plan) if decision.starved_queues else {}
    starved = [replace(q, visible=left) for q in plan.queues if q.name in short and not q.held
               and (left := min(short[q.name], q.visible - q.on_demand_wanted)) > 0]  # fmt: skip
    chosen = preemption.choose(env.queues, starved, list(view.nodes), now, frozenset(borrowing))
    marks = chosen.marks | {n.id: tuple(sorted({*preemption.running_marks(n), *moves.get(n.id, ())}))
                            for n in view.nodes if n.cordoned and (n.preempting or n.id in moves)}  # fmt: skip
    changed = tuple((n.id, marks.get(n.id, ())) for n in view.nodes
                    if n.state == "running" and set(marks.get(n.id, ())) != set(n.preempting))  # fmt: skip
    return replace(decision, preempt=changed, reasons=decision.reasons + chosen.reasons)


def _with_quota(decision: PoolDecision, share: quota.PoolQuota | None) -> PoolDecision:
    if share is None or not (share.hold or share.release or share.reasons):  # no [teams]: nearly every tick
        return decision
    return replace(decision, hold=share.hold, release=share.release, reasons=decision.reasons + share.reasons)


def _unknown_pool(env: Environment, view: PoolView) -> PoolDecision:
    known = ", ".join(sorted(env.pools))
    reason = f"leave pool {view.name} unchanged: not in environment {env.name} (known pools: {known})"
    return PoolDecision(view.name, view.desired, (), None, (reason,))


# --- per pool ------------------------------------------------------------------------------


def _plan_pool(env: Environment, view: PoolView, queues: list[QueueView], now: float) -> _Plan:
    pool = env.pools[view.name]
    scaler = env.scaler
    queues = sorted(queues, key=lambda q: (-q.priority, -q.slots_per_item, q.name))
    demand = sum(map(demand_slots, queues))
    nodes = _sort_nodes(view.nodes, pool, now)
    relaunch_s = _relaunch_s(pool, queues)
    # Hysteresis, so that one never undoes the other: nodes are uncordoned when demand exceeds the
    # slots that take items, and cordoned only while those left cover demand and what intake
    # brings within a relaunch.
    uncordon, uncordon_reasons = _uncordon(nodes, demand)
    smallest = min(t.weight for t in pool.instance_types)
    # Waiting multi-slot items (and items left to on-demand nodes) are placed only on nodes that
    # take items; a drained, cordoned node that would hold one is uncordoned rather than a node
    # launched for it.
    takers = [n for n in nodes.serving if not n.cordoned]
    for_on_demand, packed = _placements(queues, takers, smallest * pool.slots_per_unit, pool.boot_estimate_s)
    late_by_queue = [late_items(q, pool.boot_estimate_s) for q in queues]  # rule 1a's, decided once
    late = sum(n * q.slots_per_item for n, q in zip(late_by_queue, queues, strict=True))
    for n in sorted((n for n in nodes.serving if n.cordoned), key=lambda n: (-n.slots, n.id)):
        if any(packed.unplaced):
            why = "a waiting multi-slot item fits no other node"
        elif late > sum(t.slots - t.busy_slots for t in takers if t.state == "running"):
            why = "items past their wait target find no free slot on the other nodes"
        elif any(for_on_demand.new_nodes) and not n.spot:
            why = "an item left to on-demand nodes fits no other on-demand node"
        else:
            continue
        uncordon.append(n)
        uncordon_reasons.append(f"uncordon {n.id}: {why}")
        nodes.serving[nodes.serving.index(n)] = replace(n, cordoned=False)
        takers = [n for n in nodes.serving if not n.cordoned]
        for_on_demand, packed = _placements(queues, takers, smallest * pool.slots_per_unit, pool.boot_estimate_s)
    reasons = [_replace_reason(n, pool, now) for n in nodes.replace]
    reasons += [f"terminate {n.id}: draining and idle" for n in nodes.release]
    reasons += [_draining_kept_reason(n) for n in nodes.draining_busy]
    reasons += uncordon_reasons

    members = nodes.serving + nodes.release + nodes.replace + nodes.draining_busy + nodes.cordoned
    launching = max(0, view.desired - _units(members))
    serving_slots = _slots(takers)  # a drained, cordoned node is kept (for scale-in) but takes no items
    held_units = _units(nodes.draining_busy) + _units(nodes.cordoned)
    idle_timeout_s = env.idle_timeout_s(view.name)
    break_even = None if idle_timeout_s is not None else BreakEven.of(queues, nodes.serving, relaunch_s)
    # The newest node that stays: a just-launched node this decision releases (a spot notice)
    # is gone next tick, and deciding again must not find the cooldown over.
    last_launch = max(map(_LAUNCHED_AT, _without(view.nodes, {n.id for n in nodes.release + nodes.replace})),
                      default=None)
    for_late = _free_for_late(takers, late)
    idle_out, idle_reasons = _choose_idle(
        nodes.serving,
        demand=demand,
        serving_slots=serving_slots,
        group_units=held_units + _units(nodes.serving),
        reserved=packed.reserved | for_late,
        for_on_demand=for_on_demand.reserved,
        on_demand_launch=any(for_on_demand.new_nodes),
        pool=pool,
        idle_timeout_s=idle_timeout_s,
        break_even=break_even,
        cooldown_s=scaler.scale_out_cooldown_s,
        last_launch=last_launch,
        now=now,
    )
    reasons += idle_reasons
    reasons += [f"keep {n.id}: cordoned, {n.busy_slots} busy slot(s) finishing" for n in nodes.cordoned]
    terminated = nodes.replace + nodes.release + idle_out
    gone = {n.id for n in terminated}
    uncordon = [n for n in uncordon if n.id not in gone]  # a node leaving needs no mark
    staying = _without(members, gone)

    # Rule 11: with an item past its queue's max_wait_s, a spot node still booting after a typical
    # boot is already a shortage: its items are not kept waiting for the fallback delay too.
    window_s, fallback_s = scaler.spot_failure_window_s, scaler.spot_fallback_after_s
    shortage = _spot_shortage(view, nodes.serving, window_s, fallback_s, now)
    overdue = [q.name for q in queues if quota.overdue(q)]
    if overdue and pool.boot_estimate_s < fallback_s:
        eager = _spot_shortage(view, nodes.serving, window_s, pool.boot_estimate_s, now)
        if len(eager) > len(shortage):
            shortage = [*eager, f"queue {', '.join(overdue)} waited past max_wait_s: escalated"]
    prices = PoolPrices.of(pool)
    group_units = _units(staying)
    on_demand_staying = _units([n for n in staying if not n.spot])
    on_demand_needed = sum(for_on_demand.new_nodes) * smallest
    base = pool.on_demand_base
    if any(q.on_demand_wanted for q in queues):  # rule 13 may raise the base, and lowers it not: priced so
        base = max(base, view.on_demand_base, on_demand_staying + on_demand_needed)
    launch_cost = LaunchCost(
        prices,
        group_units=group_units,
        on_demand_units=on_demand_staying,
        on_demand_base=pool.max if shortage else base,
        on_demand_percent=pool.on_demand_percent,
    )
    staying_serving_slots = serving_slots - _slots([n for n in idle_out if not n.cordoned])
    booting = [max(0.0, n.launched_at + pool.boot_estimate_s - now)
               for n in nodes.serving if n.state == "pending" for _ in range(n.slots)]  # fmt: skip
    free_now = sum([n.slots - n.busy_slots for n in takers if n.state == "running" and n.id not in gone])
    horizon = boot_horizon(queues, staying_serving_slots - len(booting), booting, pool.boot_estimate_s, free_now,
                           late_by_queue)  # fmt: skip
    needs = _needs(horizon, packed, for_on_demand, pool.slots_per_unit, smallest)
    wanted = needs[-1] if needs else 0
    cordon: list[NodeView] = []
    moves = preemption.NO_MOVES
    forced = max(0, min(pool.min, pool.max) - group_units)  # launched to keep the pool at min
    if wanted == 0 and forced == 0:  # never cordons while launching
        # With an uncordon in the same decision it is a swap: the uncordoned node's slots may let a
        # less loaded one drain now (the next tick would cordon it anyway), never the uncordoned one.
        idle_ids = {n.id for n in idle_out}
        cordon, cordon_reasons = _consolidate(
            _without(nodes.serving, idle_ids),
            demand=demand + _expected_slots(queues, relaunch_s),
            reserved=packed.reserved | for_on_demand.reserved | {n.id for n in uncordon},
        )
        reasons += cordon_reasons
        if pool.checkpoint_and_move and nodes.cordoned:
            # Free slots after the waiting multi-slot items and those left to on-demand nodes are
            # placed, on nodes that stay and take items (not those cordoned now).
            closed = gone | {n.id for n in cordon}
            room = [n.slots - n.busy_slots - packed.taken.get(n.id, 0) - for_on_demand.taken.get(n.id, 0)
                    for n in takers if n.state == "running" and n.id not in closed]  # fmt: skip
            waiting = sum(max(0, q.visible - q.on_demand_wanted) for q in queues if q.slots_per_item == 1 and not q.held)
            moves = preemption.moves(env.queues, nodes.cordoned, room, waiting + _expected_slots(queues, relaunch_s), now,
                                     held=frozenset(q.name for q in queues if q.held))
            reasons += moves.reasons
    in_cooldown = last_launch is not None and now - last_launch < scaler.scale_out_cooldown_s
    leave = stay_first = 0
    # Rule 9b's room is free slots, often an idle node's: while a move is decided or under way (its
    # attempts still checkpointing), no idle node may leave before they are back in their queue.
    moving = bool(moves.marks) or pool.checkpoint_and_move and any(map(preemption.moving, nodes.cordoned))
    if break_even is not None and not (wanted or forced or in_cooldown or any(for_on_demand.new_nodes) or moving):
        leave, stay_first, leave_reason = _leave_units(break_even, _without(nodes.serving, gone), group_units - pool.min)
        reasons += leave_reason
    reasons += _horizon_reason(horizon, demand, staying_serving_slots, pool)
    reasons += [f"queue {name}: {n} item(s) waited a boot and would miss target_wait_s, with its agents taking too few "
                "to reach them: slots for them, turnover not counted" for name, n in horizon.stalled]
    reasons += _packing_reasons(queues, packed, smallest * pool.slots_per_unit)
    limit, limited_by = max(0, pool.max - group_units), "max"
    if pool.cost_cap_usd_per_hour is not None and min(limit, wanted) > 0:
        # Searching only up to what demand wants keeps the common, uncapped case one price call.
        budget = pool.cost_cap_usd_per_hour - _existing_cost(prices, view.nodes, gone)
        affordable = launch_cost.affordable(budget, min(limit, wanted))
        if affordable < min(limit, wanted):
            limit, limited_by = affordable, "pool cost cap"
    if view.faults and (held := faults.hold(view.name, view.faults, view.nodes, now)) is not None:
        reasons.append(held.reason)  # rule 14: min too; nodes that cannot run items are no capacity
        if held.launch * smallest < limit:
            limit, limited_by = held.launch * smallest, "node faults"
        forced = min(forced, held.launch * smallest)
    return _Plan(
        name=view.name,
        pool=pool,
        view=view,
        queues=queues,
        needs=needs,
        demand=demand,
        capacity=serving_slots + launching * pool.slots_per_unit,
        serving_slots=staying_serving_slots,
        group_units=group_units,
        terminate=[n.id for n in terminated],
        reasons=reasons,
        launch_cost=launch_cost,
        wanted=wanted,
        forced=forced,
        limit=limit,
        limited_by=limited_by,
        shortage=shortage,
        on_demand_items=_on_demand_items(env, queues),
        on_demand_needed=on_demand_needed,
        cordon=[n.id for n in cordon],
        uncordon=[n.id for n in uncordon],
        leave=leave,
        stay_first=stay_first,
        moves=moves.marks,
    )


def _placements(queues: list[QueueView], takers: list[NodeView], node_slots: int,
                boot_s: int) -> tuple[Packing, Packing]:  # fmt: skip
    """Rule 13's items on on-demand nodes first (only those take them), then rule 1b's on what is left."""
    for_on_demand = on_demand(queues, takers, node_slots)
    return for_on_demand, packing(queues, takers, node_slots, boot_s, for_on_demand.taken)


def _free_for_late(takers: list[NodeView], late: int) -> set[str]:
    """Nodes whose free slots rule 1a's late items (`late_items`, `late` slots) take: kept from
    scale-in like a placed item's node, the busiest first, so that no decision releases free
    slots and launches for late items at once."""
    kept: set[str] = set()
    if late <= 0:  # nearly every tick: no sort
        return kept
    for n in sorted((n for n in takers if n.state == "running" and n.slots > n.busy_slots),
                    key=lambda n: (n.busy_slots == 0, n.slots - n.busy_slots, n.id)):  # fmt: skip
        if late <= 0:
            break
        kept.add(n.id)
        late -= n.slots - n.busy_slots
    return kept


def _needs(horizon: Horizon, packed: Packing, for_on_demand: Packing, slots_per_unit: int,
           node_units: int) -> list[int]:  # fmt: skip
    """Per queue, units the queues up to it need: the larger of slot counting and the new nodes
    that placed items need (rule 1b's and rule 13's, different items: they add up)."""
    needs, slots, nodes = [], 0, 0
    for uncovered, new_nodes, new_on_demand in zip(horizon.uncovered, packed.new_nodes, for_on_demand.new_nodes,
                                                   strict=True):  # fmt: skip
        slots += uncovered
        nodes += new_nodes + new_on_demand
        needs.append(max(math.ceil(slots / slots_per_unit), nodes * node_units))
    return needs


def _on_demand_items(env: Environment, queues: list[QueueView]) -> str:
    """Rule 13's items in words: `2 item(s) of queue train interrupted >= 3 times`, per queue."""
    return ", ".join(
        f"{q.on_demand_wanted} item(s) of queue {q.name} interrupted >= "
        f"{env.queues[q.name].on_demand_after_interruptions} times"
        for q in queues if q.on_demand_wanted
    )  # fmt: skip


def _horizon_reason(horizon: Horizon, demand: int, serving_slots: int, pool: Pool) -> list[str]:
    """A line only when turnover changed the answer: slots missing by count, fewer by time."""
    missing = demand - serving_slots
    more = sum(horizon.uncovered)
    if missing <= 0 or more >= missing or not horizon.means:
        return []
    low, high = min(horizon.means), max(horizon.means)
    mean = f"~{low:.0f}s" if round(low) == round(high) else f"~{low:.0f}-{high:.0f}s"
    guessed = f" (two boots, a guess: no item of {', '.join(horizon.guessed)} finished yet)" if horizon.guessed else ""
    return [
        (
            f"boot horizon: {horizon.waiting} queued items of {mean}{guessed}; {serving_slots} serving slots start "
            f"~{horizon.started} of them within the {pool.boot_estimate_s}s a new node needs; {more} more slots"
        )
    ]


def _packing_reasons(queues: list[QueueView], packed: Packing, node_slots: int) -> list[str]:
    return [
        f"packing: {unplaced} item(s) of {q.slots_per_item} slots (queue {q.name}) fit no node's free slots; "
        f"{nodes} node(s) of {node_slots} slots needed"
        + (f" ({waits} wait within target_wait_s for the slots its {q.in_flight} item(s) in flight free)"
           if waits else "")
        for q, unplaced, nodes, waits in zip(queues, packed.unplaced, packed.new_nodes, packed.deferred, strict=True)
        if unplaced
    ]


def _without(nodes: Sequence[NodeView], ids: set[str]) -> Sequence[NodeView]:
    """The nodes whose id is not in `ids`; most ticks terminate none: then `nodes` itself (read only)."""
    return [n for n in nodes if n.id not in ids] if ids else nodes


def _existing_cost(prices: PoolPrices, nodes: Sequence[NodeView], gone: set[str]) -> float:
    """$/h of the nodes that stay."""
    return sum(map(prices.node, _without(nodes, gone)))


def _units(nodes: list[NodeView]) -> int:
    return sum(map(_WEIGHT, nodes))


def _slots(nodes: list[NodeView]) -> int:
    return sum(map(_SLOTS, nodes))


def _sort_nodes(nodes: tuple[NodeView, ...], pool: Pool, now: float) -> _Nodes:
    out = _Nodes()
    timeout_s = pool.boot_timeout_s
    for node in nodes:
        if node.state == "terminating":
            out.leaving.append(node)
        # `_boot_timed_out`, its common case inline (the simulator sorts ~10^7 nodes a replay)
        elif now - node.last_heartbeat > timeout_s if node.last_heartbeat is not None else _boot_timed_out(node, pool, now):
            out.replace.append(node)
        elif node.state == "draining":
            idle = node.busy_slots == 0 and node.idle_since is not None and not node.protected
            (out.release if idle else out.draining_busy).append(node)
        elif node.cordoned and node.state == "running" and not _is_idle(node):
            out.cordoned.append(node)  # drained ones serve as idle nodes: scaled in or uncordoned
        else:
            out.serving.append(node)
    return out


def _boot_timed_out(node: NodeView, pool: Pool, now: float) -> bool:
    """Rule 5: never reported since launch, or silent since its last heartbeat, past the boot timeout.

    A silent node is replaced even if its last heartbeat said busy or protected: its agent is
    dead or hung, its items come back through the queue's visibility timeout, and an explicit
    terminate ignores scale-in protection. A node never heard from but showing work or
    protection (from the group) is not a dead boot and is left alone.
    """
    if node.last_heartbeat is not None:
        return now - node.last_heartbeat > pool.boot_timeout_s
    never_reported = node.busy_slots == 0 and not node.protected
    return never_reported and now - node.launched_at > pool.boot_timeout_s


def _replace_reason(node: NodeView, pool: Pool, now: float) -> str:
    if node.last_heartbeat is not None:
        return (
            f"replace {node.id}: last heartbeat {now - node.last_heartbeat:.0f}s ago "
            f"> boot timeout {pool.boot_timeout_s}s (agent silent)"
        )
    return (
        f"replace {node.id}: no heartbeat {now - node.launched_at:.0f}s after launch "
        f"> boot timeout {pool.boot_timeout_s}s"
    )


def _draining_kept_reason(node: NodeView) -> str:
    if node.busy_slots:
        return f"keep {node.id}: draining with {node.busy_slots} busy slot(s)"
    if node.protected:
        return f"keep {node.id}: draining, scale-in protected"
    return f"keep {node.id}: draining, not reported idle yet"


def _is_idle(node: NodeView) -> bool:
    return (
        node.state == "running"
        and node.busy_slots == 0
        and node.idle_since is not None
        and node.last_heartbeat is not None
        and not node.protected
    )


def _kept_line(serving: list[NodeView], idle_timeout_s: int | None, warm: int, now: float) -> list[str]:
    """One line for the serving nodes that are no scale-in candidate yet, counted by why: a
    line per node would bury the decision at thousands of nodes (and cost a string each)."""
    busy, protected, booting, unreported, young = [], [], [], [], []
    for n in serving:
        if n.busy_slots:
            busy.append(n)
        elif n.protected:
            protected.append(n)
        elif n.last_heartbeat is None or n.state == "pending":
            booting.append(n)
        elif n.idle_since is None:
            unreported.append(n)
        elif idle_timeout_s is not None and now - n.idle_since <= idle_timeout_s:
            young.append(n)
    parts = [f"{len(busy)} busy"] if busy else []
    if protected:
        parts.append(f"{len(protected)} scale-in protected")
    if booting:
        oldest = now - min(n.launched_at for n in booting)
        parts.append(f"{len(booting)} booting (no heartbeat yet, oldest {oldest:.0f}s after launch)")
    if unreported:
        parts.append(f"{len(unreported)} not reported idle yet")
    if young:
        longest = now - min(n.idle_since for n in young)
        parts.append(f"{len(young)} idle <= {idle_timeout_s}s (longest {longest:.0f}s)")
    if warm:
        parts.append(f"{warm} idle, next item sooner than a relaunch")
    kept = len(busy) + len(protected) + len(booting) + len(unreported) + len(young) + warm
    return [f"keep {kept} node(s): {', '.join(parts)}"] if kept else []


def _relaunch_s(pool: Pool, queues: list[QueueView]) -> float:
    """What terminating an idle node costs when an item then needs it, in seconds of the node:
    the replacement's boot, billed, plus the item's wait for it where that wait misses the
    queue's target (valued as node time: one more boot's worth at most)."""
    targets = [q.target_wait_s for q in queues if q.target_wait_s is not None]
    missed = max(0, pool.boot_estimate_s - min(targets)) if targets else pool.boot_estimate_s
    return float(pool.boot_estimate_s + missed)


def _expected_slots(queues: list[QueueView], within_s: float) -> int:
    """Slots the pool's intake rate asks for within `within_s` (rounded up)."""
    return math.ceil(sum(q.intake_per_s * q.slots_per_item for q in queues) * within_s)


@dataclass(frozen=True, slots=True)
class BreakEven:
    """Rule 4 by default (no fixed idle timeout): keep an idle node only while the next item
    expected to land on it comes sooner than a relaunch would cost (`_relaunch_s`).

    Items arrive at the pool's intake rate (slot-starts per second, the agents' smoothed rates)
    and take the free slots of the nodes ahead first: busy nodes, then the idle nodes kept
    before it. Busy slots free up at busy / mean item time per second, so the slots ahead fill
    at intake - turnover, and the next item lands on this node in about
    (free slots ahead + its slots) / (intake - turnover): never, when turnover keeps up with
    intake. Its slots: the items' mean (slots taken / items taken), 1 where every item takes one."""

    intake: float  # slot-starts per second
    mean_item_s: float | None  # intake-weighted over the pool's queues; None = unknown
    relaunch_s: float
    waiting: int  # slots of waiting items: they take free slots first
    item_slots: float = 1.0  # slots of the next item, on average over the items taken

    @classmethod
    def of(cls, queues: list[QueueView], serving: list[NodeView], relaunch_s: float) -> BreakEven:
        rates = [(q.intake_per_s * q.slots_per_item, q.mean_item_s) for q in queues]
        intake = sum(r for r, _ in rates)
        known = [(r, m) for r, m in rates if m and r > 0]
        mean = sum(r * m for r, m in known) / sum(r for r, _ in known) if known and intake else None
        waiting = sum(q.visible * q.slots_per_item for q in queues)
        items = sum(q.intake_per_s for q in queues)
        return cls(intake, mean, relaunch_s, waiting, intake / items if items > 0 else 1.0)

    def next_item_s(self, free_ahead: int, busy_ahead: int) -> float:
        # Its slots arrive too: an 8-GPU item on an 8-GPU node comes once per item, not once per GPU of intake.
        arrivals = free_ahead - self.waiting + self.item_slots
        if arrivals <= 0:
            return 0.0  # a waiting item needs it now
        turnover = busy_ahead / self.mean_item_s if self.mean_item_s else 0.0
        fill = self.intake - turnover
        return math.inf if fill <= 0 else arrivals / fill

    def surplus(self, serving: list[NodeView], idle: list[NodeView]) -> dict[str, float]:
        """For each idle node, in keep order (spot first, most recently idle first), the expected
        time to its next item, counting every node ahead of it; only those past a relaunch."""
        if not idle:
            return {}
        ids = {n.id for n in idle}
        free, busy = _free_and_busy(n for n in serving if n.id not in ids)
        out = {}
        for n in sorted(idle, key=lambda n: (n.cordoned, not n.spot, -n.idle_since, n.id)):
            gap = self.next_item_s(free, busy)
            if gap >= self.relaunch_s:
                out[n.id] = gap
            free += 0 if n.cordoned else n.slots
        return out

    def line(self, gap: float) -> str:
        when = "never (turnover keeps up)" if math.isinf(gap) else f"in ~{gap:.0f}s"
        return f"next item expected {when} >= a relaunch's {self.relaunch_s:.0f}s (intake {self.intake:.3f} slots/s)"


def _free_and_busy(nodes: Iterable[NodeView]) -> tuple[int, int]:
    """(free slots, busy slots) of the nodes that take items (a booting node's slots are all free)."""
    free = busy = 0
    for n in nodes:
        if not n.cordoned:
            taken = n.busy_slots if n.state == "running" else 0
            free, busy = free + n.slots - taken, busy + taken
    return free, busy


def _leave_units(break_even: BreakEven, staying: Sequence[NodeView], above_min: int) -> tuple[int, int, list[str]]:
    """Rule 4 between ticks: (units of nodes that may leave on their own when they go idle before
    the next tick (the agent finds nothing to receive), units of the first nodes going idle that
    stay first, the line that says so). A node that goes idle a few seconds after this tick would
    otherwise stay billed until the next one (half a tick on average, as long as a short item
    itself). The same break-even as for idle nodes now, for each node as it goes idle: one more
    idle node, behind every node that stays, would wait past a relaunch for its next item. When
    the first would not, busy nodes going idle (least busy first) stay warm, each freeing its busy
    slots ahead of the next and taking their turnover away, until the next one would wait past a relaunch:
    those after it may leave (a bursty pool's nodes otherwise all waited for the next tick)."""
    if above_min <= 0:
        return 0, 0, []
    free, busy = _free_and_busy(staying)
    gap, relaunch = break_even.next_item_s(free, busy), break_even.relaunch_s

    def granted(stay: int, gap: float) -> tuple[int, int, list[str]]:
        first = f", once the first {stay} unit(s) going idle stayed" if stay else ""
        line = f"idle nodes may leave on their own until the next tick, up to {above_min} unit(s){first}: "
        return above_min, stay, [line + break_even.line(gap)]

    if gap >= relaunch:
        return granted(0, gap)
    # With x busy slots gone idle, the next one waits (a + x) / (c + x / mean): past a relaunch from
    # some x on when the mean is longer than a relaunch (or unknown), so all idle decides; only up
    # to some x when shorter, so none does unless waiting items took every free slot (x = 0 fails
    # on arrivals). Both before any sort: ticks of a busy fleet ask this every time.
    mean = break_even.mean_item_s
    if (break_even.next_item_s(free + busy, 0) < relaunch if not mean or mean > relaunch
            else free - break_even.waiting + break_even.item_slots > 0):
        return 0, 0, []
    going = sorted((n for n in staying if n.state == "running" and not n.cordoned and n.busy_slots),
                   key=lambda n: (n.busy_slots, n.id))  # fmt: skip
    stay = 0
    for n in going:  # it goes idle and stays: its busy slots free ahead of the next, no longer turning over
        free, busy, stay = free + n.busy_slots, busy - n.busy_slots, stay + n.weight
        gap = break_even.next_item_s(free, busy)
        if gap >= relaunch:
            return granted(stay, gap)
    return 0, 0, []


def _choose_idle(
    serving: list[NodeView],
    *,
    demand: int,
    serving_slots: int,
    group_units: int,
    reserved: set[str],
    for_on_demand: set[str],
    on_demand_launch: bool,
    pool: Pool,
    idle_timeout_s: int | None,
    break_even: BreakEven | None,
    cooldown_s: int,
    last_launch: float | None,
    now: float,
) -> tuple[list[NodeView], list[str]]:
    """Idle nodes to terminate (rule 4), a line for each of them and for each overdue node kept,
    and one line counting the other serving nodes kept while there is surplus."""
    idle = [n for n in serving if n.busy_slots == 0 and _is_idle(n)]  # busy ones without a call: most nodes
    if break_even is None:
        why = {n.id: f"idle {now - n.idle_since:.0f}s > {idle_timeout_s}s" for n in idle if now - n.idle_since > idle_timeout_s}
    else:
        since = {n.id: n.idle_since for n in idle}
        why = {nid: f"idle {now - since[nid]:.0f}s, {break_even.line(gap)}" for nid, gap in break_even.surplus(serving, idle).items()}
    overdue = sorted(
        (n for n in idle if n.id in why),
        key=lambda n: (not n.cordoned, n.spot, n.idle_since, n.id),  # drained, on-demand, longest idle first
    )
    surplus = serving_slots - demand  # serving_slots: the slots that take items; a drained, cordoned node has none
    if surplus <= 0 and not any(n.cordoned for n in overdue):
        if overdue:
            return [], [f"no scale-in: demand {demand} slots needs all {serving_slots} serving slots"]
        return [], []
    warm = 0 if break_even is None else len(idle) - len(overdue)
    reasons = _kept_line(serving, idle_timeout_s, warm, now)
    if not overdue:
        return [], reasons
    if on_demand_launch:  # rule 13 launches: an idle spot node goes next tick, never in and out at once
        reasons.append("hold scale-in: on-demand nodes launch for items left to them")
        return [], reasons
    since = None if last_launch is None else now - last_launch
    if since is not None and since < cooldown_s:
        reasons.append(f"hold scale-in: {since:.0f}s since scale-out < cooldown {cooldown_s}s")
        return [], reasons
    chosen = []
    for n in overdue:
        if n.id in reserved:
            reasons.append(f"keep {n.id}: idle but needed, a waiting multi-slot item fits its free slots")
        elif n.id in for_on_demand:
            reasons.append(f"keep {n.id}: idle but needed, an item left to on-demand nodes is placed on it")
        elif not n.cordoned and n.slots > surplus:
            reasons.append(
                f"keep {n.id}: idle but needed, demand {demand} slots leaves {surplus} spare < its {n.slots}"
            )
        elif group_units - n.weight < pool.min:
            reasons.append(f"keep {n.id}: idle but pool min is {pool.min} units")
        else:
            chosen.append(n)
            surplus -= 0 if n.cordoned else n.slots
            group_units -= n.weight
            order = "cordoned, drained" if n.cordoned else "on-demand first" if not n.spot else "spot, longest idle first"
            reasons.append(f"terminate {n.id}: {why[n.id]} ({order})")
    return chosen, reasons


# --- consolidation ---------------------------------------------------------------------------


def _uncordon(nodes: _Nodes, demand: int) -> tuple[list[NodeView], list[str]]:
    """Demand came back beyond the uncordoned serving slots: cordoned nodes take items again, most free slots first (drained ones before busy
    ones), before any node is launched. Moves the busy ones to `nodes.serving`; drained ones
    are there already (as idle nodes, for scale-in). A drained node not wanted stays cordoned
    until it is removed: uncordoning it would only make the next tick cordon another."""
    short = demand - _slots([n for n in nodes.serving if not n.cordoned])
    cordoned = nodes.cordoned + [n for n in nodes.serving if n.cordoned]
    back = []
    for n in sorted(cordoned, key=lambda n: (n.busy_slots - n.slots, n.id)):
        if short <= 0:
            break
        back.append(n)
        short -= n.slots
    for n in back:  # from here on the plan sees them as they will be: taking items
        if n in nodes.cordoned:
            nodes.cordoned.remove(n)
            nodes.serving.append(replace(n, cordoned=False))
        else:
            nodes.serving[nodes.serving.index(n)] = replace(n, cordoned=False)
    return back, [f"uncordon {n.id}: demand {demand} slots exceeds the serving slots" for n in back]


def _consolidate(serving: list[NodeView], *, demand: int, reserved: set[str]) -> tuple[list[NodeView], list[str]]:
    """Rule 9: when demand (plus what intake brings within a relaunch) fits on fewer nodes, stop
    intake on the least-loaded multi-slot busy nodes, so they drain and become idle. Running
    items are never interrupted; a node a waiting multi-slot item was placed on is not taken."""
    capacity = _slots([n for n in serving if not n.cordoned])  # a drained, cordoned node takes no items
    candidates = sorted(
        [n for n in serving
         if n.state == "running" and not n.cordoned and n.slots > 1 and 0 < n.busy_slots < n.slots
         and n.id not in reserved],
        key=lambda n: (n.busy_slots / n.slots, n.busy_slots, n.id),
    )  # fmt: skip
    out, reasons = [], []
    for n in candidates:
        if capacity - n.slots < demand:
            break
        out.append(n)
        capacity -= n.slots
        reasons.append(
            f"cordon {n.id}: {n.busy_slots} of {n.slots} slots busy; demand {demand} slots fits the other "
            f"{capacity} serving slots (its items finish, then it is idle)"
        )
    return out, reasons


def _spot_shortage(
    view: PoolView, serving: list[NodeView], window_s: int, fallback_s: int, now: float
) -> list[str]:
    """Signals that spot is short. Slow nodes signal only while they stay: one being replaced
    is gone after this decision, and the signal must not vanish with it (idempotence); if its
    spot replacement cannot launch, the launch failure is the signal."""
    signals = []
    failures = sum(1 for t in view.spot_failures if now - t <= window_s)
    if failures:
        signals.append(f"{failures} spot launch failure(s) in the last {window_s}s")
    signals += [
        f"{n.id} spot without heartbeat {now - n.launched_at:.0f}s > {fallback_s}s"
        for n in serving
        if n.spot and n.last_heartbeat is None and now - n.launched_at > fallback_s
    ]
    return signals


# --- the environment budget ------------------------------------------------------------------


def _share_budget(plans: list[_Plan], env: Environment) -> None:
    """Set each plan's `granted` units: its own limits, then the environment cap by priority.

    Units pool min forces come first. Then every queue, highest priority first (across pools),
    gets the units that cover it and every higher queue of its pool, while the budget lasts.
    Budget a high queue cannot use (less than one of its units) still goes to lower queues.
    """
    cap = env.scaler.cost_cap_usd_per_hour
    budget = float("inf") if cap is None else cap - sum(p.existing_cost for p in plans)
    for plan in plans:
        plan.granted = plan.forced
        budget -= plan.launch_cost(plan.forced)
    steps = [
        (-queue.priority, plan.name, index, plan) for plan in plans for index, queue in enumerate(plan.queues)
    ]
    steps.sort(key=lambda s: s[:3])
    for *_, index, plan in steps:
        target = plan.target(index)
        if target <= plan.granted:
            continue
        spent = plan.launch_cost(plan.granted)
        affordable = plan.launch_cost.affordable(budget + spent, target)
        if affordable < target:
            plan.env_limited = True
        if affordable > plan.granted:
            budget -= plan.launch_cost(affordable) - spent
            plan.granted = affordable


# --- the decision and its reasons ------------------------------------------------------------


def _decision(plan: _Plan, env_cap: str) -> PoolDecision:
    desired = min(plan.pool.max, plan.group_units + plan.granted)
    reasons = [_desired_reason(plan, desired)]
    starved: tuple[str, ...] = ()
    if plan.granted < plan.wanted:
        starved = _starved(plan)
        reasons.append(_cap_reason(plan, desired, starved, env_cap))
    if plan.forced and plan.launch_cost(plan.forced) + plan.existing_cost > (
        plan.pool.cost_cap_usd_per_hour or math.inf
    ):
        reasons.append(
            f"pool min {plan.pool.min} units costs more than the pool cost cap "
            f"{_usd(plan.pool.cost_cap_usd_per_hour)}: kept anyway, lower min or raise the cap"
        )
    on_demand_base, base_reason = _on_demand_base(plan, desired)
    if base_reason:
        reasons.append(base_reason)
    return PoolDecision(
        pool=plan.name,
        desired=desired,
        terminate=tuple(plan.terminate),
        on_demand_base=on_demand_base,
        reasons=tuple(reasons + plan.reasons),
        starved_queues=starved,
        cordon=tuple(plan.cordon),
        uncordon=tuple(plan.uncordon),
        leave=plan.leave,
        stay_first=plan.stay_first,
    )


def _demand_text(plan: _Plan) -> str:
    active = [q for q in plan.queues if q.visible or q.in_flight]
    parts = [
        f"queue {q.name}: {q.visible} visible + {q.in_flight} in flight"
        + (f" x {q.slots_per_item} slots" if q.slots_per_item > 1 else "")
        for q in active[:QUEUES_NAMED]
    ]
    if len(active) > QUEUES_NAMED:
        parts.append(f"{len(active) - QUEUES_NAMED} more queues")
    return f"demand {plan.demand} slots" + (f" ({'; '.join(parts)})" if parts else "")


def _desired_reason(plan: _Plan, desired: int) -> str:
    before = plan.view.desired
    verb = "scale out" if desired > before else "scale in" if desired < before else "keep"
    change = f"{before} -> {desired} units" if desired != before else f"{desired} units"
    compare = ">" if plan.demand > plan.capacity else "<="
    line = f"{verb} {change}: {_demand_text(plan)} {compare} capacity {plan.capacity} slots"
    to_launch = desired - plan.group_units
    if to_launch > 0:
        # Beyond what desired grows by, the group refills units it lost: nodes replaced or gone.
        replacing = to_launch - max(0, desired - before)
        line += f"; {to_launch} unit(s) to launch" + (f", {replacing} of them short in the group already (replacements, launches under way)" if replacing else "")
    if plan.forced and plan.granted == plan.forced and plan.forced > plan.wanted:
        line += f"; pool min {plan.pool.min} units"
    return line


def _starved(plan: _Plan) -> tuple[str, ...]:
    """Queues with waiting items that the capped capacity leaves waiting (`_shortfall`)."""
    return tuple(_shortfall(plan))


def _shortfall(plan: _Plan) -> dict[str, int]:
    """The waiting items, per queue, that the capped capacity leaves waiting: the free slots of
    the nodes that take items (pending ones too), and of the units granted, go to the
    highest-priority waiting items first. (Not the per-queue needs: those credit the busy slots'
    turnover to the first queue, whichever queue's items hold them.)"""
    free = sum(n.slots - n.busy_slots for n in plan.view.nodes if n.state in ("running", "pending") and not n.cordoned)
    free += plan.granted * plan.pool.slots_per_unit
    short = {}
    for queue in plan.queues:  # highest priority first
        covered = max(0, free) // queue.slots_per_item
        free -= queue.visible * queue.slots_per_item
        if queue.visible > covered:
            short[queue.name] = queue.visible - covered
    return short


def _cap_reason(plan: _Plan, desired: int, starved: tuple[str, ...], env_cap: str) -> str:
    by_name = {q.name: q for q in plan.queues}
    waiting = (
        ", ".join(f"{name} (priority {by_name[name].priority})" for name in starved)
        or "no queue with waiting items"
    )
    cost = plan.existing_cost + plan.launch_cost(plan.granted)
    needs = f"demand needs {plan.group_units + plan.wanted} units"
    if plan.env_limited:
        why = f"cost cap: pool {plan.name} capped at {desired} units ({_usd(cost)}) by the {env_cap}"
    elif plan.limited_by == "pool cost cap":
        cap = plan.pool.cost_cap_usd_per_hour
        over = ": over the cap already, by nodes it keeps; it launches none" if cost > cap else ""
        why = f"cost cap: pool {plan.name} capped at {desired} units ({_usd(cost)} of {_usd(cap)}{over})"
    elif plan.limited_by == "node faults":
        why = f"launches held: pool {plan.name} at {desired} units, its last nodes could not run items"
    else:
        why = f"at max: pool {plan.name} capped at {plan.pool.max} units"
    return f"{why}, {needs}; waiting: {waiting}"


def _on_demand_base(plan: _Plan, desired: int) -> tuple[int | None, str | None]:
    """Rule 6: raise the base to cover the units to launch while spot is short; restore it after.
    Rule 13: raise it to cover the new on-demand nodes items wait for; keep it while they wait."""
    current, configured = plan.view.on_demand_base, plan.pool.on_demand_base
    if plan.shortage:
        # Only what is launched now needs the base; it is never lowered while spot is short.
        to_launch = max(0, desired - plan.group_units)
        wanted = min(plan.pool.max, max(configured, plan.launch_cost.on_demand_units + to_launch))
        signals = "; ".join(plan.shortage)
        if to_launch == 0 or wanted <= current:
            return None, f"spot short ({signals}): on-demand base stays {current} units"
        return (
            wanted,
            f"spot short ({signals}): on-demand base {current} -> {wanted} units so {to_launch} unit(s) to launch come on demand",
        )
    if plan.on_demand_items:
        launch = min(max(0, desired - plan.group_units), plan.on_demand_needed)
        wanted = min(plan.pool.max, max(configured, plan.launch_cost.on_demand_units + launch))
        if launch and wanted > current:
            return (
                wanted,
                (f"{plan.on_demand_items} wait for on-demand capacity: on-demand base {current} -> {wanted} units "
                 f"so {launch} unit(s) to launch come on demand"),
            )
        return None, f"{plan.on_demand_items} wait for on-demand capacity: on-demand base stays {current} units"
    if current != configured:
        return configured, f"spot healthy: on-demand base {current} -> {configured} units (configured)"
    return None, None


def _usd(amount: float) -> str:
    return f"${amount:,.2f}/h"
