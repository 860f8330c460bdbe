"""The simulator places items as the agent pulls them, counts CPU pools in vCPUs, and the
benchmark scores shipped defaults on held-out data and seeded synthetic shapes."""

from __future__ import annotations

import itertools
import random
import re
from pathlib import Path

import pytest

from tidefleet.config import parse_environment
from tidefleet.sim import Timing, TraceItem, simulate
from tidefleet.sim.bench import (
    MOVED,
    README_BEGIN,
    README_END,
    README_HEAD,
    WORKLOADS,
    best_setting,
    halves,
    row_names,
)
from tidefleet.sim.engine import BOOTED, Simulation, intake_order
from tidefleet.sim.policies import TidefleetPolicy
from tidefleet.sim.run import PolicyResult
from tidefleet.sim.shapes import GPU8_SLOT_SETS, KINDS, SHAPES, random_shape
from tidefleet.sim.trace import load_trace

ROOT = Path(__file__).resolve().parent.parent
BOOT = 45.0
TIMING = Timing(boot_s=BOOT, notice_s=120.0, kick_s=0.0)


def make_env(*, queues, slots_per_unit=4, max_units=10, capacity_unit="nodes", weight=1):
    return parse_environment(
        {
            "region": "us-east-1",
            "scaler": {"tick_s": 60, "scale_in_delay_s": 60, "scale_out_cooldown_s": 0},
            "pools": {"p": {"max": max_units, "command": "run", "slots_per_unit": slots_per_unit,
                            "capacity_unit": capacity_unit,
                            "instance_types": [{"type": "c6i.2xlarge", "weight": weight, "spot_price": 1.0}]}},
            "queues": {name: {"pool": "p", **q} for name, q in queues.items()},
        },
        name="t",
    )  # fmt: skip


def first_starts(env, items):
    policy = TidefleetPolicy(env, TIMING.kick_s)
    sim = Simulation(env, "p", items, policy, TIMING)
    return sim.run().first_start


def test_a_node_takes_its_queues_in_the_agents_order_not_the_oldest_item_first():
    # One 4-slot node at most. The 2-slot item came first, but the agent receives from its queues
    # by priority ("one" is higher): four 1-slot items fill the node, and the wide item waits.
    env = make_env(queues={"two": {"slots_per_item": 2}, "one": {"priority": 5}}, max_units=1)
    items = [TraceItem(0, 100, 2)] + [TraceItem(1, 100, 1) for _ in range(4)]
    starts = first_starts(env, items)
    assert starts[1:] == [BOOT] * 4
    assert starts[0] == BOOT + 100


def test_queues_of_equal_priority_are_received_from_in_the_files_order():
    env = make_env(queues={"two": {"slots_per_item": 2}, "one": {}, "top": {"priority": 1}})
    names = [name for name, _ in sorted(env.queues_of("p").items(), key=lambda kv: kv[1].slots_per_item)]
    assert [names[q] for q in intake_order(env, "p", [(n, env.queues[n]) for n in names])] == ["top", "two", "one"]


def test_small_items_fragment_nodes_and_a_wide_item_waits_for_a_whole_node():
    # Two 4-slot nodes full of 1-slot items; a 4-slot item at 60 s makes the policy launch a node.
    # A 1-slot item that came later (100 s) is in the first queue the new node receives from, so
    # it takes a slot there and the wide item waits for yet another node: best fit would not.
    env = make_env(queues={"one": {}, "four": {"slots_per_item": 4}})
    items = [TraceItem(0, 600, 1) for _ in range(8)] + [TraceItem(60, 300, 4)]
    items += [TraceItem(100 + 20 * i, 600, 1) for i in range(20)]
    starts = first_starts(env, items)
    assert starts[9] == 60 + BOOT  # the later small item, on the node launched for the wide one
    assert starts[8] > starts[9]


@pytest.mark.parametrize("seed", range(8))
def test_placement_never_puts_an_item_on_a_node_without_enough_free_slots(seed, monkeypatch):
    rng = random.Random(seed)
    env = make_env(queues={"one": {}, "two": {"slots_per_item": 2}, "four": {"slots_per_item": 4, "priority": 3}},
                   max_units=6)  # fmt: skip
    items = sorted(
        (TraceItem(rng.uniform(0, 4000), rng.expovariate(1 / 400), rng.choice([1, 1, 1, 2, 4])) for _ in range(150)),
        key=lambda i: i.submit_s,
    )  # fmt: skip
    placed = []
    original = Simulation._start

    def checked_start(self, node, index):
        placed.append((node.slots - node.busy, self.need[index], self.takes_items(node)))
        original(self, node, index)

    monkeypatch.setattr(Simulation, "_start", checked_start)
    result = simulate(env, "p", items, ["tidefleet"], timing=TIMING, seed=seed).results[0]
    assert result.items_finished == len(items)
    assert len(placed) >= len(items)
    assert all(need <= free and taking for free, need, taking in placed)


def test_a_cordoned_node_takes_no_new_items():
    env = make_env(queues={"one": {}}, max_units=1)
    sim = Simulation(env, "p", [TraceItem(0, 100, 1)], TidefleetPolicy(env, 0.0), TIMING)
    sim.set_desired(1)
    node = next(iter(sim.nodes.values()))
    node.cordoned = True
    sim._handle(BOOTED, node.id)
    sim._arrive(0)
    assert (node.busy, sim.visible) == (0, [1])


@pytest.mark.parametrize(
    ("cpus", "slots"),
    [("3.2", 4), ("", 1), ("0", 1), ("8", 8)],
)
def test_a_vcpu_pool_counts_each_items_cpus_rounded_up(tmp_path, cpus, slots):
    path = tmp_path / "t.csv"
    path.write_text(f"submit_s,duration_s,gpus,cpus\n0,100,,{cpus}\n")
    env = make_env(queues={"q": {}}, slots_per_unit=1, capacity_unit="vcpus", weight=8)
    report = simulate(env, "p", load_trace(path), ["oracle"], timing=TIMING)
    assert report.lower_bound_usd == pytest.approx(100 / 3600 * slots / 8 * 1.0)


def test_two_four_vcpu_items_share_an_eight_vcpu_node_and_a_third_waits(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("submit_s,duration_s,gpus,cpus\n" + "0,100,,3.5\n" * 3)
    env = make_env(queues={"q": {}}, slots_per_unit=1, capacity_unit="vcpus", weight=8, max_units=8)
    result = simulate(env, "p", load_trace(path), ["tidefleet"], timing=TIMING).results[0]
    assert (result.wait_s["p50"], result.wait_s["max"], result.peak_nodes) == (BOOT, BOOT + 100, 1)


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_each_synthetic_shape_is_the_same_for_a_seed_and_another_for_another(name):
    shape = SHAPES[name]
    assert shape.items(1) == shape.items(1)
    assert shape.items(1) != shape.items(2)
    items = shape.items(1)
    assert len(items) > 500 and all(a.submit_s <= b.submit_s for a, b in itertools.pairwise(items))


def test_the_shapes_have_the_character_their_names_promise():
    bursty = SHAPES["bursty-short"].items(1)
    assert sorted(i.duration_s for i in bursty)[len(bursty) // 2] < BOOT  # shorter than a boot
    large = SHAPES["rare-large"].items(1)
    wide = [i for i in large if i.slots > 1]
    assert {i.slots for i in wide} == {4, 8} and 0 < len(wide) < len(large) / 10
    steady = SHAPES["diurnal-steady"].items(1)
    by_hour = [0] * 24
    for i in steady:
        by_hour[int(i.submit_s // 3600) % 24] += 1
    assert max(by_hour) > 3 * min(by_hour)


@pytest.mark.parametrize("kind", KINDS)
def test_a_random_shape_is_the_same_for_an_rng_state_and_has_its_kind(kind):
    def draw(seed):
        return random_shape(random.Random(seed), slot_sets=GPU8_SLOT_SETS, kinds=[kind], max_items=500)

    (items, described), (again, _) = draw(3), draw(3)
    assert items == again and items != draw(4)[0] and described.startswith(kind)
    assert 0 < len(items) <= 500 and all(a.submit_s <= b.submit_s for a, b in itertools.pairwise(items))
    assert {i.slots for i in items} <= {1, 2, 4, 8} and min(i.duration_s for i in items) >= 1
    if kind == "batch":  # submitted in a few groups, each within 5 s
        gaps = [b.submit_s - a.submit_s for a, b in itertools.pairwise(items)]
        assert sum(g > 5 for g in gaps) <= 5


def test_the_held_out_half_is_the_second_half_of_the_items():
    items = [TraceItem(float(t), 1.0, 1) for t in range(7)]
    tune, held_out = halves(items)
    assert tune == items[:3] and held_out == items[3:]


def _result(cost, p95, unfinished=0):
    return PolicyResult("tidefleet", cost, 1.0, 0.5, {"p50": 1, "p95": p95, "p99": 1, "max": 1}, 1.0, 1,
                        unfinished, 0, 0, 0.0, 0, 0, 1, 1.0, cost)  # fmt: skip


@pytest.mark.parametrize(
    ("tuning", "picked"),
    [
        ([(None, _result(10, 50)), ({"a": 1}, _result(8, 50)), ({"a": 2}, _result(5, 80))], {"a": 1}),
        ([(None, _result(10, 50)), ({"a": 1}, _result(8, 60))], None),  # cheaper only by waiting longer
        ([(None, _result(10, 50)), ({"a": 1}, _result(8, 40, unfinished=3))], None),  # cheaper by not finishing
        ([(None, _result(10, 50)), ({"a": 1}, _result(10, 50))], None),  # a tie keeps the defaults
    ],
)
def test_tuning_picks_the_cheapest_setting_no_slower_than_the_defaults(tuning, picked):
    assert best_setting(tuning) == picked


def test_the_readme_table_is_the_generated_block_with_a_row_per_workload_and_policy():
    # An empty block means `invoke bench --readme` has not been run since the table's columns
    # changed; once it has, every workload has a row per policy, nothing more or less.
    readme = (ROOT / "README.md").read_text()
    block = re.search(re.escape(README_BEGIN) + "\n(.*?)" + re.escape(README_END), readme, re.DOTALL)
    assert block, "the README has no generated bench block"
    lines = block.group(1).splitlines()
    if not lines:
        return
    assert lines[0] == README_HEAD
    rows = {tuple(c.strip() for c in line.strip("|").split("|")[:2]) for line in lines[2:]}
    assert rows == {(f"{w.label} ({w.pool})", p) for w in WORKLOADS for p in row_names(w)}
    assert {w.label for w in WORKLOADS if MOVED in row_names(w)} >= {"Philly"}  # the 8-GPU nodes


def test_invoke_bench_readme_writes_a_block_the_readme_test_accepts(tmp_path):
    from tidefleet.sim.bench import readme_block, update_readme

    readme = tmp_path / "README.md"
    readme.write_text(f"before\n{README_BEGIN}\nold\n{README_END}\nafter\n")
    update_readme(readme, readme_block(["| a (p) | tidefleet | 1.00 | 1.00 | 0 / 0 | 1.0 | 0 % | 0 |"]))
    text = readme.read_text()
    assert text.startswith("before\n" + README_BEGIN + "\n" + README_HEAD) and text.endswith(README_END + "\nafter\n")
    assert "old" not in text
