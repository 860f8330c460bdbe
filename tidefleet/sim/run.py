"""One simulation request: load, split off what can never fit, run each policy, summarise."""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace

from tidefleet.config import DAY_S, MAX_ITEM_TIMEOUT_S, Environment, Queue, parse_environment
from tidefleet.sim.engine import (
    NO_INTERRUPTIONS,
    Interruptions,
    Outcome,
    Sample,
    Simulation,
    Timing,
    gang_nodes,
    is_gang,
    placement,
    pool_queues,
)
from tidefleet.sim.policies import BASELINES, POLICY_NAMES, TidefleetPolicy
from tidefleet.sim.teams import TeamRow, route
from tidefleet.sim.teams import by_team as by_team_rows
from tidefleet.sim.trace import TraceError, TraceItem, for_pool

SCHEMA = "tidefleet.sim/1"
PROGRESS_EVERY_S = 10.0  # a line this often while one policy's replay runs (`simulate`'s progress)
PLOT_POINTS = 1500  # timeline samples per run, whatever the trace length

# Boot (launch to a usable OS and the agent's first heartbeat) and spot notice, per cloud:
# traces/README.md gives EC2 25-60 s to a usable OS, GCE 25-45 s; notices 2 min / 30 s.
DEFAULT_TIMING = {"aws": (45.0, 120.0), "gcp": (35.0, 30.0)}


def _every(seconds: float, name: str, started: float, last_submit_s: float,
           say: Callable[[str], None]) -> Callable[[int, int, float], None]:  # fmt: skip
    """The engine's progress callback: a line at most every `seconds` of the replay."""
    last = started
    unit, size = ("day", DAY_S) if last_submit_s >= 2 * DAY_S else ("hour", 3600)  # not "day 0 of 0"

    def tell(done: int, items: int, now: float) -> None:
        nonlocal last
        at = time.perf_counter()
        if at - last >= seconds:
            last = at
            say(f"  {name}: {done:,} of {items:,} items done ({done / items:.0%}), trace {unit} {now / size:,.0f} "
                f"of {last_submit_s / size:,.0f}, {at - started:.0f} s")  # fmt: skip

    return tell


def default_timing(env: Environment, boot_s: float | None = None, notice_s: float | None = None,
                   resume_s: float | None = None) -> Timing:  # fmt: skip
    boot, notice = DEFAULT_TIMING[env.cloud]
    timing = Timing(boot if boot_s is None else boot_s, notice if notice_s is None else notice_s)
    return timing if resume_s is None else replace(timing, resume_s=resume_s)


@dataclass(frozen=True)
class PolicyResult:
    policy: str
    cost_usd: float
    node_hours: float
    idle_node_hours: float
    wait_s: dict[str, float]  # p50, p95, p99, max
    makespan_s: float
    items_finished: int
    items_unfinished: int
    items_interrupted: int
    items_dead_lettered: int
    work_redone_s: float
    busy_items_killed_by_scale_in: int
    spot_launch_failures: int
    peak_nodes: int
    lower_bound_usd: float
    cost_vs_lower_bound: float
    cost_vs_zero_wait: float = math.nan  # over the report's zero_wait_usd
    stopped: str | None = None  # the engine's STALLED or HORIZON: the replay gave up with items unfinished
    held_queues: tuple[str, ...] = ()  # queues whose items waited held by the team quotas when it gave up


@dataclass
class Report:
    trace: str
    env: str
    pool: str
    window: tuple[float, float] | None
    seed: int
    boot_s: float
    notice_s: float
    interruption_rate_per_hour: float
    spot_trace: str | None
    items: int
    unfittable: dict
    gangs: dict
    lower_bound_usd: float
    results: list[PolicyResult]
    zero_wait_usd: float = math.nan  # `zero_wait_bound`
    resume_s: float = math.nan  # `Timing.resume_s`: work a preempted (or moved) attempt repeats
    timelines: dict[str, list[Sample]] = field(default_factory=dict)
    teams: dict[str, list[TeamRow]] = field(default_factory=dict)  # per policy, with by_team
    # Items longer than their queue's item_timeout_s, not replayed (`split_too_long`).
    too_long: dict = field(default_factory=lambda: {"count": 0, "by_queue": {}, "work_s": 0.0, "attempts": 0, "attempts_usd": 0.0})

    def to_json(self) -> dict:
        """The report as JSON data (the schema in tidefleet.sim), its waits and durations to 0.1 s: the
        replay's times are whole seconds plus boots and ticks, and a p95 of 324.144567101519 s claims a
        precision nothing has."""
        data = asdict(self)
        del data["timelines"]
        data["window"] = None if self.window is None else [_finite(end) for end in self.window]
        for result in data["results"]:
            result["wait_s"] = _tenths(result["wait_s"])
            result.update(_tenths({key: result[key] for key in ("makespan_s", "work_redone_s")}))
            for key, value in result.items():  # a ratio to a bound of 0 (every item 0 s long): null, as JSON has no inf
                if isinstance(value, float):
                    result[key] = _finite(value)
        for rows in data["teams"].values():
            for row in rows:
                row.update(_tenths({key: row[key] for key in ("wait_p50_s", "wait_p95_s")}))
        return {"schema": SCHEMA, **data}


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _tenths(seconds: dict[str, float]) -> dict[str, float]:
    return {key: round(value, 1) for key, value in seconds.items()}


def split_unfittable(env: Environment, pool: str, items: list[TraceItem]) -> tuple[list[TraceItem], dict]:
    """Items no node and no gang of the pool can ever run: report them.

    An item larger than the pool's biggest node runs only as a gang of whole nodes, so only on a
    pool with a gang queue (as the agent runs it), and only if some gang queue's max and the pool's
    max both hold the nodes it spans: a trace's job ran on all of them.
    """
    p = env.pools[pool]
    biggest = max(p.slots(t) for t in p.instance_types)
    most_nodes = max((q.gang[1] for q in env.queues_of(pool).values() if is_gang(q)), default=1)
    most_nodes = max(1, min(most_nodes, p.max // max(t.weight for t in p.instance_types)))
    fits = [i for i in items if gang_nodes(i.slots, biggest) <= most_nodes]
    too_big = [i for i in items if gang_nodes(i.slots, biggest) > most_nodes]
    sizes: dict[int, int] = {}
    for i in too_big:
        sizes[i.slots] = sizes.get(i.slots, 0) + 1
    info = {
        "count": len(too_big),
        "largest_node_slots": biggest,
        "most_nodes": most_nodes,  # an item may span (> 1 only as a gang)
        "by_slots": {str(k): v for k, v in sorted(sizes.items())},
        "work_s": sum(i.duration_s for i in too_big),
    }
    return fits, info


def split_too_long(queues: list[tuple[str, Queue]], items: list[TraceItem], queue_of: list[int], need: list[int],
                   slot_hour_usd: float) -> tuple[list[TraceItem], list[int], list[int], dict]:  # fmt: skip
    """Items that run longer than their queue's `item_timeout_s`: report them, as the unfittable.

    The agent kills an attempt at the timeout and counts it failed, so on the real system such an
    item runs `max_retries + 1` attempts of that long and is dead-lettered: never done, whatever
    the scaler does. Replaying it to success would predict work the deployment cannot do.
    Returns the items, queues and slots kept, and {count, by_queue: {queue: {count,
    item_timeout_s, longest_s}}, work_s, attempts, attempts_usd}: the attempts deployed as is would
    run to the timeout, and their slot-hours at `slot_hour_usd` (the lower bound's rate: at least
    what they would bill, boots and idle left out).
    """
    keep, by_queue, work_s, attempts, attempt_slot_s = [], {}, 0.0, 0, 0.0
    for k, (item, q) in enumerate(zip(items, queue_of, strict=True)):
        name, queue = queues[q]
        if item.duration_s <= queue.item_timeout_s:
            keep.append(k)
            continue
        row = by_queue.setdefault(name, {"count": 0, "item_timeout_s": queue.item_timeout_s, "longest_s": 0.0})
        row["count"] += 1
        row["longest_s"] = max(row["longest_s"], item.duration_s)
        work_s += item.duration_s
        tries = queue.max_retries + 1
        attempts += tries
        attempt_slot_s += tries * queue.item_timeout_s * need[k] * queue.gang[0]
    info = {"count": len(items) - len(keep), "by_queue": dict(sorted(by_queue.items())), "work_s": work_s,
            "attempts": attempts, "attempts_usd": attempt_slot_s / 3600.0 * slot_hour_usd}  # fmt: skip
    return [items[k] for k in keep], [queue_of[k] for k in keep], [need[k] for k in keep], info


def too_long_fix(too_long: dict) -> str:
    """What to do about the items `split_too_long` left out: a longer timeout while one is allowed."""
    days = MAX_ITEM_TIMEOUT_S / DAY_S
    if all(row["item_timeout_s"] >= MAX_ITEM_TIMEOUT_S for row in too_long["by_queue"].values()):
        return f"split the work ({days:.0f} days is the most item_timeout_s allows)"
    return f"raise item_timeout_s (at most {days:.0f} days) or split the work"


def gang_report(queues: list[tuple[str, Queue]], items: list[TraceItem], queue_of: list[int]) -> dict:
    """The items replayed as gangs: how many, by the nodes they start on (their queue's
    `nodes_per_item` min, as the replay forms them and the bounds count them; the item's slots
    chose the queue), and their work."""
    gang = [(i, queues[q][1]) for i, q in zip(items, queue_of) if is_gang(queues[q][1])]
    sizes = Counter(queue.gang[0] for _, queue in gang)
    return {
        "count": len(gang),
        "by_nodes": {str(k): v for k, v in sorted(sizes.items())},
        "work_s": sum(i.duration_s for i, _ in gang),
    }


def cheapest_slot_hour(env: Environment, pool: str) -> tuple[float, int]:
    """($ per slot-hour, slots per node) of the pool's cheapest type on spot."""
    p = env.pools[pool]
    best = min(p.instance_types, key=lambda t: (t.price(True) or math.inf) / p.slots(t))
    return (best.price(True) or 0.0) / p.slots(best), p.slots(best)


def lower_bound(env: Environment, pool: str, items: list[TraceItem], need: list[int]) -> tuple[float, float]:
    """(USD, node-hours) of the work alone at the cheapest $/slot-hour: no boot, no idle, no wait."""
    price, slots = cheapest_slot_hour(env, pool)
    slot_hours = sum(i.duration_s * n for i, n in zip(items, need)) / 3600.0
    return slot_hours * price, slot_hours / slots


def _slot_events(items: list[TraceItem], need: list[int]) -> list[tuple[float, int]]:
    """(time, +slots at an item's submit / -slots at its end), in time order, every item started
    at its submit. Ends before starts at one time: a node freed then serves the next item. An
    item of 0 s holds no slot (its end would come before its own start), nor one whose end rounds
    to its start (10 s at 1e18 s: past what the trace reader lets in, not past what callers give)."""
    timed = [(i, n) for i, n in zip(items, need) if i.submit_s + i.duration_s > i.submit_s]
    return sorted([(i.submit_s + i.duration_s, -n) for i, n in timed] + [(i.submit_s, n) for i, n in timed])


def zero_wait_bound(env: Environment, pool: str, items: list[TraceItem], need: list[int], boot_s: float) -> float:
    """USD: less than any schedule pays that starts every item at its submit, knowing the future.
    At each moment it needs the running slots' worth of nodes, ceil(slots / the pool's smallest
    node's), each at the cheapest $/slot-hour (items split across nodes as they cannot be); every
    rise in that count is a node launched a boot earlier (billed) or one kept idle since the last
    fall, whichever is shorter (node counts taken as levels, the k-th node serving while k are
    needed). The work bound (`lower_bound`) leaves out boots and whole nodes: against 8-GPU nodes
    and items shorter than a boot it is out of any policy's reach; this one is not."""
    p = env.pools[pool]
    price, _ = cheapest_slot_hour(env, pool)
    node_slots = min(p.slots(t) for t in p.instance_types)
    events = _slot_events(items, need)
    busy = nodes = 0
    up_since: list[float] = []  # per level, the k-th node: when it last started serving
    down_since: list[float] = []  # per level: when it last stopped (a gap to bridge)
    node_s = 0.0
    for t, delta in events:
        busy += delta
        wanted = -(-busy // node_slots)
        for k in range(nodes, wanted):  # levels k+1 .. wanted start serving
            node_s += min(boot_s, t - down_since[k]) if k < len(down_since) else boot_s
            if k < len(up_since):
                up_since[k] = t
            else:
                up_since.append(t)
        for k in range(wanted, nodes):  # levels wanted+1 .. nodes stop
            node_s += t - up_since[k]
            if k < len(down_since):
                down_since[k] = t
            else:
                down_since.append(t)
        nodes = wanted
    return node_s / 3600.0 * price * node_slots


def _ratio(cost: float, bound: float) -> float:
    return cost / bound if bound else math.inf


def percentile(sorted_values: list[float], p: float) -> float:
    """Nearest-rank percentile of an ascending list (0 when empty)."""
    if not sorted_values:
        return 0.0
    return sorted_values[max(0, math.ceil(p / 100 * len(sorted_values)) - 1)]


def summarise(items: list[TraceItem], outcome: Outcome, lb_usd: float, zero_wait_usd: float) -> PolicyResult:
    """Waits count every item: one never started waits until the run ended (a lower bound)."""
    waits = sorted(
        (start if start is not None else outcome.end_s) - item.submit_s
        for item, start in zip(items, outcome.first_start)
    )
    finished = [t for t in outcome.finished if t is not None]
    first_submit = items[0].submit_s if items else 0.0
    return PolicyResult(
        policy=outcome.policy,
        cost_usd=outcome.cost_usd,
        node_hours=outcome.node_hours,
        idle_node_hours=outcome.idle_node_hours,
        wait_s={f"p{p}": percentile(waits, p) for p in (50, 95, 99)} | {"max": waits[-1] if waits else 0.0},
        makespan_s=(max(finished) - first_submit) if finished else 0.0,
        items_finished=len(finished),
        items_unfinished=len(items) - len(finished),
        items_interrupted=outcome.interruptions,
        items_dead_lettered=outcome.dead_lettered,
        work_redone_s=outcome.redone_s,
        busy_items_killed_by_scale_in=outcome.busy_killed,
        spot_launch_failures=outcome.spot_launch_failures,
        peak_nodes=outcome.peak_nodes,
        lower_bound_usd=lb_usd,
        cost_vs_lower_bound=_ratio(outcome.cost_usd, lb_usd),
        cost_vs_zero_wait=_ratio(outcome.cost_usd, zero_wait_usd),
        stopped=outcome.stopped,
        held_queues=outcome.held,
    )


def oracle_peak_nodes(env: Environment, pool: str, items: list[TraceItem], need: list[int]) -> int:
    """The oracle's nodes at its busiest: the most slots running at once (every item from its
    submit), over the slots of a node of the type `cheapest_slot_hour` bills, rounded up."""
    _, node_slots = cheapest_slot_hour(env, pool)
    busy = peak = 0
    for _, delta in _slot_events(items, need):
        busy += delta
        peak = max(peak, busy)
    return -(-peak // node_slots)


def oracle_outcome(items: list[TraceItem], lb: tuple[float, float], peak_nodes: int) -> Outcome:
    starts = [i.submit_s for i in items]
    out = Outcome(
        "oracle", starts, [i.submit_s + i.duration_s for i in items], cost_usd=lb[0], node_hours=lb[1],
        peak_nodes=peak_nodes,
    )  # fmt: skip
    out.end_s = max(out.finished, default=0.0)
    return out


def make_policy(name: str, env: Environment, pool: str, timing: Timing):
    if name == "tidefleet":
        return TidefleetPolicy(env, timing.kick_s)
    return BASELINES[name](env, pool)


def with_target_wait(env: Environment, pool: str, seconds: int) -> Environment:
    """`env` with `target_wait_s = seconds` on every queue of `pool`, checked as its file would be
    (a ConfigError names the field, the value and the rule: below the queue's `max_wait_s`, say)."""
    data = env.model_dump(exclude_unset=True)
    for name, queue in env.queues.items():
        if queue.pool == pool:
            data["queues"][name]["target_wait_s"] = seconds
    return parse_environment(data, name=env.name, source=f"--target-wait-s {seconds}")


TARGET_WAIT_ROW = "tidefleet, target_wait_s="  # a `--target-wait-s` replay's row: this and the seconds


def target_wait_row(seconds: int) -> str:
    return f"{TARGET_WAIT_ROW}{seconds}"


def pool_problem(env: Environment, pool: str) -> str | None:
    """The line saying `pool` is none of the environment's, or None."""
    if pool in env.pools:
        return None
    return f"--pool: unknown pool (got {pool!r}); pools of {env.name}: {', '.join(sorted(env.pools))}"


def simulate(
    env: Environment,
    pool: str,
    items: list[TraceItem],
    policies: list[str],
    *,
    trace_name: str = "<items>",
    timing: Timing | None = None,
    interruptions: Interruptions = NO_INTERRUPTIONS,
    spot_trace_name: str | None = None,
    seed: int = 0,
    window: tuple[float, float] | None = None,
    by_team: bool = False,
    progress: Callable[[str], None] | None = None,
    target_waits: tuple[int, ...] = (),
) -> Report:
    """Replay `items` under each policy, in submit order whatever their order in the list (ties keep
    it); `progress` (the CLI's stderr) gets a line as the replay starts, one every `PROGRESS_EVERY_S`
    of a policy's replay (Philly takes a minute or more under tidefleet) and one as each policy is done.
    Each of `target_waits` adds a tidefleet row (`target_wait_row`) with that `target_wait_s` on every
    queue of the pool: the cost of letting items wait, on this workload."""
    if unknown_pool := pool_problem(env, pool):
        raise ValueError(unknown_pool)
    unknown = [name for name in policies if name not in POLICY_NAMES]
    if unknown:
        raise ValueError(
            f"--policy: unknown policy (got {unknown[0]!r}); choose from {', '.join(POLICY_NAMES)}"
        )
    # Every row's environment first: a wait target the config refuses ends the command before any replay.
    runs = [(name, name, env) for name in policies]
    runs += [(target_wait_row(w), "tidefleet", with_target_wait(env, pool, w)) for w in dict.fromkeys(target_waits)]
    timing = timing or default_timing(env)
    # The engine takes arrivals in list order: an item listed late but submitted early would wait
    # from its submit for the items listed before it (a p95 of 82,108 s against 47 s, said nothing).
    items = sorted(items, key=lambda i: i.submit_s)
    fits, unfittable = split_unfittable(env, pool, for_pool(items, env.pools[pool].capacity_unit))
    fits = route(env, pool, fits)
    queues = pool_queues(env, pool)
    queue_of, need = placement(queues, fits)
    fits, queue_of, need, too_long = split_too_long(queues, fits, queue_of, need, cheapest_slot_hour(env, pool)[0])
    if not fits:
        too_big = f", {unfittable['count']} too big for pool {pool}" if unfittable["count"] else ""
        longer = f", {too_long['count']} longer than their queue's item_timeout_s" if too_long["count"] else ""
        fixes = ["check the file", *(["widen --window"] if window else []), *([too_long_fix(too_long)] if longer else [])]
        raise TraceError(f"{trace_name}: no items to replay ({len(items)} {'in --window' if window else 'read'}{too_big}"
                         f"{longer}); {', or '.join(fixes)}")
    span = (fits[-1].submit_s - fits[0].submit_s) if fits else 0.0
    sample_s = max(float(env.scaler.tick_s), span / PLOT_POINTS)
    # A gang item's slots on every member of the smallest gang it runs as.
    slots = [n * queues[q][1].gang[0] for q, n in zip(queue_of, need)]
    lb = lower_bound(env, pool, fits, slots)
    zero_wait = zero_wait_bound(env, pool, fits, slots, timing.boot_s)
    gangs = gang_report(queues, fits, queue_of)
    results, timelines, teams = [], {}, {}
    say = progress or (lambda line: None)
    say(f"replaying {len(fits):,} item{'s' * (len(fits) != 1)} under {len(runs)} "
        f"polic{'ies' if len(runs) != 1 else 'y'}")  # fmt: skip
    for done, (row, name, run_env) in enumerate(runs, start=1):
        started = time.perf_counter()
        if name == "oracle":
            outcome = oracle_outcome(fits, lb, oracle_peak_nodes(env, pool, fits, slots))
        else:
            policy = make_policy(name, run_env, pool, timing)
            simulation = Simulation(run_env, pool, fits, policy, timing, interruptions, seed, sample_s)
            outcome = simulation.run(_every(PROGRESS_EVERY_S, row, started, fits[-1].submit_s, say) if progress else None)
        results.append(replace(summarise(fits, outcome, lb[0], zero_wait), policy=row))
        if row == name:  # a wait target's replay is a point on the cost-wait plot, not another timeline
            timelines[row] = outcome.samples
        if by_team and name != "oracle":
            teams[row] = by_team_rows(run_env, pool, fits, outcome)
        say(f"[{done}/{len(runs)}] {row}: {time.perf_counter() - started:.1f} s")
    return Report(
        trace=trace_name,
        env=env.name,
        pool=pool,
        window=window,
        seed=seed,
        boot_s=timing.boot_s,
        notice_s=timing.notice_s,
        interruption_rate_per_hour=interruptions.rate_per_hour,
        spot_trace=spot_trace_name,
        items=len(items),
        unfittable=unfittable,
        gangs=gangs,
        lower_bound_usd=lb[0],
        results=results,
        zero_wait_usd=zero_wait,
        resume_s=timing.resume_s,
        timelines=timelines,
        teams=teams,
        too_long=too_long,
    )
