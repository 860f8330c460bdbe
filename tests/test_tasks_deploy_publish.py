"""invoke deploy: an apply that succeeded and a publish that failed says both, and how to finish:
the nodes cannot fetch the agent until `invoke publish` runs."""

from __future__ import annotations

import pytest
from invoke import Exit, MockContext

import tasks


def test_a_failed_publish_after_the_apply_says_the_apply_is_done_and_to_run_publish(monkeypatch):
    applied = []
    monkeypatch.setattr(tasks, "_terraform", lambda c, env, *args: applied.append(env))

    def fails(environment):
        raise RuntimeError("pip download failed: no network")

    monkeypatch.setattr("stacks.publish.publish_agent", fails)
    with pytest.raises(Exit) as stopped:
        tasks.deploy(MockContext(), env="dev", yes=True)
    assert applied == ["dev"]
    assert stopped.value.code == 1
    assert stopped.value.message == (
        "deploy: dev's infrastructure is applied, but publishing the agent failed, so its nodes cannot fetch the "
        "agent at boot: pip download failed: no network; once that is fixed, run `invoke publish --env dev`"
    )
