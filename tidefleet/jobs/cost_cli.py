"""`tidefleet cost` and `tidefleet rightsize`: what the recorded attempts cost, by team, job,
queue, submitter or pool (and month), and what their measured use says about node sizes.
Thin: the store is read here; attribution is `tidefleet.costs`, advice `tidefleet.rightsize`."""

from __future__ import annotations

import csv
import io
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable

import click
from rich import progress

from tidefleet import costs, rightsize
from tidefleet.cloud import for_env
from tidefleet.config import Environment
from tidefleet.jobs.cli import CliConsole, _emit, _explained, _load, env_option, json_option
from tidefleet.jobs.identity import OS_USER
from tidefleet.jobs.sdk import JobError, not_found
from tidefleet.records import Job


def collect(env: Environment, *, since: float = 0.0, queue: str | None = None, job_id: str | None = None,
            track: Callable[[list[Job]], Iterable[Job]] = iter) -> tuple[list[costs.Charge], Counter]:  # fmt: skip
    """Every priced attempt of the environment (one queue's, one job's) ended since `since`, and
    the count of those that could not be priced, by reason. Reads every job record, then the items
    of each job with an attempt that may have ended since (`costs.may_have_charges`: O(items) of
    those jobs only), and the members' parts of such jobs whose queue is a gang queue, or no
    longer configured (a query more each: most jobs have none). `track` is handed the jobs to read
    (the CLI's progress bar: a job of 250k items takes minutes)."""
    store = for_env(env).store
    if job_id is not None:
        job = store.job(job_id)
        if job is None:
            raise not_found(store, env, job_id, "check the id printed by submit")
        found_jobs = [job]
    else:
        if queue is not None and queue not in env.queues:
            raise JobError(f"queue: unknown queue {queue!r} in environment {env.name!r}; "
                           f"known queues: {', '.join(sorted(env.queues))}")  # fmt: skip
        found_jobs = store.jobs(queue)
    found_jobs = [job for job in found_jobs if costs.may_have_charges(job, since)]
    unpriced: Counter = Counter()
    found = [c for job in track(found_jobs) for c in costs.charges(env, job, store.items(job.job_id), since=since,
                                                            parts=store.parts(job.job_id) if _may_have_parts(env, job) else None,
                                                            unpriced=unpriced)]  # fmt: skip
    return found, unpriced


def _reading(jobs: list[Job]) -> Iterable[Job]:
    """The jobs, with a bar on a terminal's stderr while their items are read (gone once done);
    piped, nothing (rich would still end its bar with a blank line)."""
    console = CliConsole(stderr=True)
    return progress.track(jobs, description="reading the jobs' attempts", console=console, transient=True,
                          disable=not jobs or not console.is_terminal)  # fmt: skip


def _may_have_parts(env: Environment, job: Job) -> bool:
    queue = env.queues.get(job.queue)
    return queue is None or queue.gang != (1, 1)


def _since(text: str) -> float:
    try:
        return costs.parse_since(text, time.time())
    except ValueError as err:  # a usage error (exit 2), as `jobs --since` gives
        raise click.UsageError(str(err)) from None


@click.command()
@env_option
@click.option("--by", type=click.Choice(costs.BY), default="team", show_default=True,
              help="sum by team, job, queue, user (the submitter) or pool")  # fmt: skip
@click.option("--since", "since_text", default="30d", show_default=True,
              help="attempts ended this long ago or later: 7d, 12h, a date 2026-01-31, or all")  # fmt: skip
@click.option("--monthly", is_flag=True, help="one row per month (UTC) and group")
@json_option
@click.option("--csv", "as_csv", is_flag=True, help="print CSV instead of text")
def cost(env_name, by, since_text, monthly, as_json, as_csv) -> None:
    """What the recorded attempts cost: node-seconds × the item's share of the node × the node's
    spot or on-demand price, summed by team, job, queue, submitter or pool. Busy time only."""
    if as_json and as_csv:
        raise click.UsageError("--json and --csv: choose one")
    env = _load(env_name)
    since = _since(since_text)
    with _explained(env):
        found, unpriced = collect(env, since=since, track=_reading)
    rows = costs.summarise(found, by, monthly=monthly)
    total = sum(r.cost_usd for r in rows)
    if as_json:
        _emit("cost", env=env.name, by=by, since=since, monthly=monthly, currency="USD", total_usd=round(total, 9),
              rows=[{"key": r.key, "month": r.month, "attempts": r.attempts, "node_hours": round(r.node_hours, 9),
                     "cost_usd": round(r.cost_usd, 9)} for r in rows],
              unpriced=dict(unpriced), idle=costs.IDLE_NOTE)  # fmt: skip
        return
    if as_csv:
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(["month", by, "attempts", "node_hours", "cost_usd"] if monthly else
                        [by, "attempts", "node_hours", "cost_usd"])  # fmt: skip
        for r in rows:
            writer.writerow(([r.month] if monthly else []) + [r.key, r.attempts, f"{r.node_hours:.9f}", f"{r.cost_usd:.9f}"])
        click.echo(out.getvalue(), nl=False)
        # On stderr, the CSV left clean: what it leaves out matters most when it is set against the bill.
        for why, n in unpriced.most_common():
            click.echo(f"not priced: {n} attempt(s): {why}", err=True)
        click.echo(costs.IDLE_NOTE, err=True)
        return
    if not rows:
        click.echo(f"no priced attempts since {time.strftime('%Y-%m-%d %H:%M', time.gmtime(since))} UTC", err=True)
    width = max([len(by)] + [len(r.key) for r in rows])
    if rows:  # the columns' names, over the rows they are sized for
        click.echo(f"{'month    ' if monthly else ''}{by:<{width}}  {'cost (USD)':>13}  {'node-hours':>17}  attempts")
    for r in rows:
        month = f"{r.month}  " if monthly else ""
        click.echo(f"{month}{r.key:<{width}}  ${r.cost_usd:>12,.4f}  {r.node_hours:>10,.3f} node-h  {r.attempts} attempt(s)")
    click.echo(f"total ${total:,.4f} (USD, {len(found)} attempt(s))")
    if by == "user" and any(r.key.startswith(OS_USER) for r in rows):
        click.echo(f"{OS_USER}NAME: the cloud identity could not be read at submit; the OS user is shown")
    for why, n in unpriced.most_common():
        click.echo(f"not priced: {n} attempt(s): {why}")
    click.echo(costs.IDLE_NOTE)


@click.command("rightsize")
@env_option
@click.option("--queue", default=None, help="only this queue's items")
@click.option("--job", "job_id", default=None, help="only this job's items")
@click.option("--since", "since_text", default="30d", show_default=True, help="attempts ended this long ago or later: 7d, 12h, a date 2026-01-31, or all")
@json_option
def rightsize_command(env_name, queue, job_id, since_text, as_json) -> None:
    """Recommend items per node, instance types and memory from measured use (cores = cpu_s /
    seconds, peak RSS, GPU memory and utilisation), with the expected saving; flag items that hit
    their memory or time limit."""
    if queue and job_id:  # a usage error (exit 2), as cost's --json with --csv
        raise click.UsageError("--queue and --job: choose one")
    env = _load(env_name)
    since = _since(since_text)
    with _explained(env):
        found, _ = collect(env, since=since, queue=queue, job_id=job_id, track=_reading)
    scopes: dict[str, list[costs.Charge]] = defaultdict(list)
    for c in found:
        scopes[f"job {c.job_id}" if job_id else f"queue {c.queue}"].append(c)
    advice = [rightsize.advise(env, scope, cs[0].pool, cs) for scope, cs in sorted(scopes.items())
              if cs[0].pool in env.pools]  # fmt: skip
    if as_json:
        _emit("rightsize", env=env.name, since=since, advice=[_advice_json(a) for a in advice])
        return
    if not advice:
        click.echo("no measured attempts to size from (none recorded with usage in this window)", err=True)
    for a in advice:
        click.echo("\n".join(_advice_lines(a)))


def _advice_json(a: rightsize.Advice) -> dict:
    def fit(f: rightsize.Fit | None) -> dict | None:
        return None if f is None else {"instance_type": f.instance_type, "items_per_node": f.items_per_node,
                                       "usd_per_item_hour": round(f.usd_per_item_hour, 9), "limited_by": f.limited_by}

    return {
        "scope": a.scope, "attempts": a.attempts, "spot": a.spot, "gang": a.gang,
        "measured": {"cores_p95": round(a.cores_p95, 3), "peak_rss_mb": a.peak_rss_mb,
                     "gpu_util_pct": a.gpu_util_pct, "gpu_mem_peak_mb": a.gpu_mem_peak_mb},
        "need": {"cores": round(a.need.cores, 3), "memory_mb": round(a.need.mem_mb, 1), "gpus": a.need.gpus,
                 "gpu_memory_mb": round(a.need.gpu_mem_mb, 1)},
        "now": [{"instance_type": n.instance_type, "items_per_node": n.items, "fits": fit(n.fits),
                 "slots_per_unit": n.slots_per_unit} for n in a.now],
        "best": fit(a.best), "item_hours": round(a.item_hours, 9), "spent_usd": round(a.spent_usd, 9),
        "expected_usd": None if a.expected_usd is None else round(a.expected_usd, 9),
        "saving_usd": round(a.saving_usd, 9),
        "hit_memory": list(a.hit_memory), "hit_time": list(a.hit_time),
    }  # fmt: skip


def _by_packing(a: rightsize.Advice) -> str:
    """How much of the saving packing the one type the items ran on as it fits gives alone (set
    slots_per_unit), so a change of type is not credited with it; '' where it is not one type."""
    (now, *others) = a.now or (None,)
    if others or now is None or now.fits is None or now.fits.items_per_node == now.items or not a.saving_usd:
        return ""
    packed = max(0.0, a.spent_usd - a.item_hours * now.fits.usd_per_item_hour)
    return f", of which ${costs.usd(min(packed, a.saving_usd))} by packing {now.instance_type} as it fits"


def _bound(f: rightsize.Fit) -> str:
    return "a gang member takes its whole node" if f.limited_by == rightsize.GANG else f"{f.limited_by} bound"


def _advice_lines(a: rightsize.Advice) -> list[str]:
    lines = [(f"{a.scope}: {a.attempts} attempt(s) measured, {a.item_hours:.3f} item-hour(s), ${costs.usd(a.spent_usd)} "
              f"({'spot' if a.spot else 'on-demand'})"),
             f"  each item used {a.cores_p95:.2f} cores (p95) and {a.peak_rss_mb:,.0f} MiB (peak); sized for "
             f"{a.need.cores:.2f} cores, {a.need.mem_mb:,.0f} MiB" + (f", {a.need.gpus:g} GPU(s)" if a.need.gpus else "")]
    if a.need.gpus or a.gpu_util_pct is not None or a.gpu_mem_peak_mb is not None:  # n/a: the driver had no reading
        util = "n/a" if a.gpu_util_pct is None else f"{a.gpu_util_pct:.0f}%"
        peak = "n/a" if a.gpu_mem_peak_mb is None else f"{a.gpu_mem_peak_mb:,.0f} MiB"
        lines.append(f"  GPU: {util} mean utilisation, {peak} peak memory")
    for n in a.now:
        itype, items, f = n.instance_type, n.items, n.fits
        if f is None:
            lines.append(f"  {itype}: {items} item(s) per node now; its size is not in tidefleet/prices.py SPECS")
        elif f.items_per_node != items:
            lines.append(f"  {itype}: {items} item(s) per node now, {f.items_per_node} fit ({f.limited_by} bound): "
                         f"set slots_per_unit = {n.slots_per_unit}")
        else:
            lines.append(f"  {itype}: {items} item(s) per node now, which is what fits ({_bound(f)})")
    if a.best is not None:
        lines.append(f"  cheapest fit: {a.best.instance_type}, {a.best.items_per_node} item(s) per node, "
                     f"${costs.usd(a.best.usd_per_item_hour)} per item-hour: ${costs.usd(a.expected_usd)} for the same work, "
                     f"saving ${costs.usd(a.saving_usd)}{_by_packing(a)}")
        if a.gang and a.best.instance_type not in {n.instance_type for n in a.now}:
            lines.append("  (a gang member takes its whole node: on another type, set the queue's slots_per_item to "
                         "that type's slots in the pool, and the workload's processes per node to match)")
    else:
        lines.append("  no sized type fits one item")
    for what, ids, fix in (("memory", a.hit_memory, ("give items more memory: fewer items per node or a type "
                                                     "with more memory per core")),
                           ("time", a.hit_time, "raise the queue's item_timeout_s, or split the items")):  # fmt: skip
        if ids:
            shown = ", ".join(ids[:rightsize.FLAGS_SHOWN]) + (" …" if len(ids) > rightsize.FLAGS_SHOWN else "")
            lines.append(f"  hit their {what} limit: {len(ids)} item(s) ({shown}): {fix}")
    return lines
