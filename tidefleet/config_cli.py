"""`tidefleet validate`: check environment files before anything is synthesized."""

from __future__ import annotations

import click

from tidefleet.config import ConfigError, known_environments, load_environment


@click.command()
@click.argument("envs", nargs=-1)
def validate(envs: tuple[str, ...]) -> None:
    """Validate ENVS (names or .toml paths; default: every environment). Exit 1 on any problem."""
    failed = False
    for name in envs or known_environments():
        try:
            env = load_environment(name)
        except ConfigError as err:
            failed = True
            click.echo(str(err), err=True)
            continue
        click.echo(f"{env.name}: ok ({env.cloud} {env.region}, {len(env.pools)} pool(s), {len(env.queues)} queue(s))")
    if failed:
        raise SystemExit(1)
