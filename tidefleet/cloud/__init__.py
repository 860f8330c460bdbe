"""The small ports the control tick talks to, and the plain data they return.

A port is what the tick needs from a cloud, nothing more: backlog per queue, the groups
and their instances, node heartbeats. `tidefleet.cloud.aws` implements them with boto3
(the same code runs against AWS and the moto server); `tidefleet.store.Store` already is
a node-state port. No SDK import here, so the simulator and tests can use these types
without paying for boto3.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from tidefleet.store import Heartbeat, QueueStats


@dataclass(frozen=True, slots=True)
class Backlog:
    visible: int  # waiting items
    in_flight: int  # received by an agent, not yet deleted


@dataclass(frozen=True, slots=True)
class GroupInstance:
    id: str
    instance_type: str
    lifecycle_state: str  # the group's word: Pending, InService, Terminating:Wait, ...
    spot: bool
    launched_at: float | None  # epoch seconds; None if EC2 does not list it yet (eventual consistency)
    protected: bool  # scale-in protection (set by a busy agent)
    weight: int | None = None  # the group's weighted capacity, when it reports one


@dataclass(frozen=True, slots=True)
class GroupState:
    name: str
    desired: int  # capacity units
    min: int
    max: int
    on_demand_base: int
    instances: tuple[GroupInstance, ...]
    spot_failures: tuple[float, ...] = ()  # start times of recent failed spot launches


class QueuePort(Protocol):
    def backlog(self, queue: str) -> Backlog:
        """Current backlog of a configured queue (the config name, not the cloud name)."""


class FleetPort(Protocol):
    def groups(self, pools: list[str], since: float) -> dict[str, GroupState]:
        """The group of each pool that exists, by pool; spot failures started at or after `since`."""

    def set_desired(self, pool: str, desired: int) -> None: ...

    def terminate(self, pool: str, instance_ids: tuple[str, ...]) -> tuple[str, ...]:
        """Terminate these instances WITH a decrement of desired capacity, so the group never
        launches a replacement nor picks a victim of its own. Instances already gone or no
        longer in service are skipped, not an error. Returns the ids actually terminated."""

    def set_on_demand_base(self, pool: str, units: int) -> None: ...

    def group_of(self, instance_id: str) -> str | None:
        """The name of the group the instance belongs to, or None."""

    def complete_lifecycle_action(self, pool: str, instance_id: str, hook: str, token: str | None) -> None:
        """Let a node held by the terminate lifecycle hook go now (result CONTINUE)."""


class NodeStatePort(Protocol):
    def heartbeats(self, pool: str) -> dict[str, Heartbeat]: ...

    def mark_draining(self, pool: str, node_id: str) -> None: ...

    def forget_node(self, pool: str, node_id: str) -> None: ...


class QueueStatsPort(Protocol):
    def queue_stats(self, queues: list[str]) -> dict[str, QueueStats]:
        """Recorded statistics of these queues (mean item run time), by name; absent if none yet."""


@dataclass(frozen=True)
class Ports:
    queues: QueuePort
    fleet: FleetPort
    nodes: NodeStatePort
    stats: QueueStatsPort | None = None  # None: mean item times unknown, the policy counts slots only
