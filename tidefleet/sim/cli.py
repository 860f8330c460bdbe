"""`tidefleet simulate`: replay a trace through scaling policies (see tidefleet.sim)."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import click

from tidefleet.config import ConfigError, Environment, load_environment
from tidefleet.costs import usd
from tidefleet.sim.engine import HORIZON, STALL_S, STALLED, Interruptions
from tidefleet.sim.plot import partial_file
from tidefleet.sim.policies import POLICY_NAMES
from tidefleet.sim.run import PolicyResult, Report, default_timing, pool_problem, with_target_wait
from tidefleet.sim.run import simulate as run_simulation
from tidefleet.sim.teams import TeamRow
from tidefleet.sim.trace import (
    TraceError,
    WindowError,
    is_dir,
    load_spot_trace,
    load_trace,
    parse_window,
    trace_name,
)
from tidefleet.sim.words import format_table, replay_title, too_long_line, usd_column

PLOT_SUFFIXES = (".png", ".svg", ".pdf")  # formats matplotlib writes by the name's suffix
# Past these a replay models no cloud (boots take 25-60 s, notices 30-120 s, spot nodes see well under a
# notice a day) and only gives up after a week with nothing served: more likely milliseconds taken for seconds.
MAXIMA = {
    "--boot-s": (86400.0, "s, a day; real boots take 25-60 s"),
    "--notice-s": (86400.0, "s, a day; real spot notices are 30-120 s"),
    "--resume-s": (86400.0, "s, a day; a checkpoint is saved and loaded again in seconds to minutes"),
    "--interruption-rate": (60.0, "notices per spot node-hour, one a minute; no node boots through more"),
}


def format_team_table(policy: str, rows: list[TeamRow], policy_cost_usd: float) -> str:
    """A markdown table, one row per team, and a last row for what the policy paid beyond the teams'
    work (`teams.py`: a team's cost is its work at the lower bound's price), so the cost column adds
    up to the policy's cost; negative only where items were left unfinished (their work is counted whole)."""
    costs = usd_column([r.cost_usd for r in rows] + [policy_cost_usd - sum(r.cost_usd for r in rows), policy_cost_usd])
    head = "| team | quota | weight | items | slot-h of work | wait p50 s | wait p95 s | cost of work $ |"
    out = [f"{policy}, by team:", head, "|" + "---|" * (head.count("|") - 1)]
    for r, cost in zip(rows, costs):  # waits in seconds, as in the policies' table and the JSON
        out.append(f"| {r.team} | {r.quota} | {r.weight} | {r.items:,} | {r.slot_hours:,.1f} | "
                   f"{r.wait_p50_s:,.0f} | {r.wait_p95_s:,.0f} | {cost} |")  # fmt: skip
    out.append(f"| (no team: idle nodes, unused slots, boots, redone work, dearer nodes) | | | | | | | {costs[-2]} |")
    out.append(f"cost of work: a team's slot-h at the pool's lowest $/slot-h, as the lower bound counts it (the same "
               f"under every policy); with the last row the column adds up to what {policy} paid, ${costs[-1]}")
    return "\n".join(out)


def stop_notes(report: Report) -> list[str]:
    """A line per policy whose replay gave up with items unfinished (its waits run to the give-up)."""
    why = {
        STALLED: f"items waited {STALL_S / 86400:.0f} days while nothing arrived, started or finished: the pool never "
                 "served them (nodes that never finish booting, or are interrupted as they boot? see --boot-s, "
                 "--interruption-rate)",
        HORIZON: "a week past the last submit plus twice the longest item, they still had not finished (waiting "
                 "behind each other, or lost to scale-in or interruptions again and again)",
    }  # fmt: skip
    return [f"note: the {r.policy} replay gave up with {r.items_unfinished} of {r.items_finished + r.items_unfinished} "
            f"items unfinished; {_held(r) if r.stopped == STALLED and r.held_queues else why[r.stopped]}"
            for r in report.results if r.stopped]  # fmt: skip


def _held(r: PolicyResult) -> str:
    queues = ", ".join(r.held_queues)
    return (f"items waited {STALL_S / 86400:.0f} days held by the team quotas (queue {queues}): a team whose quota "
            "leaves it no slot, with no idle quota of another team to borrow (tidefleet validate names the quota); "
            "see --by-team")  # fmt: skip


def plural(count: int, noun: str) -> str:
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


def unwritable(path: Path) -> str | None:
    """Why a file cannot be written at path (its folder made, its name looked up, a partial file
    made beside it), else None."""
    if is_dir(path):
        return "a folder of that name exists"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            path.stat()  # a name the OS refuses (too long) says so here; a missing file is the usual case
        except FileNotFoundError:
            pass
        partial_file(path).unlink()
    except FileExistsError as err:  # mkdir's word for a file where a folder goes
        return f"{err.filename} is a file, not a folder"
    except OSError as err:
        return err.strerror or str(err)
    return None


def chosen_pool(env: Environment, pool: str | None) -> str:
    """The pool `--pool` names, checked before the trace is read; left out: the environment's only one."""
    if pool is not None and (unknown := pool_problem(env, pool)):
        raise click.UsageError(unknown)
    if pool is None and len(env.pools) != 1:
        raise click.UsageError(f"--pool: {env.name} has {len(env.pools)} pools; name one of: {', '.join(sorted(env.pools))}")
    return pool or next(iter(env.pools))


def refused_target_wait(err: ConfigError) -> str:
    """A refused `--target-wait-s` in one line where every queue of the pool refuses it alike (the
    same rule, the same numbers), else the config's own list of problems."""
    first, rest = err.problems[0], err.problems[1:]
    rule = first.split(".", 2)[-1]  # queues.<name>.target_wait_s: ... -> target_wait_s: ...
    if rest and all(p.split(".", 2)[-1] == rule for p in rest):
        return f"{err.source}: {first} (the pool's {len(rest)} other queue{'s' * (len(rest) != 1)} alike)"
    return str(err)


def cannot_write_plot(plot: Path, why: str) -> click.ClickException:
    return click.ClickException(f"--plot: cannot write {plot} ({why}); give a writable path")


@click.command()
@click.argument("trace", type=click.Path(path_type=Path))
@click.option(
    "--env", "env_name", envvar="TIDEFLEET_ENV", show_envvar=True, required=True,
    help="environment name (environments/<name>.toml) or a .toml path"
)
@click.option("--pool", help="pool whose instance types, slots and prices are simulated (the environment's one pool if left out)")
@click.option("--policy", "policies", multiple=True, type=click.Choice(POLICY_NAMES), default=("tidefleet",),
              show_default=True, help="policy to replay; repeat for several")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="print the report as JSON (schema in tidefleet.sim)")
@click.option(
    "--plot", type=click.Path(path_type=Path), help="write cost vs p95 wait and a timeline to this file (.png, .svg or .pdf)"
)
@click.option("--window", help="START:END: only items with START <= submit_s < END (either side may be left out)")
@click.option("--seed", default=0, show_default=True, help="seed for every random pick")
@click.option(
    "--spot-trace",
    type=click.Path(path_type=Path),
    help="skypilot spot-traces JSON: interruptions and refusals",
)
@click.option("--interruption-rate", type=float, help="spot notices per spot node-hour (Poisson; at most 60)")
@click.option("--boot-s", type=float, help="launch to first heartbeat, s (default: AWS 45, GCP 35; at most a day)")
@click.option("--notice-s", type=float, help="spot notice to reclaim, s (default: AWS 120, GCP 30; at most a day)")
@click.option("--resume-s", type=float,
              help="work a preempted or moved attempt does again when it resumes: checkpoint save and load, s (default 60)")
@click.option("--by-team", is_flag=True, help="also a table per policy: each team's quota, wait and cost")
@click.option("--target-wait-s", "target_waits", type=int, multiple=True,
              help="also replay tidefleet with this target_wait_s on every queue of the pool (a row "
                   "'tidefleet, target_wait_s=N'); repeat for a curve of cost against wait")  # fmt: skip
def simulate(
    trace,
    env_name,
    pool,
    policies,
    as_json,
    plot,
    window,
    seed,
    spot_trace,
    interruption_rate,
    boot_s,
    notice_s,
    resume_s,
    by_team,
    target_waits,
):
    """Replay TRACE (CSV: submit_s, duration_s; optional gpus, cpus, group; - reads it from stdin) through
    scaling policies on one pool."""
    if plot is not None and plot.suffix.lower() not in PLOT_SUFFIXES:
        raise click.UsageError(f"--plot: give a file name ending {', '.join(PLOT_SUFFIXES)} (got '{plot}')")
    if plot is not None and importlib.util.find_spec("matplotlib") is None:  # before the replay, not after it
        raise click.UsageError("--plot needs matplotlib, which the base install leaves out: pip install matplotlib")
    if plot is not None and (why := unwritable(plot)):  # not after a replay of hours
        raise click.UsageError(cannot_write_plot(plot, why).message)
    if spot_trace and interruption_rate is not None:
        raise click.UsageError("use either --spot-trace or --interruption-rate, not both")
    for flag, value in (
        ("--interruption-rate", interruption_rate),
        ("--boot-s", boot_s),
        ("--notice-s", notice_s),
        ("--resume-s", resume_s),
    ):
        if value is not None and not (math.isfinite(value) and value >= 0):  # nan and inf too: a replay never ends
            raise click.UsageError(f"{flag}: must be a finite number >= 0 (got {value})")
        most, why = MAXIMA.get(flag, (math.inf, ""))
        if value is not None and value > most:
            raise click.UsageError(f"{flag}: at most {most:g} ({why}) (got {value:g})")
    try:
        env = load_environment(env_name)
        pool = chosen_pool(env, pool)
        for seconds in target_waits:  # a flag the config refuses: a usage error before the trace is read
            try:
                with_target_wait(env, pool, seconds)
            except ConfigError as err:
                raise click.UsageError(refused_target_wait(err)) from None
        bounds = parse_window(window) if window else None
        items = load_trace(trace, bounds)
        interruptions = Interruptions(
            rate_per_hour=interruption_rate or 0.0, spot=load_spot_trace(spot_trace) if spot_trace else None
        )
        report = run_simulation(
            env, pool, items, list(dict.fromkeys(policies)), trace_name=trace_name(trace), timing=default_timing(env, boot_s, notice_s, resume_s),
            interruptions=interruptions, spot_trace_name=Path(spot_trace).name if spot_trace else None,
            seed=seed, window=bounds, by_team=by_team, progress=lambda line: click.echo(line, err=True),
            target_waits=target_waits,
        )  # fmt: skip
    except WindowError as err:  # the command line's window, as every other flag: a usage error
        raise click.UsageError(str(err)) from None
    except (ConfigError, TraceError, ValueError) as err:
        raise click.ClickException(str(err)) from None
    except KeyboardInterrupt:  # click's bare "Aborted!" (exit 1) says nothing of what was lost
        click.echo("simulate: interrupted; nothing written", err=True)
        raise SystemExit(130) from None  # the shell's code for Ctrl-C, as submit and invoke bench
    if as_json:
        click.echo(json.dumps(report.to_json()))  # one object on one line, as every --json
    else:
        unfit = report.unfittable
        click.echo(f"{replay_title(report)}: {plural(report.items, 'item')}, lower bound ${usd(report.lower_bound_usd)}, zero-wait bound ${usd(report.zero_wait_usd)}")  # fmt: skip
        if report.gangs["count"]:
            click.echo(f"gangs: {plural(report.gangs['count'], 'item')} replayed on whole nodes at once "
                       f"(by nodes: {report.gangs['by_nodes']})")  # fmt: skip
        if unfit["count"]:
            room = (
                f"{unfit['most_nodes']} nodes of {plural(unfit['largest_node_slots'], 'slot')} (the pool's gangs)"
                if unfit["most_nodes"] > 1
                else f"the {plural(unfit['largest_node_slots'], 'slot')} of the pool's biggest node"
            )
            need = "needs" if unfit["count"] == 1 else "need"
            click.echo(f"not replayed: {plural(unfit['count'], 'item')} {need} more than {room} "
                       f"(by slots: {unfit['by_slots']})")  # fmt: skip
        if left_out := too_long_line(report.too_long):
            click.echo(left_out)
        click.echo(format_table(report))
        for note in stop_notes(report):
            click.echo(note)
        paid = {r.policy: r.cost_usd for r in report.results}
        for policy, rows in report.teams.items():
            click.echo("\n" + format_team_table(policy, rows, paid[policy]))
    if plot:
        from tidefleet.sim.plot import plot_report

        # Drawn beside it, then put in its place: a Ctrl-C or a full disk leaves an older plot as it was.
        partial = None
        try:
            partial = partial_file(plot)
            plot_report(report, partial)
            partial.replace(plot)
        except OSError as err:  # the place changed during the replay, a read-only file
            if partial:
                partial.unlink(missing_ok=True)
            raise cannot_write_plot(plot, err.strerror or str(err)) from None
        except KeyboardInterrupt:  # the result is out already
            if partial:
                partial.unlink(missing_ok=True)
            click.echo(f"simulate: interrupted while writing the plot; {plot} not written", err=True)
            raise SystemExit(130) from None
        if not as_json:
            click.echo(f"plot: {plot}", err=True)  # stdout carries the result alone
