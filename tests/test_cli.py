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
