"""invoke tasks: thin wrappers, each calls into the library or terraform.

`invoke --list` shows them; `invoke --help TASK` explains each flag. User mistakes end in
a message that says what to do, never a traceback.
"""

from __future__ import annotations

import atexit
import errno
import os
import shlex
import signal
import sys
from contextlib import contextmanager
from pathlib import Path

from invoke import Exit, task

ROOT = Path(__file__).resolve().parent
OUT = ROOT / "build"
ENV_HELP = ("environment: a name from environments/ (or $TIDEFLEET_ENVIRONMENTS), or a .toml file's path "
            "(default: $TIDEFLEET_ENV, as for the tidefleet CLI)")


_READER_LEFT = []  # set once a closed pipe ended the run: `_exit_141`


def _reader_left(kind, err, tb, *, _default=sys.excepthook) -> None:
    """`invoke --list | head -1`: the reader closed the pipe, and invoke's next print raised
    BrokenPipeError to the top. A Unix tool then says nothing (tasks' own cleanup already ran as it
    unwound); stdout goes to /dev/null so the interpreter's last flush does not raise it again."""
    if not issubclass(kind, BrokenPipeError):
        _default(kind, err, tb)
        return
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    _READER_LEFT.append(True)


@atexit.register  # at tasks.py's import: it runs after the exit handlers registered since (LIFO)
def _exit_141() -> None:
    """An uncaught exception exits 1 whatever its hook does: a run the reader left exits 141 (128 +
    SIGPIPE), as the tidefleet commands do and a shell reports a tool the closed pipe killed."""
    if _READER_LEFT:
        sys.stderr.flush()
        os._exit(141)


sys.excepthook = _reader_left


def _env_default() -> str | None:
    """$TIDEFLEET_ENV, the environment the tidefleet CLI uses when --env is left out."""
    return os.environ.get("TIDEFLEET_ENV") or None


def _env(name: str | None):
    from tidefleet.config import ConfigError, environments_dir, known_environments, load_environment

    known = ", ".join(known_environments()) or f"none (no .toml files in {environments_dir()})"
    _refuse_empty_env(name, known)
    name = name or _env_default()
    if not name:
        raise Exit(f"--env is required (or set TIDEFLEET_ENV); known environments: {known}")
    try:
        return load_environment(name)
    except ConfigError as err:
        raise Exit(str(err)) from None


def _refuse_empty_env(name: str | None, known: str) -> None:
    """`--env ''` (in CI, `--env "$EMPTY"`) is a mistake, not "left out": it would quietly run on
    whatever $TIDEFLEET_ENV names, a deploy --yes included."""
    if name == "":
        fallback = f" ({_env_default()!r})" if _env_default() else ""
        raise Exit(f"--env: '' names no environment; give one (known: {known}), or leave the option out to use "
                   f"$TIDEFLEET_ENV{fallback}")  # fmt: skip


def _number(flag: str, value, kind: type = int):
    """An option's value as a number, or a one-line error naming the flag and the value (invoke
    itself would end a non-number given to an int option in a traceback: hence string defaults)."""
    try:
        number = kind(value)
    except (TypeError, ValueError):
        raise Exit(f"--{flag}: must be {'a whole number' if kind is int else 'a number'} (got {value!r})") from None
    if not 0 <= number < float("inf"):  # negative, infinite or NaN
        raise Exit(f"--{flag}: must be a finite number, not negative (got {value!r})")
    return number


def _run(c, command: str, *, reads_stdin: bool = False, **kwargs):
    """`c.run`, mirroring invoke's stdin into the child only where the child reads it. Mirrored,
    a Ctrl-C once invoke's stdin was at its end (a CI job, `< /dev/null`) ended in invoke's
    ValueError traceback: it had closed the child's stdin and wrote ^C into it. Not mirrored, the
    Ctrl-C reaches the child as the signal alone."""
    return c.run(command, **kwargs) if reads_stdin else c.run(command, in_stream=False, **kwargs)


def _output_folder(folder: Path) -> Path:
    """`folder` under build/, made; where build/ is a file or cannot be written, one line naming it
    and what to do (the stacks' own mkdir ended in a NotADirectoryError traceback)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if not os.access(folder, os.W_OK):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(folder))
    except OSError as err:
        raise Exit(f"cannot write {err.filename or folder} ({err.strerror or err}); {_out_fix()}") from None
    return folder


def _out_fix() -> str:
    return f"the tasks write under {OUT}: make it a folder you can write (move away a file of that name)"


@contextmanager
def _ctrl_c_says(what: str, left: str):
    """Ctrl-C in a task's own Python work (a child's stop is read from its exit, `_terraform`): one
    line saying what it left and exit 130; invoke ended it in exit 1 saying nothing."""
    try:
        yield
    except KeyboardInterrupt:
        raise Exit(f"{what}: interrupted (Ctrl-C); {left}", 130) from None


def _synth(name: str):
    env = _env(name)  # before importing the stacks: a bad config fails in a second, not ten
    from stacks.app import synth as synth_stack

    out = synth_stack(env, _output_folder(OUT / "synth" / env.name))
    print(f"synthesized {env.name} -> {out}")
    return env, out


@task(help={"env": ENV_HELP})
def synth(c, env=None):
    """Validate an environment and synthesize its Terraform JSON into build/synth/<env>/."""
    with _ctrl_c_says("synth", "its stack folder may be half written: run it again"):
        _synth(env)


@task(help={"env": ENV_HELP})
def scan(c, env=None):
    """Synthesize, then run checkov (offline) on the Terraform JSON; fail on any failed check.

    Suppressions live in stacks/checkov_suppressions.toml, one per (check, resource) with its reason.
    """
    with _ctrl_c_says("scan", "nothing was scanned to the end"):
        env, out = _synth(env)
        from stacks.scan import scan as run_scan

        failed = run_scan(out, env.name)
    if failed:
        raise Exit(f"checkov: {failed} failed check(s) in {env.name}; fix them or add a reasoned suppression", 1)


@task(help={"env": ("environment whose archive to build: a name from environments/ (or $TIDEFLEET_ENVIRONMENTS), or a "
                   ".toml file's path (default: $TIDEFLEET_ENV; neither: every environment in that folder)"),
            "cloud": "aws or gcp: only that cloud's environments (default: both)",
            "out": "directory for the archives (default build/)"})
def build(c, cloud=None, out=None, env=None):
    """Package an environment's functions into a deterministic zip: functions-<env>.zip (AWS Lambda) or gcp-scaler-<env>.zip (Cloud Function).

    Each holds the functions, the library and that environment's file alone, as it was validated
    (whatever folder it came from). They are built from the working tree; each records the commit
    it was built from, and the packaged files that differ from it, in tidefleet/build_info.json,
    and a line here names those files."""
    from stacks.package import ARCHIVES, build_archive

    if cloud is not None and cloud not in ARCHIVES:
        raise Exit(f"--cloud: must be one of {', '.join(ARCHIVES)} (got {cloud!r}); leave it out to build both")
    for environment in _build_environments(env, cloud):
        try:
            with _ctrl_c_says(f"build of {environment.name}'s archive", "run it again"):
                path, digest, info = build_archive(environment, Path(out) if out else OUT)
        except RuntimeError as err:  # the Lambda wheels could not be downloaded, a library's version is out of range
            raise Exit(str(err)) from None
        except OSError as err:  # --out names a file, or a place that cannot be written
            fix = "give --out a folder that can be written" if out else _out_fix()  # plan/deploy build without --out
            raise Exit(f"build: cannot write {err.filename or out or OUT} ({err.strerror or err}); {fix}") from None
        print(f"{path} sha256={digest}" + (f" commit={info['commit'][:12]}" if info["commit"] else ""))
        _say_source(path, info)


def _build_environments(name: str | None, cloud: str | None) -> list:
    """The environments `invoke build` packages: the one --env (or $TIDEFLEET_ENV) names, else every
    one in the environments folder; of --cloud only, where given."""
    from tidefleet.config import known_environments

    if name is not None or _env_default():
        environment = _env(name)
        if cloud is not None and environment.cloud != cloud:
            raise Exit(f"--cloud: environment {environment.name} is on {environment.cloud}, not {cloud}; leave "
                       "--cloud out to build its archive")  # fmt: skip
        return [environment]
    every = [_env(known) for known in known_environments()]
    return [e for e in every if cloud is None or e.cloud == cloud]


def _say_source(path: Path, info: dict) -> None:
    """One line where the archive holds what no commit does (a deploy from a dirty tree, an
    environment's file from outside the checkout), or where there is no commit to record; nothing
    for a clean checkout."""
    from stacks.package import BUILD_INFO

    if info.get("outside_checkout"):
        print(f"note: {path}: {', '.join(info['outside_checkout'])} is packaged from outside this checkout, so no "
              "commit records it", file=sys.stderr)  # fmt: skip
    if info.get("note"):
        print(f"note: {path}: {info['note']}, so the archive records no commit", file=sys.stderr)
    elif info["dirty"]:
        files = info["changed"]
        shown = ", ".join(files[:5]) + (f" and {len(files) - 5} more" if len(files) > 5 else "")
        print(f"warning: {path} is built from uncommitted changes in {len(files)} file{'s' * (len(files) != 1)}: "
              f"{shown} (the archive records commit {info['commit'][:12]} and these files in {BUILD_INFO})",
              file=sys.stderr)  # fmt: skip


# What a failed terraform/tofu step most likely needs, found in its output: (words, fix).
TERRAFORM_FIXES = (
    (("error asking for approval",),  # its yes/no prompt read the end of stdin (a CI job, `< /dev/null`)
     "{tool} asked for approval and got no answer (stdin is not a terminal): pass --yes in a non-interactive run"),
    (("Failed to query available provider packages", "Failed to install provider", "registry.terraform.io",
      "registry.opentofu.org"),
     ("the providers could not be downloaded (offline, or no provider mirror); configure a provider mirror "
      "(provider_installation in the CLI config file, $TF_CLI_CONFIG_FILE or ~/.terraformrc) or allow network access "
      "to the registry, then run this again")),
    (("No valid credential sources", "failed to refresh cached credentials", "InvalidClientTokenId", "ExpiredToken",
      "UnrecognizedClientException", "SignatureDoesNotMatch", "could not find default credentials",
      "cannot fetch token"),
     "no usable credentials; {credentials}, then run this again"),
    (("no such host", "dial tcp", "i/o timeout", "connection refused"),
     "the cloud's API could not be reached (offline, a proxy or a firewall); check the network, then run this again"),
)
CREDENTIALS = {"aws": "set AWS_PROFILE or AWS_ACCESS_KEY_ID for the environment's account",
               "gcp": "run `gcloud auth application-default login` or set GOOGLE_APPLICATION_CREDENTIALS"}


def _terraform_binary() -> str:
    from stacks.terraform import TerraformMissing, terraform_binary

    try:
        return terraform_binary()
    except TerraformMissing as err:
        raise Exit(str(err)) from None


def _check_offerings(environment) -> None:
    """AWS: refuse a pool's instance type that no node can launch as where the pool's subnets are
    (one line each), warn of one some of its zones lack. A check that cannot ask EC2 (credentials,
    network, a role without ec2:DescribeInstanceTypeOfferings) says so and lets terraform run."""
    if environment.cloud != "aws":
        return
    from tidefleet.cloud import for_env
    from tidefleet.cloud.aws.offerings import check

    cloud = for_env(environment)
    try:
        refused, warned = check(environment)
    except cloud.errors as err:
        print(f"could not check instance type offerings in {environment.region}: {cloud.explain(err)}; "
              "terraform will run without the check", file=sys.stderr)  # fmt: skip
        return
    for line in warned:
        print(f"warning: {line}", file=sys.stderr)
    if refused:
        raise Exit("\n".join(refused), 1)


def _terraform(c, env: str | None, *args: str) -> None:
    """init, then `args` (plan, apply or destroy) in the environment's synthesized stack. A failed
    step ends the task with its exit code and one line: which step, and what most likely fixes it."""
    environment = _env(env)  # a bad config stops here, before anything else is asked of the user
    binary = _terraform_binary()  # missing: said before the cloud is asked anything, as destroy does
    with _ctrl_c_says(f"{args[0]} for {environment.name}", f"{Path(binary).name} never ran: nothing was changed"):
        if args[0] in ("plan", "apply"):  # what would create the groups; a destroy goes on whatever is offered
            _check_offerings(environment)
        build(c, cloud=environment.cloud, env=env)  # this environment's archive: its file, as validated above
        synthesized, out = _synth(env)
    if synthesized.model_dump() != environment.model_dump():  # its file was edited since: the archive holds another
        raise Exit(f"the file of environment {environment.name} changed while it was being built and synthesized; run "
                   "the same command again")  # fmt: skip
    tty = sys.stdout.isatty()
    color = [] if tty else ["-no-color"]  # escape codes only for a terminal, not into a file or a CI log
    for step in (["init", "-input=false"], list(args)):
        command = shlex.join([binary, f"-chdir={out}", *step, *color])
        asks = step[0] in ("apply", "destroy") and "-auto-approve" not in step  # its yes/no prompt
        result = _run(c, command, reads_stdin=asks, pty=tty, warn=True)
        tool = Path(binary).name
        said = result.stdout + result.stderr
        # Ctrl-C (a CI job cancelled): killed by SIGINT (the shell's 130), or terraform's own graceful stop.
        if result.exited in (-signal.SIGINT, 128 + signal.SIGINT) or (result.exited and "Interrupt received" in said):
            raise Exit(f"{tool} {step[0]} for {environment.name} was interrupted (Ctrl-C) and nothing after it ran; run "
                       "the same command again to go on (terraform keeps the state it saved)", 130)  # fmt: skip
        if result.exited < 0:  # another signal: out of memory (SIGKILL), a crash, a stop from outside
            name = signal.Signals(-result.exited).name if -result.exited in signal.valid_signals() else -result.exited
            raise Exit(f"{tool} {step[0]} for {environment.name} was killed by signal {name} (out of memory, a crash, "
                       "or stopped from outside); a stopped apply may leave its state locked: see its output above, "
                       "then run the same command again", 1)  # fmt: skip
        if result.exited and asks and f"{step[0].capitalize()} cancelled." in said:  # not 'yes' at its prompt
            raise Exit(f"{tool} {step[0]} for {environment.name} was cancelled at its prompt (only 'yes' approves): "
                       "nothing was changed", result.exited)  # fmt: skip
        if result.exited:
            fix = next((fix for words, fix in TERRAFORM_FIXES if any(w in said for w in words)), None)
            if fix is None and step[0] == "init":
                fix = ("its error is above; most often the provider download (offline, or no provider mirror: "
                       "configure one) or the state backend's access ([state] in the environment)")
            elif fix is None:
                fix = "its error is above; most often credentials ({credentials}) or a resource changed outside terraform"
            raise Exit(f"{tool} {step[0]} failed for {environment.name} (exit {result.exited}): "
                       f"{fix.format(credentials=CREDENTIALS[environment.cloud], tool=tool)}", result.exited)


@task(help={"env": ENV_HELP})
def plan(c, env=None):
    """terraform/tofu plan for an environment (whichever binary is on PATH)."""
    _terraform(c, env, "plan", "-input=false")


@task(help={"env": ENV_HELP, "yes": "apply without asking (CI)"})
def deploy(c, env=None, yes=False):
    """Build the functions, synthesize, terraform/tofu apply, then publish the agent nodes install."""
    _terraform(c, env, "apply", "-input=false", *(["-auto-approve"] if yes else []))
    name = env or _env_default()
    try:
        publish(c, env)
    except Exit as failed:  # its line alone read as if nothing had been deployed
        raise Exit(f"deploy: {_env(env).name}'s infrastructure is applied, but publishing the agent failed, so its "
                   f"nodes cannot fetch the agent at boot: {failed.message}; once that is fixed, run "
                   f"`invoke publish --env {shlex.quote(name)}`", failed.code) from None  # fmt: skip


@task(help={"env": ENV_HELP})
def publish(c, env=None):
    """Upload the agent wheel and the environment file to the artifacts bucket (deploy does this)."""
    from stacks.publish import publish_agent
    from tidefleet.cloud import for_env

    environment = _env(env)
    cloud = for_env(environment)
    try:
        with _ctrl_c_says(f"publish for {environment.name}", "the files printed above were uploaded: run it again"):
            for uri in publish_agent(environment):
                print(f"published {uri}")
    except (ValueError, RuntimeError) as err:  # a bad suppression file, a failed wheel download
        raise Exit(str(err)) from None
    except cloud.errors as err:
        raise Exit(cloud.explain(err)) from None


def _work_left(environment) -> tuple[dict[str, int], int] | None:
    """What destroying the environment would lose: its items (queued, in flight, dead-lettered, over
    every queue) and its unfinished jobs; None when none of its queues nor its job table exists
    (never deployed, or destroyed already). Raises the cloud's errors when they cannot be read."""
    from tidefleet import naming
    from tidefleet.cloud import for_env
    from tidefleet.jobs import sdk

    cloud = for_env(environment)
    # A dead-letter queue is read like a queue: through the backlog port, by the name under which
    # naming.queue gives the dead-letter queue's own name.
    dead_letter = {q: naming.dead_letter_queue(environment.name, q).removeprefix(naming.queue(environment.name, ""))
                   for q in environment.queues}  # fmt: skip
    both = environment.model_copy(update={"queues": {**environment.queues,
                                                     **{dead_letter[q]: spec for q, spec in environment.queues.items()}}})
    backlog = for_env(both).control_ports().queues.backlog
    items, found = {"queued": 0, "in flight": 0, "dead-lettered": 0}, False
    for queue in environment.queues:
        for name, dead in ((queue, False), (dead_letter[queue], True)):
            try:
                left = backlog(name)
            except cloud.errors as err:
                if not _missing(err):
                    raise
                continue
            found = True
            if dead:
                items["dead-lettered"] += left.visible + left.in_flight
            else:
                items["queued"] += left.visible
                items["in flight"] += left.in_flight
    try:
        unfinished = len(sdk.jobs(environment, state="running"))
    except cloud.errors as err:
        if not _missing(err):
            raise
        unfinished = 0
    else:
        found = True
    return (items, unfinished) if found else None


def _missing(err: BaseException) -> bool:
    """The cloud's "no such queue or table": a QueueMissing (a LookupError), an error code naming a
    missing thing, or HTTP 404."""
    from tidefleet.jobs.sdk import _not_found

    return isinstance(err, LookupError) or _not_found(err)


def _check_nothing_is_lost(environment, force: bool) -> None:
    """Refuse to destroy an environment that still holds items or unfinished jobs, or whose cloud
    cannot be read, unless --force; one that was never deployed has nothing to lose."""
    from tidefleet.cloud import for_env

    name, cloud = environment.name, for_env(environment)
    override = "or pass --force to destroy it anyway"
    try:
        left = _work_left(environment)
    except cloud.errors as err:
        if not force:
            raise Exit(f"destroy: cannot read what {name} still holds ({cloud.explain(err)}); fix that and run this "
                       f"again, {override}", 1) from None  # fmt: skip
        print(f"destroy: cannot read what {name} still holds ({cloud.explain(err)}); destroying it anyway (--force)")
        return
    if left is None:
        print(f"destroy: {name} has no queues and no job table deployed: no work to lose")
        return
    items, unfinished = left
    if not sum(items.values()) and not unfinished:
        print(f"destroy: {name} holds no items and no unfinished jobs")
        return
    held = ", ".join(f"{n} {state}" for state, n in items.items() if n)
    what = " and ".join([*([f"{held} item(s)"] if held else []), *([f"{unfinished} unfinished job(s)"] if unfinished else [])])
    live = items["queued"] or items["in flight"] or unfinished
    advice = [f"let them finish or cancel them (tidefleet jobs --env {name} --state running)"] if live else []
    if items["dead-lettered"]:  # items that gave up, often of a finished job: nothing to cancel, retry-failed reruns them
        advice.append(f"rerun {'the dead-lettered ones' if live else 'them'} (tidefleet retry-failed --env {name} JOB)")
    if not force:
        raise Exit(f"destroy: {name} still holds {what}, lost with its queues and job table; {', '.join(advice)}, "
                   f"{override}", 1)  # fmt: skip
    print(f"destroy: {name} still holds {what}; destroying them with it (--force)")


@task(help={"env": ENV_HELP, "yes": "destroy without asking (CI)",
            "force": "destroy even if items are queued, in flight or dead-lettered, jobs are unfinished, or the "
                     "environment cannot be read to check (default: refuse)"})
def destroy(c, env=None, yes=False, force=False):
    """terraform/tofu destroy an environment, with its queues and job table.

    First checks it holds no items (queued, in flight or dead-lettered) and no unfinished jobs, and
    refuses if it does, or if it cannot be read, unless --force. One never deployed needs no --force."""
    environment = _env(env)
    _terraform_binary()  # missing: said before the cloud is asked anything
    _check_nothing_is_lost(environment, force)
    _terraform(c, env, "destroy", "-input=false", *(["-auto-approve"] if yes else []))


@task(help={"args": "extra pytest arguments, e.g. '-k policy -x'"})
def test(c, args=""):
    """Run the test suite (the README's test command). No tests collected is not a failure."""
    # In parallel, one worker per core (pytest-xdist); `--args '-n 0'` runs in one process. The
    # calibration compares a real sandbox run's node-seconds with the simulator's: it runs after
    # the rest, alone, so the other tests' load does not skew the sandbox's clock.
    passes = [f"-n auto {args}"]
    if "-m" not in args.split():
        passes = [f"-n auto -m 'not calibration' {args}", f"-n 0 -m calibration {args}"]
    failed = []
    for p in passes:  # stdin mirrored at a terminal only, for a debugger (--pdb)
        code = _run(c, f"{sys.executable} -m pytest {p}", reads_stdin=sys.stdin.isatty(), warn=True,
                    pty=sys.stdout.isatty()).exited  # fmt: skip
        if code == 2:  # pytest's "interrupted" (Ctrl-C, or collection errors): no pass after it
            raise Exit(code=code)
        failed += [code] if code not in (0, 5) else []
    if failed:
        raise Exit(code=failed[0])


@task
def lint(c):
    """ruff on the code, shellcheck on every environment's rendered node user-data."""
    _run(c, f"{sys.executable} -m ruff check .")
    from stacks.shellcheck import shellcheck_all

    problems = shellcheck_all()
    if problems:
        raise Exit("\n".join(problems), 1)


@task(
    help={
        "env": "environment to run: a name in environments/ or your own .toml file (default sandbox)",
        "items": "items in the demo job (default 200, at most 10000; 0: none, with --keep just the system)",
        "chaos": "SIGKILL random nodes, send spot notices and duplicate item messages while the job runs",
        "keep": "stay up afterwards and print the commands that point the CLI at it",
        "train": "GPU items on their own devices and a 2-node training gang that survives a spot notice "
                 "(environment sandbox-train unless --env names another)",
        "time_limit": "give up after this many seconds (default 600, at least 10)",
        "tick": "control tick in seconds, at least 0.2 (default: the environment's scaler.tick_s)",
        "workdir": "keep the work folder (inputs, node and scaler logs) here; default: a temp folder, removed after a run that passed",
        "boot_delay": "seconds from an instance going in service to its node's boot (default: tidefleet sandbox's, 1.5)",
        "seed": "seed of the generated inputs and of --chaos (default: tidefleet sandbox's, 7)",
        "json": "print only the summary, as JSON (for scripts and tests)",
    }
)
def sandbox(c, env=None, items=None, chaos=False, keep=False, train=False, time_limit="600", tick=None, workdir=None,
            boot_delay=None, seed=None, json=False):  # fmt: skip
    """The whole system on this machine against a moto server: a job in, nodes up, work done, fleet at zero."""
    args = ["sandbox", *(["--env", env] if env is not None else []), "--time-limit", str(_number("time-limit", time_limit))]
    # --items given only: --train refuses it
    args += ["--items", str(_sandbox_items(items, keep=keep, train=train))] if items is not None else []
    args += ["--chaos"] * chaos + ["--keep"] * keep + ["--train"] * train + ["--json"] * json
    args += ["--tick", str(_number("tick", tick, float))] if tick is not None else []
    args += ["--boot-delay", str(_number("boot-delay", boot_delay, float))] if boot_delay is not None else []
    args += ["--seed", seed] if seed is not None else []  # any integer, a negative one too: the command checks it
    args += ["--workdir", workdir] if workdir is not None else []  # '' too: the command refuses it
    _tidefleet(args)


def _sandbox_items(items: str, *, keep: bool, train: bool) -> int:
    """--items checked here, as every other option of the tasks (exit 1), not by the command's own
    range (click's usage error, exit 2)."""
    from tidefleet.sandbox.cli import sandbox as sandbox_command

    number = _number("items", items)
    most = next(p for p in sandbox_command.params if p.name == "items").type.max  # the command's own limit
    if number > most:
        raise Exit(f"--items: must be at most {most} (got {items!r})")
    if number == 0 and not keep and not train:  # --train refuses --items itself
        raise Exit("--items: 0 runs no demo job, so the sandbox would start and stop with nothing to show; give at "
                   "least 1, or add --keep to start just the system")  # fmt: skip
    return number


def _tidefleet(args: list[str]) -> None:
    """Run a tidefleet command in this process, not a child: it gets the terminal (a live view, stdin
    for a trace `-`) and Ctrl-C as it is, and says its own usage; its exit status is the task's. (A
    child's Ctrl-C ended in invoke's traceback wherever invoke's stdin had reached its end.)"""
    from tidefleet.cli import main

    try:
        main(args, prog_name="tidefleet")
    except SystemExit as done:  # click ends every run with one
        if done.code:
            raise Exit(code=done.code if isinstance(done.code, int) else 1) from None


@task(
    help={
        "trace": "trace CSV: a path, or a file name in the project's traces/ (see traces/README.md)",
        "env": f"{ENV_HELP.removesuffix(')')}; else prod)",
        "pool": "pool whose instance types, slots and prices are simulated (default: the environment's only pool; "
                "one with several asks which)",
        "policy": "policy to replay (repeatable): tidefleet (default), target-tracking, clearml, keda, oracle",
        "extra": "further tidefleet simulate options, e.g. '--window 0:86400 --plot out.png'",
    },
    iterable=["policy"],
)
def simulate(c, trace, env=None, pool=None, policy=None, extra=""):
    """Replay a workload trace through scaling policies; print cost and wait per policy."""
    from tidefleet.config import known_environments
    from tidefleet.sim.trace import traces_dir

    _refuse_empty_env(env, ", ".join(known_environments()))
    if trace in ("-h", "--help"):  # invoke hands a required positional the next word, even --help
        _run(c, f"{sys.executable} -m invoke -r {shlex.quote(str(ROOT))} --help simulate")
        return
    # A bare name such as philly_2017_jobs.csv means the project's copy, whatever the cwd.
    found = next((p for p in (Path(trace), ROOT / trace, traces_dir() / trace) if _is_file(p)), Path(trace))
    try:  # --extra is the simulator's options, split as a shell would: never run by one (no `;`, no `$(...)`)
        options = shlex.split(extra)
    except ValueError as err:  # an unclosed quote
        raise Exit(f"--extra: cannot split {extra!r} into options ({err}); close its quotes") from None
    _tidefleet(["simulate", str(found), "--env", env or _env_default() or "prod", *(["--pool", pool] if pool else []),
                *(a for p in policy or ["tidefleet"] for a in ("--policy", p)), *options])  # fmt: skip


def _is_file(path: Path) -> bool:
    """Whether a file is there; a path the OS refuses (a name too long) is not one: the simulator
    then names it and the reason in its own line."""
    try:
        return path.is_file()
    except OSError:
        return False


@task(help={"out": "folder for the table and plots (default build/bench)",
            "readme": "also rewrite the README's generated benchmark table",
            "calibration": "also run the calibration scenarios through the sandbox and the simulator (about 2 min)"})
def bench(c, out=None, readme=False, calibration=False):
    """Every policy over every workload's held-out half: a table and plots of cost against p95 wait.

    The workloads: the traces in traces/ (or $TIDEFLEET_TRACES) and the synthetic shapes."""
    from tidefleet.sim.bench import run_bench
    from tidefleet.sim.trace import TraceError

    try:
        run_bench(Path(out) if out else OUT / "bench", readme=ROOT / "README.md" if readme else None,
                  calibration=calibration)
    except TraceError as err:
        raise Exit(str(err), 1) from None
    except OSError as err:  # --out names a file, or a place that cannot be written
        raise Exit(f"bench: cannot write {err.filename or out} ({err.strerror or err}); "
                   "give --out a folder that can be written", 1) from None


@task(
    help={
        "submit_items": "items bench_submit.py submits (default 2000; the issue's goal is 250000)",
        "agent_items": "no-op items bench_agent.py runs (default 300)",
        "tick_queues": "queues in bench_tick.py's environment (default 1000)",
        "tick_pools": "pools, one Auto Scaling group each (default 100)",
        "tick_nodes": "instances over all pools (default 10000; moto launches them once, minutes)",
    }
)
def bench_io(c, submit_items="2000", agent_items="300", tick_queues="1000", tick_pools="100", tick_nodes="10000"):
    """Throughput of submit, agent and scaler tick on a moto server, each against a bare boto3 loop.

    Each bare loop makes the same calls, measured in the same run; ends with the three ratio lines
    (1.00: as fast as the bare calls; the goals are >= 0.80 for submit and agent)."""
    runs = {
        "bench_submit.py": f"--items {_number('submit-items', submit_items)}",
        "bench_agent.py": f"--items {_number('agent-items', agent_items)}",
        "bench_tick.py": f"--queues {_number('tick-queues', tick_queues)} --pools {_number('tick-pools', tick_pools)} "
                         f"--nodes {_number('tick-nodes', tick_nodes)}",
    }
    ratios = []
    for script, args in runs.items():
        print(f"== {script} {args}", flush=True)
        path = shlex.quote(str(ROOT / "benchmarks" / script))
        result = _run(c, f"{sys.executable} {path} {args}", warn=True)
        if result.exited:
            raise Exit(f"{script} failed (exit {result.exited}); its output is above", result.exited)
        ratios += [line for line in result.stdout.splitlines() if line.startswith("ratio ")][-1:]
    print("\n".join(["", *ratios]))


@task(
    help={
        "only": "mutants to run, a glob on their names such as 'tidefleet.policy.cost*' (repeatable; "
        "default: every file [tool.mutmut] names)",
        "jobs": "mutants tested at once (default 2)",
    },
    iterable=["only"],
)
def mutate(c, only=None, jobs="2"):
    """Mutation testing of the pure policy with mutmut; prints the mutants no test killed.

    On demand only (minutes per file; `invoke test` never runs it). Files and tests are set in
    [tool.mutmut] of pyproject.toml; mutants/ keeps the results, so a second run retests only what
    changed. docs/mutation.md explains the known survivors; `mutmut show NAME` prints one's diff.
    """
    names = " ".join(shlex.quote(glob) for glob in only or [])
    if (children := _number("jobs", jobs)) < 1:  # mutmut would end in its own ValueError (a pool of 0 processes)
        raise Exit(f"--jobs: must be at least 1 (got {jobs!r}); it is how many mutants are tested at once")
    result = _run(c, f"{sys.executable} -m mutmut run --max-children {children} {names}", warn=True,
                  pty=sys.stdout.isatty())
    if result.exited:
        raise Exit("mutmut run failed; see its output above", result.exited)
    # `mutmut results` lists every mutant not killed: "name: status".
    results = [line.strip().rsplit(": ", 1) for line in _run(c, f"{sys.executable} -m mutmut results", hide=True).stdout.splitlines()]
    survivors = [name + ": " + status for name, status in results if status not in ("not checked", "timeout")]
    timeouts = sum(status == "timeout" for _, status in results)
    print("\n".join(["survivors:", *survivors]) if survivors else "no survivors")
    print(f"{timeouts} timed out (a mutant that loops forever counts as caught)")


@task(
    help={
        "repo": "the repository whose pipelines may assume the roles: OWNER/NAME (GitLab: GROUP/PROJECT)",
        "ci": "github (GitHub Actions) or gitlab (gitlab.com); default github",
        "branch": "the deploy branch, default main (GitLab's deploy role trusts only it; on GitHub the environments do)",
        "env": "environment whose [state] backend the pipelines use: S3 (AWS) or, for a GCP environment, GCS (default prod)",
        "deploy_envs": "comma-separated environments the deploy role deploys (default dev,prod; on GCP environments of --env's project)",
    }
)
def bootstrap(c, repo=None, ci="github", branch="main", env="prod", deploy_envs="dev,prod"):
    """Synthesize and scan the CI bootstrap stack (OIDC provider, plan and deploy roles; on GCP, with a GCP --env: Workload
    Identity pool and provider, plan and deploy service accounts) into build/synth/bootstrap/.

    Apply it once with an administrator's credentials: terraform -chdir=<printed folder> init && terraform apply.
    """
    import re

    from stacks.aws.bootstrap import synth_bootstrap
    from stacks.scan import scan as run_scan

    if not repo or not re.fullmatch(r"[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)+", repo):
        raise Exit(f"--repo: give the repository as OWNER/NAME (got {repo!r})")
    if ci not in ("github", "gitlab"):
        raise Exit(f"--ci: must be github or gitlab (got {ci!r})")
    environments = tuple(e.strip() for e in deploy_envs.split(","))
    if not deploy_envs.strip():
        raise Exit("--deploy-envs: '' names no environment, and a deploy role that no environment may assume deploys "
                   "nothing; give the deploy environments, comma-separated, such as dev,prod")  # fmt: skip
    _ci_name("branch", branch, "branch", "give the one deploy branch ({chars}), such as main", "/")
    for name in environments:
        _ci_name("deploy-envs", name, "environment",
                 "give the deploy environments, comma-separated (each {chars}), such as dev,prod")  # fmt: skip
    state_env = _env(env)
    if state_env.cloud == "gcp":
        from stacks.gcp.bootstrap import synth_gcp_bootstrap

        if state_env.state.backend != "gcs":
            raise Exit(f"--env: {state_env.name} has no GCS state backend; give a GCP environment with [state] backend = \"gcs\"")
        deploy = tuple(_env(name) for name in environments)  # their stacks' project grants: the deploy account's limit
        for other in deploy:
            if other.cloud != "gcp" or other.project != state_env.project:
                raise Exit(f"--deploy-envs: {other.name} is not a GCP environment of project {state_env.project}; give the "
                           f"environments the deploy account deploys there, comma-separated, such as {state_env.name}")  # fmt: skip
        try:
            out = synth_gcp_bootstrap(_output_folder(OUT / "synth" / "bootstrap"), ci=ci, repo=repo, branch=branch,
                                      project=state_env.project, state_bucket=state_env.state.bucket,
                                      state_prefix="tidefleet", environments=deploy)  # fmt: skip
        except ValueError as err:
            raise Exit(f"--deploy-envs: {err}") from None
    elif state_env.cloud != "aws" or state_env.state.backend != "s3":
        raise Exit(f"--env: {state_env.name} has no S3 state backend; give an environment with [state] backend = \"s3\"")
    else:
        out = synth_bootstrap(_output_folder(OUT / "synth" / "bootstrap"), ci=ci, repo=repo, branch=branch,
                              state=state_env.state, region=state_env.region, environments=environments)  # fmt: skip
    print(f"synthesized the CI bootstrap stack -> {out}")
    if run_scan(out, "ci-bootstrap"):
        raise Exit("checkov: the bootstrap stack has failed checks; fix them or add a reasoned suppression", 1)


def _ci_name(option: str, value: str, kind: str, fix: str, also: str = "") -> None:
    """Refuse a branch or environment name that the deploy role's trust must not hold. Its `sub`
    condition is StringLike where a subject holds `*` or `?`: one of those lets every matching
    branch or environment assume the role that deploys prod. The rule is kept simple: letters,
    digits, '.', '_', '-' (and '/' in a branch), which every GitHub or GitLab name of the kind can be."""
    import re

    if re.fullmatch(rf"[A-Za-z0-9._{re.escape(also)}-]+", value):
        return
    chars = ", ".join(["letters", "digits", *(repr(c) for c in "._-" + also)])
    article = "an" if kind[0] in "aeiou" else "a"
    wildcard = f": '*' and '?' would let every matching {kind} assume the deploy role" if set("*?") & set(value) else ""
    raise Exit(f"--{option}: {value!r} is not {article} {kind} name{wildcard}; {fix.format(chars=chars)}")
