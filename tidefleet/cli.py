"""The `tidefleet` command. Subcommands live beside the code they drive and load lazily,
so `tidefleet status` never pays for the simulator's imports."""

from __future__ import annotations

import importlib

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
    "jobs": "tidefleet.jobs.cli:jobs",
    "cost": "tidefleet.jobs.cost_cli:cost",
    "rightsize": "tidefleet.jobs.cost_cli:rightsize_command",
    "agent": "tidefleet.agent.cli:agent",
    "tick": "tidefleet.control_cli:tick",
    "simulate": "tidefleet.sim.cli:simulate",
    "sandbox": "tidefleet.sandbox.cli:sandbox",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module, attr = COMMANDS[name].split(":")
        return getattr(importlib.import_module(module), attr)


@click.group(cls=LazyGroup)
@click.version_option(package_name="tidefleet")
def main() -> None:
    """tidefleet: queue-driven, spot-first ML compute.

    Submit a job's items to a queue; nodes appear while there is work and vanish when it is
    done. Every command takes --env (an environments/<name>.toml) where it needs one.
    """


if __name__ == "__main__":
    main()
