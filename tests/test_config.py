"""Environment files: the shipped ones load; every kind of mistake gets one clear line."""

from __future__ import annotations

import copy
import tomllib
from pathlib import Path

import pytest

from tidefleet.config import ConfigError, known_environments, load_environment, parse_environment

ROOT = Path(__file__).resolve().parents[1] / "environments"
BASE = tomllib.loads((ROOT / "dev.toml").read_text())


def test_every_shipped_environment_loads():
    assert {"sandbox", "dev", "prod"} <= set(known_environments(ROOT))
    for name in known_environments(ROOT):
        env = load_environment(name, ROOT)
        assert env.name == name and env.pools and env.queues


def test_prod_has_cpu_and_gpu_pools_and_prioritised_queues():
    env = load_environment("prod", ROOT)
    assert set(env.pools) == {"cpu", "gpu", "gpu4"}
    assert len({q.priority for q in env.queues.values()}) >= 3
    assert env.state.backend == "s3" and env.state.lock_table


def _with(**changes):
    """dev.toml with nested changes, e.g. _with(**{"pools.cpu.max": -1}); None deletes."""
    data = copy.deepcopy(BASE)
    for dotted, value in changes.items():
        *parents, leaf = dotted.split(".")
        node = data
        for key in parents:
            node = node.setdefault(key, {})
        if value is None:
            node.pop(leaf, None)
        else:
            node[leaf] = value
    return data


BAD = [
    # (case, change, expected fragment of the single message)
    ("unknown pool in queue", {"queues.default.pool": "gpu"}, "queues.default.pool: unknown pool (got 'gpu'); known pools: cpu"),
    ("min above max", {"pools.cpu.min": 5, "pools.cpu.max": 2}, "pools.cpu.max: must be >= min (got 2 < 5)"),
    ("empty instance list", {"pools.cpu.instance_types": []}, "pools.cpu.instance_types: List should have at least 1 item"),
    ("negative item timeout", {"queues.default.item_timeout_s": -5}, "queues.default.item_timeout_s: Input should be greater than or equal to 1 (got -5)"),
    ("negative idle timeout", {"pools.cpu.idle_timeout_s": -1}, "pools.cpu.idle_timeout_s: Input should be greater than or equal to 0"),
    ("bad region", {"region": "us-east"}, "region: not a aws region (got 'us-east')"),
    ("unknown top-level key", {"regoin": "us-east-1"}, "regoin: unknown key"),
    ("unknown pool key", {"pools.cpu.max_nodes": 3}, "pools.cpu.max_nodes: unknown key"),
    ("string for int", {"pools.cpu.max": "10"}, "pools.cpu.max: Input should be a valid integer (got '10')"),
    ("float for int", {"pools.cpu.min": 1.5}, "pools.cpu.min: Input should be a valid integer"),
    ("bad capacity unit", {"pools.cpu.capacity_unit": "cores"}, "pools.cpu.capacity_unit: Input should be 'nodes', 'vcpus' or 'gpus' (got 'cores')"),
    ("on-demand percent over 100", {"pools.cpu.on_demand_percent": 150}, "pools.cpu.on_demand_percent: Input should be less than or equal to 100 (got 150)"),
    ("on-demand base over max", {"pools.cpu.on_demand_base": 20}, "pools.cpu.on_demand_base: must be <= max (got 20 > 10)"),
    ("both command and container", {"pools.cpu.container": "busybox"}, "pools.cpu: set exactly one of 'command' or 'container' (got both)"),
    ("neither command nor container", {"pools.cpu.command": None}, "pools.cpu: set exactly one of 'command' or 'container' (got neither)"),
    ("duplicate instance type", {"pools.cpu.instance_types": [{"type": "c6i.large"}, {"type": "c6i.large"}]}, "pools.cpu.instance_types[1].type: duplicate instance type (got 'c6i.large')"),
    ("bad instance type", {"pools.cpu.instance_types": [{"type": "large"}]}, "pools.cpu.instance_types[0].type: not a aws instance type (got 'large')"),
    ("unknown price", {"pools.cpu.instance_types": [{"type": "x9z.huge"}]}, "pools.cpu.instance_types[0].on_demand_price: no built-in price for 'x9z.huge'"),
    ("bad image", {"pools.cpu.image": "ubuntu"}, "pools.cpu.image: not an AMI id or ssm:/ parameter (got 'ubuntu')"),
    ("queue name collides with a dead-letter queue", {"queues.default-dlq": {"pool": "cpu"}}, "queues.default-dlq: duplicate queue name 'default-dlq' (also used by queues.default)"),
    ("bad pool name", {"pools.CPU_Pool": BASE["pools"]["cpu"], "queues.default.pool": "CPU_Pool", "pools.cpu": None}, "pools.CPU_Pool: bad name (got 'CPU_Pool')"),
    ("zero retries above cap", {"queues.default.max_retries": 1000}, "queues.default.max_retries: Input should be less than or equal to 100 (got 1000)"),
    ("s3 state without bucket", {"state.backend": "s3"}, "state.bucket: required for backend 's3' (got nothing)"),
    ("unknown state backend", {"state.backend": "consul"}, "state.backend: Input should be 'local', 's3' or 'gcs' (got 'consul')"),
    ("gpu weight not gpu count", {"pools.cpu.capacity_unit": "gpus", "pools.cpu.instance_types": [{"type": "g5.xlarge", "weight": 1}]}, "pools.cpu.instance_types[0].weight: with capacity_unit 'gpus' the weight is the GPU count"),
    ("item needs more slots than any node", {"queues.default.slots_per_item": 8}, "queues.default.slots_per_item: nodes of c6i.large, c7i.large, m6i.large in pool 'cpu' have fewer slots (got 8 > 2)"),
    ("reserved env var", {"pools.cpu.env": {"TIDEFLEET_JOB_ID": "x"}}, "pools.cpu.env.TIDEFLEET_JOB_ID: not a usable variable name"),
    ("gcp without project", {"cloud": "gcp", "region": "us-central1", "pools.cpu.instance_types": [{"type": "n2-standard-4"}], "pools.cpu.image": "projects/debian-cloud/global/images/family/debian-12"}, "project: required when cloud = 'gcp'"),
    ("no pools", {"pools": {}}, "pools: Dictionary should have at least 1 item"),
    ("wrong type for tags", {"tags": "ml"}, "tags: Input should be a valid dictionary (got 'ml')"),
    ("bad vpc cidr", {"network.vpc_cidr": "10.0.0.0/8"}, "network.vpc_cidr: String should match pattern"),
    ("aws tag prefix", {"tags": {"aws:owner": "me"}}, "tags.aws:owner: not a valid tag"),
]


@pytest.mark.parametrize("case,change,expected", BAD, ids=[c[0] for c in BAD])
def test_bad_config_names_field_value_and_rule(case, change, expected):
    with pytest.raises(ConfigError) as err:
        parse_environment(_with(**change), name="dev")
    problems = err.value.problems
    assert any(expected in p for p in problems), f"{expected!r} not in {problems}"
    assert len(problems) == 1, f"one problem, one message: {problems}"


def test_several_problems_are_all_reported_at_once():
    with pytest.raises(ConfigError) as err:
        parse_environment(_with(**{"pools.cpu.max": "ten", "queues.default.priority": -1, "regoin": "x"}), name="dev")
    assert len(err.value.problems) == 3


def test_duplicate_table_in_toml_is_a_clear_error(tmp_path):
    text = (ROOT / "dev.toml").read_text() + '\n[queues.default]\npool = "cpu"\n'
    (tmp_path / "dup.toml").write_text(text)
    with pytest.raises(ConfigError) as err:
        load_environment("dup", tmp_path)
    assert "duplicate names are not allowed" in err.value.problems[0]


def test_unknown_environment_lists_known_ones():
    with pytest.raises(ConfigError) as err:
        load_environment("staging", ROOT)
    assert "unknown environment (got 'staging'); known: " in err.value.problems[0]
    assert "dev, " in err.value.problems[0] and "prod" in err.value.problems[0]


def test_file_name_and_declared_name_must_agree():
    with pytest.raises(ConfigError) as err:
        parse_environment({**BASE, "name": "prod"}, name="dev")
    assert "name: must match the file name" in err.value.problems[0]


def test_validate_command_exits_non_zero_on_bad_file(tmp_path):
    from click.testing import CliRunner

    from tidefleet.cli import main

    (tmp_path / "bad.toml").write_text('region = "mars-1"\n')
    result = CliRunner().invoke(main, ["validate", str(tmp_path / "bad.toml")])
    assert result.exit_code == 1
    assert "pools: required field is missing" in result.output
