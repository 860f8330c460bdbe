"""The `tidefleet` command. Subcommands live beside the code they drive and load lazily,
so `tidefleet status` never pays for the simulator's imports."""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from collections.abc import Iterator

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


# command name -> its line in `tidefleet --help`: whole, where click would cut the docstring's
# first sentence at the listing's width (62 characters in 80 columns).
SUMMARIES = {
    "validate": "Check environment files; one line per problem",
    "submit": "Submit a job's items to a queue and kick the scaler",
    "status": "A job's item counts and failures, with a progress bar",
    "logs": "Print the output of a job's (or one item's) attempts",
    "cancel": "Cancel a job: queued items skipped, running ones stopped",
    "retry-failed": "Send a job's dead-lettered items back to its queue",
    "nodes": "Per pool: nodes, types, spot or on-demand, busy, GPUs",
    "jobs": "List the environment's jobs with their item counts",
    "cost": "What recorded attempts cost, by team, job, queue, user, pool",
    "rightsize": "Items per node and instance types from measured use",
    "agent": "The node agent: run a pool's items on this node",
    "tick": "One control tick by hand; changes the fleet unless --dry-run",
    "simulate": "Replay a trace through scaling policies: cost and waits",
    "sandbox": "The whole system on this machine, no cloud account needed",
}


# `tidefleet status JOB | head -1`: the reader left before the output ended. A Unix tool is killed
# by SIGPIPE then, which a shell reports as 128 + 13; click would exit 1, which `status` gives a job
# done with failed items. SIGPIPE itself stays ignored: it would kill us on a dropped connection too.
READER_LEFT = 141

# Ctrl-C: what a shell reports for SIGINT (128 + 2), and one line saying what the stop left. Click
# would print a bare "Aborted!" and exit 1, which `status` gives a job done with failed items.
# Commands with more to say (submit while sending, simulate, sandbox) say it and exit 130 themselves.
INTERRUPTED = 130
NOTHING_CHANGED = "nothing was changed"
LEFT_BY_A_STOP = {
    "submit": "nothing was sent",  # while its items are read and checked; once sending, submit counts what went
    "cancel": "the job may be cancelled in part; run the same command again to finish",
    "retry-failed": "some items may be back in their queue already; run the same command again to send the rest",
    "tick": "the tick may have acted in part (the lines above say what it did); the next tick decides again",
    "agent": "it asked its items to checkpoint and handed back those still running (the log above says which)",
}


@contextlib.contextmanager
def _reader_may_leave() -> Iterator[None]:
    """A closed stdout ends the command quietly with READER_LEFT (the `signal` docs' "Note on
    SIGPIPE" recipe), whatever wrote to it: click, rich, or the flush of what is still buffered."""
    try:
        try:
            yield
        finally:  # what is left in the buffer meets the closed pipe here, not in the interpreter's last flush
            sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing left to flush at exit fails
        raise SystemExit(READER_LEFT) from None


class LazyGroup(click.Group):
    # Before click's own EPIPE handling (exit 1): `tidefleet --help` writes in make_context, every
    # subcommand (its --help too) in invoke.
    def make_context(self, *args, **kwargs) -> click.Context:
        with _reader_may_leave():
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx: click.Context):
        with _reader_may_leave():
            try:
                return super().invoke(ctx)
            except KeyboardInterrupt:
                name = ctx.invoked_subcommand or "tidefleet"
                click.echo(f"{name}: interrupted; {LEFT_BY_A_STOP.get(name, NOTHING_CHANGED)}", err=True)
                raise SystemExit(INTERRUPTED) from None

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module, attr = COMMANDS[name].split(":")
        command = getattr(importlib.import_module(module), attr)
        if command.short_help is None:  # one set on the command itself wins
            command.short_help = SUMMARIES.get(name)
        return command


@click.group(cls=LazyGroup)
@click.version_option(package_name="tidefleet")
def main() -> None:
    """tidefleet: queue-driven, spot-first ML compute.

    Submit a job's items to a queue; nodes appear while there is work and vanish when it is
    done. Every command takes --env (an environments/<name>.toml) where it needs one.
    """


if __name__ == "__main__":
    main()
