"""A boot script too big for the cloud is refused by validation, in one line naming the field,
not by the first render (synth, the sandbox) with a traceback."""

from __future__ import annotations

import pytest
from test_config import BASE, GCP_BASE, _with

from tidefleet.config import ConfigError, parse_environment
from tidefleet.userdata import EC2_USER_DATA_LIMIT, LOCAL_PYTHON, render_user_data

LINE = "echo " + "x" * 104  # about 110 bytes a line, as the audit's init_script


def _refused(base, name, **changes) -> str:
    with pytest.raises(ConfigError) as err:
        parse_environment(_with(base, **changes), name=name)
    assert len(err.value.problems) == 1, err.value.problems
    return err.value.problems[0]


def test_an_init_script_over_ec2s_16_kb_is_refused_by_validation_naming_the_field():
    problem = _refused(BASE, "dev", **{"pools.cpu.init_script": "\n".join([LINE] * 170)})
    assert problem.startswith("pools.cpu.init_script: the node's boot script would be "), problem
    assert "over EC2's user-data limit of 16384 bytes" in problem and "shorten" in problem, problem
    assert "\n" not in problem


def test_env_values_count_too_and_the_line_names_env_when_it_is_the_bulk():
    env = {f"VAR_{i}": "v" * 200 for i in range(80)}
    problem = _refused(BASE, "dev", **{"pools.cpu.env": env})
    assert problem.startswith("pools.cpu.env: the node's boot script would be "), problem


def test_gcp_takes_a_startup_script_up_to_gces_256_kib_metadata_value():
    big = "\n".join([LINE] * 170)  # too big for EC2, fine for GCE
    env = parse_environment(_with(GCP_BASE, **{"pools.cpu.init_script": big}), name="gcp-dev")
    assert len(render_user_data(env, "cpu", artifacts_bucket="b").encode()) > EC2_USER_DATA_LIMIT
    problem = _refused(GCP_BASE, "gcp-dev", **{"pools.cpu.init_script": "\n".join([LINE] * 2500)})
    assert problem.startswith("pools.cpu.init_script: the node's boot script would be "), problem
    assert "over GCE's metadata value limit (startup-script) of 262144 bytes" in problem, problem


def test_what_validates_renders_and_a_little_more_is_refused():
    """The size counts the artifacts bucket's real name (a 12-digit account id)."""
    base = parse_environment(BASE, name="dev")
    room = EC2_USER_DATA_LIMIT - len(render_user_data(base, "cpu", artifacts_bucket="tidefleet-dev-artifacts-123456789012").encode())
    fits = parse_environment(_with(BASE, **{"pools.cpu.init_script": "x" * (room - 1000)}), name="dev")
    assert render_user_data(fits, "cpu", artifacts_bucket="b")
    _refused(BASE, "dev", **{"pools.cpu.init_script": "x" * (room + 10)})


def test_the_sandboxs_local_script_is_not_held_to_ec2s_limit():
    """The sandbox runs it itself; what EC2 would get is checked by validation."""
    env = parse_environment(BASE, name="dev")
    local = {LOCAL_PYTHON: "/usr/bin/python3", "TIDEFLEET_ENVIRONMENTS": "/" + "d" * 20000}
    assert len(render_user_data(env, "cpu", artifacts_bucket="b", local=local).encode()) > EC2_USER_DATA_LIMIT
