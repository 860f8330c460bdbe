"""One apply path: `control.act` gives the same fleet whether the group is the simulator's or
the in-memory adapter's, so the simulator replays what the product does."""

from __future__ import annotations

import pytest

from tidefleet import control
from tidefleet.cloud.memory import MemoryFleet, MemoryGroup, MemoryNodes, MemoryQueues
from tidefleet.config import parse_environment
from tidefleet.policy.model import PoolDecision
from tidefleet.ports import Ports
from tidefleet.sim.engine import Simulation, Timing
from tidefleet.sim.policies import TidefleetPolicy
from tidefleet.sim.ports import SimulationPorts


def environment(weight: int = 1, min_units: int = 0):
    types = [{"type": "c6i.large", "weight": weight}]
    pool = {"min": min_units, "max": 12, "command": "run", "instance_types": types}
    return parse_environment({"region": "us-east-1", "pools": {"p": pool}, "queues": {"q": {"pool": "p"}}}, name="t")


def decision(desired, terminate=(), base=None):
    return PoolDecision("p", desired, tuple(terminate), base, reasons=("table",))


# (case, environment, units launched before, decisions applied in turn)
# fmt: off
CASES = [
    ("terminate some", environment(), 4, [decision(2, ["i-00000001", "i-00000003"])]),
    ("terminate a weighted node", environment(weight=2), 6, [decision(4, ["i-00000002"])]),
    ("raise the on-demand base, then lower it", environment(), 3, [decision(3, base=2), decision(3, base=0)]),
    ("lower desired below live capacity", environment(), 4, [decision(1)]),
    ("terminate one and lower desired further", environment(), 4, [decision(0, ["i-00000004"])]),
    ("stray ids of another group", environment(), 2, [decision(2, ["i-00000099", "g-00000001", "cpu-i0"])]),
    ("terminate at min: desired stays at min", environment(min_units=2), 2, [decision(2, ["i-00000001"])]),
    ("the same decision twice", environment(), 3, [decision(2, ["i-00000002"])] * 2),
]
# fmt: on


def simulated(env, units):
    sim = Simulation(env, "p", [], TidefleetPolicy(env, 0.0), Timing(boot_s=45.0, notice_s=120.0))
    sim.set_desired(units)  # the group launches them (booting: in service, no heartbeat yet)
    view = SimulationPorts(sim)
    return sim, Ports(queues=view, fleet=view, nodes=view, stats=view)


def in_memory(env, ports):
    state = ports.fleet.groups(["p"], since=0.0)["p"]
    group = MemoryGroup(state.name, desired=state.desired, min=state.min, max=state.max,
                        on_demand_base=state.on_demand_base, instances=state.instances)  # fmt: skip
    return Ports(queues=MemoryQueues(), fleet=MemoryFleet({"p": group}), nodes=MemoryNodes())


def apply_all(env, ports, decisions):
    """Each decision as the tick applies it: observe the group, then act. Returns the log fields."""
    done = []
    for d in decisions:
        done.append(control.act(ports, env, d, ports.fleet.groups(["p"], since=0.0)["p"]))
    return done


@pytest.mark.parametrize(("case", "env", "units", "decisions"), CASES, ids=[c[0] for c in CASES])
def test_the_simulator_and_the_in_memory_fleet_apply_decisions_alike(case, env, units, decisions):
    sim, sim_ports = simulated(env, units)
    memory_ports = in_memory(env, sim_ports)
    before = {i.id for i in sim_ports.fleet.groups(["p"], 0.0)["p"].instances}

    assert apply_all(env, sim_ports, decisions) == apply_all(env, memory_ports, decisions)

    def fleet(ports):
        group = ports.fleet.groups(["p"], since=0.0)["p"]
        # Only the nodes there before: the simulated group also launches up to desired (at min).
        return group.desired, group.on_demand_base, sorted(i.id for i in group.instances if i.id in before)

    assert fleet(sim_ports) == fleet(memory_ports)
    assert sim.units == sim.desired  # the simulated group never had to pick a victim


@pytest.mark.parametrize(("case", "env", "units", "decisions"), CASES, ids=[c[0] for c in CASES])
def test_terminate_alone_decrements_both_groups_alike(case, env, units, decisions):
    # Act sets desired again after terminating: here the decrement itself is compared.
    _, sim_ports = simulated(env, units)
    memory_ports = in_memory(env, sim_ports)
    for d in decisions:
        assert sim_ports.fleet.terminate("p", d.terminate) == memory_ports.fleet.terminate("p", d.terminate)
    sim_group, memory_group = (p.fleet.groups(["p"], since=0.0)["p"] for p in (sim_ports, memory_ports))
    assert sim_group.desired == memory_group.desired
    assert {i.id for i in memory_group.instances} <= {i.id for i in sim_group.instances}


def test_a_simulated_node_leaves_by_terminate_and_its_decrement_only():
    env = environment()
    _, ports = simulated(env, 3)
    assert ports.fleet.terminate("p", ("i-00000002", "i-00000002")) == ("i-00000002",)
    group = ports.fleet.groups(["p"], since=0.0)["p"]
    assert (group.desired, [i.id for i in group.instances]) == (2, ["i-00000001", "i-00000003"])
    assert ports.fleet.group_of("i-00000002") is None and ports.fleet.group_of("i-00000001") == "sim-p"


@pytest.mark.parametrize(
    ("action", "message"),
    [
        (lambda f: f.set_desired("p", 13), "tidefleet-t-p: desired 13 is outside [min 0, max 12]"),
        (lambda f: f.set_on_demand_base("p", -1), "tidefleet-t-p: on-demand base must be >= 0 (got -1)"),
        (lambda f: f.terminate("gpu", ("i-1",)), "pool 'gpu': no group; known: p"),
    ],
)
def test_the_in_memory_fleet_refuses_what_the_cloud_refuses_with_one_line(action, message):
    fleet = MemoryFleet({"p": MemoryGroup("tidefleet-t-p", desired=0, max=12)})
    with pytest.raises((ValueError, LookupError)) as err:
        action(fleet)
    assert str(err.value).strip("'\"") == message
