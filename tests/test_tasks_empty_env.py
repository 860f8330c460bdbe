"""An explicitly empty --env is refused, not taken as "left out": in CI, `--env "$EMPTY" --yes`
would otherwise deploy whatever $TIDEFLEET_ENV names."""

from __future__ import annotations

import pytest
from invoke import Exit, MockContext

import tasks


@pytest.mark.parametrize("task", [tasks.synth, tasks.plan, tasks.deploy, tasks.destroy, tasks.publish])
def test_an_empty_env_is_refused_even_with_tidefleet_env_set(monkeypatch, task):
    monkeypatch.setenv("TIDEFLEET_ENV", "dev")
    monkeypatch.setattr(tasks, "_terraform_binary", lambda: pytest.fail("terraform was looked for"))
    with pytest.raises(Exit) as refused:
        task(MockContext(), env="")
    assert refused.value.code == 1
    assert refused.value.message.startswith("--env: '' names no environment; give one (known: ")
    assert refused.value.message.endswith("), or leave the option out to use $TIDEFLEET_ENV ('dev')")


def test_simulate_refuses_an_empty_env_too(monkeypatch):
    monkeypatch.setenv("TIDEFLEET_ENV", "dev")
    monkeypatch.setattr("tidefleet.cli.main", lambda args, prog_name: pytest.fail("simulate ran"))
    with pytest.raises(Exit) as refused:
        tasks.simulate(MockContext(), "philly_2017_jobs.csv", env="")
    assert refused.value.message.startswith("--env: '' names no environment")


def test_left_out_it_is_tidefleet_env(monkeypatch):
    monkeypatch.setenv("TIDEFLEET_ENV", "dev")
    assert tasks._env(None).name == "dev"


def test_sandbox_hands_an_empty_env_to_the_command_which_refuses_it(monkeypatch):
    """Left out, the sandbox runs its own environment; given empty, the command says what is wrong."""
    seen = []
    monkeypatch.setattr("tidefleet.cli.main", lambda args, prog_name: seen.append(args))
    tasks.sandbox(MockContext(), env="")
    tasks.sandbox(MockContext())
    assert seen[0][:3] == ["sandbox", "--env", ""] and "--env" not in seen[1]
