"""Wrong argument types to the job SDK: each is refused with the argument, the value and what
to give instead, not a traceback from deep inside. No cloud is reached."""

from __future__ import annotations

from pathlib import Path

import pytest
from agent_harness import Harness

from tidefleet.cloud import for_env
from tidefleet.jobs import sdk
from tidefleet.jobs.spec import JobSpec

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


@pytest.fixture
def h(tmp_path, aws):
    return Harness(tmp_path, aws)


@pytest.mark.parametrize("spec, message", [
    (JobSpec(command=5), "spec.command: must be a string of shell words (got 5); e.g. 'python train.py --fast'"),
    (JobSpec(command=["python", "x.py"]), "spec.command: must be a string of shell words (got ['python', 'x.py'])"),
    (JobSpec(image=5), "spec.image: must be a string (got 5); e.g. 'ghcr.io/acme/train:v2' or ':v2'"),
    (JobSpec(env=["A=1"]), "spec.env: must be a dict of variable names to values (got ['A=1']); e.g. {'SEED': '1'}"),
    ({"command": "python x.py"}, ("spec: must be a JobSpec (got {'command': 'python x.py'}); "
                                 "e.g. spec=JobSpec(**{'command': 'python x.py'})")),
])  # fmt: skip
def test_a_spec_of_the_wrong_type_is_refused_naming_the_field(h, spec, message):
    with pytest.raises(sdk.JobError) as refused:
        sdk.submit(h.env, "spec", "work", sdk.read_items(["s3://b/a"]), kick=False, spec=spec)
    assert str(refused.value).startswith(message), str(refused.value)
    assert for_env(h.env).store.job(sdk.job_id_for("spec")) is None


def test_a_name_that_is_not_a_string_is_refused_saying_so(h):
    with pytest.raises(sdk.JobError) as refused:
        sdk.submit(h.env, 123, "work", sdk.read_items(["s3://b/a"]), kick=False)
    assert str(refused.value) == "name: must be a string (got 123); give a few words, e.g. name='nightly-eval'"


def test_ids_that_are_not_strings_are_refused_and_a_submitted_points_at_its_job_id(h):
    submitted = sdk.submit(h.env, "ids", "work", sdk.read_items(["s3://b/a"]), kick=False)
    with pytest.raises(sdk.JobError) as refused:
        sdk.log_lines(h.env, submitted.job_id, 0)
    assert str(refused.value) == (f"item id: must be a string (got 0); give an item id of job {submitted.job_id}, "
                                  "e.g. '000000' for its first item when submit numbered them")
    for call in (sdk.status, sdk.cancel_job, sdk.retry_failed, sdk.log_lines, sdk.reconcile_dead_letters):
        with pytest.raises(sdk.JobError) as refused:
            call(h.env, submitted)
        assert str(refused.value) == f"job id: must be a string (got a Submitted); give its .job_id ({submitted.job_id!r})"
        with pytest.raises(sdk.JobError, match=r"^job id: must be a string \(got 7\); give the id submit printed$"):
            call(h.env, 7)
