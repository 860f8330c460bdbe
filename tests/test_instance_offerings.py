"""invoke plan / deploy ask EC2, before terraform runs, whether each pool's instance types are
offered where its nodes launch: a type offered nowhere in the region, or in none of the pool's
zones, stops the task in one line; one some of its zones lack is a one-line warning; a check
that cannot ask EC2 says so in one line and terraform runs anyway. Against a moto server, whose
offerings are a snapshot of AWS's (e.g. af-south-1 offers no g5, and g4dn.xlarge only in
af-south-1b and -1c); a fake terraform records the steps it is asked to run."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import bad_endpoints
import boto3
import pytest

import tasks
from tests.test_task_terraform import calls, context, fake_terraform  # noqa: F401 - a fixture
from tidefleet.cloud.aws import _fail_fast
from tidefleet.cloud.aws.offerings import Offerings, check, problems
from tidefleet.config import load_environment
from tidefleet.emulator import FAKE_CREDENTIALS, free_port

ROOT = Path(__file__).resolve().parents[1]
COULD_NOT = "could not check instance type offerings in {region}: "
WITHOUT = "; terraform will run without the check"


def environment_file(
    tmp_path: Path, region: str, *types: str, placement: str = "spread", network: str = ""
) -> Path:
    # Prices of their own: a type without a built-in price is valid with them.
    listed = ", ".join(f'{{ type = "{t}", on_demand_price = 1.0, spot_price = 0.5 }}' for t in types)
    path = tmp_path / "offerings.toml"
    path.write_text(f'region = "{region}"\n{network}\n[pools.work]\nmax = 8\nplacement = "{placement}"\n'
                    f'command = "python -m work"\ninstance_types = [{listed}]\n\n[queues.jobs]\npool = "work"\n')  # fmt: skip
    return path


def field(i: int) -> str:
    return f"pools.work.instance_types[{i}].type"


SPREAD_AF = (
    "the zones the stack spreads the pool's nodes over (af-south-1a, af-south-1b: network.az_count = 2)"
)
OWN_SUBNETS = '[network]\nsubnet_ids = ["subnet-0123456789abcdef0"]\n'

# (case, region, types, options, refused, warned)
CASES = [
    ("every type offered in every zone", "us-east-1", ("c6i.large", "g5.xlarge", "p4d.24xlarge"), {}, [], []),
    ("a cluster pool's type offered in its zone", "af-south-1", ("c6i.large",), {"placement": "cluster"}, [], []),
    ("a type offered nowhere in the region: its family's nearest sizes named", "il-central-1", ("i4i.12xlarge",), {},
     [(f"{field(0)}: i4i.12xlarge is not offered in il-central-1; choose one it offers (i4i.16xlarge, i4i.8xlarge, "
      "i4i.32xlarge) or another region")], []),
    ("a family the region has none of", "af-south-1", ("c6i.large", "g5.xlarge"), {},
     [(f"{field(1)}: g5.xlarge is not offered in af-south-1; it offers no g5 type: choose another type or another "
      "region")], []),
    ("a type one of the zones lacks", "af-south-1", ("c6i.large", "g4dn.xlarge"), {}, [],
     [(f"{field(1)}: g4dn.xlarge is not offered in af-south-1a, of {SPREAD_AF}: the group launches it only in "
      "af-south-1b; to use every zone, choose a type offered in all of them, or give network.subnet_ids in zones "
      "that offer it")]),
    ("a cluster pool's type its one zone lacks", "af-south-1", ("g4dn.xlarge",), {"placement": "cluster"},
     [(f"{field(0)}: g4dn.xlarge is offered in af-south-1 but not in af-south-1a, the one zone a cluster-placement "
      "pool launches in (the stack's first subnet), so the group never launches it; choose another type, or give "
      "network.subnet_ids whose first subnet is in af-south-1b or af-south-1c")], []),
    ("a type offered only in zones past az_count", "us-east-1", ("trn1.32xlarge",),
     {"network": "[network]\naz_count = 1\n"},
     [(f"{field(0)}: trn1.32xlarge is offered in us-east-1 but not in the zones the stack spreads the pool's nodes "
      "over (us-east-1a: network.az_count = 1), so the group never launches it; it is offered in us-east-1b, "
      "us-east-1c, us-east-1f: raise network.az_count to 2, choose another type, or give network.subnet_ids there")],
     []),
    ("the environment's own subnets: only the region is checked", "af-south-1", ("g4dn.xlarge", "g5.xlarge"),
     {"network": OWN_SUBNETS},
     [(f"{field(1)}: g5.xlarge is not offered in af-south-1; it offers no g5 type: choose another type or another "
      "region")], []),
]  # fmt: skip


@pytest.mark.parametrize(
    ("case", "region", "types", "options", "refused", "warned"), CASES, ids=[c[0] for c in CASES]
)
def test_each_type_not_offered_where_its_pool_launches_is_one_line(aws, tmp_path, case, region, types, options,
                                                                   refused, warned):  # fmt: skip
    env = load_environment(str(environment_file(tmp_path, region, *types, **options)))
    assert check(env) == (refused, warned)


def test_an_endpoint_that_lists_no_offerings_checks_nothing_and_says_so(tmp_path):
    """An emulator without a region's data lists no type at all: every type refused would be wrong."""
    env = load_environment(str(environment_file(tmp_path, "us-east-1", "c6i.large")))
    assert problems(env, Offerings("us-east-1", frozenset(), (), {})) == (
        [], ["EC2 lists no instance type offerings in us-east-1: the pools' types were not checked"])


@pytest.fixture
def terraform(fake_terraform) -> Callable[[], list[str]]:  # noqa: F811 - the fixture's value
    """The steps (init, plan, ...) tests/test_task_terraform.py's fake terraform was asked to run
    so far; the functions' build and the synth are skipped there."""
    return lambda: [line.split()[1] for line in calls(fake_terraform)]


def test_plan_says_nothing_more_when_every_type_is_offered(aws, tmp_path, terraform, capfd):
    tasks.plan(context(), env=str(environment_file(tmp_path, "us-east-1", "c6i.large", "g5.xlarge")))
    assert terraform() == ["init", "plan"]
    assert capfd.readouterr() == ("init done\nplan done\n", "")  # the fake's own lines alone


def test_deploy_warns_in_one_line_of_a_type_some_zones_lack_and_applies(
    aws, tmp_path, terraform, capfd, monkeypatch
):
    monkeypatch.setattr(tasks, "publish", lambda c, env: None)  # nothing was applied to publish to
    tasks.deploy(
        context(), env=str(environment_file(tmp_path, "af-south-1", "c6i.large", "g4dn.xlarge")), yes=True
    )
    assert terraform() == ["init", "apply"]
    lines = capfd.readouterr().err.splitlines()
    warning = f"warning: {field(1)}: g4dn.xlarge is not offered in af-south-1a"
    assert len(lines) == 1 and lines[0].startswith(warning), lines


@pytest.mark.parametrize("task", ["plan", "deploy"])
def test_a_type_the_region_does_not_offer_ends_the_task_in_one_line_before_terraform(aws, tmp_path, task):
    """As a user runs it: `invoke`, in its own process, with a terraform on PATH that records being run."""
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "terraform").write_text(f"#!/bin/sh\ntouch {tmp_path}/terraform-ran\n")
    (tmp_path / "bin" / "terraform").chmod(0o755)
    path = environment_file(tmp_path, "af-south-1", "c6i.large", "g5.xlarge")
    result = subprocess.run([sys.executable, "-m", "invoke", task, "--env", str(path)], check=False, cwd=ROOT,
                            capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"})  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.splitlines() == [(f"{field(1)}: g5.xlarge is not offered in af-south-1; it offers no g5 "
                                          "type: choose another type or another region")], result.stderr  # fmt: skip
    assert "Traceback" not in result.stdout and not (tmp_path / "terraform-ran").exists()


@pytest.fixture
def fresh_session(monkeypatch):
    """boto3's default session as a new `invoke` process has it: no credentials found yet (this
    test process's session keeps the ones an earlier test gave it)."""
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)
    _fail_fast.cache_clear()
    yield
    _fail_fast.cache_clear()


DENIED = ("UnauthorizedOperation", ("You are not authorized to perform this operation. User: "
          "arn:aws:sts::123456789012:assumed-role/ci/x is not authorized to perform: "
          "ec2:DescribeInstanceTypeOfferings because no identity-based policy allows the "
          "ec2:DescribeInstanceTypeOfferings action. Encoded authorization failure message: AbCd"))  # fmt: skip


@pytest.mark.parametrize(("situation", "says"), [
    ("denied", "this AWS identity may not call ec2:DescribeInstanceTypeOfferings"),
    ("throttled", "AWS still throttled the call after 3 tries with backoff"),
    ("unreachable", "cannot reach AWS for 'offerings' (Could not connect to the endpoint URL"),
    ("no credentials", "no AWS credentials: set AWS_PROFILE, or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"),
])  # fmt: skip
def test_a_check_that_cannot_ask_ec2_says_so_in_one_line_and_terraform_runs(tmp_path, terraform, capfd, monkeypatch,
                                                                            fresh_session, situation, says):  # fmt: skip
    for key in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    if situation != "no credentials":
        for key, value in FAKE_CREDENTIALS.items():
            monkeypatch.setenv(key, value)
    endpoint = {
        "denied": bad_endpoints.aws_errors(*DENIED, status=403),
        "throttled": bad_endpoints.aws_errors("RequestLimitExceeded", "Request limit exceeded.", status=503),
    }.get(situation, contextlib.nullcontext(f"http://127.0.0.1:{free_port()}"))  # nothing listens there
    with endpoint as url:
        monkeypatch.setenv("AWS_ENDPOINT_URL", url)
        tasks.plan(context(), env=str(environment_file(tmp_path, "af-south-1", "g5.xlarge")))
    assert terraform() == ["init", "plan"]
    lines = capfd.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(COULD_NOT.format(region="af-south-1")), lines
    line = lines[0]
    assert says in line and line.endswith(WITHOUT) and "Encoded authorization" not in line, line


def test_destroy_asks_nothing_about_offerings(aws, tmp_path, terraform, monkeypatch):
    """A type gone from the region must not keep its group from being destroyed."""
    monkeypatch.setattr(tasks, "_check_nothing_is_lost", lambda environment, force: None)
    tasks.destroy(context(), env=str(environment_file(tmp_path, "af-south-1", "g5.xlarge")), yes=True)
    assert terraform() == ["init", "destroy"]


def test_a_gcp_environment_is_not_checked(tmp_path, terraform, capfd, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")  # an AWS call would say so
    tasks.plan(context(), env="gcp-dev")
    assert terraform() == ["init", "plan"]
    assert capfd.readouterr() == ("init done\nplan done\n", "")  # the fake's own lines alone
