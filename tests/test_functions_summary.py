"""The scaler function's one summary line (`tidefleet.triggers.run`) says what the tick did,
not what the policy asked: the group may cap a desired capacity, and the fleet skips nodes it
cannot terminate. The tick itself is faked here; test_handlers.py runs it on the moto server."""

from __future__ import annotations

import json
import logging

import pytest

from tidefleet import control, triggers
from tidefleet.config import parse_environment
from tidefleet.policy.model import PoolDecision

CAPPED = "desired capped at the group's MaxSize 2 (config max 6), not 3: deploy the environment to apply it"


def environment(dry_run: bool = False):
    return parse_environment(
        {
            "region": "us-east-1",
            "scaler": {"dry_run": dry_run},
            "pools": {"cpu": {"max": 6, "command": "work", "instance_types": [{"type": "c6i.large"}]},
                      "gpu": {"max": 4, "command": "train", "instance_types": [{"type": "g5.xlarge"}]}},
            "queues": {"demo": {"pool": "cpu"}},
        },
        name="t",
    )  # fmt: skip


@pytest.fixture
def ticked(monkeypatch):
    """The tick's decisions and what acting on them did: cpu asked 3 nodes and two terminations,
    the group capped it at 2 and one node was already gone; gpu was set as decided."""

    def tick(env, ports, now, *, report=None, acted=None, **_):
        decisions = (PoolDecision("cpu", 3, ("i-1", "i-2"), None, ()), PoolDecision("gpu", 1, (), None, ()))
        if acted is not None and not env.scaler.dry_run:
            acted("cpu", {"terminated": ["i-1"], "desired_after": 2, "base_after": 0, "held": CAPPED})
            acted("gpu", {"terminated": [], "desired_after": 1, "base_after": 0})
        return decisions

    monkeypatch.setattr(control, "tick", tick)


def summary_of(env, caplog) -> dict:
    with caplog.at_level(logging.INFO, "tidefleet.scaler"):
        summary = triggers.run(triggers.Trigger("schedule", "rule"), lambda: (env, None))
    assert [json.loads(r.getMessage()) for r in caplog.records if r.name == "tidefleet.scaler"] == [summary]
    return summary


def test_the_summary_says_what_was_set_and_terminated_and_why_a_pool_differs(ticked, caplog):
    summary = summary_of(environment(), caplog)
    assert summary["desired"] == {"cpu": 2, "gpu": 1} and summary["held"] == {"cpu": CAPPED}
    assert summary["terminated"] == 1 and "dry_run" not in summary


def test_a_dry_runs_summary_says_what_it_decided_and_that_nothing_was_done(ticked, caplog):
    summary = summary_of(environment(dry_run=True), caplog)
    assert summary["desired"] == {"cpu": 3, "gpu": 1} and summary["dry_run"] is True
    assert summary["terminated"] == 2 and "held" not in summary
