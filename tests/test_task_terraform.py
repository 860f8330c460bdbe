"""invoke plan / deploy / destroy when terraform fails: its output without colour codes when it
is not going to a terminal, then one line naming the step that failed and the likely fix, and
the step's exit code. A fake terraform on a temp path stands in: no test needs the real one
(nor the network its init would use)."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import pytest
from invoke import Config, Context, Exit

import tasks

FAKE = """#!/bin/sh
# A terraform that logs its arguments and fails the step $FAKE_FAIL names, saying $FAKE_SAYS.
echo "$*" >> "$(dirname "$0")/calls"
red=$(printf '\\033[31m'); plain=$(printf '\\033[0m')
case " $* " in *" -no-color "*) red=; plain=;; esac
if [ "$2" = "$FAKE_FAIL" ]; then
  printf '%sError: %s%s\\n' "$red" "$FAKE_SAYS" "$plain" >&2
  exit 3
fi
echo "$2 done"
"""


@pytest.fixture
def fake_terraform(tmp_path, monkeypatch) -> Path:
    """A fake terraform binary; the functions' build and the synth are skipped (what they do is
    tested elsewhere), the stack folder is a temp one."""
    binary = tmp_path / "bin" / "terraform"
    binary.parent.mkdir()
    binary.write_text(FAKE)
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setattr("stacks.terraform.terraform_binary", lambda: str(binary))
    monkeypatch.setattr(tasks, "build", lambda c, cloud=None, env=None: None)
    monkeypatch.setattr(tasks, "_synth", lambda env: (tasks._env(env), tmp_path / "stack"))
    monkeypatch.setattr(sys.stdout, "isatty", lambda: False)
    return binary


def context() -> Context:
    return Context(Config(overrides={"run": {"in_stream": False}}))  # pytest's stdin cannot be read


def calls(binary: Path) -> list[str]:
    return (binary.parent / "calls").read_text().splitlines()


@pytest.mark.parametrize(
    ("task", "fail", "says", "line"),
    [
        (tasks.plan, "init",
         "Failed to query available provider packages: could not connect to registry.terraform.io",
         ("terraform init failed for dev (exit 3): the providers could not be downloaded (offline, or no provider "
          "mirror); configure a provider mirror")),
        (tasks.plan, "plan", "No valid credential sources found",
         "terraform plan failed for dev (exit 3): no usable credentials; set AWS_PROFILE or AWS_ACCESS_KEY_ID"),
        (tasks.plan, "plan", "Invalid count argument",
         "terraform plan failed for dev (exit 3): its error is above; most often credentials (set AWS_PROFILE"),
        (tasks.plan, "init", "Backend initialization required",
         "terraform init failed for dev (exit 3): its error is above; most often the provider download"),
        (tasks.deploy, "apply", "dial tcp: lookup sts.us-east-1.amazonaws.com: no such host",
         "terraform apply failed for dev (exit 3): the cloud's API could not be reached"),
    ],
)
def test_a_failed_terraform_step_ends_in_one_line_naming_it_and_the_fix(fake_terraform, monkeypatch, capfd, task,
                                                                        fail, says, line):  # fmt: skip
    monkeypatch.setenv("FAKE_FAIL", fail)
    monkeypatch.setenv("FAKE_SAYS", says)
    with pytest.raises(Exit) as stopped:
        task(context(), env="dev", **({"yes": True} if task is tasks.deploy else {}))
    assert stopped.value.code == 3  # terraform's own
    assert str(stopped.value.message).startswith(line), stopped.value.message
    assert "\n" not in stopped.value.message
    out, err = capfd.readouterr()
    assert f"Error: {says}" in err and "\x1b[" not in out + err  # its own words, no colour codes into a file
    assert all(call.endswith(" -no-color") for call in calls(fake_terraform)), calls(fake_terraform)
    assert [call.split()[1] for call in calls(fake_terraform)] == (["init"] if fail == "init" else ["init", fail])


def test_terraform_keeps_its_colours_on_a_terminal(fake_terraform, monkeypatch):
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    monkeypatch.setenv("FAKE_FAIL", "none")
    tasks.plan(context(), env="dev")
    assert [call.split()[1:] for call in calls(fake_terraform)] == [["init", "-input=false"], ["plan", "-input=false"]]


@pytest.mark.parametrize(("step", "stops"), [
    ("plan", 'kill -INT $$'),  # killed by Ctrl-C's signal
    # terraform's own graceful stop: it says so and exits 1
    ("apply", 'echo "Interrupt received." >&2; echo "Gracefully shutting down..." >&2; exit 1'),
], ids=["killed", "graceful"])  # fmt: skip
def test_a_terraform_step_stopped_by_ctrl_c_says_it_was_interrupted_not_what_most_often_fails(
    fake_terraform, monkeypatch, step, stops
):
    """It said "terraform plan failed for dev (exit -2): its error is above; most often credentials"."""
    fake_terraform.write_text(FAKE.replace('echo "$2 done"', f'[ "$2" = "{step}" ] && {{ {stops}; }}\necho "$2 done"'))
    task = tasks.deploy if step == "apply" else tasks.plan
    with pytest.raises(Exit) as stopped:
        task(context(), env="dev", **({"yes": True} if step == "apply" else {}))
    assert stopped.value.code == 130  # the shell's code for Ctrl-C
    assert stopped.value.message == (f"terraform {step} for dev was interrupted (Ctrl-C) and nothing after it ran; "
                                     "run the same command again to go on (terraform keeps the state it saved)")
    assert [call.split()[1] for call in calls(fake_terraform)] == ["init", step]


def test_a_terraform_step_killed_by_another_signal_says_so_not_that_it_was_ctrl_c(fake_terraform):
    fake_terraform.write_text(FAKE.replace('echo "$2 done"', '[ "$2" = "plan" ] && kill -KILL $$\necho "$2 done"'))
    with pytest.raises(Exit) as stopped:
        tasks.plan(context(), env="dev")
    assert stopped.value.code == 1
    assert stopped.value.message.startswith("terraform plan for dev was killed by signal SIGKILL (out of memory, a "
                                            "crash, or stopped from outside)")


@pytest.mark.parametrize("step", ["apply", "destroy"])
def test_a_prompt_with_no_answer_says_to_pass_yes_not_that_credentials_most_often_fail(fake_terraform, step):
    """deploy/destroy without --yes in CI (stdin at its end): terraform says "Error: error asking for
    approval: EOF" and exits 1; the line after it blamed credentials."""
    fake_terraform.write_text(FAKE.replace('echo "$2 done"', f'[ "$2" = "{step}" ] && {{ echo "Error: error asking for '
                                           'approval: EOF" >&2; exit 1; }\necho "$2 done"'))  # fmt: skip
    with pytest.raises(Exit) as stopped:
        tasks._terraform(context(), "dev", step, "-input=false")
    assert stopped.value.code == 1
    assert stopped.value.message == (f"terraform {step} failed for dev (exit 1): terraform asked for approval and got "
                                     "no answer (stdin is not a terminal): pass --yes in a non-interactive run")


@pytest.mark.parametrize("step", ["apply", "destroy"])
def test_a_no_at_the_prompt_is_said_as_cancelled(fake_terraform, step):
    """terraform prints "Apply cancelled." (or "Destroy cancelled.") on stdout and exits 1."""
    fake_terraform.write_text(FAKE.replace('echo "$2 done"', f'[ "$2" = "{step}" ] && {{ echo "{step.capitalize()} '
                                           'cancelled."; exit 1; }\necho "$2 done"'))  # fmt: skip
    with pytest.raises(Exit) as stopped:
        tasks._terraform(context(), "dev", step, "-input=false")
    assert stopped.value.code == 1
    assert stopped.value.message == (f"terraform {step} for dev was cancelled at its prompt (only 'yes' approves): "
                                     "nothing was changed")


def _interrupt(*_args, **_kwargs):
    raise KeyboardInterrupt


@pytest.mark.parametrize("stage", ["build", "_synth"])
def test_ctrl_c_before_terraform_runs_says_nothing_was_changed(fake_terraform, monkeypatch, stage):
    """The offerings check, the functions' build and the synth come first: a Ctrl-C there ended
    invoke in exit 1 saying nothing (and a synth's Node child in its stream errors)."""
    monkeypatch.setattr(tasks, stage, _interrupt)
    with pytest.raises(Exit) as stopped:
        tasks.deploy(context(), env="dev", yes=True)
    assert stopped.value.code == 130
    assert stopped.value.message == "apply for dev: interrupted (Ctrl-C); terraform never ran: nothing was changed"
    assert not (fake_terraform.parent / "calls").exists()


@pytest.mark.parametrize(("task", "patched", "line"), [
    (tasks.synth, "_synth", "synth: interrupted (Ctrl-C); its stack folder may be half written: run it again"),
    (tasks.scan, "_synth", "scan: interrupted (Ctrl-C); nothing was scanned to the end"),
    (tasks.build, "stacks.package.build_archive", "build of dev's archive: interrupted (Ctrl-C); run it again"),
])  # fmt: skip
def test_ctrl_c_in_a_tasks_own_work_is_one_line_and_exit_130(monkeypatch, task, patched, line):
    monkeypatch.setattr(*((patched, _interrupt) if "." in patched else (tasks, patched, _interrupt)))
    with pytest.raises(Exit) as stopped:
        task(context(), env="dev")
    assert (stopped.value.code, stopped.value.message) == (130, line)
