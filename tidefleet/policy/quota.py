"""Team quotas and fair share: how a pool's capacity is shared among the teams whose queues feed it.

Pure: no SDK, no clock, no environment variables. Kueue's cohort model, in slots of one pool:

1. Quota. A team's quota (`[teams.X] quota`, over the environment, and `pools.P`, in one pool) is
   turned into slots of the pool: each limit (GPUs, vCPUs, nodes, $/h of spot) divided by what one
   slot of the pool holds of it, the most any of its types holds (so a slot is never undercounted).
   An environment-wide limit is what the team's running items in other pools leave of it.
2. Guaranteed. Each team may hold min(demand, quota) slots. When the pool cannot hold them all
   (its max, or its own cost cap at its cheapest spot slot), they are shared by weight
   (`teams.X.weight`), each up to its guarantee. The environment's cost cap is not seen here: it is
   shared among pools afterwards, by priority (scaling rule 8).
3. Borrowing. Quota a team does not use (quota - demand, when positive) may be lent: teams that
   want more than their quota share it by weight, within what the pool can hold. A team without
   a `[teams]` quota is limited only by the pool and its weight. Capacity owed to no one is not
   lent: a team whose quota leaves it no slot of a pool runs there only on another team's idle
   quota (`never_runs`; config refuses a quota that leaves it none to borrow either).
4. Return. Shares are recomputed every tick from the demand then: once an owner has demand, the
   borrowers' shares drop that same tick and their queues are held (below): they take no new items,
   and their running items finish (they are never stopped), so the owner's items start as they end.
5. Escalation. A team with a queue whose oldest item waited past `max_wait_s` is served first in
   rules 2 and 3 (then the others, by weight).

A pool whose queues are all one team's is not shared: its max bounds the team as it does without
`[teams]`, and only the team's own quota holds it (else each hand-over would wait for a tick).

Enforcement: agents pull from every queue of their pool, so a team at its share gets its queues
held (a mark in the job store, read by each agent with its heartbeat): held while its running slots
reach its share and it has waiting items (or runs at its full quota: a new item then waits for the
next tick, which the submit's kick brings within seconds, to be lent idle quota). Between ticks an
agent may still take a few items past a share: quotas are exact at each tick, not between them.
Waiting items beyond a team's share are left out of the demand the pool is sized for, and so are a
held team's items in flight beyond its share that no node runs (the pool's in-flight slots beyond
its busy ones: finished items not yet deleted, a lost node's items not yet visible again, items
spot agents left for on-demand nodes): a node launched for them could take none of the held team's
items, and its items left for on-demand nodes raise no on-demand base.
Those a node runs still count, so a borrower's running items keep their nodes and the owner's
items get new ones beside them. Members forming gangs wait for are never left out (they need nodes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from tidefleet.config import Environment, Pool, Quota, Team
from tidefleet.policy.model import FleetView, QueueView

UNITS = {"gpus": "GPUs", "vcpus": "vCPUs", "nodes": "nodes", "usd_per_hour": "$/h"}


@dataclass(frozen=True, slots=True)
class TeamDemand:
    team: str
    quota: int | None  # slots owed in this pool; None: no quota binds here
    weight: int
    demand: int  # slots: waiting and running items
    running: int  # slots of running (in-flight) items
    urgent: bool = False  # a queue of it waited past max_wait_s


@dataclass(frozen=True, slots=True)
class Share:
    allowed: int  # slots the team may hold this tick
    borrowed: int  # of them, idle quota of other teams


@dataclass(frozen=True, slots=True)
class PoolQuota:
    """What the quotas make of one pool's queues this tick."""

    queues: tuple[QueueView, ...]  # waiting items beyond their team's share left out
    hold: tuple[str, ...]  # queues to hold now (their agents take no new items)
    release: tuple[str, ...]  # held queues that take items again
    reasons: tuple[str, ...]
    # Queues of teams running past their own quota (on quota others lent): preemption takes their
    # attempts before those of teams within theirs.
    borrowing: tuple[str, ...] = ()


def share(capacity: int, teams: list[TeamDemand]) -> dict[str, Share]:
    """Rules 2, 3 and 5: each team's slots out of `capacity`."""
    guaranteed = {t.team: min(t.demand, t.demand if t.quota is None else t.quota) for t in teams}
    allowed = _fill(capacity, guaranteed, teams)
    spare = capacity - sum(allowed.values())
    lendable = sum(max(0, t.quota - t.demand) for t in teams if t.quota is not None)
    # Only a team that got its whole guarantee borrows: one short of it is short of capacity, not quota.
    wants = {t.team: t.demand - allowed[t.team] for t in teams if allowed[t.team] == guaranteed[t.team]}
    borrowed = _fill(min(spare, lendable), wants, teams)
    return {t.team: Share(allowed[t.team] + borrowed.get(t.team, 0), borrowed.get(t.team, 0)) for t in teams}


def _fill(amount: int, caps: dict[str, int], teams: list[TeamDemand]) -> dict[str, int]:
    """`amount` slots shared by weight, each team up to its cap; urgent teams are filled first."""
    given = dict.fromkeys(caps, 0)
    for urgent in (True, False):
        group = [t for t in teams if t.team in caps and t.urgent == urgent]
        active = [t for t in group if caps[t.team] > 0]
        while amount > 0 and active:
            weights = sum(t.weight for t in active)
            step = {t.team: min(caps[t.team] - given[t.team], amount * t.weight // weights) for t in active}
            if not any(step.values()):  # less than a slot each: one each, least served for its weight first,
                # counted as Webster's rounding does ((given + 1/2) / weight): the split nearest the weights, so one
                # slot between weights 1 and 100 goes to the heavier (it went to 'a' by name)
                for t in sorted(active, key=lambda t: ((given[t.team] + 0.5) / t.weight, t.team))[:amount]:
                    step[t.team] = 1
            for team, slots in step.items():
                given[team] += slots
                amount -= slots
            active = [t for t in active if given[t.team] < caps[t.team]]
    return given


# --- from the environment and the fleet to the shares ---------------------------------------


def per_slot(pool: Pool) -> dict[str, float]:
    """What one slot of the pool holds of each limited resource: the most any of its types holds."""
    out = {"gpus": 0.0, "nodes": 0.0, "usd_per_hour": 0.0, "vcpus": 0.0}
    for t in pool.instance_types:
        slots = pool.slots(t)
        out["gpus"] = max(out["gpus"], t.gpus / slots)
        out["nodes"] = max(out["nodes"], 1 / slots)
        out["usd_per_hour"] = max(out["usd_per_hour"], (t.price(True) or t.price(False) or 0.0) / slots)
    if pool.capacity_unit == "vcpus":  # a unit is a vCPU (config: a vCPU quota needs such a pool)
        out["vcpus"] = 1 / pool.slots_per_unit
    return out


def pool_capacity(pool: Pool) -> int:
    """Slots the pool can hold: its max, or fewer when its cost cap buys fewer (at the cheapest spot slot)."""
    slots = pool.max * pool.slots_per_unit
    if pool.cost_cap_usd_per_hour is None:
        return slots
    cheapest = min((t.price(True) or t.price(False) or 0.0) / pool.slots(t) for t in pool.instance_types)
    return slots if cheapest <= 0 else min(slots, math.floor(pool.cost_cap_usd_per_hour / cheapest + 1e-9))


def quota_slots(quotas: list[tuple[Quota, dict[str, float]]], slot: dict[str, float]) -> tuple[int | None, str]:
    """Slots of a pool (whose slot holds `slot`) that quotas leave, and the binding limit in words.

    Each quota comes with what the team already uses of it elsewhere."""
    best: tuple[int | None, str] = (None, "")
    for quota, used in quotas:
        for dim, limit in quota.limits().items():
            if slot[dim] <= 0:
                continue  # this pool's slots hold none of it: the limit does not bind here
            slots = _whole(limit - used.get(dim, 0.0), slot[dim])
            if best[0] is None or slots < best[0]:
                amount = f"${limit:,.2f}/h" if dim == "usd_per_hour" else f"{limit:g} {UNITS[dim]}"
                best = (slots, amount)
    return best


def _whole(amount: float, each: float) -> int:
    """Whole slots `amount` pays for at `each` a slot (a float's last digit never drops one)."""
    return max(0, math.floor(amount / each + 1e-9))


def _quotas(team: Team, pool_name: str, elsewhere: dict[str, float]) -> list[tuple[Quota, dict[str, float]]]:
    """The team's quotas that bind in the pool, each with what it already uses of it elsewhere."""
    return [(team.quota, elsewhere)] + ([(team.pools[pool_name], {})] if pool_name in team.pools else [])


def never_runs(env: Environment, team: str, pool_name: str) -> tuple[str, float, float] | None:
    """(the limit, as `quota.gpus` or `pools.<pool>.gpus`, its value, and one slot of the pool's worth
    of it) of a team's quota that leaves it no slot of the pool when no other team there has a quota
    that could lend one (rule 3): the team's queues there can never run. None: they can."""
    config, slot = env.teams.get(team), per_slot(env.pools[pool_name])
    if config is None or quota_slots(_quotas(config, pool_name, {}), slot)[0] != 0:
        return None
    others = {env.team_of(q) for q, v in env.queues.items() if v.pool == pool_name} - {team}
    for other in (env.teams[o] for o in sorted(others) if o in env.teams):
        if quota_slots(_quotas(other, pool_name, {}), slot)[0]:
            return None  # its idle quota is lent
    for at, quota in (("quota", config.quota), (f"pools.{pool_name}", config.pools.get(pool_name))):
        for dim, limit in (quota.limits() if quota is not None else {}).items():
            if slot[dim] > 0 and _whole(limit, slot[dim]) == 0:
                # One slot's worth, rounded up to what a config would write: whole units, or cents.
                cents = dim == "usd_per_hour"
                one = math.ceil(slot[dim] * 100 - 1e-6) / 100 if cents else math.ceil(slot[dim] - 1e-9)
                return f"{at}.{dim}", limit, one
    return None


def apply(env: Environment, fleet: FleetView) -> dict[str, PoolQuota]:
    """Per pool of `fleet`, its queues as the quotas leave them, the queues to hold or release, and
    one line per team held, borrowing or cut by a capped pool. No `[teams]`: only releases."""
    by_pool: dict[str, list[QueueView]] = {}
    for q in fleet.queues:
        by_pool.setdefault(q.pool, []).append(q)
    if not env.teams:
        return {p: PoolQuota(tuple(qs), (), tuple(q.name for q in qs if q.held), ()) for p, qs in by_pool.items()}
    slot = {name: per_slot(pool) for name, pool in env.pools.items()}
    running: dict[tuple[str, str], int] = {}  # (team, pool) -> running slots
    for q in fleet.queues:
        if q.pool in env.pools:
            running[q.team, q.pool] = running.get((q.team, q.pool), 0) + q.in_flight * q.slots_per_item
    busy = {p.name: sum(n.busy_slots for n in p.nodes if n.state != "terminating") for p in fleet.pools}
    out = {}
    for pool_name, queues in by_pool.items():
        if pool_name not in env.pools:
            continue
        # In-flight slots no node reports busy; unknown (none) where the fleet has no view of the pool.
        in_flight = sum(q.in_flight * q.slots_per_item for q in queues)
        unbacked = max(0, in_flight - busy[pool_name]) if pool_name in busy else 0
        out[pool_name], using = _pool(env, pool_name, queues, slot, running, unbacked)
        # What a team may use here this tick counts against its environment-wide quota in the pools
        # after this one: each pool granted the whole quota at once, and two pools launched twice it.
        running |= {(team, pool_name): slots for team, slots in using.items()}
    return out


def _pool(
    env: Environment,
    pool_name: str,
    queues: list[QueueView],
    slot: dict[str, dict[str, float]],
    running: dict[tuple[str, str], int],
    unbacked: int = 0,
) -> tuple[PoolQuota, dict[str, int]]:
    """The pool's quota decisions, and the slots each team may use in it this tick (what it runs,
    or what its share lets it run once its kept items start, if more)."""
    teams: dict[str, list[QueueView]] = {}
    for q in queues:
        teams.setdefault(q.team, []).append(q)
    demands, words = [], {}
    for team, qs in sorted(teams.items()):
        config = env.teams.get(team)
        quota, words[team] = (None, "")
        if config is not None:
            elsewhere = {
                dim: sum(n * slot[p][dim] for (t, p), n in running.items() if t == team and p != pool_name)
                for dim in UNITS
            }
            quota, words[team] = quota_slots(_quotas(config, pool_name, elsewhere), slot[pool_name])
        demands.append(TeamDemand(
            team=team,
            quota=quota,
            weight=config.weight if config is not None else 1,
            demand=sum((q.visible + q.in_flight) * q.slots_per_item for q in qs),
            running=sum(q.in_flight * q.slots_per_item for q in qs),
            urgent=any(overdue(q) for q in qs),
        ))  # fmt: skip
    capacity = pool_capacity(env.pools[pool_name])
    # One team alone is not shared: only its quota may hold it (the pool's max bounds it as without [teams]).
    shares = share(capacity if len(demands) > 1 else demands[0].demand, demands)
    trimmed, hold, release, reasons, using, borrowing = [], [], [], [], {}, []
    for t in demands:
        s, qs = shares[t.team], teams[t.team]
        kept = _trim(qs, s.allowed - t.running, env)
        using[t.team] = t.running + sum(q.visible * q.slots_per_item for q in kept)
        if t.quota is not None and t.running > t.quota:
            borrowing += [q.name for q in qs]
        waiting = sum(q.visible for q in qs)
        at_quota = t.quota is not None and t.running >= t.quota
        # Held once its smallest waiting item would take it past its share: an agent takes any item
        # that fits its node, and a 2-GPU item at 4 of 5 GPUs ran the team at 6.
        smallest = min((q.slots_per_item for q in qs if q.visible), default=1)
        held = t.running + smallest > s.allowed and (waiting > 0 or at_quota)
        if held:  # its items left for on-demand nodes wait like any: none of its agents takes one now
            kept = [replace(q, on_demand_wanted=0) if q.on_demand_wanted else q for q in kept]
        if held and unbacked:
            kept, cut = _drop_unbacked(kept, min(unbacked, t.running - s.allowed))
            unbacked -= cut
            if cut:
                reasons.append(f"team {t.team}: {cut} of its {t.running} slots in flight are on no node "
                               f"(finished or lost): they launch nothing")  # fmt: skip
        trimmed += kept
        for q in qs:
            if held and not q.held:
                hold.append(q.name)
            elif q.held and not held:
                release.append(q.name)
        reasons += _lines(t, s, words[t.team], waiting, held, capacity, pool_name, qs)
    return PoolQuota(tuple(trimmed), tuple(hold), tuple(release), tuple(reasons), tuple(borrowing)), using


def overdue(q: QueueView) -> bool:
    """Its oldest waiting item waited past the queue's max_wait_s (rule 5)."""
    return bool(q.visible) and q.max_wait_s is not None and q.oldest_age_s is not None and q.oldest_age_s > q.max_wait_s


def _trim(queues: list[QueueView], room: int, env: Environment) -> list[QueueView]:
    """The team's queues with only the waiting items its share has room for: overdue queues first,
    then by priority. A gang queue keeps whole gangs (its visible counts each item's `max` nodes),
    or the part of one that can start (an elastic gang's `min`): part of a gang that cannot form
    would launch nodes that wait for members its share never lets come."""
    out = []
    for q in sorted(queues, key=lambda q: (not overdue(q), -q.priority, q.name)):
        keep = min(q.visible, max(0, room) // q.slots_per_item)
        if q.gang and q.name in env.queues:
            low, high = env.queues[q.name].gang
            keep -= keep % high if keep % high < low else 0
        room -= keep * q.slots_per_item
        out.append(q if keep == q.visible else replace(q, visible=keep))
    return out


def _drop_unbacked(queues: list[QueueView], slots: int) -> tuple[list[QueueView], int]:
    """Up to `slots` of a held team's in-flight slots left out of demand, lowest priority first, whole
    items, never members gangs still form; and the slots left out."""
    out, cut = {q.name: q for q in queues}, 0
    for q in sorted(queues, key=lambda q: (q.priority, q.name)):
        items = min(q.in_flight - q.forming_short, (slots - cut) // q.slots_per_item)
        if items > 0:
            cut += items * q.slots_per_item
            out[q.name] = replace(q, in_flight=q.in_flight - items)
    return list(out.values()), cut


def _lines(
    t: TeamDemand, s: Share, quota: str, waiting: int, held: bool, capacity: int, pool: str, queues: list[QueueView]
) -> list[str]:
    out = [
        f"queue {q.name} waited {q.oldest_age_s:.0f}s > max_wait_s {q.max_wait_s}s: team {t.team} served first"
        for q in queues
        if overdue(q)
    ]
    guarantee = t.demand if t.quota is None else min(t.demand, t.quota)
    if s.allowed < guarantee:
        out.append(f"team {t.team} gets {s.allowed} of {guarantee} slots: pool {pool} holds {capacity} slots, "
                   f"shared by weight ({t.weight})")  # fmt: skip
    if s.borrowed:
        out.append(f"team {t.team} borrows {s.borrowed} slots of idle quota (quota {quota} = {t.quota} slots; "
                   f"{t.demand} slots wanted)")  # fmt: skip
    if held:
        what = f"at quota {quota}" if t.quota is not None and s.allowed <= t.quota else f"at its share {s.allowed} slots"
        queue_names = ", ".join(q.name for q in queues)
        out.append(f"team {t.team} {what}; {waiting} items wait (held: {queue_names})")
    return out
