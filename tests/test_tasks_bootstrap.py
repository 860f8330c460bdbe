"""invoke bootstrap refuses a --branch or --deploy-envs value that would widen the deploy role's
trust (a `*` or `?` is a StringLike wildcard: any branch or any environment could deploy), that
names nothing, or that no branch or environment can be called, before anything is synthesized."""

from __future__ import annotations

import pytest
from invoke import Exit, MockContext

import tasks


@pytest.fixture
def synthesized(monkeypatch) -> list[dict]:
    """synth_bootstrap, replaced: the options of each call (none for a refused value)."""
    calls: list[dict] = []
    monkeypatch.setattr("stacks.aws.bootstrap.synth_bootstrap", lambda out, **options: calls.append(options) or out)
    monkeypatch.setattr("stacks.scan.scan", lambda out, name: 0)
    return calls


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"ci": "gitlab", "branch": "*"},
         ("--branch: '*' is not a branch name: '*' and '?' would let every matching branch assume the deploy role; "
          "give the one deploy branch (letters, digits, '.', '_', '-', '/'), such as main")),
        ({"ci": "gitlab", "branch": "rel?"}, "--branch: 'rel?' is not a branch name"),
        ({"branch": ""}, "--branch: '' is not a branch name"),
        ({"branch": "a b"}, "--branch: 'a b' is not a branch name"),
        ({"deploy_envs": "*"},
         ("--deploy-envs: '*' is not an environment name: '*' and '?' would let every matching environment assume "
          "the deploy role; give the deploy environments, comma-separated (each letters, digits, '.', '_', '-'), "
          "such as dev,prod")),
        ({"deploy_envs": ""},
         ("--deploy-envs: '' names no environment, and a deploy role that no environment may assume deploys "
          "nothing; give the deploy environments, comma-separated, such as dev,prod")),
        ({"deploy_envs": "no pe,$x"}, "--deploy-envs: 'no pe' is not an environment name"),
        ({"deploy_envs": "dev,,prod"}, "--deploy-envs: '' is not an environment name"),
    ],
)
def test_a_wildcard_empty_or_impossible_name_is_refused_before_synthesizing(synthesized, options, message):
    with pytest.raises(Exit) as refused:
        tasks.bootstrap(MockContext(), repo="a/b", **options)
    assert refused.value.code == 1
    assert refused.value.message.startswith(message), refused.value.message
    assert synthesized == []


def test_plain_names_are_synthesized_as_given(synthesized):
    tasks.bootstrap(MockContext(), repo="a/b", ci="gitlab", branch="release/v1.2", deploy_envs="dev, prod-eu")
    (options,) = synthesized
    assert options["branch"] == "release/v1.2" and options["environments"] == ("dev", "prod-eu")


@pytest.fixture
def gcp_envs(tmp_path, monkeypatch):
    """gcp-dev with its state in a GCS bucket, as gcp-ci, beside gcp-dev itself and an AWS one."""
    from tidefleet.config import environment_path

    text = environment_path("gcp-dev").read_text()
    (tmp_path / "gcp-dev.toml").write_text(text)
    (tmp_path / "gcp-ci.toml").write_text(text + '\n[state]\nbackend = "gcs"\nbucket = "acme-tf"\n')
    (tmp_path / "dev.toml").write_text(environment_path("dev").read_text())
    monkeypatch.setenv("TIDEFLEET_ENVIRONMENTS", str(tmp_path))
    calls: list[dict] = []
    monkeypatch.setattr("stacks.gcp.bootstrap.synth_gcp_bootstrap", lambda out, **options: calls.append(options) or out)
    monkeypatch.setattr("stacks.scan.scan", lambda out, name: 0)
    return calls


def test_a_gcp_environment_with_gcs_state_synthesizes_the_gcp_bootstrap_for_its_project(gcp_envs):
    tasks.bootstrap(MockContext(), repo="a/b", env="gcp-ci", deploy_envs="gcp-ci,gcp-dev")
    (options,) = gcp_envs
    assert (options["project"], options["state_bucket"]) == ("acme-ml-dev", "acme-tf")
    assert [e.name for e in options["environments"]] == ["gcp-ci", "gcp-dev"]


@pytest.mark.parametrize(
    ("env", "deploy_envs", "message"),
    [
        ("gcp-dev", "gcp-dev", '--env: gcp-dev has no GCS state backend; give a GCP environment with [state] backend = "gcs"'),
        ("gcp-ci", "gcp-ci,dev", "--deploy-envs: dev is not a GCP environment of project acme-ml-dev"),
    ],
)
def test_a_gcp_bootstrap_without_gcs_state_or_with_another_clouds_deploy_environment_is_refused(gcp_envs, env,
                                                                                                 deploy_envs, message):  # fmt: skip
    with pytest.raises(Exit) as refused:
        tasks.bootstrap(MockContext(), repo="a/b", env=env, deploy_envs=deploy_envs)
    assert refused.value.message.startswith(message), refused.value.message
    assert gcp_envs == []
