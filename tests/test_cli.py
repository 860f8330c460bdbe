"""The `tidefleet` command lists and loads every subcommand."""

from click.testing import CliRunner

from tidefleet.cli import COMMANDS, main


def test_every_subcommand_loads_and_explains_itself():
    runner = CliRunner()
    listing = runner.invoke(main, ["--help"])
    assert listing.exit_code == 0
    for name in COMMANDS:
        assert name in listing.output
        result = runner.invoke(main, [name, "--help"])
        assert result.exit_code == 0, (name, result.output)
        assert "Usage: main " + name in result.output or f"Usage: tidefleet {name}" in result.output
