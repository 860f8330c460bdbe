"""Apply policy decisions to a policy view the one way the product does: `control.act` on the
in-memory fleet. For the policy tests, which state fleets as views."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from tidefleet import control
from tidefleet.cloud.memory import MemoryFleet, MemoryGroup, MemoryNodes, MemoryQueues
from tidefleet.config import Environment
from tidefleet.policy.model import FleetView, NodeView, PoolDecision
from tidefleet.ports import GroupInstance, Ports

# How the group lists a node the policy sees in this state. A node whose agent has not
# reported is in service as far as the group knows (so a replaced one can be terminated).
LIFECYCLE = {"pending": "InService", "running": "InService", "draining": "InService", "terminating": "Terminating"}


def instance(node: NodeView) -> GroupInstance:
    return GroupInstance(
        id=node.id,
        instance_type=node.instance_type,
        lifecycle_state=LIFECYCLE[node.state],
        spot=node.spot,
        launched_at=node.launched_at,
        protected=node.protected,
        weight=node.weight,
    )


def memory_fleet(env: Environment, fleet: FleetView) -> MemoryFleet:
    """The groups the view was observed from, bounds from the environment's pools."""
    return MemoryFleet({
        p.name: MemoryGroup(
            f"tidefleet-{env.name}-{p.name}", desired=p.desired, min=env.pools[p.name].min,
            max=env.pools[p.name].max, on_demand_base=p.on_demand_base,
            instances=map(instance, p.nodes), spot_failures=p.spot_failures,
        )
        for p in fleet.pools
    })  # fmt: skip


def apply(env: Environment, fleet: FleetView, decisions: Iterable[PoolDecision]) -> FleetView:
    """The view after `control.act` applied the decisions: terminated nodes gone, desired and
    the base as the group now has them. Launching for a raised desired is the cloud's job."""
    memory = memory_fleet(env, fleet)
    nodes = MemoryNodes()  # no heartbeats: cordon marks wait in it for the nodes' next beat
    ports = Ports(queues=MemoryQueues(), fleet=memory, nodes=nodes)
    for decision in decisions:
        group = memory.groups([decision.pool], since=0.0)[decision.pool]
        done = control.act(ports, env, decision, group)
        assert "failed" not in done, done["failed"]
    groups = memory.groups([p.name for p in fleet.pools], since=0.0)
    return replace(fleet, pools=tuple(
        replace(p, nodes=tuple(replace(n, cordoned=nodes.cordons.get((p.name, n.id), n.cordoned))
                              for n in p.nodes if n.id in memory.groups_[p.name].instances),
                desired=groups[p.name].desired, on_demand_base=groups[p.name].on_demand_base)
        for p in fleet.pools
    ))  # fmt: skip
