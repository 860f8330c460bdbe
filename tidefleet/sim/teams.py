"""Teams in a replay: a trace's `group` column names the team an item belongs to, and the
per-team rows of `tidefleet simulate --by-team`: work, wait and cost per team, next to its quota.

A team's cost is its work priced as the lower bound prices it (the pool's lowest $/slot-hour), so
the teams' costs add up to the lower bound under every policy; what a policy pays beyond it (idle
nodes, unused slots of busy nodes, boots, redone work, dearer nodes) is no team's, and the table
shows it as a row of its own.

An item's group is the team of the same name, or `vc-<group>`: team names start with a letter,
and Philly's virtual clusters are hex ids (`6214e9`). Such an item goes to its team's queues
(`engine.placement`); an item of no known team goes to any queue, as without teams.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tidefleet.config import Environment
from tidefleet.policy.quota import per_slot, quota_slots
from tidefleet.sim.engine import Outcome, placement, pool_queues
from tidefleet.sim.trace import TraceItem

GROUP_PREFIX = "vc-"


def route(env: Environment, pool: str, items: list[TraceItem]) -> list[TraceItem]:
    """Items with their group renamed to the team of the pool's queues it names, where one does."""
    teams = {q.team for _, q in pool_queues(env, pool) if q.team is not None}
    prefixed = {t.removeprefix(GROUP_PREFIX): t for t in teams if t.startswith(GROUP_PREFIX)}
    out = []
    for item in items:
        team = item.group if item.group in teams else prefixed.get(item.group)
        out.append(item if team is None or team == item.group else replace(item, group=team))
    return out


@dataclass(frozen=True)
class TeamRow:
    team: str
    quota: str  # the binding limit in words, "-" without one
    quota_slots: int | None
    weight: int
    items: int
    slot_hours: float  # the work: run time x slots, every node's of a gang
    wait_p50_s: float
    wait_p95_s: float
    cost_usd: float  # the work at the pool's lowest $/slot-hour: its share of the lower bound


def by_team(env: Environment, pool: str, items: list[TraceItem], outcome: Outcome) -> list[TeamRow]:
    from tidefleet.sim.run import cheapest_slot_hour, percentile

    queues = pool_queues(env, pool)
    queue_of, need = placement(queues, items)
    price, _ = cheapest_slot_hour(env, pool)
    waits: dict[str, list[float]] = {}
    work: dict[str, float] = {}
    for index, item in enumerate(items):
        name, queue = queues[queue_of[index]]
        team = env.team_of(name)
        start = outcome.first_start[index]
        waits.setdefault(team, []).append((outcome.end_s if start is None else start) - item.submit_s)
        # need is one node's slots; a gang holds that many on each of its nodes (as the lower bound counts)
        work[team] = work.get(team, 0.0) + item.duration_s * need[index] * queue.gang[0] / 3600.0
    rows = []
    for team in sorted(waits, key=lambda t: -work[t]):
        config = env.teams.get(team)
        slots, words = quota_slots([(config.quota, {})], per_slot(env.pools[pool])) if config else (None, "")
        w = sorted(waits[team])
        rows.append(TeamRow(team, words or "-", slots, config.weight if config else 1, len(w), work[team],
                            percentile(w, 50), percentile(w, 95), work[team] * price))  # fmt: skip
    return rows
