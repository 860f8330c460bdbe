"""No traceback anywhere a user can reach: every `tidefleet` command and every invoke task that
talks to a cloud, run as a user runs it (a real process), with missing credentials, an
unreachable endpoint and an environment that is not deployed (a moto server with nothing in it),
on an AWS environment and on the GCP one without application-default credentials. Each must end
with exit 1 or 2 and one line on stderr that says what is wrong and what to do.

The walk is driven by the command tree (`tidefleet --help`, subgroups included) and by the
invoke collection: a new command is walked as soon as it exists, and a new required argument
without a sample value below fails the walk until it gets one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import bad_endpoints
import click
import pytest
from invoke import Collection

import tasks
from tidefleet.cli import main
from tidefleet.emulator import FAKE_CREDENTIALS, free_port

ROOT = Path(__file__).resolve().parents[1]
AWS_ENV, GCP_ENV = "dev", "gcp-dev"

# Commands and tasks that take --env but never call the environment's cloud, and why.
LOCAL = {
    "simulate": "replays a trace on the pool's prices; no cloud",
    "sandbox": "brings its own emulator",
    "validate": "reads environment files only",
    "synth": "writes Terraform JSON only",
    "scan": "runs checkov on the synthesized JSON only",
    "bootstrap": "synthesizes and scans the CI bootstrap stack only",
    "build": "packages the function archives only (its --env picks the environment file to package)",
}
# A sample value for each required argument a cloud command may have, by parameter name.
SAMPLES = {
    "job_id": "walk-job",
    "pool": "cpu",
    "queue": "default",
    "name": "walk",
    "items_from": "ITEMS",  # replaced by a real file of two items
}
CODE_WORDS = ("Traceback", 'File "')


def _walk(group: click.Group, ctx: click.Context, prefix: tuple[str, ...] = ()):
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if isinstance(command, click.Group):
            yield from _walk(command, click.Context(command, parent=ctx), (*prefix, name))
        else:
            yield (*prefix, name), command


def cloud_commands() -> list[tuple[tuple[str, ...], click.Command]]:
    """Every leaf command of `tidefleet` that takes an environment and calls its cloud."""
    return [(path, cmd) for path, cmd in _walk(main, click.Context(main))
            if path[-1] not in LOCAL and any(p.name == "env_name" for p in cmd.params)]  # fmt: skip


def cloud_tasks() -> list[str]:
    collection = Collection.from_module(tasks)
    return sorted(name for name in collection.task_names
                  if name not in LOCAL and any("env" in a.names for a in collection[name].get_arguments()))  # fmt: skip


def command_line(path: tuple[str, ...], command: click.Command, env: str, items: Path) -> list[str]:
    args = [sys.executable, "-m", "tidefleet.cli", *path, "--env", env]
    for param in command.params:
        if not param.required or param.name == "env_name":
            continue
        assert param.name in SAMPLES, f"{' '.join(path)}: add a sample value for {param.name!r} to SAMPLES"
        value = str(items) if param.name == "items_from" else SAMPLES[param.name]
        args += [value] if isinstance(param, click.Argument) else [param.opts[0], value]
    return args


def test_the_walk_reaches_every_command_that_talks_to_a_cloud():
    walked = {" ".join(path) for path, _ in cloud_commands()}
    assert {"submit", "status", "logs", "cancel", "retry-failed", "nodes", "jobs", "tick", "agent"} <= walked
    assert {"publish", "deploy", "plan", "destroy"} <= set(cloud_tasks())


def _clean_env(tmp_path: Path) -> dict[str, str]:
    """This machine's environment without any cloud's credentials or settings."""
    keep = {k: v for k, v in os.environ.items()
            if not k.startswith(("AWS_", "GOOGLE_", "GCLOUD", "CLOUDSDK_", "TIDEFLEET_", "GCE_"))}  # fmt: skip
    return {
        **keep,
        "HOME": str(tmp_path),  # no ~/.aws, no ~/.config/gcloud
        "AWS_CONFIG_FILE": str(tmp_path / "none"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
        "AWS_EC2_METADATA_DISABLED": "true",  # not an EC2 instance: no credentials from IMDS
        "CLOUDSDK_CONFIG": str(tmp_path / "gcloud"),
        "NO_GCE_CHECK": "True",  # not a GCE VM: no credentials from the metadata server
        "TIDEFLEET_KICK_URL": f"http://127.0.0.1:{free_port()}/",
        "TIDEFLEET_IMDS_URL": f"http://127.0.0.1:{free_port()}",
        "PATH": os.environ["PATH"],
    }


@pytest.fixture
def empty_aws(moto_server):
    """A moto server with nothing provisioned in it."""
    import urllib.request

    urllib.request.urlopen(urllib.request.Request(f"{moto_server.url}/moto-api/reset", method="POST")).close()
    return moto_server


@pytest.fixture(scope="module")
def wrong_endpoints():
    """Servers that are not AWS, as a user may point AWS_ENDPOINT_URL at them by mistake."""
    with bad_endpoints.empty_answers() as empty, bad_endpoints.html_pages() as html:
        yield {"aws endpoint answers empty": empty, "aws endpoint serves web pages": html}


def situation(name: str, tmp_path: Path, server, wrong: dict[str, str] | None = None) -> tuple[str, dict[str, str]]:
    """(environment, process environment) of one of the situations a user meets."""
    base = _clean_env(tmp_path)
    if name == "aws without credentials":
        return AWS_ENV, base
    if name == "aws endpoint unreachable":
        return AWS_ENV, {**base, **FAKE_CREDENTIALS, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}"}
    if name == "aws endpoint without a scheme":  # http:// forgotten: botocore refuses it when a client is built
        return AWS_ENV, {**base, **FAKE_CREDENTIALS, "AWS_ENDPOINT_URL": f"127.0.0.1:{free_port()}"}
    if wrong and name in wrong:
        return AWS_ENV, {**base, **FAKE_CREDENTIALS, "AWS_ENDPOINT_URL": wrong[name]}
    if name == "aws endpoint that does not parse":  # urlsplit's ValueError, before botocore's own check
        return AWS_ENV, {**base, **FAKE_CREDENTIALS, "AWS_ENDPOINT_URL": "http://[::1"}
    if name == "aws profile not found":
        return AWS_ENV, {**base, "AWS_PROFILE": "nosuch"}
    if name in ("aws config file does not parse", "aws credentials file does not parse"):
        bad = tmp_path / "badcfg"
        bad.write_text("[default\nx")
        variable = "AWS_CONFIG_FILE" if "config" in name else "AWS_SHARED_CREDENTIALS_FILE"
        return AWS_ENV, {**base, variable: str(bad)}
    if name == "aws not deployed":
        return AWS_ENV, {**base, **server.env()}
    if name == "gcp credentials file missing":
        return GCP_ENV, {**base, "GOOGLE_APPLICATION_CREDENTIALS": str(tmp_path / "gone.json")}
    assert name == "gcp without credentials"
    return GCP_ENV, base


SITUATIONS = ["aws without credentials", "aws endpoint unreachable", "aws not deployed", "gcp without credentials"]
# What a user types wrong in AWS_ENDPOINT_URL: each must say so in one line, whatever the command.
ENDPOINT_MISTAKES = ["aws endpoint without a scheme", "aws endpoint answers empty", "aws endpoint serves web pages",
                     "aws endpoint that does not parse"]  # fmt: skip
# What a user's own settings may name wrongly: a profile, a file. Each is named, with the fix.
SETTING_MISTAKES = ["aws profile not found", "aws config file does not parse", "aws credentials file does not parse",
                    "gcp credentials file missing"]  # fmt: skip
SAYS = {
    "aws endpoint without a scheme": "is not a URL; write http://127.0.0.1:",
    "aws endpoint answers empty": "did not answer like the AWS API (HTTP 202); check AWS_ENDPOINT_URL",
    "aws endpoint serves web pages": "did not answer like the AWS API (HTTP 501); check AWS_ENDPOINT_URL",
    "aws endpoint that does not parse": "AWS_ENDPOINT_URL 'http://[::1' is not a URL (Invalid IPv6 URL); write a URL",
    "aws profile not found": ("AWS profile 'nosuch' (AWS_PROFILE) is not in the AWS config or credentials file "
                              "({home}/none); create it with `aws configure --profile nosuch`, or unset AWS_PROFILE"),
    "aws config file does not parse": ("the AWS config file {home}/badcfg (AWS_CONFIG_FILE) does not parse (line 1: "
                                       "'[default'); fix it, or point AWS_CONFIG_FILE at another file"),
    "aws credentials file does not parse": ("the AWS credentials file {home}/badcfg (AWS_SHARED_CREDENTIALS_FILE) does "
                                            "not parse (line 1: '[default'); fix it, or point "
                                            "AWS_SHARED_CREDENTIALS_FILE at another file"),
    "gcp credentials file missing": ("GOOGLE_APPLICATION_CREDENTIALS names {home}/gone.json, which does not exist; "
                                     "point it at a credentials file, or unset it and run `gcloud auth "
                                     "application-default login`"),
}


def assert_one_clear_line(result: subprocess.CompletedProcess, what: str) -> None:
    output = result.stdout + result.stderr
    assert result.returncode in (1, 2), f"{what}: exit {result.returncode}\n{output[-3000:]}"
    assert not any(word in output for word in CODE_WORDS), f"{what}: a traceback\n{output[-3000:]}"
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, f"{what}: expected one line on stderr, got\n{result.stderr}"


@pytest.mark.parametrize("situation_name", SITUATIONS + ENDPOINT_MISTAKES + SETTING_MISTAKES)
@pytest.mark.parametrize(("path", "command"), cloud_commands(), ids=lambda v: " ".join(v) if isinstance(v, tuple) else "")
def test_every_cloud_command_fails_in_one_clear_line(path, command, situation_name, tmp_path, empty_aws,
                                                     wrong_endpoints):  # fmt: skip
    env, process_env = situation(situation_name, tmp_path, empty_aws, wrong_endpoints)
    items = tmp_path / "items.txt"
    items.write_text("s3://bucket/a\ns3://bucket/b\n")
    result = subprocess.run(command_line(path, command, env, items), cwd=ROOT, env=process_env,
                            capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert_one_clear_line(result, f"tidefleet {' '.join(path)} ({situation_name})")
    if situation_name in SAYS:  # not "job not found", not the page, not a KeyError
        says = SAYS[situation_name].format(home=tmp_path)
        assert says in " ".join(result.stderr.split()), f"{' '.join(path)} ({situation_name}): {result.stderr}"


@pytest.mark.parametrize("situation_name", SITUATIONS + ["aws endpoint that does not parse", *SETTING_MISTAKES])
@pytest.mark.parametrize("task", cloud_tasks())
def test_every_cloud_task_fails_in_one_clear_line(task, situation_name, tmp_path, empty_aws):
    env, process_env = situation(situation_name, tmp_path, empty_aws)
    process_env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}/usr/bin{os.pathsep}/bin"  # no terraform
    result = subprocess.run([sys.executable, "-m", "invoke", task, "--env", env], cwd=ROOT, env=process_env,
                            capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert_one_clear_line(result, f"invoke {task} ({situation_name})")
