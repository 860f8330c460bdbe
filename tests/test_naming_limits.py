"""Cloud names derived from an environment fit their cloud's limits, and naming's table knows
every name the stacks create (so a new resource cannot skip the check)."""

from __future__ import annotations

import copy
import json
import re
import tomllib
from pathlib import Path

import pytest

from tidefleet import naming
from tidefleet.config import AWS_REGIONS, known_environments, load_environment, parse_environment

ROOT = Path(__file__).resolve().parents[1] / "environments"
# Attributes that carry a resource's own name in the synthesized Terraform JSON.
NAME_ATTRIBUTES = {"name", "name_prefix", "function_name", "alarm_name", "dashboard_name", "account_id", "bucket",
                   "bucket_id", "role_id", "base_instance_name"}  # fmt: skip


@pytest.mark.parametrize("env_name", known_environments(ROOT))
def test_every_derived_name_of_every_shipped_environment_is_within_its_limit(env_name):
    env = load_environment(env_name, ROOT)
    derived = naming.derived_names(env)
    assert len(derived) >= 20
    assert [(d.name, d.rule.resource, d.rule.problem(d.name)) for d in derived if d.rule.problem(d.name)] == []


def test_every_name_rule_refuses_one_character_over_its_limit_and_a_trailing_newline():
    for rule in naming.NAME_RULES:
        assert "characters" in rule.problem("a" * (rule.max_len + 1)), rule
        assert rule.problem("tidefleet-dev\n") is not None, rule


def test_the_model_defaults_validate():
    minimal = {"region": "us-east-1", "pools": {"p": {"instance_types": [{"type": "c6i.large"}], "max": 1, "command": "w"}},
               "queues": {"q": {"pool": "p"}}}  # fmt: skip
    assert parse_environment(minimal, name="minimal").pools["p"].boot_timeout_s == 600
    gcp = copy.deepcopy(minimal) | {"cloud": "gcp", "region": "us-central1", "project": "acme-ml-dev"}
    gcp["pools"]["p"] |= {"instance_types": [{"type": "n2-standard-4"}], "image": "projects/debian-cloud/global/images/family/debian-12"}
    assert parse_environment(gcp, name="minimal").cloud == "gcp"


def test_every_region_botocore_knows_is_accepted():
    import botocore.session

    session = botocore.session.get_session()
    known = {r for p in ("aws", "aws-cn", "aws-us-gov") for r in session.get_available_regions("ec2", partition_name=p)}
    assert known - AWS_REGIONS == set()


def _longest(env_file: str, name: str, pool: str) -> dict:
    """A shipped environment renamed to the longest names validation accepts."""
    data = tomllib.loads((ROOT / f"{env_file}.toml").read_text())
    first = min(data["pools"])
    data["pools"] = {pool: data["pools"][first]}
    data["queues"] = {"q" * 31: {"pool": pool}}
    return parse_environment({**data, "name": name}, name=name)


@pytest.mark.synth
@pytest.mark.parametrize(
    "env_file,name,pool",
    [
        # S3 allows a 30-character environment (63 with the account id); the node role then allows 18.
        ("dev", "e" * 30, "p" * 18),
        # The GCS bucket carries the project id (11 here): 31 is allowed; the VM base name then allows 13.
        ("gcp-dev", "e" * 31, "p" * 13),
    ],
)
def test_the_stack_uses_only_names_the_table_checks(tmp_path, env_file, name, pool):
    from stacks.app import synth

    env = _longest(env_file, name, pool)
    stack = json.loads((synth(env, tmp_path) / "cdk.tf.json").read_text())
    known = {d.name for d in naming.derived_names(env)}
    # The account id is known at apply time (the table assumes a 12-digit one); any other
    # reference names another resource or an object key, not a name of this resource.
    names = {
        (rtype, attribute, re.sub(r"\$\{[^}]*account_id\}", naming.LONGEST_ACCOUNT_ID, value))
        for rtype, resources in stack["resource"].items()
        for body in resources.values()
        for attribute, value in body.items()
        if attribute in NAME_ATTRIBUTES and isinstance(value, str)
    }
    names = {n for n in names if "${" not in n[2]}
    assert len(names) >= 20
    assert {n for n in names if n[2] not in known} == set()


@pytest.mark.parametrize("env_file,name,pool", [("dev", "e" * 30, "p" * 19), ("gcp-dev", "e" * 31, "p" * 14)])
def test_one_character_more_is_refused(env_file, name, pool):
    from tidefleet.config import ConfigError

    with pytest.raises(ConfigError) as err:
        _longest(env_file, name, pool)
    assert [p.split(":")[0] for p in err.value.problems] == [f"pools.{pool}"]
