"""`tidefleet tick`: one control tick from a laptop, against the environment's cloud."""

from __future__ import annotations

import contextlib
import json
import logging
import time
from dataclasses import asdict

import click

from tidefleet.cloud import for_env
from tidefleet.config import ConfigError, Environment, env_argument, load_environment
from tidefleet.control import TickError
from tidefleet.control import tick as run_tick


@click.command()
@click.option("--env", "env_name", envvar="TIDEFLEET_ENV", required=True, show_envvar=True,
              help="environment name or .toml path")
@click.option("--dry-run", is_flag=True, help="decide and print, change nothing (without it, the tick changes the live fleet)")
@click.option("--pool", "pools", multiple=True, help="only this pool (repeatable); default: every pool")
@click.option("--log-json", is_flag=True, help="also print the JSON decision lines the function logs")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object (schema tidefleet.tick/1) instead of text")
def tick(env_name: str, dry_run: bool, pools: tuple[str, ...], log_json: bool, as_json: bool) -> None:
    """Run one control tick by hand: read the queues and the fleet, decide, act; print each decision and why.

    Without --dry-run this changes the live fleet, as the scaler function does: it sets the
    pools' desired capacity and on-demand base and terminates the nodes it decided to remove."""
    try:
        env = load_environment(env_name)
    except ConfigError as err:
        raise click.ClickException(str(err)) from None
    unknown = sorted(set(pools) - set(env.pools))
    if unknown:
        raise click.BadParameter(
            f"unknown pool(s) {', '.join(unknown)}; known: {', '.join(env.pools)}", param_hint="--pool"
        )
    with _function_log(shown=log_json):
        _tick(env, dry_run, pools, as_json)


@contextlib.contextmanager
def _function_log(shown: bool):
    """--log-json: the JSON lines tidefleet's loggers write (what the function logs), on stderr,
    and only theirs: botocore's INFO ("Found credentials in environment variables.") goes to the
    root logger, which stays as it is. Else none: what they say is said in words."""
    if not shown:
        logging.getLogger("tidefleet.control").addHandler(logging.NullHandler())
        yield
        return
    log, handler = logging.getLogger("tidefleet"), logging.StreamHandler()  # this run's stderr
    handler.setFormatter(logging.Formatter("%(message)s"))
    level = log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        yield
    finally:
        log.removeHandler(handler)
        log.setLevel(level)


def _missing_groups(env: Environment, cloud, missing: list[str], ticked: list[str]) -> str:
    """What follows the deploy hint when only some pools' groups are missing: which, that the others
    were ticked, and the items waiting in the missing pools' queues (read here: the tick skipped them)."""
    waiting, in_flight, unread = [], 0, []
    queues = cloud.control_ports().queues
    for name in (q for q, queue in env.queues.items() if queue.pool in missing):
        try:
            backlog = queues.backlog(name)
        except Exception:  # noqa: BLE001 - a count only: the line goes on without it
            unread.append(name)
            continue
        in_flight += backlog.in_flight
        if backlog.visible:
            waiting.append((name, backlog.visible))
    groups = ", ".join(f"pool {p}'s group" for p in missing)
    line = (f", which recreates the missing group ({groups} is gone: deleted outside terraform, or the pool "
            f"was added since the deploy); the other pools ({', '.join(ticked)}) were ticked; "
            f"{sum(n for _, n in waiting)} items wait for it")
    if waiting:
        line += f" ({', '.join(f'{q} {n}' for q, n in waiting)})"
    if in_flight:
        line += f", {in_flight} in flight"
    if unread:
        line += f" (queue(s) {', '.join(unread)} not read)"
    return line


def _tick(env: Environment, dry_run: bool, pools: tuple[str, ...], as_json: bool) -> None:
    failed = summary = None
    cloud = for_env(env)
    try:
        decisions = run_tick(env, cloud.control_ports(), time.time(), pools=pools or None, dry_run=dry_run)
    except TickError as err:  # each failed action or read in the cloud's words, as a failed observe's
        decisions, summary = err.decisions, err.summary
        failed = "\n".join(f"{where}: {cloud.explain(e) if isinstance(e, cloud.errors) else f'{type(e).__name__}: {e}'}"
                           for where, e in err.failures)  # fmt: skip
    except cloud.errors as err:
        raise click.ClickException(cloud.explain(err)) from None
    dry = dry_run or env.scaler.dry_run
    undeployed = sorted(set(pools or env.pools) - {d.pool for d in decisions})
    if undeployed and failed is None:
        failed = f"no group for pool(s) {', '.join(undeployed)}: {env.name} is not deployed in {env.region}; " \
                 f"deploy it with `invoke deploy --env {env_argument(env)}`"
        if decisions:  # the others are there: only these groups are missing
            failed += _missing_groups(env, cloud, undeployed, [d.pool for d in decisions])
    if as_json:
        click.echo(json.dumps({"schema": "tidefleet.tick/1", "env": env.name, "dry_run": dry,
                               "decisions": [asdict(d) for d in decisions],
                               "failures": [] if failed is None else str(failed).splitlines()}))
        if failed is not None:
            raise SystemExit(1)
        return
    for d in decisions:
        changes = [f"desired {d.desired}"]
        if d.terminate:
            changes.append(f"terminate {', '.join(d.terminate)}")
        if d.on_demand_base is not None:
            changes.append(f"on-demand base {d.on_demand_base}")
        click.echo(f"{d.pool}: {'; '.join(changes)}{' (dry run: nothing changed)' if dry else ''}")
        for reason in d.reasons:
            click.echo(f"  - {reason}")
        if d.starved_queues:
            click.echo(f"  waiting because of a cap: {', '.join(d.starved_queues)}")
    if failed is not None:
        raise click.ClickException(str(failed) if undeployed else f"{summary}:\n{failed}")
