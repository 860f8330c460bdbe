"""`tidefleet validate`: check environment files before anything is synthesized."""

from __future__ import annotations

import json
import os
from pathlib import Path

import click

from tidefleet.config import (
    ConfigError,
    environment_clashes,
    environment_path,
    environment_warnings,
    environments_dir,
    known_environments,
    load_environment,
)


@click.command()
@click.argument("envs", nargs=-1)
@click.option("--json", "as_json", is_flag=True, help="print one JSON object (schema tidefleet.validate/1)")
def validate(envs: tuple[str, ...], as_json: bool) -> None:
    """Validate ENVS (names or .toml paths; default: every environment). Exit 1 on any problem."""
    names = envs or known_environments()
    if not names:  # nothing checked is not "all good"
        raise click.ClickException(_none_found(environments_dir()))
    results, loaded = [], {}
    for name in names:
        try:
            env = load_environment(name)
        except ConfigError as err:
            results.append({"name": name, "ok": False, "error": str(err), "cloud": None, "region": None,
                            "pools": None, "queues": None})
            if not as_json:
                click.echo(str(err), err=True)
            continue
        # One file named twice (by name and by path, through a link) is one environment, not a clash.
        loaded.setdefault(environment_path(name).resolve(), (name, env))
        results.append({"name": env.name, "ok": True, "error": None, "cloud": env.cloud, "region": env.region,
                        "pools": len(env.pools), "queues": len(env.queues)})
        if not as_json:
            click.echo(f"{env.name}: ok ({env.cloud} {env.region}, {len(env.pools)} pool(s), {len(env.queues)} queue(s))")
    ok = all(r["ok"] for r in results)
    warnings = [f"{name}: {line}" for name, env in loaded.values() for line in environment_warnings(env)]
    warnings += environment_clashes(dict(loaded.values()))
    if not as_json:
        for line in warnings:
            click.echo(f"warning: {line}", err=True)
    else:
        click.echo(json.dumps({"schema": "tidefleet.validate/1", "ok": ok, "environments": results, "warnings": warnings}))
    if not ok:
        raise SystemExit(1)


def _none_found(folder: Path) -> str:
    """'no environment files in X', why, and what to give instead."""
    why = ("no such folder" if not folder.exists() else "a file, not a folder" if not folder.is_dir()
           else "no .toml files there")  # fmt: skip
    named = " (TIDEFLEET_ENVIRONMENTS)" if os.environ.get("TIDEFLEET_ENVIRONMENTS") else ""
    return (f"no environment files in {folder}{named}: {why}; give environment names or .toml paths, or set "
            "TIDEFLEET_ENVIRONMENTS to a folder of <name>.toml files")
