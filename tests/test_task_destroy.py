"""invoke destroy loses no work silently: before terraform runs it counts the environment's items
(queued, in flight, dead-lettered) and unfinished jobs through its cloud, on a moto server, and
refuses with one line naming them unless --force; one whose cloud cannot be read is refused too,
one that was never deployed is not. No test runs terraform: the step is replaced, or the task
stops before it (a fake terraform on PATH records any call)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from invoke import Config, Context, Exit

import tasks
from tidefleet.cloud import for_env
from tidefleet.cloud.aws.dynamodb import create_table
from tidefleet.cloud.aws.provision import create_queues
from tidefleet.config import load_environment
from tidefleet.emulator import FAKE_CREDENTIALS, free_port
from tidefleet.jobs import sdk

ROOT = Path(__file__).resolve().parents[1]
ENV = "dev"


@pytest.fixture
def terraform_runs(monkeypatch) -> list[tuple]:
    """The terraform step, replaced: each call's arguments."""
    runs: list[tuple] = []
    monkeypatch.setattr("stacks.terraform.terraform_binary", lambda: "/nonexistent/terraform")
    monkeypatch.setattr(tasks, "_terraform", lambda c, env, *args: runs.append((env, *args)))
    monkeypatch.delenv("TIDEFLEET_ENV", raising=False)
    return runs


def deployed():
    env = load_environment(ENV)
    create_queues(env)
    create_table(env.name, env.region)
    return env


def destroy(**options) -> None:
    tasks.destroy(Context(Config(overrides={"run": {"in_stream": False}})), env=ENV, yes=True, **options)


def test_an_environment_never_deployed_is_destroyed_without_force(aws, terraform_runs, capsys):
    destroy()
    assert terraform_runs == [(ENV, "destroy", "-input=false", "-auto-approve")]
    assert "destroy: dev has no queues and no job table deployed: no work to lose" in capsys.readouterr().out


def test_an_empty_environment_is_destroyed_without_force(aws, terraform_runs, capsys):
    deployed()
    destroy()
    assert len(terraform_runs) == 1
    assert "destroy: dev holds no items and no unfinished jobs" in capsys.readouterr().out


def test_queued_in_flight_and_dead_lettered_items_and_an_unfinished_job_stop_it(aws, terraform_runs):
    env = deployed()
    sdk.submit(env, "nightly", "default", [sdk.ItemSpec(f"i{n}", [str(n)]) for n in range(3)])
    queues = for_env(env).queues
    assert len(queues.receive("default", 1, 0, hold_s=600)) == 1  # a node works on one
    queues.send("default", ["an earlier job's item that gave up"], dead_letter=True)
    with pytest.raises(Exit) as refused:
        destroy()
    assert refused.value.code == 1
    assert refused.value.message == (
        "destroy: dev still holds 2 queued, 1 in flight, 1 dead-lettered item(s) and 1 unfinished job(s), lost with "
        "its queues and job table; let them finish or cancel them (tidefleet jobs --env dev --state running), rerun "
        "the dead-lettered ones (tidefleet retry-failed --env dev JOB), or pass --force to destroy it anyway"
    )
    assert terraform_runs == []


def test_dead_letters_alone_stop_it(aws, terraform_runs):
    env = deployed()
    for_env(env).queues.send("default", ["a", "b"], dead_letter=True)
    with pytest.raises(Exit) as refused:
        destroy()
    # no unfinished job to let finish or cancel (that list is empty): retry-failed reruns them
    assert refused.value.message == (
        "destroy: dev still holds 2 dead-lettered item(s), lost with its queues and job table; rerun them "
        "(tidefleet retry-failed --env dev JOB), or pass --force to destroy it anyway"
    )
    assert terraform_runs == []


def test_force_destroys_them_with_it_and_says_so(aws, terraform_runs, capsys):
    env = deployed()
    sdk.submit(env, "nightly", "default", [sdk.ItemSpec("a", ["1"])])
    destroy(force=True)
    assert len(terraform_runs) == 1
    assert "destroy: dev still holds 1 queued item(s) and 1 unfinished job(s); destroying them with it (--force)" in (
        capsys.readouterr().out
    )


# -- as a user runs it: a real invoke process, with a terraform on PATH that must not run --------

FAKE_TERRAFORM = '#!/bin/sh\necho "$*" >> "$(dirname "$0")/calls"\n'


def run_destroy(tmp_path: Path, variables: dict[str, str], env: str = ENV, *options: str) -> subprocess.CompletedProcess:
    binary = tmp_path / "bin" / "terraform"
    binary.parent.mkdir(exist_ok=True)
    binary.write_text(FAKE_TERRAFORM)
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "GOOGLE_", "CLOUDSDK_", "TIDEFLEET_"))}
    process_env = {**keep, "HOME": str(tmp_path), "AWS_CONFIG_FILE": str(tmp_path / "none"),
                   "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"), "AWS_EC2_METADATA_DISABLED": "true",
                   "CLOUDSDK_CONFIG": str(tmp_path / "gcloud"), "NO_GCE_CHECK": "True",
                   "PATH": f"{binary.parent}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}/usr/bin{os.pathsep}/bin",
                   **variables}  # fmt: skip
    result = subprocess.run([sys.executable, "-m", "invoke", "destroy", "--env", env, "--yes", *options], cwd=ROOT,
                            env=process_env, capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert not (binary.parent / "calls").exists(), "terraform ran"
    return result


def test_refused_in_one_line_as_a_user_sees_it(aws, tmp_path):
    env = deployed()
    sdk.submit(env, "nightly", "default", [sdk.ItemSpec("a", ["1"])])
    result = run_destroy(tmp_path, aws.env())
    assert result.returncode == 1 and "Traceback" not in result.stdout + result.stderr
    assert result.stderr.strip().splitlines() == [
        ("destroy: dev still holds 1 queued item(s) and 1 unfinished job(s), lost with its queues and job table; let "
         "them finish or cancel them (tidefleet jobs --env dev --state running), or pass --force to destroy it anyway")
    ]


@pytest.mark.parametrize(
    ("situation", "env", "says"),
    [
        ("aws without credentials", ENV, "no AWS credentials"),
        ("aws endpoint unreachable", ENV, "cannot reach AWS for 'dev'"),
        ("gcp without credentials", "gcp-dev", "no Google credentials"),
    ],
)
def test_an_environment_that_cannot_be_read_is_refused_without_force(tmp_path, situation, env, says):
    variables = {"aws endpoint unreachable": {**FAKE_CREDENTIALS, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}"}}
    result = run_destroy(tmp_path, variables.get(situation, {}), env)
    assert result.returncode == 1 and "Traceback" not in result.stdout + result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"destroy: cannot read what {env} still holds (") and says in line, line
    assert line.endswith("; fix that and run this again, or pass --force to destroy it anyway"), line
