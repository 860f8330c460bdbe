"""`tidefleet sandbox`: the whole system on this machine, no cloud account needed."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import click

from tidefleet.cloud import for_env
from tidefleet.config import ConfigError, environment_path, load_environment
from tidefleet.options import finite

MARKER = ".tidefleet-sandbox"  # in the work folder: a sandbox run claimed it


@click.command()
@click.option("--env", "env_name", default="sandbox", show_default=True,
              help="environment to run: a name in environments/ or your own .toml file (an aws one)")
@click.option(
    "--items",
    default=200,
    show_default=True,
    type=click.IntRange(0, 10_000),
    help="items in the demo job (0: no demo; with --keep, just the system)",
)
@click.option("--chaos", is_flag=True,
              help="SIGKILL random nodes, send spot notices and duplicate item messages while the job runs")
@click.option("--keep", is_flag=True, help="stay up afterwards and print how to point the CLI at it")
@click.option("--train", is_flag=True,
              help="instead of the demo job: GPU items sharing nodes on their own devices, and a 2-node training "
                   "gang that gets a spot notice and resumes (environment sandbox-train unless --env names another)")
@click.option(
    "--time-limit",
    default=600,
    show_default=True,
    type=click.IntRange(10),
    help="give up after this many seconds",
)
@click.option(
    "--tick",
    type=click.FloatRange(0.2, 3600),
    callback=finite,
    help="control tick in seconds (default: the environment's scaler.tick_s)",
)
@click.option(
    "--boot-delay",
    default=1.5,
    show_default=True,
    type=click.FloatRange(0, 3600),
    callback=finite,
    help="seconds from in service to the node's boot",
)
@click.option("--seed", default=7, show_default=True, help="seed of the generated inputs and of --chaos")
@click.option(
    "--workdir",
    type=click.Path(file_okay=False),
    callback=lambda ctx, param, value: _named_folder(value),
    help="inputs, node logs, checkpoints (default: a new temp dir)",
)
@click.option(
    "--json", "as_json", is_flag=True, help="print only the summary, as JSON (for scripts and tests)"
)
def sandbox(env_name, items, chaos, keep, train, time_limit, tick, boot_delay, seed, workdir, as_json) -> None:
    """A moto server, the environment's queues, table and groups, the scaler on a fast clock,
    nodes as local processes running their real user-data, and a demo job: watch machines
    appear, do the work and go back to zero. Exit 0 when every item is accounted for and the fleet is
    back at zero (a pool with `min` > 0 never is: the run ends at --time-limit, exit 2, saying so)."""
    from tidefleet.jobs.cli import CliConsole
    from tidefleet.sandbox.run import Timing

    source = click.get_current_context().get_parameter_source
    if train:  # its own scenario: options of the demo job would be ignored without a word
        given = [f"--{name}" for name in ("items", "chaos") if source(name) is not click.core.ParameterSource.DEFAULT]
        if given:
            raise click.UsageError(f"--train runs its own scenario instead of the demo job, which {' and '.join(given)} "
                                   f"{'shape' if len(given) > 1 else 'shapes'}; drop {' and '.join(given)} or --train")
    if train and source("env_name") is click.core.ParameterSource.DEFAULT:
        env_name = "sandbox-train"
    try:
        env = load_environment(env_name)
    except ConfigError as err:
        raise click.ClickException(str(err)) from None
    if env.cloud != "aws":
        raise click.BadParameter(f"{env.name} is a {env.cloud} environment; the sandbox emulates AWS only "
                                 "(set cloud = \"aws\" in a copy of it)", param_hint="--env")  # fmt: skip
    if train:
        from tidefleet.sandbox.training import NotATrainingEnvironment, Queues

        try:
            Queues.of(env)
        except NotATrainingEnvironment as err:
            raise click.BadParameter(str(err), param_hint="--env") from None
    console = CliConsole(stderr=as_json)
    temporary = workdir is None
    # Absolute once: each node runs in its own folder under it, so a relative one would nest there.
    workdir = _workdir(workdir).absolute()
    # SIGTERM ends the run like Ctrl-C does, so every node process and the emulator go too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    summary, failed, interrupted = None, False, False
    try:
        summary = _run(env, environment_path(env_name).resolve().parent, workdir, console, items=items, chaos=chaos,
                       keep=keep, train=train, deadline=time.time() + time_limit,
                       timing=Timing(boot_delay_s=boot_delay, tick_s=tick), seed=seed, as_json=as_json)  # fmt: skip
    except KeyboardInterrupt:  # Ctrl-C mid-run: on its way out, _run stopped every node and the emulator
        interrupted = True
    except Exception:  # the emulator died (its line names moto.log in the folder), or worse
        failed = True
        raise
    finally:
        # A temp workdir goes, unless the run failed: then its node and scaler logs are the evidence.
        if temporary and not failed and (summary is None or summary.ok):
            shutil.rmtree(workdir, ignore_errors=True)
            if summary is not None and not as_json:
                console.print(f"{workdir} removed (--workdir DIR keeps the work folder)", highlight=False, markup=False)
    if interrupted:
        where = f"{workdir} removed (--workdir DIR keeps the work folder)" if temporary else f"work folder {workdir} kept"
        console.print(f"interrupted: every node and the emulator stopped; {where}", highlight=False, soft_wrap=True,
                      markup=False)  # fmt: skip
        sys.exit(130)
    if summary is not None and not summary.ok:
        console.print(f"node logs and the scaler log are kept in {workdir}", highlight=False, markup=False)
        sys.exit(2 if summary.time_limit_hit else 1)


def _named_folder(value: str | None) -> Path | None:
    """--workdir as given; '' (an unset variable in a script) would be the current folder, which
    the run would fill with its inputs, logs and checkpoints."""
    if value == "":
        raise click.BadParameter("'' names no folder; give one (a new or empty folder), or leave the option out for a "
                                 "temp folder")  # fmt: skip
    return None if value is None else Path(value)


def _workdir(workdir: Path | None) -> Path:
    """The work folder, created and claimed with a marker file before anything starts: one that
    cannot be made or written is a bad --workdir (or TMPDIR), not a traceback once the emulator
    is up; one an earlier (or a running) sandbox claimed is refused, as the demo job has the same
    id every run: its events and its items' checkpoints there would count as this run's."""
    try:
        if workdir is None:
            workdir = Path(tempfile.mkdtemp(prefix="tidefleet-sandbox-"))
    except OSError as err:
        raise click.ClickException(f"cannot create a temp folder in {tempfile.gettempdir()} ({err.strerror or err}); "
                                   "set TMPDIR to a folder that can be written, or give --workdir DIR") from None
    doing = "create"
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        doing = "write in"
        # Created only if absent, in one step: of two runs started at once, one claims the folder.
        os.close(os.open(workdir / MARKER, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    except FileExistsError:
        raise click.BadParameter(
            f"{workdir} holds an earlier sandbox run ({MARKER}), whose records would count as this run's; "
            "give a new folder, or remove that one",
            param_hint="--workdir",
        ) from None
    except OSError as err:
        raise click.BadParameter(f"cannot {doing} {workdir} ({err.strerror or err}); give a folder that can be written",
                                 param_hint="--workdir") from None
    return workdir


def _run(env, environments: Path, workdir: Path, console, *, items, chaos, keep, train, deadline, timing, seed, as_json):
    """Bring the sandbox up, run the demo job (unless items is 0), stay up under --keep; the summary."""
    started = time.time()
    with contextlib.ExitStack() as stack:
        try:
            box = _started(stack, console, env, workdir, timing, environments)
        except RuntimeError as err:  # the emulator did not come up: what it died of, in one line
            raise click.ClickException(f"the sandbox could not start: {err}") from None
        except Exception as err:
            from tidefleet.sandbox.run import MOTO_LOG

            _emulator_failed(env, err, workdir / MOTO_LOG)  # while the sandbox provisions
            raise
        try:
            return _up(box, env, workdir, console, started=started, items=items, chaos=chaos, keep=keep, train=train,
                       deadline=deadline, seed=seed, as_json=as_json)  # fmt: skip
        except KeyboardInterrupt:
            _stopping(console)
            raise
        except Exception as err:
            # The emulator died under it: every call fails now, and that is the one thing to say.
            with contextlib.suppress(subprocess.TimeoutExpired):
                box.moto.process.wait(timeout=2)  # a refused call may beat the exit's reaping
            if (gone := box.emulator_gone()) is not None:
                raise click.ClickException(gone) from None
            _emulator_failed(env, err, box.moto.log)
            raise


def _emulator_failed(env, err: Exception, log: Path) -> None:
    """ClickException for an emulator's error (moto's HTTP 500 under load, its own), in one line."""
    cloud = for_env(env)
    if isinstance(err, cloud.errors):
        raise click.ClickException(f"the emulator failed a call the sandbox made: {cloud.explain(err)}; its log is "
                                   f"{log}; start the sandbox again") from None  # fmt: skip


def _started(stack: contextlib.ExitStack, console, *args):
    """A `Sandbox(*args)`, entered on `stack`. A Ctrl-C while it starts (moto, then the queues, table
    and groups: seconds) is said at once and acted on once it is up: its __enter__ stops only what
    it has a handle on, and a Ctrl-C while moto was starting (its process running, start_moto not
    yet returned) left the emulator running after the sandbox had exited."""
    interrupted, box = False, None

    def defer(*_) -> None:
        nonlocal interrupted
        if not interrupted:
            interrupted = True
            _stopping(console)
            signal.signal(signal.SIGINT, defer)
        # A second one is ignored while the emulator runs: a start cut short would leave it behind.
        # Once a terminal's Ctrl-C has ended it too, nothing is left to stop, and the start can only
        # fail on it, seconds later: no reason to wait for that.
        elif box is None or box.emulator_gone() is not None:
            raise KeyboardInterrupt

    # Installed even where it was started with SIGINT ignored (a background job of a shell without
    # job control, as in a CI script): Python then leaves it ignored, and `--keep` ran on.
    signal.signal(signal.SIGINT, defer)
    try:
        from tidefleet.sandbox.run import Sandbox

        box = Sandbox(*args)
        stack.enter_context(box)
    except Exception:
        if interrupted:  # a terminal's Ctrl-C reached the emulator too, and its start failed on that
            raise KeyboardInterrupt from None
        raise
    finally:
        # Interrupted: a Ctrl-C from here is ignored while the stack stops what __enter__ started.
        signal.signal(signal.SIGINT, signal.SIG_IGN if interrupted else signal.default_int_handler)
    if interrupted:
        raise KeyboardInterrupt
    return box


def _up(box, env, workdir: Path, console, *, started, items, chaos, keep, train, deadline, seed, as_json):
    """The demo job (unless items is 0), then up under --keep until Ctrl-C or the emulator's end."""
    from rich.markup import escape

    from tidefleet.sandbox.run import Chaos, run_demo

    if not as_json:
        console.print(f"[bold]tidefleet sandbox[/bold]: moto on {box.moto.url}, work in {escape(str(workdir))}", highlight=False)
    summary = None
    if train:
        from tidefleet.sandbox.training import run_training

        summary = _watched(box, console, started=started, as_json=as_json,
                           run=lambda draw: run_training(box, deadline=deadline, on_progress=draw))  # fmt: skip
    elif items:
        strike = Chaos(random.Random(seed)) if chaos else None
        summary = _watched(box, console, started=started, as_json=as_json,
                           run=lambda draw: run_demo(box, items=items, deadline=deadline, chaos=strike,
                                                     on_progress=draw, seed=seed))  # fmt: skip
    if keep:
        lines = [*box.export_lines(), *box.try_lines(workdir / "my-items.txt")]
        console.print("\n[bold]The sandbox stays up.[/bold] In another shell, paste:\n")
        console.print("\n".join(lines), highlight=False, markup=False, soft_wrap=True)
        console.print("\nCtrl-C stops everything.")
        try:
            while (gone := box.emulator_gone()) is None:
                time.sleep(1)
            raise click.ClickException(gone)
        except KeyboardInterrupt:
            _stopping(console)
    return summary


def _stopping(console) -> None:
    """Ctrl-C: say so at once (stopping the nodes and the emulator takes seconds), and let no second
    Ctrl-C cut that short and leave node processes behind (SIGTERM still ends it the same way)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    console.print("Ctrl-C: stopping every node and the emulator", highlight=False)


def _watched(box, console, *, started: float, as_json: bool, run):
    """`run(on_progress)` under the live view (none with --json); its summary, printed (as JSON with
    --json): the demo's table, or the training scenario's rows."""
    from rich.table import Table
    from rich.text import Text

    from tidefleet.cloud import for_env
    from tidefleet.sandbox import view
    from tidefleet.sandbox.training import TrainingSummary

    env, store = box.env, for_env(box.env).store
    screen = None if as_json else view.Screen(console)

    def draw(progress: dict) -> None:
        if screen is not None:
            busy = {hb.node_id: hb.busy_slots for pool in env.pools for hb in store.heartbeats(pool).values()}
            screen.show(env_name=env.name, started=started, status=progress["status"], queues=progress["queues"],
                        nodes=box.launcher.snapshot(), busy=busy,
                        reasons=[r for d in box.last_decisions for r in d.reasons],
                        tick_error=box.tick_error or (box.launcher.error and f"launcher: {box.launcher.error}"))  # fmt: skip

    try:
        summary = run(draw)
    finally:
        if screen is not None:
            screen.close()
    if as_json:
        click.echo(summary.to_json())
        return summary
    console.print()
    if not isinstance(summary, TrainingSummary):
        console.print(view.summary_table(summary))  # its notes included
        return summary
    table = Table("", "", box=None, show_header=False, pad_edge=False)
    for name, value in summary.rows():
        table.add_row(Text(name), Text(str(value)))
    console.print(table)
    for note in summary.notes:
        console.print(f"note: {note}", highlight=False, markup=False)
    return summary
