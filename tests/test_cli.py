"""The `tidefleet` command lists and loads every subcommand."""

from click.testing import CliRunner

from tidefleet.cli import COMMANDS, SUMMARIES, main


def test_every_subcommand_loads_and_explains_itself():
    runner = CliRunner()
    listing = runner.invoke(main, ["--help"])
    assert listing.exit_code == 0
    for name in COMMANDS:
        assert name in listing.output
        result = runner.invoke(main, [name, "--help"])
        assert result.exit_code == 0, (name, result.output)
        assert "Usage: main " + name in result.output or f"Usage: tidefleet {name}" in result.output


def test_the_listing_gives_each_command_a_whole_summary():
    """click cuts a docstring's first sentence at the listing's width ("Run one control tick: read
    the queues and the fleet,..."): each command's line is its summary, whole."""
    listing = CliRunner().invoke(main, ["--help"], terminal_width=80).output
    commands = listing.split("Commands:\n", 1)[1].splitlines()
    assert set(SUMMARIES) == set(COMMANDS) and len(commands) == len(COMMANDS), listing
    for line in commands:
        name, summary = line.split(maxsplit=1)
        assert summary == SUMMARIES[name] and not summary.endswith("..."), line


def test_tick_help_says_it_changes_the_live_fleet_without_dry_run():
    text = " ".join(CliRunner().invoke(main, ["tick", "--help"]).output.split())
    assert "Without --dry-run this changes the live fleet" in text
    assert "--dry-run decide and print, change nothing (without it, the tick changes the live fleet)" in text


def test_ctrl_c_in_any_command_exits_130_with_one_line_saying_what_the_stop_left(monkeypatch):
    """Click printed a bare "Aborted!" and exited 1, which `status` gives a job done with failed items."""
    from tidefleet.jobs import sdk

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    for name in ("status", "cancel_job"):
        monkeypatch.setattr(sdk, name, interrupted)
    runner = CliRunner()
    watch = runner.invoke(main, ["status", "--env", "dev", "some-job", "--watch"])
    assert (watch.exit_code, watch.stderr) == (130, "status: interrupted; nothing was changed\n")
    cancel = runner.invoke(main, ["cancel", "--env", "dev", "some-job"])
    assert (cancel.exit_code, cancel.stderr) == (
        130, "cancel: interrupted; the job may be cancelled in part; run the same command again to finish\n")


def test_ctrl_c_while_submit_reads_its_items_says_nothing_was_sent(tmp_path):
    """A real SIGINT, while `submit --items FIFO` waits for items that never come."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from ctrl_c import as_at_a_terminal

    fifo = tmp_path / "items"
    os.mkfifo(fifo)
    child = subprocess.Popen(as_at_a_terminal([sys.executable, "-m", "tidefleet.cli", "submit", "--env", "dev", "--queue",
                                               "default", "--name", "x", "--items", str(fifo)]),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.monotonic() + 60
    while True:  # the write end opens once the child opened it to read: past its imports, however slow the machine
        try:
            writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError:  # ENXIO: no reader yet
            assert child.poll() is None and time.monotonic() < deadline, child.communicate()
            time.sleep(0.05)
    child.send_signal(signal.SIGINT)
    out, err = child.communicate(timeout=60)
    os.close(writer)
    assert (child.returncode, out, err.splitlines()[-1:]) == (130, "", ["submit: interrupted; nothing was sent"]), err
    assert "Aborted" not in err and "Traceback" not in err
