"""invoke tasks: thin wrappers, each calls into the library or terraform.

`invoke --list` shows them; `invoke --help TASK` explains each flag. User mistakes end in
a message that says what to do, never a traceback.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from invoke import Exit, task

ROOT = Path(__file__).resolve().parent
OUT = ROOT / "build"
ENV_HELP = "environment name: a file environments/<name>.toml"


def _env(name: str | None):
    from tidefleet.config import ConfigError, known_environments, load_environment

    if not name:
        raise Exit(f"--env is required; known environments: {', '.join(known_environments())}")
    try:
        return load_environment(name)
    except ConfigError as err:
        raise Exit(str(err)) from None


def _synth(name: str):
    env = _env(name)  # before importing the stacks: a bad config fails in a second, not ten
    from stacks.app import synth as synth_stack

    out = synth_stack(env, OUT / "synth" / env.name)
    print(f"synthesized {env.name} -> {out}")
    return env, out


@task(help={"env": ENV_HELP})
def synth(c, env=None):
    """Validate an environment and synthesize its Terraform JSON into build/synth/<env>/."""
    _synth(env)


@task(help={"env": ENV_HELP})
def scan(c, env=None):
    """Synthesize, then run checkov (offline) on the Terraform JSON; fail on any failed check.

    Suppressions live in stacks/checkov_suppressions.toml, one per (check, resource) with its reason.
    """
    env, out = _synth(env)
    from stacks.scan import scan as run_scan

    failed = run_scan(out, env.name)
    if failed:
        raise Exit(f"checkov: {failed} failed check(s) in {env.name}; fix them or add a reasoned suppression", 1)


@task(help={"cloud": "aws or gcp: build only that cloud's archive (default: both)",
            "out": "directory for the archives (default build/)"})
def build(c, cloud=None, out=None):
    """Package the functions into deterministic zips: functions.zip (AWS Lambda), gcp-scaler.zip (Cloud Function)."""
    from stacks.package import ARCHIVES, build_archive

    if cloud is not None and cloud not in ARCHIVES:
        raise Exit(f"--cloud: must be one of {', '.join(ARCHIVES)} (got {cloud!r}); leave it out to build both")
    for name in [cloud] if cloud else ARCHIVES:
        try:
            path, digest = build_archive(name, Path(out) if out else OUT)
        except RuntimeError as err:  # the Lambda wheels could not be downloaded
            raise Exit(str(err)) from None
        print(f"{path} sha256={digest}")


def _terraform(c, env: str | None, *args: str) -> None:
    from stacks.terraform import TerraformMissing, terraform_binary

    try:
        binary = terraform_binary()
    except TerraformMissing as err:
        raise Exit(str(err)) from None
    cloud = _env(env).cloud  # a bad config stops here, before the (slow) function build
    build(c, cloud=cloud)
    _, out = _synth(env)
    c.run(f"{binary} -chdir={shlex.quote(str(out))} init -input=false", pty=sys.stdout.isatty())
    c.run(f"{binary} -chdir={shlex.quote(str(out))} {' '.join(args)}", pty=sys.stdout.isatty())


@task(help={"env": ENV_HELP})
def plan(c, env=None):
    """terraform/tofu plan for an environment (whichever binary is on PATH)."""
    _terraform(c, env, "plan", "-input=false")


@task(help={"env": ENV_HELP, "yes": "apply without asking (CI)"})
def deploy(c, env=None, yes=False):
    """Build the functions, synthesize, terraform/tofu apply, then publish the agent nodes install."""
    _terraform(c, env, "apply", "-input=false", *(["-auto-approve"] if yes else []))
    publish(c, env)


@task(help={"env": ENV_HELP})
def publish(c, env=None):
    """Upload the agent wheel and the environment file to the artifacts bucket (deploy does this)."""
    from stacks.publish import publish_agent

    try:
        for uri in publish_agent(_env(env)):
            print(f"published {uri}")
    except ValueError as err:
        raise Exit(str(err)) from None


@task(help={"env": ENV_HELP, "yes": "destroy without asking (CI)"})
def destroy(c, env=None, yes=False):
    """terraform/tofu destroy an environment. Queued items and the job table go with it."""
    _terraform(c, env, "destroy", "-input=false", *(["-auto-approve"] if yes else []))


@task(help={"args": "extra pytest arguments, e.g. '-k policy -x'"})
def test(c, args=""):
    """Run the test suite (the README's test command). No tests collected is not a failure."""
    # In parallel, one worker per core (pytest-xdist); `--args '-n 0'` runs in one process.
    result = c.run(f"{sys.executable} -m pytest -n auto {args}", warn=True, pty=sys.stdout.isatty())
    if result.exited not in (0, 5):
        raise Exit(code=result.exited)


@task
def lint(c):
    """ruff on the code, shellcheck on every environment's rendered node user-data."""
    c.run(f"{sys.executable} -m ruff check .")
    from stacks.shellcheck import shellcheck_all

    problems = shellcheck_all()
    if problems:
        raise Exit("\n".join(problems), 1)


@task(
    help={
        "items": "items in the demo job",
        "chaos": "SIGKILL random nodes, send spot notices and duplicate item messages while the job runs",
        "keep": "stay up afterwards and print how to point the CLI at it",
        "time_limit": "give up after this many seconds",
        "tick": "control tick in seconds (default: the environment's scaler.tick_s)",
    }
)
def sandbox(c, items=200, chaos=False, keep=False, time_limit=600, tick=None):
    """The whole system on this machine against a moto server: a job in, nodes up, work done, fleet at zero."""
    flags = f"--items {int(items)} --time-limit {int(time_limit)}" + (" --chaos" if chaos else "") + (" --keep" if keep else "")
    flags += f" --tick {float(tick)}" if tick else ""
    result = c.run(f"{sys.executable} -m tidefleet.cli sandbox {flags}", warn=True, pty=sys.stdout.isatty())
    if result.exited:
        raise Exit(code=result.exited)


@task(
    help={
        "trace": "trace CSV: a path, or a file name in the project's traces/ (see traces/README.md)",
        "env": ENV_HELP,
        "pool": "pool whose instance types, slots and prices are simulated",
        "policy": "policy to replay (repeatable): tidefleet, target-tracking, clearml, keda, oracle",
        "extra": "further tidefleet simulate options, e.g. '--window 0:86400 --plot out.png'",
    },
    iterable=["policy"],
)
def simulate(c, trace, env="prod", pool="gpu", policy=None, extra=""):
    """Replay a workload trace through scaling policies; print cost and wait per policy."""
    from tidefleet.sim.trace import traces_dir

    # A bare name such as philly_2017_jobs.csv means the project's copy, whatever the cwd.
    found = next((p for p in (Path(trace), ROOT / trace, traces_dir() / trace) if p.is_file()), Path(trace))
    policies = " ".join(f"--policy {shlex.quote(p)}" for p in (policy or ["tidefleet"]))
    result = c.run(f"{sys.executable} -m tidefleet.cli simulate {shlex.quote(str(found))} --env {env} --pool {pool} "
                   f"{policies} {extra}", warn=True)  # fmt: skip
    if result.exited:  # the command has said why
        raise Exit(code=result.exited)


@task(help={"out": "folder for the table and plots (default build/bench)"})
def bench(c, out=None):
    """Every policy over every trace in traces/ ($TIDEFLEET_TRACES): a table and plots of cost against p95 wait."""
    from tidefleet.sim.bench import run_bench
    from tidefleet.sim.trace import TraceError

    try:
        run_bench(Path(out) if out else OUT / "bench")
    except TraceError as err:
        raise Exit(str(err), 1) from None


@task(
    help={
        "only": "mutants to run, a glob on their names such as 'tidefleet.policy.cost*' (repeatable; "
        "default: every file [tool.mutmut] names)",
        "jobs": "mutants tested at once (default 2)",
    },
    iterable=["only"],
)
def mutate(c, only=None, jobs=2):
    """Mutation testing of the pure policy with mutmut; prints the mutants no test killed.

    On demand only (minutes per file; `invoke test` never runs it). Files and tests are set in
    [tool.mutmut] of pyproject.toml; mutants/ keeps the results, so a second run retests only what
    changed. docs/mutation.md explains the known survivors; `mutmut show NAME` prints one's diff.
    """
    names = " ".join(shlex.quote(glob) for glob in only or [])
    result = c.run(f"{sys.executable} -m mutmut run --max-children {int(jobs)} {names}", warn=True,
                   pty=sys.stdout.isatty())
    if result.exited:
        raise Exit("mutmut run failed; see its output above", result.exited)
    # `mutmut results` lists every mutant not killed: "name: status".
    results = [line.strip().rsplit(": ", 1) for line in c.run(f"{sys.executable} -m mutmut results", hide=True).stdout.splitlines()]
    survivors = [name + ": " + status for name, status in results if status not in ("not checked", "timeout")]
    timeouts = sum(status == "timeout" for _, status in results)
    print("\n".join(["survivors:", *survivors]) if survivors else "no survivors")
    print(f"{timeouts} timed out (a mutant that loops forever counts as caught)")
