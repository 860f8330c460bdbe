"""`tidefleet validate`: check environment files before anything is synthesized."""

from __future__ import annotations

import json

import click

from tidefleet.config import ConfigError, known_environments, load_environment


@click.command()
@click.argument("envs", nargs=-1)
@click.option("--json", "as_json", is_flag=True, help="print one JSON object (schema tidefleet.validate/1)")
def validate(envs: tuple[str, ...], as_json: bool) -> None:
    """Validate ENVS (names or .toml paths; default: every environment). Exit 1 on any problem."""
    results = []
    for name in envs or known_environments():
        try:
            env = load_environment(name)
        except ConfigError as err:
            results.append({"name": name, "ok": False, "error": str(err), "cloud": None, "region": None,
                            "pools": None, "queues": None})
            if not as_json:
                click.echo(str(err), err=True)
            continue
        results.append({"name": env.name, "ok": True, "error": None, "cloud": env.cloud, "region": env.region,
                        "pools": len(env.pools), "queues": len(env.queues)})
        if not as_json:
            click.echo(f"{env.name}: ok ({env.cloud} {env.region}, {len(env.pools)} pool(s), {len(env.queues)} queue(s))")
    ok = all(r["ok"] for r in results)
    if as_json:
        click.echo(json.dumps({"schema": "tidefleet.validate/1", "ok": ok, "environments": results}))
    if not ok:
        raise SystemExit(1)
