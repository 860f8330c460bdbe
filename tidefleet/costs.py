"""Cost attribution: what each recorded attempt cost, summed by team, job, queue, submitter, pool
or month. Pure: it reads records the job store returns and the environment's prices.

An attempt costs its node-seconds × its share of the node (the item's slots / the node's slots)
× the node's hourly price (spot or on-demand: `InstanceType.price`, the prices the scaler uses).
The agent writes what ran where into each attempt's history entry (`instance_type`, `spot`,
`slots`, `node_slots`, `seconds`, `ended_at`), because heartbeats go with their node; a gang
member writes the same of its node's part beside the item (`JobStore.record_part`).

Busy time only: a node's idle and boot time is recorded nowhere once the node is gone, so it
is not charged to anyone (never guessed); `IDLE_NOTE` says so wherever a total is shown.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from tidefleet import prices
from tidefleet.config import Environment
from tidefleet.records import Item, Job

BY = ("team", "job", "queue", "user", "pool")
IDLE_NOTE = ("busy time only: nodes' idle and boot time, and the free slots of busy nodes, are not charged (no "
             "record of them outlives a node); the bill for the same tags minus this total is mostly that time, "
             "and the gap between the configured and the paid spot price")  # fmt: skip


@dataclass(frozen=True)
class Charge:
    """One attempt, priced."""

    job_id: str
    item_id: str
    queue: str
    team: str
    user: str
    pool: str
    ended_at: float
    instance_type: str
    spot: bool
    seconds: float  # the attempt's wall time on its node
    share: float  # its slots / the node's slots
    usd_per_hour: float  # the whole node's price
    entry: dict  # the history entry, for right-sizing

    @property
    def node_hours(self) -> float:
        return self.seconds * self.share / 3600

    @property
    def cost_usd(self) -> float:
        return self.node_hours * self.usd_per_hour

    @property
    def month(self) -> str:
        return datetime.fromtimestamp(self.ended_at, UTC).strftime("%Y-%m")

    def key(self, by: str) -> str:
        return {"team": self.team, "job": self.job_id, "queue": self.queue, "user": self.user,
                "pool": self.pool}[by]  # fmt: skip


@dataclass(frozen=True)
class Row:
    key: str
    month: str | None  # with --monthly
    attempts: int
    node_hours: float
    cost_usd: float


def usd(x: float) -> str:
    """Cents from $1 up (`1,146.86`); under $1, 4 significant digits (`0.09740`), so that a printed
    ratio can be checked against the printed costs of a small trace."""
    rounded = float(f"{x:.3e}")  # to 4 significant digits: 0.99996 is $1.00, 0.099999 is 0.1000
    if not 0 < abs(rounded) < 1:  # 0, $1 and more (nan and inf too)
        return f"{x:,.2f}"
    return f"{rounded:.{3 - math.floor(math.log10(abs(rounded)))}f}"


def hourly(env: Environment, pool: str | None, instance_type: str, spot: bool) -> float | None:
    """The node's price: the pool's configured type, else the built-in table; None if neither knows it."""
    configured = env.pools[pool].instance_types if pool in env.pools else []
    itype = next((t for t in configured if t.type == instance_type), None)
    return itype.price(spot) if itype is not None else prices.default_price(instance_type, spot)


def unpriced_reason(entry: dict, usd_per_hour: float | None) -> str | None:
    """Why an attempt cannot be priced honestly, or None when it can."""
    if entry.get("outcome") == "lost":
        return "node lost during the attempt: its run time died with it"
    if entry.get("seconds") is None:
        return "no run time recorded"
    if not entry.get("instance_type") or not entry.get("node_slots"):
        return "no instance type recorded (written by an agent older than cost attribution)"
    if usd_per_hour is None:
        return f"no price for {entry['instance_type']}: set on_demand_price / spot_price on the type"
    return None


# How long before a window's start a job's last recorded attempt end (`Job.last_attempt_at`) may
# be and the job still be read: the stamp is the writer's clock, of two writers a moment apart the
# earlier one's may land last, and a write of its own is skipped within `records.STAMP_EVERY_S` of
# the client's last. An hour covers all three many times over, at the price of reading a few jobs
# that ended just before the window.
ATTEMPT_STAMP_SLACK_S = 3600.0


def may_have_charges(job: Job, since: float) -> bool:
    """Whether an attempt of the job may have ended at or after `since`; True where the store has
    no stamp (a job with no recorded attempt yet, or recorded before the stamp was kept)."""
    return job.last_attempt_at is None or job.last_attempt_at >= since - ATTEMPT_STAMP_SLACK_S


def charges(env: Environment, job: Job, items: Iterable[Item], *, parts: dict[str, list[dict]] | None = None,
            since: float = 0.0, unpriced: Counter | None = None) -> list[Charge]:  # fmt: skip
    """Every attempt of the job's items that ended at or after `since`, and every gang member's
    part of one (`parts`, by item id: `JobStore.parts`), priced; each that cannot be priced is
    counted by its reason in `unpriced`."""
    queue = env.queues.get(job.queue)
    pool = queue.pool if queue else None
    team = (queue.team or env.pools[pool].team) if queue and pool in env.pools else "unknown"
    out = []
    for item in items:
        seen = set()
        for entry in [*item.history, *(parts or {}).get(item.item_id, ())]:
            if (entry.get("ended_at") or item.updated_at) < since:
                continue
            # An end whose write landed but whose answer was lost is appended again by the retry (its
            # fence, the attempt number, still passes): the same end, billed once.
            same = repr(sorted(entry.items()))
            if same in seen and entry.get("ended_at") is not None:
                continue
            seen.add(same)
            price = hourly(env, pool, entry["instance_type"], bool(entry.get("spot"))) \
                if entry.get("instance_type") else None  # fmt: skip
            why = unpriced_reason(entry, price)
            if why is not None:
                if unpriced is not None:
                    unpriced[why] += 1
                continue
            out.append(Charge(job.job_id, item.item_id, job.queue, team, job.submitter or "unknown", pool or "unknown",
                              entry["ended_at"], entry["instance_type"], bool(entry["spot"]), float(entry["seconds"]),
                              entry.get("slots", 1) / entry["node_slots"], price, entry))  # fmt: skip
    return out


def summarise(found: Iterable[Charge], by: str, *, monthly: bool = False) -> list[Row]:
    """Sums by `by` (one of BY), and by month when asked: months oldest first, then costliest first."""
    if by not in BY:
        raise ValueError(f"by: unknown grouping {by!r}; one of {', '.join(BY)}")
    groups: dict[tuple[str | None, str], list[Charge]] = defaultdict(list)
    for c in found:
        groups[(c.month if monthly else None, c.key(by))].append(c)
    rows = [Row(key, month, len(cs), sum(c.node_hours for c in cs), sum(c.cost_usd for c in cs))
            for (month, key), cs in groups.items()]  # fmt: skip
    return sorted(rows, key=lambda r: (r.month or "", -round(r.cost_usd, 9), r.key))


def parse_since(text: str, now: float) -> float:
    """`7d`, `12h`, `30m`, `90s` before `now`, or a date `2026-01-31` (UTC); `all` is the beginning,
    as is a duration that reaches past it (a time before 1970 is no time: OverflowError, EOVERFLOW)."""
    text = text.strip()
    if text == "all":
        return 0.0
    units = {"d": 86400, "h": 3600, "m": 60, "s": 1}
    if text[-1:] in units and text[:-1].isascii() and text[:-1].isdigit():  # "²" is a digit to isdigit, not to int()
        return max(0.0, now - min(int(text[:-1]) * units[text[-1]], now))
    try:
        return datetime.strptime(text, "%Y-%m-%d").replace(tzinfo=UTC).timestamp()
    except ValueError:
        raise ValueError(f"--since: not a duration or a date (got {text!r}); use e.g. 7d, 12h or 2026-01-31, "
                         "or all") from None  # fmt: skip
