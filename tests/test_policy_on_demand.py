"""Rule 13, interruption-aware placement: items that spot agents leave to on-demand nodes (interrupted
`on_demand_after_interruptions` times) are placed on on-demand nodes' free slots, and launch on-demand
nodes for the rest. Each case asserts the decision and its reason text."""

from __future__ import annotations

from dataclasses import replace

import pytest
from test_policy_rules import assert_settled, decide_pool, environment, fleet, node

RULE = "wait for on-demand capacity"


def env(**changes):
    return environment(**{"queues.render.on_demand_after_interruptions": 3, **changes})


def view(environment, nodes, *, base=0, deferred=1, render=(0, 1), **depth):
    """The fleet with `deferred` of render's items left to on-demand nodes by the spot agents."""
    seen = fleet(environment, nodes, base=base, render=render, **depth)
    queues = tuple(replace(q, on_demand_wanted=deferred) if q.name == "render" else q for q in seen.queues)
    return replace(seen, queues=queues)


# fmt: off
CASES = [
    # (case, env changes, nodes, base, deferred, new desired, new base, rule line)
    ("an item left to on-demand nodes launches one on demand although spot slots are free", {},
     [node("i-s", idle=30)], 0, 1, 2, 1,
     ("1 item(s) of queue render interrupted >= 3 times wait for on-demand capacity: on-demand base 0 -> 1 units "
      "so 1 unit(s) to launch come on demand")),
    ("items share the slots of a new on-demand node", {}, [node("i-s", idle=30)], 0, 2, 2, 1,
     ("2 item(s) of queue render interrupted >= 3 times wait for on-demand capacity: on-demand base 0 -> 1 units "
      "so 1 unit(s) to launch come on demand")),
    ("an on-demand node with free slots takes them: nothing launched, the base stays", {},
     [node("i-o", spot=False, busy=1)], 0, 1, 1, None,
     "1 item(s) of queue render interrupted >= 3 times wait for on-demand capacity: on-demand base stays 0 units"),
    ("a full on-demand node does not", {}, [node("i-o", spot=False, busy=2)], 0, 1, 2, 2,
     ("1 item(s) of queue render interrupted >= 3 times wait for on-demand capacity: on-demand base 0 -> 2 units "
      "so 1 unit(s) to launch come on demand")),
    ("the on-demand node launched for them counts while it boots, and the raised base stays while they wait", {},
     [node("i-s", idle=30), node("i-o", spot=False, booted=False, age=30)], 1, 1, 2, None,
     "1 item(s) of queue render interrupted >= 3 times wait for on-demand capacity: on-demand base stays 1 units"),
    ("the base returns to the configured one once none wait", {}, [node("i-o", spot=False, busy=1)], 1, 0, 1, 0,
     None),
    ("the launch stays within max, and the cap says who waits", {"pools.cpu.max": 1},
     [node("i-s", busy=1)], 0, 1, 1, None,
     "1 item(s) of queue render interrupted >= 3 times wait for on-demand capacity: on-demand base stays 0 units"),
]
# fmt: on


@pytest.mark.parametrize("case, changes, nodes, base, deferred, desired, new_base, line", CASES,
                         ids=[c[0] for c in CASES])  # fmt: skip
def test_items_left_to_on_demand_nodes(case, changes, nodes, base, deferred, desired, new_base, line):
    environment = env(**changes)
    seen = view(environment, nodes, base=base, deferred=deferred)
    decision = decide_pool(environment, seen)
    assert (decision.desired, decision.on_demand_base) == (desired, new_base), decision.reasons
    assert [r for r in decision.reasons if RULE in r] == ([line] if line else [])
    assert_settled(environment, seen)


def test_at_max_the_items_left_to_on_demand_nodes_are_named_as_waiting():
    environment = env(**{"pools.cpu.max": 1})
    decision = decide_pool(environment, view(environment, [node("i-s", busy=1)]))
    assert "at max: pool cpu capped at 1 units, demand needs 2 units; waiting: no queue with waiting items" in decision.reasons


def test_an_idle_on_demand_node_an_item_is_placed_on_is_kept_and_an_idle_spot_node_goes_instead():
    environment = env()
    nodes = [node("i-o", spot=False, idle=1000), node("i-s", idle=1000)]
    decision = decide_pool(environment, view(environment, nodes))
    assert decision.terminate == ("i-s",)
    assert "keep i-o: idle but needed, an item left to on-demand nodes is placed on it" in decision.reasons
    # Without the item, the on-demand node is the first to go (rule 4).
    assert decide_pool(environment, view(environment, nodes, deferred=0)).terminate[0] == "i-o"


def test_an_on_demand_node_holding_such_an_item_is_not_cordoned():
    environment = env(**{"pools.cpu.slots_per_unit": 4})
    nodes = [replace(node("i-o", spot=False, busy=1), slots=4), replace(node("i-s", spot=True, busy=1), slots=4)]
    plain = decide_pool(environment, view(environment, nodes, deferred=0, render=(0, 2)))
    assert plain.cordon == ("i-o",)  # both a quarter busy: demand fits on one, the first by id drains
    placed = decide_pool(environment, view(environment, nodes, deferred=1, render=(0, 3)))
    assert "i-o" not in placed.cordon, placed.reasons


def test_a_multi_slot_item_left_to_on_demand_nodes_is_placed_once_not_also_by_packing():
    environment = env(**{"queues.render.slots_per_item": 2})
    decision = decide_pool(environment, view(environment, [node("i-s", busy=2)], render=(1, 0)))
    assert (decision.desired, decision.on_demand_base) == (2, 1), decision.reasons


def test_a_drained_cordoned_on_demand_node_is_uncordoned_for_them_rather_than_one_launched():
    environment = env()
    drained = replace(node("i-o", spot=False, idle=30), cordoned=True)
    decision = decide_pool(environment, view(environment, [drained, node("i-s", busy=2)], deferred=1))
    assert (decision.desired, decision.uncordon) == (2, ("i-o",)), decision.reasons
    assert "uncordon i-o: an item left to on-demand nodes fits no other on-demand node" in decision.reasons
