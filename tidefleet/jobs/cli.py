"""`tidefleet submit | status | logs | cancel | retry-failed | nodes`: thin wrappers over the SDK.

Every command finds the environment's endpoints from its name (--env, default $TIDEFLEET_ENV)
and turns cloud errors into a line that says what to do.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections import Counter
from dataclasses import asdict

import click
from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn
from rich.table import Table
from rich.text import Text

from tidefleet.cloud import for_env
from tidefleet.config import ConfigError, Environment, env_argument, load_environment
from tidefleet.costs import parse_since
from tidefleet.jobs import sdk
from tidefleet.jobs.spec import JobSpec
from tidefleet.options import finite

json_option = click.option("--json", "as_json", is_flag=True,
                            help="print JSON (schema in the README) instead of text")
env_option = click.option(
    "--env", "env_name", envvar="TIDEFLEET_ENV", required=True, show_envvar=True,
    help="environment name or .toml path",
)


def _load(env_name: str) -> Environment:
    try:
        return load_environment(env_name)
    except ConfigError as err:
        raise click.ClickException(str(err)) from None


@contextlib.contextmanager
def _explained(env: Environment):
    """A failed cloud call ends in one line that says what is wrong and what to do."""
    cloud = for_env(env)
    try:
        yield
    except sdk.JobError as err:
        raise click.ClickException(str(err)) from None
    except cloud.errors as err:
        line = cloud.explain(err)  # and what the SDK noted of where it stopped (the explanation is a note too)
        raise click.ClickException("; ".join([line, *(n for n in getattr(err, "__notes__", ()) if n != line)])) from None


@click.command()
@env_option
@click.option("--name", required=True, help="job name; the job id derives from it (re-submitting the same items to the same queue is a no-op; other items under that name are refused)")
@click.option("--queue", required=True, help="queue name from the environment file")
@click.option("--items", "items_from", required=True, help="file of URIs or JSON lines, '-' for stdin")
@click.option("--job-id", default=None, help="explicit job id instead of one derived from the name")
@click.option("--image", default=None, help="container image for this job, or ':TAG' of the pool's image "
              "(the queue's accept_images must allow other images)")
@click.option("--command", "command", default=None, help="command for this job, item args appended "
              "(the queue's accept_commands must allow it)")
@click.option("--item-env", "job_env", multiple=True, metavar="KEY=VALUE", help="environment for this job's items (repeatable)")
@click.option("--slots", type=int, default=None, help="slots (GPUs) per item, at most the queue's slots_per_item")
@click.option("--timeout", "timeout_s", type=int, default=None, help="seconds per attempt, at most the queue's item_timeout_s")
@click.option("--max-retries", type=int, default=None, help="failed attempts retried, at most the queue's max_retries")
@click.option("--after", default=None, metavar="JOB", help="hold the items until job JOB has succeeded")
@click.option("--after-finished", is_flag=True, help="with --after: hold them until JOB has finished, however")
def submit(env_name, name, queue, items_from, job_id, image, command, job_env, slots, timeout_s, max_retries,
           after, after_finished) -> None:
    """Submit a job: record it and its items, send them to the queue, kick the scaler.
    The job runs its queue's pool command or container unless --image, --command, --item-env,
    --slots, --timeout or --max-retries say otherwise, within what the queue allows."""
    if after_finished and after is None:
        raise click.UsageError("--after-finished needs --after JOB: the job to wait for")
    env = _load(env_name)
    pairs = [kv.partition("=") for kv in job_env]
    if bad := [key for key, eq, _ in pairs if not eq]:
        raise click.BadParameter(f"got {bad[0]!r}; write KEY=VALUE", param_hint="--item-env")
    if twice := [key for key, n in Counter(key for key, _, _ in pairs).items() if n > 1]:
        raise click.BadParameter(f"{twice[0]!r} given more than once; give each KEY once", param_hint="--item-env")
    spec = JobSpec(image=image, command=command, env={k: v for k, _, v in pairs}, slots=slots, timeout_s=timeout_s,
                   max_retries=max_retries)  # fmt: skip
    done, started = 0, None

    def told(n: int) -> None:
        nonlocal done
        done += n
        bar.advance(task, n)

    def recorded(job) -> None:  # the id at once: a long submit can be followed (and resumed) by it
        nonlocal started
        started = job
        if job.chunk and not job.submitting:  # submitted before: the last line says so
            return
        doing = (f"recording {len(items)} item(s) on {job.queue}, held until {job.after} has "
                 f"{'finished' if job.after_finished else 'succeeded'}" if job.waiting
                 else f"sending {len(items)} item(s) to {job.queue}")  # fmt: skip
        bar.console.print(f"job {job.job_id}: {doing}; if stopped, the same command continues it",
                          markup=False, highlight=False, soft_wrap=True)  # one line: the id is copied from it

    def stopping(chunks: int, seconds: float) -> None:  # Ctrl-C: say at once what it waits for
        bar.console.print(f"stopping: {done} item(s) sent so far; waiting up to {seconds:g} s for {chunks} chunk(s) "
                          "in flight; Ctrl-C again to leave now", markup=False, highlight=False, soft_wrap=True)

    with _explained(env):
        items = sdk.read_items(items_from)
        try:
            with Progress(TextColumn("sending"), BarColumn(), TextColumn("{task.completed}/{task.total} items"),
                          console=CliConsole(stderr=True), transient=True, disable=len(items) < 1000) as bar:
                task = bar.add_task("", total=len(items))
                result = sdk.submit(env, name, queue, items, job_id=job_id, progress=told, on_job=recorded, spec=spec,
                                    after=after, after_finished=after_finished, flags=True, on_stop=stopping)  # fmt: skip
        except KeyboardInterrupt as stop:  # said once the bar is gone: a live bar is drawn again over a line
            click.echo(f"interrupted: {_sent(started, done, stop)}", err=True)
            raise SystemExit(130) from None
    if result.already:
        click.echo(f"job {result.job_id}: already submitted ({result.total} item(s)); nothing recorded or sent again; "
                   f"`tidefleet status --env {env_argument(env)} {result.job_id}` shows its progress")  # fmt: skip
    elif result.held:  # what the record waits for (a re-run's options were checked against it)
        click.echo(f"job {result.job_id}: {result.total} item(s), {result.new_items} new, held: sent once job "
                   f"{started.after} has {'finished' if started.after_finished else 'succeeded'}")  # fmt: skip
    else:
        click.echo(f"job {result.job_id}: {result.total} item(s), {result.new_items} new, {result.sent} sent; {result.kick}")


def _sent(job, done: int, stop: KeyboardInterrupt) -> str:
    """What a stopped submit sent, and that the same command continues it. Items are counted once
    their chunk is marked; a chunk cut short may have sent some of its items: "at least"."""
    again = "run the same command again to finish (nothing is sent twice)"
    if job is None:
        return f"nothing sent; {again}"
    if isinstance(stop, sdk.SubmitInterrupted) and stop.unconfirmed:  # given up on: sent or not, unknown
        return (f"job {job.job_id}: at least {done} of {job.total} item(s) confirmed sent, {stop.unconfirmed} chunk(s) "
                "still in flight unconfirmed; run the same command again: it continues the job")  # fmt: skip
    return f"job {job.job_id}: at least {done} of {job.total} item(s) sent; {again}"


class CliConsole(Console):
    def on_broken_pipe(self) -> None:
        """rich's own exits 1, the code `status` gives a job done with failed items: the closed pipe
        goes on to the CLI's main instead, which ends every command alike (tidefleet.cli)."""
        raise BrokenPipeError


def _console(**kwargs) -> Console:
    # User text (ids, reasons, output) goes through escape(); emoji codes like :x: stay as typed.
    # Piped (CI logs, grep), lines and tables are as wide as their text: rich would fold them at 80
    # columns and cut node ids short.
    console = CliConsole(emoji=False, **kwargs)
    if not console.is_terminal:
        console.width = PIPED_WIDTH
    return console


PIPED_WIDTH = 10_000


def one_line(text: str) -> str:
    """Stored text on one line as it was written, each control character (a line break, a tab, an
    escape sequence's ESC) as its escape ('\\n', '\\x1b'): a workload's coloured last line in a
    failure reason, or a name recorded before submit refused them, reaches no terminal raw."""
    return sdk.CONTROL.sub(lambda m: repr(m.group())[1:-1], text)


FAILED_SHOWN = 10  # failed items listed by `status` before --failed is needed
REASONS_SHOWN = 5  # most common failure reasons, with counts
WATCH_S = 2.0  # seconds between refreshes under --watch


def _view(status: sdk.JobStatus, *, all_failed: bool) -> list:
    """What `status` shows: progress bar, counts, the commonest failure reasons and the first
    failed items (every one with --failed), each on one line however long: for grep."""
    c, total = status.counts, max(status.job.total, 1)
    finished = c["succeeded"] + c["failed"] + c["cancelled"]
    progress = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"))
    progress.add_task(escape(status.job.job_id), total=total, completed=finished)
    cancelled = "  [cancelled job]" if status.job.cancelled else ""
    lines: list = [progress.get_renderable(), Text("  ".join(f"{k} {v}" for k, v in c.items()) + cancelled)]
    if status.job.spec:
        lines.append(Text("  spec: " + "  ".join(f"{k} {one_line(str(v))}" for k, v in status.job.spec.items())))
    if status.job.cancel_reason not in ("", "cancelled"):  # not by a user: a timeout, a failed dependency
        lines.append(Text(f"  cancelled: {one_line(status.job.cancel_reason)}"))
    if status.job.waiting and not status.job.cancelled:
        until = "finish" if status.job.after_finished else "succeed"
        lines.append(Text(f"  waiting for {status.job.after} to {until}: its items are recorded, not sent yet"))
    if status.submitting:
        lines.append(Text(f"  submitting: {status.sent} of {status.job.total} item(s) sent so far; "
                          "if its submit is no longer running, run the same submit again"))
    elif status.job.cancelled and status.job.submitting:
        lines.append(Text("  cancelled while it was being submitted: items never recorded are counted as cancelled"))
    elif status.unrecorded:
        lines.append(Text(f"  {status.unrecorded} item(s) not recorded yet: run the same submit again"))
    failed = [i for i in status.items if i.status == "failed"]
    reasons = Counter(i.reason for i in failed).most_common()
    if len(reasons) > 1 and reasons[0][1] > 1:  # all different (a reason naming its item): the list below says it
        lines.append(Text("  top failure reasons:"))
        lines += [Text(f"    {n} x {one_line(reason)}") for reason, n in reasons[:REASONS_SHOWN]]
        if len(reasons) > REASONS_SHOWN:
            lines.append(Text(f"    ... and {len(reasons) - REASONS_SHOWN} other reason(s)"))
    shown = failed if all_failed else failed[:FAILED_SHOWN]
    lines += [Text(f"  failed {i.item_id}: {one_line(i.reason)}") for i in shown]
    if len(shown) < len(failed):
        lines.append(Text(f"  ... and {len(failed) - len(shown)} more failed item(s): --failed lists them all"))
    return lines


def _print(console: Console, lines: list) -> None:
    for line in lines:  # soft_wrap: a long reason stays one line
        console.print(line, soft_wrap=True)


def _emit(schema: str, **fields) -> None:
    """One JSON object on one line; `schema` is versioned: fields are only ever added."""
    click.echo(json.dumps({"schema": f"tidefleet.{schema}/1", **fields}, separators=(",", ":")))


def status_json(status: sdk.JobStatus) -> dict:
    job = status.job
    failed = [{"item_id": i.item_id, "reason": i.reason, "exit_code": i.exit_code}
              for i in status.items if i.status == "failed"]
    return {"job_id": job.job_id, "name": job.name, "queue": job.queue, "created_at": job.created_at,
            "total": job.total, "cancelled": job.cancelled, "state": sdk.listed_state(status), "done": status.done,
            "counts": status.counts, "unrecorded": status.unrecorded, "submitting": status.submitting,
            "sent": status.sent, "failed": failed, "spec": job.spec, "waiting_for": job.after if job.waiting and not job.cancelled else None,
            "cancel_reason": job.cancel_reason,
            "warnings": list(status.warnings)}


def _warn(status: sdk.JobStatus) -> None:
    for warning in status.warnings:
        click.echo(f"warning: {warning}", err=True)


def _finish(status: sdk.JobStatus) -> None:
    """Exit 1 when the job is done with failed items or cancelled (`status --watch J && next` must
    not go on after a cancel, a scheduled run's timeout or a failed --after); 0 otherwise (done
    with every item succeeded, or still running)."""
    if status.done and (status.counts["failed"] or status.counts["cancelled"] or status.job.cancelled):
        raise SystemExit(1)


@click.command()
@env_option
@click.argument("job_id")
@click.option("--watch", is_flag=True, help=f"redraw every {WATCH_S:g} s until every item has a final status")
@click.option("--time-limit", type=click.FloatRange(min=0), default=None, metavar="S", callback=finite,
              help="with --watch: give up after S seconds (exit 1)")
@click.option("--failed", "all_failed", is_flag=True, help=f"list every failed item (default: the first {FAILED_SHOWN})")
@json_option
def status(env_name, job_id, watch, time_limit, all_failed, as_json) -> None:
    """Counts of succeeded / running / queued / failed / cancelled items, with a progress bar.

    Exit status: 0 when every item succeeded, or the job still runs; 1 when it is done with failed
    items or cancelled, when --watch gives up at --time-limit, or on an error; 130 on Ctrl-C; 141
    when its reader leaves before the output ends (| head -1), as every tidefleet command."""
    env, console = _load(env_name), _console()
    if time_limit is not None and not watch:
        raise click.BadParameter("only applies with --watch; add --watch or drop it", param_hint="--time-limit")
    with _explained(env):
        current = sdk.status(env, job_id)
        if as_json:  # under --watch, one line per refresh; warnings are in the object
            _emit("status", **status_json(current))
            current = _watch_json(env, job_id, current, watch, time_limit)
        elif not watch or current.done:
            _print(console, _view(current, all_failed=all_failed))
            _warn(current)
        elif not console.is_terminal:  # piped: a view whenever it changed, not one redrawn in place
            deadline, shown = _deadline(time_limit), _counts(current)
            _print(console, _view(current, all_failed=all_failed))
            while not current.done and _wait(deadline):
                current = sdk.status(env, job_id)
                if _counts(current) != shown:
                    shown = _counts(current)
                    _print(console, _view(current, all_failed=all_failed))
            _warn(current)
        else:
            deadline = _deadline(time_limit)
            with Live(Group(*_view(current, all_failed=all_failed)), console=console, auto_refresh=False) as live:
                while not current.done and _wait(deadline):
                    current = sdk.status(env, job_id)
                    live.update(Group(*_view(current, all_failed=all_failed)), refresh=True)
            _warn(current)
    _gave_up(current, watch, time_limit)
    _finish(current)


def _counts(status: sdk.JobStatus) -> tuple:
    return tuple(sorted(status.counts.items())), status.done


def _deadline(time_limit: float | None) -> float | None:
    return None if time_limit is None else time.monotonic() + time_limit


def _wait(deadline: float | None) -> bool:
    """Sleep until the next refresh; False once the deadline has passed."""
    left = None if deadline is None else deadline - time.monotonic()
    if left is not None and left <= 0:
        return False
    time.sleep(WATCH_S if left is None else min(WATCH_S, left))
    return True


def _watch_json(env, job_id: str, current: sdk.JobStatus, watch: bool, time_limit: float | None) -> sdk.JobStatus:
    deadline = _deadline(time_limit)
    while watch and not current.done and _wait(deadline):
        current = sdk.status(env, job_id)
        _emit("status", **status_json(current))
    return current


def _gave_up(current: sdk.JobStatus, watch: bool, time_limit: float | None) -> None:
    if watch and not current.done:
        finished = sum(current.counts[s] for s in ("succeeded", "failed", "cancelled"))
        click.echo(f"gave up after --time-limit {time_limit:g}s: job {current.job.job_id} not done "
                   f"({finished}/{current.job.total} items final)", err=True)
        raise SystemExit(1)


@click.command()
@env_option
@click.argument("job_id")
@click.argument("item_id", required=False)
@json_option
def logs(env_name, job_id, item_id, as_json) -> None:
    """Print the output of every attempt of JOB_ID's items (or of ITEM_ID only).

    With --json: one object per line, {"schema", "job_id", "stream", "line"}."""
    env = _load(env_name)
    with _explained(env):
        current = None
        for stream, line in sdk.log_lines(env, job_id, item_id):
            if as_json:
                _emit("log", job_id=job_id, stream=stream, line=line)
            else:
                if stream != current:
                    click.echo(f"==> {stream} <==")
                click.echo(line)
            current = stream
        if current is None:
            click.echo(_no_logs(env, job_id, item_id), err=True)


def _no_logs(env: Environment, job_id: str, item_id: str | None) -> str:
    """Why an item has no lines: "no logs yet" reads as "never ran", so one whose record shows
    an attempt says it ran and printed nothing."""
    store = for_env(env).store  # (a job that does not exist was refused by sdk.log_lines)
    item = store.item(job_id, item_id) if item_id else None
    if item is not None and not item.attempts and item.status in ("cancelled", "failed"):  # final: none will come
        why = f": {item.reason}" if item.reason and item.reason != item.status else ""
        return f"no logs for {job_id}/{item_id}: it never ran ({item.status}{why})"
    if item_id is None and (job := store.job(job_id)) is not None and job.cancelled:
        return f"no logs for {job_id}: it was cancelled, and none of its items printed anything"
    if item is None or not item.attempts:
        return f"no logs yet for {job_id}{'/' + item_id if item_id else ''}"
    if item.status == "running":
        return (f"no output from {job_id}/{item_id} yet: it is running (attempt {item.attempts}) "
                "and has printed nothing so far")
    return (f"no output from {job_id}/{item_id}: it ran ({item.attempts} attempt{'s' if item.attempts > 1 else ''}, "
            f"now {item.status}) and printed nothing")


@click.command()
@env_option
@click.argument("job_id")
def cancel(env_name, job_id) -> None:
    """Cancel a job: queued items are skipped, running ones are stopped by their agents."""
    env = _load(env_name)
    with _explained(env):
        done = sdk.cancel_job(env, job_id)
    if not done.already:
        click.echo(f"job {job_id} cancelled: {done.cancelled} waiting item(s) cancelled; running items stop within a heartbeat")
    elif done.cancelled:  # an earlier cancel stopped midway
        click.echo(f"job {job_id} already cancelled; {done.cancelled} waiting item(s) it left cancelled now; "
                   "running items stop within a heartbeat")  # fmt: skip
    else:
        click.echo(done.already)


@click.command()
@env_option
@click.argument("job_id")
def retry_failed(env_name, job_id) -> None:
    """Send JOB_ID's dead-lettered items back to its queue with a fresh retry budget."""
    env = _load(env_name)
    with _explained(env):
        n = sdk.retry_failed(env, job_id)
        how = sdk.kick_scaler(env, f"retry-failed {job_id}") if n else "nothing to do"
    click.echo(f"job {job_id}: {n} item(s) sent back; {how}")


@click.command()
@env_option
@json_option
def nodes(env_name, as_json) -> None:
    """Per pool: nodes, type, spot/on-demand, busy/idle, GPUs (from heartbeats and groups); a node
    the group no longer lists is shown gone until the scaler forgets its heartbeat (not while the
    pool has no group: the line under its table says so)."""
    env = _load(env_name)
    with _explained(env):
        pools = sdk.nodes(env)
    if as_json:
        _emit("nodes", env=env.name, pools=[asdict(p) for p in pools])
        return
    console = _console()
    for pool in pools:
        group = "group not found" if pool.desired is None else f"desired {pool.desired}, {pool.instances} instance(s)"
        if not pool.nodes:  # an empty table under its title would leave the user to guess why
            console.print(f"pool {escape(pool.pool)}: {group}{_no_nodes(env, pool)}", highlight=False, soft_wrap=True)
            continue
        table = Table(title=f"pool {escape(pool.pool)}: {group}", title_justify="left")
        for column in ("node", "type", "lifecycle", "busy/slots", "state", "GPUs", "heartbeat"):
            table.add_column(column)
        for n in pool.nodes:
            state = ("gone, " if n.gone else "") + "cannot run items" if n.fault else \
                "gone" if n.gone else "draining" if n.draining else "busy" if n.busy_slots else "idle"
            table.add_row(escape(n.node_id), escape(n.instance_type), "spot" if n.spot else "on-demand", f"{n.busy_slots}/{n.slots}",
                          state, str(n.gpus), _heartbeat_age(n.heartbeat_age_s))
        console.print(table)
        for n in pool.nodes:  # why it took no items, whole: a table cell would cut it
            if n.fault:
                console.print(f"{escape(n.node_id)} could not run items: {escape(one_line(n.fault))}", highlight=False,
                              soft_wrap=True)  # fmt: skip
        if pool.desired is None and pool.nodes:  # the scaler skips a pool without a group: its records stay
            deploy = f"invoke deploy --env {escape(env_argument(env))}"
            console.print(f"pool {escape(pool.pool)} has no group: its {len(pool.nodes)} node(s) above went "
                          "with it, and their heartbeat records stay listed until it is deployed again "
                          f"({deploy}), as the scaler forgets only the nodes of a group it finds",
                          highlight=False, soft_wrap=True)  # fmt: skip


def _heartbeat_age(age_s: float) -> str:
    """'12s ago'; a heartbeat from a node whose clock is ahead (the scaler reads it as written now,
    `control.CLOCK_SLACK_S`) says so rather than '0s ago'."""
    from tidefleet.control import CLOCK_SLACK_S

    if -age_s > CLOCK_SLACK_S:
        return f"now (its clock is {-age_s:.0f}s ahead)"
    return f"{max(0.0, age_s):.0f}s ago"


def _no_nodes(env: Environment, pool: sdk.PoolRow) -> str:
    """Why a pool lists no node, and whether that is normal."""
    if pool.desired is None:
        return f", no nodes; `invoke deploy --env {escape(env_argument(env))}` creates it"
    if pool.desired == 0:
        return (": no nodes; normal with nothing to run: the pool scales to zero, and the scaler starts nodes "
                "when items are queued")
    return (": no node has reported yet; each is listed from its agent's first heartbeat, typically "
            f"{env.pools[pool.pool].boot_estimate_s} s after launch")


@click.command("jobs")
@env_option
@click.option("--queue", default=None, help="only this queue's jobs")
@click.option("--state", type=click.Choice(sdk.JOB_STATES), default=None,
              help="running (items not final yet), done (none failed), failed (done with failed items), "
              "cancelling (cancelled, its running items stopping) or cancelled")
@click.option("--since", "since_text", default="all", show_default=True,
              help="only jobs created this long ago or later: 7d, 12h, a date (2026-01-31, UTC) or all")
@json_option
def jobs(env_name, queue, state, since_text, as_json) -> None:
    """List the environment's jobs, oldest first, with their item counts.

    It reads the job records only, counts from their counters (on AWS through the table's jobs
    index; a table deployed before the index is read whole, with a warning); `status` shows why
    a job's items failed."""
    try:
        since = parse_since(since_text, time.time())
    except ValueError as err:
        raise click.UsageError(str(err)) from None
    env = _load(env_name)
    with _explained(env):
        found = sdk.jobs(env, queue=queue, state=state, since=since)
    if as_json:
        fields = ("job_id", "name", "queue", "created_at", "total", "cancelled", "state", "done", "counts", "unrecorded")
        _emit("jobs", env=env.name, jobs=[{k: status_json(s)[k] for k in fields} for s in found])
        return
    if not found:
        click.echo(f"no jobs{f' on queue {queue}' if queue else ''}{f' in state {state}' if state else ''}"
                   f"{f' since {since_text}' if since else ''}", err=True)  # fmt: skip
        return
    for s in found:  # one line per job, however long: for grep and cut
        c = s.counts
        created = time.strftime("%Y-%m-%d %H:%M", time.gmtime(s.job.created_at))
        click.echo(f"{s.job.job_id}  {s.job.queue}  {sdk.listed_state(s)}  {c['succeeded'] + c['failed'] + c['cancelled']}/{s.job.total} "
                   f"final ({c['failed']} failed, {c['running']} running)  created {created}  {one_line(s.job.name)}")
