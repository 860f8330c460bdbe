"""`tidefleet sandbox --workdir DIR` with a relative DIR: every node runs in its own folder
under DIR, so the sandbox makes DIR absolute once; a node's agent work dir is DIR's, not a copy
of DIR nested inside the node's folder."""

from __future__ import annotations

import signal
import sys
import time

import pytest
from click.testing import CliRunner

from tidefleet.cli import main
from tidefleet.sandbox import cli as sandbox_cli
from tidefleet.sandbox.imds import MetadataServer
from tidefleet.sandbox.launcher import Launcher

# What the agent does with its work dir (agent.cli: `.absolute()`, from its cwd, the node's folder).
USER_DATA = ('#!/bin/bash\n"$PYTHON" -c \'import os, pathlib; '
             'print(pathlib.Path(os.environ["TIDEFLEET_AGENT_WORK_DIR"]).absolute())\' > seen.part && mv seen.part seen\n')  # fmt: skip


class OneInstance:
    """The groups' side of the launcher: one in-service instance with USER_DATA, no emulator."""

    def in_service(self):
        return {"i-0001": ("cpu", "c6i.large")}

    def is_spot(self, instance_id):
        return False

    def user_data(self, instance_id):
        return USER_DATA


@pytest.fixture
def handlers():
    """The sandbox command sets SIGTERM and SIGINT handlers for its run: put pytest's back."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def test_a_relative_workdir_holds_the_nodes_agent_work_dir_itself_not_a_copy_nested_in_the_node(
    tmp_path, monkeypatch, handlers
):
    seen: dict[str, str] = {}

    def boot_one_node(env, environments, workdir, console, **_):
        """The sandbox's run, cut to the part that starts a node from the work folder it was given."""
        imds = MetadataServer().start()
        launcher = Launcher(env, imds, workdir=workdir, node_env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable},
                            boot_delay_s=0, grace_s=1, reclaim_after_s=1)  # fmt: skip
        launcher.machines = OneInstance()
        try:
            record = workdir / "nodes" / "i-0001" / "seen"
            deadline = time.time() + 15
            while not record.exists() and time.time() < deadline:
                launcher.step(time.time())
                time.sleep(0.05)
            console_log = record.parent / "console.log"
            seen["agent work dir"] = (record.read_text().strip() if record.exists()
                                      else f"no node booted: {console_log.read_text() if console_log.exists() else ''}")  # fmt: skip
        finally:
            launcher.shutdown()
            imds.stop()

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sandbox_cli, "_run", boot_one_node)
    result = CliRunner().invoke(main, ["sandbox", "--workdir", "sb", "--items", "0"])
    assert result.exit_code == 0, result.output
    assert seen["agent work dir"] == str(tmp_path / "sb" / "nodes" / "i-0001" / "work")


@pytest.mark.parametrize(
    ("workdir", "problem"),
    [
        ("/proc/x", "cannot create /proc/x (No such file or directory)"),  # FileNotFoundError
        ("{file}/sub", "cannot create {file}/sub (Not a directory)"),  # NotADirectoryError
        ("/proc", "cannot write in /proc ("),  # there, but no file can be made in it
    ],
)
def test_a_workdir_that_cannot_be_made_is_a_bad_option_before_anything_starts(
    tmp_path, monkeypatch, handlers, workdir, problem
):
    started = []
    monkeypatch.setattr(sandbox_cli, "_run", lambda *a, **k: started.append(a))
    file = tmp_path / "f.csv"
    file.write_text("x\n")
    result = CliRunner().invoke(main, ["sandbox", "--workdir", workdir.format(file=file), "--items", "1"])
    assert result.exit_code == 2, result.output
    assert f"Invalid value for --workdir: {problem.format(file=file)}" in result.output, result.output
    assert "Traceback" not in result.output and not started


def test_a_workdir_an_earlier_sandbox_used_is_refused_before_anything_starts(tmp_path, monkeypatch, handlers):
    """Its records would count as the new run's: the demo job has the same id every run, so the
    earlier run's events.jsonl made every item 'ran to success twice' (exit 1), and its items'
    checkpoints (completion markers) are the new run's. A run going on in it is refused the same way."""
    started = []
    monkeypatch.setattr(sandbox_cli, "_run", lambda *a, **k: started.append(a))
    workdir = tmp_path / "wd"
    first = CliRunner().invoke(main, ["sandbox", "--workdir", str(workdir), "--items", "1"])
    again = CliRunner().invoke(main, ["sandbox", "--workdir", str(workdir), "--items", "1"])
    assert first.exit_code == 0, first.output
    assert again.exit_code == 2, again.output
    assert (f"Invalid value for --workdir: {workdir} holds an earlier sandbox run (.tidefleet-sandbox), whose records "
            "would count as this run's; give a new folder, or remove that one") in " ".join(again.output.split())  # fmt: skip
    assert "Traceback" not in again.output and len(started) == 1


def test_an_emulator_that_dies_at_start_is_one_line_with_what_it_died_of(tmp_path, handlers):
    """The audit: a port taken between the sandbox's choice and moto's bind (or a profile this
    machine lacks) ended in a traceback saying 'is moto[server] installed?'."""
    import socket

    from tidefleet import emulator

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    real = emulator.free_port
    emulator.free_port = lambda: taken.getsockname()[1]
    try:
        result = CliRunner().invoke(main, ["sandbox", "--workdir", str(tmp_path / "wd"), "--items", "1"])
    finally:
        emulator.free_port = real
        taken.close()
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert "the sandbox could not start: moto server exited at start (code 1): " in result.output
    assert "in use" in result.output, result.output


def test_a_port_taken_before_moto_binds_it_is_chosen_again(tmp_path):
    import socket

    from tidefleet import emulator

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    first = taken.getsockname()[1]
    ports = iter([first])
    real = emulator.free_port
    emulator.free_port = lambda: next(ports, None) or real()
    try:
        moto = emulator.start_moto(log=tmp_path / "moto.log")
    finally:
        emulator.free_port = real
        taken.close()
    try:
        assert moto.url != f"http://127.0.0.1:{first}"
    finally:
        moto.stop()


def test_an_empty_workdir_is_refused_not_the_current_folder(tmp_path, monkeypatch):
    """The audit: `--workdir ''` (an unset variable in a script) filled the current folder, a
    repository's root, with the run's inputs, logs and checkpoints; `invoke sandbox --workdir ''`
    quietly used a temp folder instead."""
    from invoke import MockContext

    import tasks

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sandbox_cli, "_run", lambda *a, **k: pytest.fail("the sandbox started"))
    result = CliRunner().invoke(main, ["sandbox", "--workdir", "", "--items", "1"])
    assert result.exit_code == 2 and "'' names no folder" in result.output, result.output
    assert list(tmp_path.iterdir()) == []
    from invoke import Exit

    with pytest.raises(Exit) as ended:
        tasks.sandbox(MockContext(), workdir="", items="1")
    assert ended.value.code == 2 and list(tmp_path.iterdir()) == []
