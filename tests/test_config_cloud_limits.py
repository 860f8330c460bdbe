"""The clouds' own limits on what a pool and the tags become: refused by validation in one line
naming the field, the value and the limit, not by `terraform apply`."""

from __future__ import annotations

import pytest
from test_config import BASE, GCP_BASE, _with

from tidefleet.config import ConfigError, parse_environment
from tidefleet.resources import resources


def _refused(base, name, **changes) -> str:
    with pytest.raises(ConfigError) as err:
        parse_environment(_with(base, **changes), name=name)
    assert len(err.value.problems) == 1, err.value.problems
    return err.value.problems[0]


def _types(n: int) -> list[dict]:
    return [{"type": f"c6i.t{i}large", "weight": 1, "on_demand_price": 0.1, "spot_price": 0.05} for i in range(n)]


def test_an_aws_pool_takes_at_most_40_instance_types():
    assert parse_environment(_with(**{"pools.cpu.instance_types": _types(40)}), name="dev")
    problem = _refused(BASE, "dev", **{"pools.cpu.instance_types": _types(41)})
    assert problem.startswith("pools.cpu.instance_types: ") and "(got 41)" in problem, problem
    assert "40" in problem and "Auto Scaling group" in problem, problem


def test_an_aws_types_weight_is_at_most_999():
    heavy = [{"type": "c6i.large", "weight": 999}]
    assert parse_environment(_with(**{"pools.cpu.instance_types": heavy}), name="dev")
    problem = _refused(BASE, "dev", **{"pools.cpu.instance_types": [{"type": "c6i.large", "weight": 1000}]})
    assert problem.startswith("pools.cpu.instance_types[0].weight: ") and "(got 1000)" in problem, problem
    assert "999" in problem and "WeightedCapacity" in problem, problem


def _tags(n: int) -> dict[str, str]:
    return {f"k{i}": "v" for i in range(n)}


def test_aws_tags_leave_room_for_the_three_the_stacks_add_under_50():
    env = parse_environment(_with(tags=_tags(47)), name="dev")
    assert len(resources(env, account="123456789012").pools["cpu"].tags) == 50  # what a node and its volume carry
    problem = _refused(BASE, "dev", tags=_tags(48))
    assert problem.startswith("tags: ") and "(got 48)" in problem and "50" in problem, problem
    assert "tidefleet:env, tidefleet:pool, tidefleet:team" in problem, problem
    assert "\n" not in _refused(BASE, "dev", tags=_tags(60))


def test_gcp_labels_leave_room_for_the_ones_the_stacks_and_terraform_add_under_64():
    assert parse_environment(_with(GCP_BASE, tags=_tags(59)), name="gcp-dev")
    problem = _refused(GCP_BASE, "gcp-dev", tags=_tags(60))
    assert problem.startswith("tags: ") and "(got 60)" in problem and "64" in problem, problem
    assert "goog-terraform-provisioned" in problem, problem
