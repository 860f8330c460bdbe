"""`tidefleet tick` where one pool's group is missing and the others are there (control_cli)."""

from __future__ import annotations

import click
import pytest

from tidefleet import control_cli
from tidefleet.config import parse_environment
from tidefleet.policy.model import PoolDecision
from tidefleet.ports import Backlog

ENV = parse_environment({
    "region": "us-east-1",
    "pools": {name: {"max": 2, "command": "work", "instance_types": [{"type": "c6i.large"}]}
              for name in ("cpu", "nogroup")},
    "queues": {"demo": {"pool": "cpu"}, "odd": {"pool": "nogroup"}, "odd-urgent": {"pool": "nogroup"}},
}, name="t")  # fmt: skip


class FakeQueues:
    def backlog(self, queue):
        return {"demo": Backlog(3, 1), "odd": Backlog(7, 2), "odd-urgent": Backlog(5, 0)}[queue]


class FakePorts:
    queues = FakeQueues()


class FakeCloud:
    errors = (OSError,)

    def control_ports(self):
        return FakePorts()


def tick_with(monkeypatch, decided):
    monkeypatch.setattr(control_cli, "for_env", lambda env: FakeCloud())
    monkeypatch.setattr(control_cli, "run_tick", lambda env, ports, now, pools, dry_run: decided)
    with pytest.raises(click.ClickException) as raised:
        control_cli._tick(ENV, True, (), False)
    return raised.value.message


def test_a_pool_whose_group_is_missing_says_so_the_others_were_ticked_and_what_waits_for_it(monkeypatch):
    message = tick_with(monkeypatch, (PoolDecision("cpu", 1, (), None, ("because",)),))
    assert message == (
        "no group for pool(s) nogroup: t is not deployed in us-east-1; deploy it with `invoke deploy --env t`, "
        "which recreates the missing group (pool nogroup's group is gone: deleted outside terraform, or the pool "
        "was added since the deploy); the other pools (cpu) were ticked; 12 items wait for it (odd 7, "
        "odd-urgent 5), 2 in flight"
    ), message


def test_no_group_at_all_is_an_environment_not_deployed(monkeypatch):
    message = tick_with(monkeypatch, ())
    assert message == ("no group for pool(s) cpu, nogroup: t is not deployed in us-east-1; deploy it with "
                       "`invoke deploy --env t`")  # fmt: skip
