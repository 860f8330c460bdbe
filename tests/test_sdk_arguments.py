"""Wrong argument types to the job SDK: each is refused with the argument, the value and what
to give instead, not a traceback from deep inside. No cloud is reached."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidefleet.jobs import sdk

CALLS = {
    "submit": lambda env: sdk.submit(env, "n", "work", sdk.read_items(["s3://b/a"])),
    "status": lambda env: sdk.status(env, "job"),
    "jobs": lambda env: sdk.jobs(env),
    "cancel": lambda env: sdk.cancel(env, "job"),
    "cancel_job": lambda env: sdk.cancel_job(env, "job"),
    "retry_failed": lambda env: sdk.retry_failed(env, "job"),
    "log_lines": lambda env: sdk.log_lines(env, "job"),
    "nodes": lambda env: sdk.nodes(env),
    "reconcile_dead_letters": lambda env: sdk.reconcile_dead_letters(env),
}


@pytest.mark.parametrize("call", CALLS, ids=str)
@pytest.mark.parametrize("env, name", [("aud", "aud"), (Path("envs/aud.toml"), "envs/aud.toml"), (None, "NAME")])
def test_an_environment_given_by_name_is_refused_saying_how_to_load_it(call, env, name):
    with pytest.raises(TypeError) as refused:
        CALLS[call](env)
    assert str(refused.value) == (f"env: must be an Environment (got {env!r}); load it first: "
                                  f"env = tidefleet.config.load_environment({name!r})")
