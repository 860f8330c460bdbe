"""The `tidefleet` command. Subcommands live beside the code they drive and load lazily,
so `tidefleet status` never pays for the simulator's imports."""

from __future__ import annotations

import importlib
import importlib.util

import click

# command name -> "module:attribute" of a click command
COMMANDS = {
    "validate": "tidefleet.config_cli:validate",
    "submit": "tidefleet.jobs.cli:submit",
    "status": "tidefleet.jobs.cli:status",
    "logs": "tidefleet.jobs.cli:logs",
    "cancel": "tidefleet.jobs.cli:cancel",
    "retry-failed": "tidefleet.jobs.cli:retry_failed",
    "nodes": "tidefleet.jobs.cli:nodes",
    "agent": "tidefleet.agent.cli:agent",
    "tick": "tidefleet.control_cli:tick",
    "simulate": "tidefleet.sim.cli:simulate",
    "sandbox": "tidefleet.sandbox.cli:sandbox",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(name for name in COMMANDS if self._available(name))

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS or not self._available(name):
            return None
        module, attr = COMMANDS[name].split(":")
        return getattr(importlib.import_module(module), attr)

    @staticmethod
    def _available(name: str) -> bool:
        try:
            return importlib.util.find_spec(COMMANDS[name].split(":")[0]) is not None
        except ModuleNotFoundError:
            return False


@click.group(cls=LazyGroup)
@click.version_option(package_name="tidefleet")
def main() -> None:
    """tidefleet: queue-driven, spot-first ML compute.

    Submit a job's items to a queue; nodes appear while there is work and vanish when it is
    done. Every command takes --env (an environments/<name>.toml) where it needs one.
    """


if __name__ == "__main__":
    main()
