"""Multi-node items (gangs): how the nodes of one item find each other, start together and stop
together. Pure rules, no I/O: the agent (`worker.py`) reads the item's record and the pool's
heartbeats, asks these, and carries out the answer.

The protocol, all through the job store (no coordinator, no extra queue):
  * The node that claims a gang item's message is its **lead** (node rank 0). The claim resets the
    item's gang: `gang = "forming"`, `members = [the lead]`. The lead holds the message and the
    lease like any attempt, and puts a `Beacon` in its heartbeat.
  * A free node of the pool joins a beaconed gang **before** it takes new items: a conditional
    append to `members`, fenced on the attempt, so a join can only reach the attempt it saw.
    Ranks follow join order; joins past the gang's size are surplus and leave again.
  * Once `min` nodes joined, the lead sets `gang = "running"` and every member starts the workload
    with the torchrun / torch.distributed variables (`workload_env`). An elastic gang (min < max)
    keeps its beacon up and takes joiners up to max while it runs: torchrun's rendezvous takes
    them in.
  * One gang forms at a time where they compete: a lead that sees an older forming gang in its
    pool gives its item back (not an attempt spent) and joins that one, so two half-formed gangs
    never wait on each other. A gang that does not form within the pool's boot timeout (new nodes
    may have to boot) is given back too.
  * A stop notice on any member of a fixed gang sets `gang = "stopping"`: every member gets the
    stop signal and checkpoints, and the lead hands the item back whole (an interruption). In an
    elastic gang the member leaves (`left`) and the rest go on while `min` remain.
  * A member whose workload fails sets `gang_failure`: the lead stops and records a failed attempt.
    A lead that is gone (its lease lapsed) ends its members' part; the item comes back with its
    message, as any lost attempt's.
"""

from __future__ import annotations

from dataclasses import dataclass

FORMING, RUNNING, STOPPING, RELEASED = "forming", "running", "stopping", "released"
MASTER_PORT_DEFAULT = 29500  # torch.distributed's usual port, when the lead cannot pick a free one
BEACON_FRESH_BEATS = 3  # a beacon in a heartbeat older than this many heartbeats is a dead lead's


@dataclass(frozen=True)
class Beacon:
    """What a lead's heartbeat says of its gang (`Heartbeat.gang`), for free nodes to join."""

    queue: str
    job: str
    item: str
    attempt: int
    since: float  # when the lead claimed it: the older forming gang goes first
    forming: bool  # False: running, and an elastic gang with room to grow
    # Members a forming gang still waits for, each a wholly free node: the scaler places them like
    # waiting multi-slot items (free slots scattered over busy nodes take no member).
    short: int = 0

    def record(self) -> dict:
        return {"queue": self.queue, "job": self.job, "item": self.item, "attempt": self.attempt,
                "since": self.since, "forming": self.forming, "short": self.short}  # fmt: skip

    @classmethod
    def parse(cls, raw: dict) -> Beacon | None:
        try:
            return cls(str(raw["queue"]), str(raw["job"]), str(raw["item"]), int(raw["attempt"]),
                       float(raw["since"]), bool(raw["forming"]), max(0, int(raw.get("short", 0))))  # fmt: skip
        except (KeyError, TypeError, ValueError, AttributeError):
            return None  # a malformed beacon is nobody's gang

    def order(self) -> tuple:
        """Forming gangs before growing ones, then the oldest claim first."""
        return (not self.forming, self.since, self.job, self.item)


def beacons(heartbeats: dict, *, own_node: str, queues: set[str], now: float, heartbeat_s: float) -> list[Beacon]:
    """The gangs a free node of these queues may join, in the order to try them: live leads only."""
    out = []
    for node_id, hb in heartbeats.items():
        beacon = Beacon.parse(hb.gang) if hb.gang else None
        if beacon is None or node_id == own_node or beacon.queue not in queues or hb.draining:
            continue
        if now - hb.at <= BEACON_FRESH_BEATS * max(heartbeat_s, 1.0):
            out.append(beacon)
    return sorted(out, key=Beacon.order)


def yields_to(own: Beacon, others: list[Beacon]) -> Beacon | None:
    """The older forming gang a forming lead gives way to, if any (one gang forms at a time)."""
    older = [b for b in others if b.forming and (b.since, b.job, b.item) < (own.since, own.job, own.item)]
    return min(older, key=Beacon.order) if older else None


def roster(members: list[dict], left: list[dict], most: int) -> list[dict]:
    """The gang's members in rank order: joined and not left, at most `most` (the rest are surplus)."""
    gone = {entry.get("node") for entry in left}
    return [m for m in members if m.get("node") not in gone][:most]


@dataclass(frozen=True)
class Wait:
    """Not yet: look again shortly."""


@dataclass(frozen=True)
class Start:
    rank: int
    members: tuple[dict, ...]


@dataclass(frozen=True)
class Leave:
    why: str


def for_member(item, attempt: int, node_id: str, most: int, now: float) -> Wait | Start | Leave:
    """What a member that joined attempt `attempt` does now, given the item's record (None: gone).
    The same rule tells a running member when to stop (`Leave`)."""
    if item is None or item.attempts != attempt or item.status != "running":
        return Leave("the item's attempt ended")
    if item.gang in (STOPPING, RELEASED):
        return Leave(f"the gang is {item.gang}")
    if item.gang_failure:
        return Leave(f"a member failed: {item.gang_failure}")
    if item.lease_until and item.lease_until < now:
        return Leave("the lead is gone (its lease lapsed)")
    ranked = roster(item.members, item.left, most)
    rank = next((i for i, m in enumerate(ranked) if m.get("node") == node_id), None)
    if rank is None:
        return Leave("the gang is full")
    return Start(rank, tuple(ranked)) if item.gang == RUNNING else Wait()


def workload_env(members: tuple[dict, ...], rank: int, *, slots: int, low: int, high: int, rendezvous_id: str) -> dict:
    """The torch.distributed / torchrun variables for node `rank` of the gang.

    A workload that runs one process per node reads MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE
    as they are (`torch.distributed.init_process_group("env://")`). A plain `torchrun train.py`
    needs no flags: torchrun reads its options from PET_* variables, so it starts
    LOCAL_WORLD_SIZE processes per node and rendezvouses (c10d) at the lead's address, elastic
    between min and max nodes; the lead hosts the rendezvous store. tidefleet starts torchrun
    once the gang's nodes are there, so torchrun's own wait for more nodes (last call) is short."""
    lead = members[0]
    nodes = len(members)
    addr, port = str(lead.get("addr") or "127.0.0.1"), str(lead.get("port") or MASTER_PORT_DEFAULT)
    nnodes = f"{low}:{high}" if low < high else str(high)
    return {
        "MASTER_ADDR": addr,
        "MASTER_PORT": port,
        "WORLD_SIZE": str(nodes * slots),
        "RANK": str(rank * slots),
        "NODE_RANK": str(rank),
        "LOCAL_WORLD_SIZE": str(slots),
        "TIDEFLEET_NNODES": nnodes,
        "TIDEFLEET_GANG_NODES": str(nodes),
        "TIDEFLEET_RDZV_ID": rendezvous_id,
        "PET_NNODES": nnodes,
        "PET_NPROC_PER_NODE": str(slots),
        "PET_RDZV_BACKEND": "c10d",
        "PET_RDZV_ENDPOINT": f"{addr}:{port}",
        "PET_RDZV_ID": rendezvous_id,
        "PET_RDZV_CONF": f"is_host={int(rank == 0)},last_call_timeout=5",
    }


def on_member_stop(item, node_id: str, low: int, high: int) -> str:
    """What a member's stop notice does to its gang: 'stopping' (everyone stops, the item goes
    back whole) or 'left' (an elastic gang goes on without it)."""
    if low == high or item is None:
        return STOPPING
    remaining = [m for m in roster(item.members, item.left, high) if m.get("node") != node_id]
    return "left" if len(remaining) >= low else STOPPING
