"""The simulator runs gang items as the agent does: a lead opens the pool's one forming gang, wholly
free nodes join it before receiving, it starts all at once at min members, a fixed gang goes back
whole when it loses a member and an elastic one runs on while min remain; items larger than a node
replay as gangs where the pool has a gang queue, and are reported."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidefleet.agent.gang import Beacon
from tidefleet.config import load_environment, parse_environment
from tidefleet.sim import Timing, TraceItem, simulate
from tidefleet.sim.engine import NOTICE, Simulation
from tidefleet.sim.policies import TidefleetPolicy
from tidefleet.sim.ports import SimulationPorts
from tidefleet.sim.trace import load_trace

ROOT = Path(__file__).resolve().parent.parent
BOOT, NOTICE_S = 45.0, 120.0
TIMING = Timing(boot_s=BOOT, notice_s=NOTICE_S, kick_s=0.0)


def make_env(nodes_per_item=2, max_nodes=4):
    """4-slot nodes; queue "one" takes 1-slot items, "four" whole-node items, "gang" the gangs."""
    return parse_environment(
        {
            "region": "us-east-1",
            "scaler": {"tick_s": 60, "scale_in_delay_s": 60, "scale_out_cooldown_s": 0},
            "pools": {"p": {"max": max_nodes, "command": "run", "slots_per_unit": 4, "capacity_unit": "nodes",
                            "instance_types": [{"type": "c6i.2xlarge", "weight": 1, "spot_price": 1.0}]}},
            "queues": {"one": {"pool": "p"}, "four": {"pool": "p", "slots_per_item": 4},
                       "gang": {"pool": "p", "slots_per_item": 4, "nodes_per_item": nodes_per_item}},
        },
        name="t",
    )  # fmt: skip


class FixedFleet:
    """Holds the group at `nodes` while work remains, then at 0; calls `look(sim)` at every poll."""

    name = "fixed"
    poll_s = 300.0
    kick_s = None
    kick_on_notice = False
    protects_busy = True

    def __init__(self, nodes: int, look=None):
        self.nodes = nodes
        self.look = look

    def poll(self, sim: Simulation) -> None:
        if self.look is not None:
            self.look(sim)
        sim.set_desired(self.nodes if sim.done < len(sim.items) else 0)


class Watched(TidefleetPolicy):
    """The real tick, calling `look(sim)` before each."""

    def __init__(self, env, look):
        super().__init__(env, TIMING.kick_s)
        self.look = look

    def poll(self, sim: Simulation) -> None:
        self.look(sim)
        super().poll(sim)


def run_fleet(env, items, nodes, notices=(), look=None):
    """Run on a fixed fleet, with spot notices to node ids (launched 1, 2, ... at t=0) at given times."""
    sim = Simulation(env, "p", items, FixedFleet(nodes, look), TIMING)
    for t, node_id in notices:
        sim._push(t, NOTICE, node_id)
    return sim.run()


GANG = TraceItem(100, 500, 8)  # 8 GPUs on 4-slot nodes: a gang of 2


@pytest.mark.parametrize(
    ("others", "nodes", "start"),
    [
        ([], 2, 100 + BOOT),  # the fleet launches when it arrives: both boot together
        ([TraceItem(0, 300, 1)], 2, BOOT + 300),  # one node runs a 1-slot item: the gang waits for it
        ([TraceItem(0, 900, 4)], 2, BOOT + 900),  # past a rendezvous timeout: released, led again
        ([], 1, None),  # one node only: never starts
    ],
)
def test_a_two_node_gang_starts_only_when_both_nodes_are_free(others, nodes, start):
    outcome = run_fleet(make_env(), others + [GANG], nodes)
    assert outcome.first_start[-1] == start
    assert outcome.interruptions == 0 and outcome.dead_lettered == 0  # a rendezvous timeout is no attempt
    if start is not None:
        assert outcome.finished[-1] == start + GANG.duration_s


def test_a_forming_gang_holds_its_leads_slots_and_is_billed():
    # Node 1 runs a whole-node item until 545; node 2 leads the gang from 100 and waits for it.
    # A 1-slot item at 200 fits the lead's 4 idle slots but waits: they are held for the gang.
    seen = {}

    def look(sim):
        if sim.now == 300:
            lead = next(n for n in sim.nodes.values() if n.gang is not None)
            group = SimulationPorts(sim).groups(["p"], since=0)["p"]
            seen["lead"] = (
                lead.busy,
                lead.slots,
                next(i.protected for i in group.instances if i.id == lead.name),
            )

    items = [TraceItem(0, 500, 4), GANG, TraceItem(200, 100, 1)]
    outcome = run_fleet(make_env(), items, 2, look=look)
    assert seen["lead"] == (4, 4, True)  # all its slots held, and protected from scale-in
    assert outcome.first_start == [BOOT, BOOT + 500, BOOT + 500 + 500]
    busy_node_s = 500 + 2 * 500 + 100  # the forming wait is billed as idle node time
    assert outcome.node_hours == pytest.approx(2 * outcome.end_s / 3600)
    assert outcome.idle_node_hours == pytest.approx(outcome.node_hours - busy_node_s / 3600)


def test_a_forming_gang_whose_member_fits_only_scattered_free_slots_gets_a_new_node():
    """Four nodes each run a long 3-slot item (1 slot free on each: 4 in all, a member's worth) and
    a fifth goes idle; the gang's lead takes that one. The lead's beacon says one member is missing,
    and the scaler launches a node for it rather than count the scattered slots."""
    env = parse_environment({"region": "us-east-1",
                             "scaler": {"tick_s": 60, "scale_in_delay_s": 60, "scale_out_cooldown_s": 0},
                             "pools": {"p": {"max": 8, "command": "run", "slots_per_unit": 4, "capacity_unit": "nodes",
                                             "instance_types": [{"type": "c6i.2xlarge", "weight": 1, "spot_price": 1.0}]}},
                             "queues": {"three": {"pool": "p", "slots_per_item": 3}, "four": {"pool": "p", "slots_per_item": 4},
                                        "gang": {"pool": "p", "slots_per_item": 4, "nodes_per_item": 2}}}, name="t")  # fmt: skip
    seen = {}

    def beacon(sim):
        lead = next((n for n in sim.nodes.values() if n.gang is not None and n.gang.members[0] is n), None)
        if lead is not None:
            raw = SimulationPorts(sim).heartbeats("p")[lead.name].gang
            seen.setdefault(lead.gang.started_at is None, Beacon.parse(raw) if raw else None)

    items = [*(TraceItem(0, 5000, 3) for _ in range(4)), TraceItem(0, 30, 4), GANG]
    sim = Simulation(env, "p", items, Watched(env, beacon), TIMING)
    outcome = sim.run()
    assert outcome.first_start[-1] == GANG.submit_s + BOOT  # the member's node boots; 5,045 s without the beacon
    assert (seen[True].queue, seen[True].forming, seen[True].short) == ("gang", True, 1)
    assert seen[False] is None  # a started gang beacons nothing


@pytest.mark.parametrize("noticed", [1, 2], ids=["the lead", "the joiner"])
def test_a_spot_notice_on_one_member_of_a_fixed_gang_requeues_it_whole_and_it_succeeds_once(noticed):
    # Both nodes boot at 45 and the gang starts; a notice at 300 stops both members. The survivor
    # leads it again, the reclaimed node's replacement (launched at 300 + notice) joins, and it
    # resumes from its checkpoint: 1000 - 255 s left.
    outcome = run_fleet(make_env(), [TraceItem(0, 1000, 8)], 2, notices=[(300, noticed)])
    resumed = 300 + NOTICE_S + BOOT
    assert outcome.interruptions == 1 and outcome.redone_s == 0
    assert outcome.first_start == [BOOT] and outcome.finished == [resumed + 1000 - (300 - BOOT)]


@pytest.mark.parametrize(
    ("noticed", "interruptions", "finished"),
    [
        ((2,), 0, BOOT + 1000),  # started on nodes 1 and 2, node 3 joined: one lost, two remain
        ((2, 3), 1, 300 + NOTICE_S + BOOT + 1000 - (300 - BOOT)),  # one left: back whole, resumed
    ],
)
def test_an_elastic_gang_of_two_to_three_loses_members_and_finishes(noticed, interruptions, finished):
    env = make_env(nodes_per_item={"min": 2, "max": 3})
    outcome = run_fleet(env, [TraceItem(0, 1000, 12)], 3, notices=[(300, n) for n in noticed])
    assert outcome.interruptions == interruptions
    assert outcome.finished == [finished]


@pytest.mark.parametrize(
    ("nodes_per_item", "slots", "unfittable", "gangs"),
    [
        ({"min": 2, "max": 8}, 8, 0, 1),  # 2 nodes
        ({"min": 2, "max": 8}, 20, 1, 0),  # 5 nodes: more than the pool's max of 4
        (2, 12, 1, 0),  # 3 nodes: more than the gang queue's 2
        (1, 8, 1, 0),  # no gang queue: one node at most
    ],
)
def test_a_gang_larger_than_the_pool_or_its_gang_queues_is_reported_unfittable(
    nodes_per_item, slots, unfittable, gangs
):
    items = [TraceItem(0, 100, 1), TraceItem(5, 100, slots)]
    report = simulate(make_env(nodes_per_item), "p", items, ["tidefleet"], timing=TIMING)
    assert report.unfittable["count"] == unfittable and report.gangs["count"] == gangs
    assert report.results[0].items_finished == 2 - unfittable


@pytest.mark.parametrize("policy", ["tidefleet", "keda", "clearml", "target-tracking"])
def test_every_policy_launches_a_gangs_whole_nodes_and_finishes_it(policy):
    items = [TraceItem(0, 600, 8), TraceItem(30, 300, 1), TraceItem(60, 600, 8)]
    result = simulate(make_env(), "p", items, [policy], timing=TIMING).results[0]
    assert result.items_finished == 3 and result.items_interrupted == 0


def test_the_scaler_launches_a_gangs_nodes_once_and_at_once():
    # Demand is the gang's max nodes, counted once (control.observe or the simulator's queue port,
    # not both): a pool of 4 gets the 2 nodes, at the submit's kick.
    result = simulate(make_env(), "p", [TraceItem(0, 600, 8)], ["tidefleet"], timing=TIMING).results[0]
    assert result.peak_nodes == 2 and result.wait_s["max"] == BOOT and result.items_finished == 1


def test_philly_replays_its_multi_node_jobs_as_gangs():
    items = load_trace(ROOT / "traces" / "philly_2017_jobs.csv", (1_780_000, 1_830_000))
    report = simulate(load_environment("bench"), "gpu8", items, ["tidefleet"], timing=TIMING)
    multi_node = sum(1 for i in items if i.slots > 8)
    assert multi_node == report.gangs["count"] == 5 and report.gangs["by_nodes"] == {"2": 5}
    assert report.unfittable["count"] == 0
    assert report.results[0].items_finished == len(items)


def test_gangs_are_reported_on_the_nodes_they_start_on_their_queues_min():
    """A gang starts on its queue's `nodes_per_item` min, as the replay forms it and the bounds
    count it, whatever the slots that chose the queue: an item that fits one node on a queue of
    { min = 2, max = 3 } was reported on one (train's GenAI replay: by nodes {'1': 106})."""
    env = make_env(nodes_per_item={"min": 2, "max": 3})
    env = env.model_copy(update={"queues": {"gang": env.queues["gang"]}})
    report = simulate(env, "p", [TraceItem(0, 600, 4), TraceItem(10, 600, 12)], ["oracle"], timing=TIMING)
    assert report.gangs == {"count": 2, "by_nodes": {"2": 2}, "work_s": 1200.0}
    assert report.results[0].node_hours == pytest.approx(2 * 600 * 2 / 3600)
