"""A function archive carries the one environment being deployed: the very file that was
validated and synthesized, whatever folder it came from ($TIDEFLEET_ENVIRONMENTS, or a path
given to --env), as environments/<name>.toml, where the function looks it up by the
TIDEFLEET_ENV its stack sets; no other environment's file.

The deploy path is run as `invoke plan` runs it (the build, the real synth, a fake terraform),
and the archive the synthesized stack points at is unzipped and its settings loaded by the
function's own code under the function's real runtime (Lambda's python3.12 -I with boto3 alone;
the Cloud Function's venv from the archive's requirements.txt): tests/test_function_archives.py's
harness."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from invoke import Config, Context, MockContext
from test_function_archives import clean_env, lambda_python, unzip, venv_with

import tasks
from stacks import app, package
from stacks.package import ROOT, archive_name, build_archive, runtime_wheels
from tidefleet.config import environment_path, load_environment

# Run with the archive's directory first on sys.path (Lambda's task root, the buildpack's
# workspace), as the function does: its entry module, then its settings (TIDEFLEET_ENV).
AWS_LOAD = """
import json, sys
sys.path.insert(0, sys.argv[1])
import lambdas.scaler.handler
from tidefleet.cloud.aws import lambda_runtime
env, _ = lambda_runtime()
print(json.dumps(env.model_dump(mode="json")))
"""
GCP_LOAD = """
import json, sys
sys.path.insert(0, sys.argv[1])
import main
from tidefleet.triggers import function_environment
print(json.dumps(function_environment().model_dump(mode="json")))
"""
FAKE_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                    "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}  # fmt: skip


@pytest.fixture
def planned(tmp_path, monkeypatch):
    """`invoke plan --env ENV` with the real build and synth into a temp build/ and a terraform
    that does nothing: the synthesized stack's function settings (archive, TIDEFLEET_ENV)."""
    build = tmp_path / "build"
    monkeypatch.setattr(tasks, "OUT", build)
    monkeypatch.setattr(app, "BUILD", build)  # where the stacks point: the same temp folder
    monkeypatch.setattr(tasks, "_check_offerings", lambda environment: None)  # no EC2 to ask
    binary = tmp_path / "bin" / "terraform"
    binary.parent.mkdir()
    binary.write_text("#!/bin/sh\nexit 0\n")
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setattr("stacks.terraform.terraform_binary", lambda: str(binary))
    monkeypatch.setattr(sys.stdout, "isatty", lambda: False)
    monkeypatch.delenv("TIDEFLEET_ENV", raising=False)

    def plan(env: str) -> tuple[Path, str]:
        tasks.plan(Context(Config(overrides={"run": {"in_stream": False}})), env=env)
        name = load_environment(env).name
        stack_dir = build / "synth" / name / "stacks" / f"tidefleet-{name}"
        resource = json.loads((stack_dir / "cdk.tf.json").read_text())["resource"]
        if "aws_lambda_function" in resource:
            function = resource["aws_lambda_function"]["control_scaler"]
            archive, variables = function["filename"], function["environment"]["variables"]
        else:
            (source,) = [o["source"] for o in resource["google_storage_bucket_object"].values() if "source" in o]
            (function,) = resource["google_cloudfunctions2_function"].values()
            archive, variables = source, function["service_config"]["environment_variables"]
        return (stack_dir / archive).resolve(), variables["TIDEFLEET_ENV"]

    return plan


def aws_function_settings(archive: Path, tidefleet_env: str, work: Path) -> dict:
    python = lambda_python()
    if python is None:
        pytest.skip("the Lambda archive's wheels are cp312: install Python 3.12 to run it here")
    venv = venv_with(python, ["boto3>=1.34,<2"])
    task_root = unzip(archive, work / "task")
    run = subprocess.run(
        [venv / "bin" / "python", "-I", "-c", AWS_LOAD, str(task_root)], cwd=task_root,
        env=clean_env(**FAKE_CREDENTIALS, TIDEFLEET_ENV=tidefleet_env, HOME=str(work)),
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.splitlines()[-1])


def gcp_function_settings(archive: Path, tidefleet_env: str, work: Path) -> dict:
    source = unzip(archive, work / "workspace")
    wanted = [line.split("#")[0].strip() for line in (source / "requirements.txt").read_text().splitlines()]
    venv = venv_with(lambda_python() or sys.executable, [w for w in wanted if w])
    run = subprocess.run(
        [venv / "bin" / "python", "-c", GCP_LOAD, str(source)], cwd=source,
        env=clean_env(TIDEFLEET_ENV=tidefleet_env, HOME=str(work)),
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.splitlines()[-1])


def environment_files(archive: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(archive) as z:
        return {n: z.read(n) for n in z.namelist() if n.startswith("environments/")}


@pytest.mark.synth
def test_a_deploy_of_an_environment_given_as_a_path_packages_that_file_and_the_lambda_loads_it(planned, tmp_path):
    """`invoke plan --env elsewhere/staging.toml`: the repository has no staging.toml. The archive
    packaged the repository's environments/ folder, so the function failed with "no environment
    'staging' in the function's package"."""
    try:
        runtime_wheels()
    except RuntimeError as err:
        pytest.skip(f"cannot pip download the Lambda wheels here: {err}")
    given = tmp_path / "elsewhere" / "staging.toml"
    given.parent.mkdir()
    given.write_bytes(environment_path("dev").read_bytes().replace(b'cost-center = "ml-dev"', b'cost-center = "ml-stg"'))
    archive, tidefleet_env = planned(str(given))
    loaded = aws_function_settings(archive, tidefleet_env, tmp_path)
    assert loaded == load_environment(str(given)).model_dump(mode="json")
    assert loaded["tags"]["cost-center"] == "ml-stg"
    assert archive.name == "functions-staging.zip" and tidefleet_env == "staging"
    assert environment_files(archive) == {"environments/staging.toml": given.read_bytes()}


@pytest.mark.synth
def test_the_archive_a_dev_deploy_ships_carries_dev_toml_and_no_other_environment(planned):
    """Every archive carried every environment's file: dev's functions shipped prod.toml."""
    archive, _ = planned("dev")
    assert environment_files(archive) == {"environments/dev.toml": environment_path("dev").read_bytes()}


@pytest.mark.synth
def test_an_environment_from_another_folder_is_not_shadowed_by_the_repositorys_file_of_its_name(
    planned, tmp_path, monkeypatch
):
    """$TIDEFLEET_ENVIRONMENTS holds its own gcp-dev.toml: the repository's gcp-dev.toml was
    packaged instead, and the Cloud Function ran silently with the repository's settings."""
    folder = tmp_path / "configs"
    folder.mkdir()
    ours = environment_path("gcp-dev").read_bytes().replace(b'cost-center = "ml-dev"', b'cost-center = "ml-other"')
    (folder / "gcp-dev.toml").write_bytes(ours)
    monkeypatch.setenv("TIDEFLEET_ENVIRONMENTS", str(folder))
    archive, tidefleet_env = planned("gcp-dev")
    loaded = gcp_function_settings(archive, tidefleet_env, tmp_path)
    assert loaded["tags"]["cost-center"] == "ml-other"
    assert archive.name == "gcp-scaler-gcp-dev.zip" and tidefleet_env == "gcp-dev"
    assert environment_files(archive) == {"environments/gcp-dev.toml": ours}
    assert loaded == load_environment("gcp-dev").model_dump(mode="json")  # ours, from $TIDEFLEET_ENVIRONMENTS
    monkeypatch.delenv("TIDEFLEET_ENVIRONMENTS")
    assert loaded != load_environment("gcp-dev").model_dump(mode="json")  # not the repository's


@pytest.mark.parametrize("name", ["dev", "gcp-dev"])
def test_an_archive_carries_its_own_environments_file_and_no_other(tmp_path, name):
    """Every archive carried every environment's file: dev's held prod.toml."""
    env = load_environment(name)
    path, _, _ = build_archive(env, tmp_path)
    assert path == tmp_path / archive_name(env)
    assert environment_files(path) == {f"environments/{name}.toml": environment_path(name).read_bytes()}


def test_an_environment_file_edited_after_it_was_validated_is_not_packaged(tmp_path):
    """The archive holds the file as it was validated and synthesized, or nothing: an edit in
    between stops the build, one line saying to run again."""
    given = tmp_path / "gcp-stg.toml"
    shutil.copy(environment_path("gcp-dev"), given)
    env = load_environment(str(given))
    given.write_text(given.read_text().replace('cost-center = "ml-dev"', 'cost-center = "ml-stg"'))
    with pytest.raises(RuntimeError, match=r"no longer holds environment 'gcp-stg' as it was validated; it was "
                                           r"edited meanwhile: run the command again"):  # fmt: skip
        build_archive(env, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    given.write_text("not = [toml")
    with pytest.raises(RuntimeError, match=r"as it was validated \(Invalid value \(at line 1, column 8\)\); it was edited"):
        build_archive(env, tmp_path / "out")


def test_another_environments_edit_leaves_an_archive_byte_for_byte(tmp_path):
    """The archive's sha256 is the function's source_code_hash (AWS) and its object's name (GCP):
    an edit of prod.toml, or of another folder's environment, must not redeploy dev's functions."""
    repo = tmp_path / "repo"
    for top in ("lambdas", "tidefleet", "environments"):
        shutil.copytree(ROOT / top, repo / top, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    env = load_environment("gcp-dev")
    first = build_archive(env, tmp_path / "a", root=repo, env_file=repo / "environments" / "gcp-dev.toml")[1]
    (repo / "environments" / "prod.toml").write_text("# edited\n")
    (repo / "environments" / "new.toml").write_text("# new\n")
    again = build_archive(env, tmp_path / "b", root=repo, env_file=repo / "environments" / "gcp-dev.toml")[1]
    assert again == first


def test_invoke_build_builds_the_named_environment_and_says_where_its_file_came_from(tmp_path, monkeypatch, capsys):
    folder = tmp_path / "configs"
    folder.mkdir()
    shutil.copy(environment_path("gcp-dev"), folder / "gcp-stg.toml")
    monkeypatch.setenv("TIDEFLEET_ENVIRONMENTS", str(folder))
    monkeypatch.delenv("TIDEFLEET_ENV", raising=False)
    tasks.build(MockContext(), env="gcp-stg", out=str(tmp_path / "out"))
    said = capsys.readouterr()
    assert said.out.startswith(f"{tmp_path / 'out' / 'gcp-scaler-gcp-stg.zip'} sha256=")
    assert (f"note: {tmp_path / 'out' / 'gcp-scaler-gcp-stg.zip'}: environments/gcp-stg.toml is packaged from outside "
            "this checkout, so no commit records it") in said.err.splitlines()  # fmt: skip
    assert os.listdir(tmp_path / "out") == ["gcp-scaler-gcp-stg.zip"]
    with zipfile.ZipFile(tmp_path / "out" / "gcp-scaler-gcp-stg.zip") as z:
        assert json.loads(z.read(package.BUILD_INFO))["outside_checkout"] == ["environments/gcp-stg.toml"]
    with pytest.raises(Exception, match="--cloud: environment gcp-stg is on gcp, not aws"):
        tasks.build(MockContext(), env="gcp-stg", cloud="aws", out=str(tmp_path / "out"))


def test_a_deploy_whose_environment_file_changes_between_build_and_synth_stops_before_terraform(
    tmp_path, monkeypatch
):
    """The archive is built from the file as validated; the synth reads it again: where the two
    differ, terraform would deploy resources of one and functions of the other."""
    from invoke import Exit

    given = tmp_path / "staging.toml"
    shutil.copy(environment_path("dev"), given)
    built = []
    monkeypatch.setattr(tasks, "_terraform_binary", lambda: "/nonexistent/terraform")
    monkeypatch.setattr(tasks, "_check_offerings", lambda environment: None)
    monkeypatch.setattr(tasks, "build", lambda c, cloud=None, env=None: built.append((cloud, env)))

    def synth_after_an_edit(env):
        given.write_text(given.read_text().replace('cost-center = "ml-dev"', 'cost-center = "ml-stg"'))
        return tasks._env(env), tmp_path / "stack"

    monkeypatch.setattr(tasks, "_synth", synth_after_an_edit)
    with pytest.raises(Exit, match="the file of environment staging changed while it was being built and synthesized; "
                                   "run the same command again"):  # fmt: skip
        tasks.plan(MockContext(), env=str(given))
    assert built == [("aws", str(given))]
