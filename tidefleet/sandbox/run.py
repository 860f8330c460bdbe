"""The whole system on one machine: emulator, scaler, nodes, and a demo job.

`Sandbox` brings up a moto server, provisions the environment through boto3, and runs
three loops beside the caller: the control tick (on its clock and on every submit kick),
the node launcher, and the schedule function's work (`ScheduledJobs`: the watch every tick,
the `[schedules.NAME]` fires at their times); the agents are the nodes' own processes.
`run_demo` submits a generated job through the job SDK, optionally makes chaos, waits for the
job and for the fleet to reach zero, and accounts for every item.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shlex
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Self

from tidefleet import control, metrics, naming, schedules
from tidefleet.cloud import for_env
from tidefleet.cloud.aws.metrics import EmfToCloudWatch
from tidefleet.cloud.aws.provision import EMULATOR_ACCOUNT, Provisioned, provision
from tidefleet.config import Environment, environments_dir
from tidefleet.emulator import MotoServer, start_moto
from tidefleet.jobs import scheduled, sdk
from tidefleet.sandbox.demo_work import EVENTS
from tidefleet.sandbox.imds import LoopbackServer, MetadataServer
from tidefleet.sandbox.launcher import Launcher
from tidefleet.sandbox.launcher import log as launcher_log
from tidefleet.userdata import LOCAL_PYTHON, render_user_data

DEMO_JOB = "sandbox-demo"
DEMO_MODULE = "tidefleet.sandbox.demo_work"
FAIL_EVERY = 25  # one input in this many is made to fail (not UTF-8)
WORDS = [
    "tide",
    "fleet",
    "spot",
    "queue",
    "node",
    "item",
    "scale",
    "drain",
    "checkpoint",
    "retry",
    "shard",
    "batch",
    "model",
    "epoch",
]


# The agent's intervals, in seconds, on the sandbox's clock (its defaults suit real nodes).
AGENT_CLOCK = {
    "TIDEFLEET_AGENT_HEARTBEAT_S": 1,
    "TIDEFLEET_IMDS_POLL_S": 1,
    "TIDEFLEET_AGENT_GRACE_S": 5,  # within Timing.grace_s, so a leaving node hands back before it is killed
    "TIDEFLEET_AGENT_WAIT_S": 1,
}


@dataclass
class Timing:
    boot_delay_s: float = 1.5  # an instance in service -> its user-data starts
    grace_s: float = 8.0  # a leaving node's agent gets this long before its processes are killed
    reclaim_after_s: float = 10.0  # spot notice -> EC2 takes the instance (two minutes on AWS)
    tick_s: float | None = None  # None: the environment's scaler.tick_s


class ScheduledJobs:
    """The schedule function's work, done in the sandbox as a deployed environment does it: the
    watch (sends the jobs held `--after` another once that allows, cancels those it never will, and
    runs past their timeout) at every step, run every tick, the sandbox's minute; and each
    `[schedules.NAME]` fired once per fire time on the wall clock, from the first after the start,
    as its scheduler would. A fire or watch that fails is one line in schedules.log, never the
    sandbox's end: the next step watches again."""

    def __init__(self, env: Environment, started: float):
        self.env, self.cloud = env, for_env(env)
        self.fired = {name: schedules.fire_time(s.cron, s.rate, started) for name, s in env.schedules.items()}

    def step(self, now: float) -> None:
        for name, schedule in self.env.schedules.items():
            due = schedules.fire_time(schedule.cron, schedule.rate, now)
            if due > self.fired[name]:
                self.fired[name] = due  # delivered once, like a scheduler's fire: a failed one is not repeated
                self._guarded(f"fire of schedule {name!r}", scheduled.fire, self.env, self.cloud, name, now,
                              fired_at=due)  # fmt: skip
        self._guarded("watch", scheduled.watch, self.env, self.cloud, now)

    def run(self, stop: threading.Event, every_s: float) -> None:
        while not stop.wait(every_s):
            self.step(time.time())

    @staticmethod
    def _guarded(what: str, work: Callable[..., object], *args, **kwargs) -> None:
        try:
            work(*args, **kwargs)
        except Exception as err:  # noqa: BLE001 - one line in the log; the next step retries, as the minute watch does
            scheduled.log.warning("%s failed: %s: %s", what, type(err).__name__, " ".join(str(err).split()))


class _KickHandler(BaseHTTPRequestHandler):
    kicked: threading.Event

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.kicked.set()
        self.send_response(202)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


MOTO_LOG = "moto.log"  # in the work folder: the emulator's output, where its errors are kept


class Sandbox:
    """Emulator + provisioned environment + control loop + node launcher. A context manager:
    leaving it (normally, on an error or on Ctrl-C) kills every node and stops the emulator."""

    def __init__(self, env: Environment, workdir: Path, timing: Timing, environments: Path | None = None):
        """environments: the folder of the environment's file, where the nodes' agents find it
        by name (default: the environments folder)."""
        self.env = env
        self.environments = environments or environments_dir()
        self.workdir = workdir
        self.timing = timing
        self.tick_s = timing.tick_s or env.scaler.tick_s
        self.stop = threading.Event()
        self.kicked = threading.Event()
        self.last_decisions: tuple = ()
        self.tick_error = ""
        self.moto: MotoServer | None = None
        self._servers: list = []
        self._threads: list[threading.Thread] = []

    def __enter__(self) -> Self:
        try:
            self._start()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.moto = start_moto(log=self.workdir / MOTO_LOG)
        # This process talks to the emulator while the sandbox runs; __exit__ puts the environment back.
        # The user's own AWS settings go meanwhile (a profile this machine lacks, a service's endpoint):
        # every client here talks to the emulator with its fake credentials, and nothing else.
        theirs = [k for k in os.environ if k.startswith("AWS_")]
        self._saved_environ = {k: os.environ.get(k) for k in [*theirs, *self.moto.env(self.env.region), "TIDEFLEET_KICK_URL"]}
        for key in theirs:
            del os.environ[key]
        os.environ.update(self.moto.env(self.env.region))
        kick_handler = type("KickHandler", (_KickHandler,), {"kicked": self.kicked})
        kick_server = LoopbackServer(("127.0.0.1", 0), kick_handler)
        self._servers.append(kick_server)
        # Serving at once: __exit__ shuts down every server it holds, and shutdown() waits for a
        # serve_forever that was never started for good (a failed provision hung the sandbox).
        self._spawn("kick", kick_server.serve_forever)
        self.kick_url = f"http://127.0.0.1:{kick_server.server_address[1]}/kick"
        os.environ["TIDEFLEET_KICK_URL"] = self.kick_url  # the SDK in this process kicks here
        self.imds = MetadataServer().start()
        self._servers.append(self.imds)

        # What every node exports: the emulator, the kick, shared checkpoints, this Python,
        # and an agent on the sandbox's fast clock.
        local = {
            **self.moto.env(self.env.region),
            "TIDEFLEET_KICK_URL": self.kick_url,
            "TIDEFLEET_CHECKPOINT_ROOT": str(self.workdir / "checkpoints"),
            "TIDEFLEET_ENVIRONMENTS": str(self.environments),
            LOCAL_PYTHON: sys.executable,
            **{k: str(v) for k, v in AGENT_CLOCK.items()},
        }
        bucket = naming.artifacts_bucket(self.env.name, EMULATOR_ACCOUNT)
        user_data = {
            p: render_user_data(self.env, p, artifacts_bucket=bucket, local=local) for p in self.env.pools
        }
        self.provisioned: Provisioned = provision(self.env, user_data=user_data)

        # A node's process sees only what its user-data exports, plus this Python on PATH.
        node_env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "TIDEFLEET_"))}
        node_env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), node_env.get("PATH", "")])
        if any(t.gpus for pool in self.env.pools.values() for t in pool.instance_types):
            node_env["PATH"] = os.pathsep.join([str(self._emulated_driver()), node_env["PATH"]])
        # The agents' per-attempt folders and the workloads' temp files: inside the workdir, so they go with it.
        node_env["TMPDIR"] = str(self.workdir / "tmp")
        (self.workdir / "tmp").mkdir(exist_ok=True)
        self.launcher = Launcher(
            self.env,
            self.imds,
            workdir=self.workdir,
            node_env=node_env,
            boot_delay_s=self.timing.boot_delay_s,
            grace_s=self.timing.grace_s,
            reclaim_after_s=self.timing.reclaim_after_s,
        )
        scaler_log = logging.FileHandler(self.workdir / "scaler.log")
        control.log.addHandler(scaler_log)
        control.log.setLevel(logging.INFO)
        control.log.propagate = False  # the live view owns the terminal
        self._launcher_log = logging.FileHandler(self.workdir / "launcher.log")
        self._launcher_log.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        launcher_log.addHandler(self._launcher_log)
        launcher_log.propagate = False
        # The fires' and the watch's decision lines, and their failures: schedules.log, beside scaler.log.
        self._schedules_log = logging.FileHandler(self.workdir / "schedules.log")
        self._schedules_log.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        scheduled.log.addHandler(self._schedules_log)
        scheduled.log.setLevel(logging.INFO)
        scheduled.log.propagate = False
        self.jobs = ScheduledJobs(self.env, time.time())
        self._spawn("control", self._control_loop)
        self._spawn("launcher", lambda: self.launcher.run(self.stop))
        self._spawn("jobs", lambda: self.jobs.run(self.stop, self.tick_s))

    def _emulated_driver(self) -> Path:
        """A folder with an `nvidia-smi` that answers as a node of the pool's type would
        (`fake_nvidia_smi`): GPU pools run here on an emulated driver, each item on its own devices."""
        folder = self.workdir / "bin"
        folder.mkdir(exist_ok=True)
        smi = folder / "nvidia-smi"
        smi.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m tidefleet.sandbox.fake_nvidia_smi "$@"\n')
        smi.chmod(0o755)
        return folder

    def _spawn(self, name: str, target: Callable[[], None]) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _control_loop(self) -> None:
        ports = for_env(self.env).control_ports()
        # The emulator extracts no EMF: the scaler's lines and the agents' outcome events are
        # published with PutMetricData, so the dashboard's metrics exist as on AWS.
        self.metrics = EmfToCloudWatch(self.env)
        while not self.stop.is_set():
            try:
                now, acted = time.time(), {}
                report = lambda fleet, decided, now=now, acted=acted: self.metrics.emit(
                    self.env, metrics.tick_points(self.env, fleet, decided, now, acted))
                self.last_decisions = control.tick(self.env, ports, now, report=report, acted=acted.__setitem__)
                self.metrics.pump_outcomes()
                self.tick_error = ""
            except Exception as err:  # noqa: BLE001 - shown in the view; the next tick retries
                self.tick_error = f"{type(err).__name__}: {err}"
            self.kicked.wait(self.tick_s)
            self.kicked.clear()

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.kicked.set()  # the control loop waits on it between ticks: it sees the stop now
        if hasattr(self, "launcher"):
            self.launcher.shutdown()
        for server in self._servers:
            if isinstance(server, MetadataServer):
                server.stop()
            else:
                server.shutdown()
                server.server_close()
        deadline = time.monotonic() + 10  # Ctrl-C answers within seconds: a stuck thread is a daemon, left behind
        for thread in self._threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        if self.moto is not None:
            self.moto.stop()
        for logger, handler in ((launcher_log, "_launcher_log"), (scheduled.log, "_schedules_log")):
            if hasattr(self, handler):
                logger.removeHandler(getattr(self, handler))
                getattr(self, handler).close()
        for key, value in getattr(self, "_saved_environ", {}).items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value

    def emulator_gone(self) -> str | None:
        """None while the moto server runs; else the one line that ends the sandbox: without it
        nothing works, and nothing else would notice (every loop retries)."""
        how = self.moto.exited() if self.moto is not None else None
        if how is None:
            return None
        return f"the sandbox's emulator (moto server) {how}; its log is {self.moto.log}; start the sandbox again"

    # -- what the view and the summary read ------------------------------------------------
    def queue_depths(self) -> dict[str, tuple[int, int, int]]:
        """queue -> (visible, in flight, dead-lettered)."""
        return {name: self.launcher.machines.queue_depth(name) for name in self.env.queues}

    def fleet_at_zero(self) -> bool:
        """No instance in any group and no node process left."""
        return self.launcher.in_service_count == 0 and all(
            n.state == "gone" for n in self.launcher.snapshot()
        )

    def export_lines(self) -> list[str]:
        env = {
            **self.moto.env(self.env.region),
            "TIDEFLEET_ENV": self.env.name,
            "TIDEFLEET_ENVIRONMENTS": str(self.environments),
            "TIDEFLEET_KICK_URL": self.kick_url,
        }
        return [f"export {k}={shlex.quote(v)}" for k, v in env.items()]

    def try_lines(self, items: Path) -> list[str]:
        """Commands that submit `items` (a file it writes) to the first queue and watch the job:
        pasted after `export_lines`, they work as printed."""
        queue, name = next(iter(self.env.queues)), "my-first-job"
        if "tidefleet.sandbox.train_work" in (self.env.pools[self.env.queues[queue].pool].command or ""):
            # --train's workload: `infer SECONDS EVENTS_FILE` (JSON lines: a list of arguments each)
            events = items.parent / "my-events.jsonl"
            items.write_text("".join(json.dumps(["infer", "2", str(events)]) + "\n" for _ in range(5)))
        else:
            specs, _ = make_inputs(items.parent / "my-inputs", 5, seed=1, fail_every=0)
            items.write_text("".join(f"{spec.args[0]}\n" for spec in specs))
        return [
            f"tidefleet submit --env {self.env.name} --queue {queue} --name {name} --items {shlex.quote(str(items))}",
            f"tidefleet status --env {self.env.name} {sdk.job_id_for(name)} --watch --time-limit 300",
        ]


# -- the demo job ---------------------------------------------------------------------------
def make_inputs(workdir: Path, count: int, seed: int, fail_every: int = FAIL_EVERY) -> tuple[list[sdk.ItemSpec], set[str]]:
    """`count` text files of a few thousand words; every `fail_every`-th (0: none) is not UTF-8.
    Returns the items and the ids of those made to fail."""
    rng = random.Random(seed)
    inputs = workdir / "inputs"
    inputs.mkdir(parents=True, exist_ok=True)
    items, doomed = [], set()
    for i in range(count):
        item_id = f"item-{i:04d}"
        if fail_every and i % fail_every == fail_every - 1:
            path = inputs / f"{item_id}.bin"
            path.write_bytes(bytes([0xFF, 0xFE]) + rng.randbytes(64))
            doomed.add(item_id)
        else:
            path = inputs / f"{item_id}.txt"
            path.write_text(" ".join(rng.choice(WORDS) for _ in range(rng.randint(2000, 8000))))
        items.append(sdk.ItemSpec(item_id, [str(path)]))
    return items, doomed


def is_demo_workload(env: Environment, queue: str) -> bool:
    """Whether `queue`'s pool runs the sandbox's demo workload (an environment of your own runs yours)."""
    return DEMO_MODULE in (env.pools[env.queues[queue].pool].command or "")


def read_events(workdir: Path) -> list[dict]:
    path = workdir / EVENTS
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@dataclass
class Summary:
    items: int
    succeeded: int
    failed: dict[str, str]  # item -> reason (designed to fail)
    failed_unexpectedly: dict[str, str]  # item -> reason
    succeeded_unexpectedly: list[str]  # made to fail, yet succeeded
    unaccounted: dict[str, str]  # item -> its last status
    duplicate_successes: dict[str, int]  # item -> workload successes, when more than one
    duplicates_explained: bool  # every duplicate's first success ran on a node that was SIGKILLed
    redelivered: int  # items that needed more than one attempt
    interruptions: int  # attempts handed back on a notice
    resumed: int  # attempts that resumed from a checkpoint an interrupted one saved
    peak_nodes: int
    node_seconds: float
    submit_to_first_start_s: float | None
    last_finish_to_zero_s: float | None
    items_per_s: float | None  # finished items / (last finish - submit)
    nodes_killed: int
    spot_notices: int
    duplicate_messages: int  # copies of item messages sent by --chaos
    time_limit_hit: bool
    fleet_at_zero: bool
    demo_workload: bool  # the queue's pool runs demo_work: its designed failures and own records are checked
    wall_s: float
    workdir: str
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (
            not self.unaccounted
            and not self.failed_unexpectedly
            and not self.succeeded_unexpectedly
            and self.duplicates_explained
            and self.fleet_at_zero
            and not self.time_limit_hit
        )

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "ok": self.ok}, indent=2, sort_keys=True)


def account(status: sdk.JobStatus, doomed: set[str], events: list[dict], killed_nodes: set[str], *,
            demo: bool = True) -> dict:
    """Every item's fate, from the job store and, for the demo workload, independently from its own
    events. Another workload (`demo` False) records no events and fails only for its own reasons:
    its items are accounted for by the store alone, a failure with the workload's reason."""
    failed, failed_unexpectedly, succeeded_unexpectedly, unaccounted = {}, {}, [], {}
    for item in status.items:
        if item.status == "succeeded":
            if item.item_id in doomed:
                succeeded_unexpectedly.append(item.item_id)
        elif item.status == "failed" and (item.item_id in doomed or not demo) and item.reason:
            failed[item.item_id] = item.reason
        elif item.status == "failed":
            failed_unexpectedly[item.item_id] = item.reason or "(no reason recorded)"
        else:
            unaccounted[item.item_id] = item.status
    successes: dict[str, list[dict]] = {}
    for event in sorted(events, key=lambda e: e["at"]):
        if event["event"] == "success":
            successes.setdefault(event["item"], []).append(event)
    duplicates = {item: len(runs) for item, runs in successes.items() if len(runs) > 1}
    # At least once: a node SIGKILLed after its workload finished but before the agent
    # recorded it loses that report, and the item runs again elsewhere. Nothing else may.
    explained = all(successes[item][0]["node"] in killed_nodes for item in duplicates)
    missing_evidence = [
        i.item_id for i in status.items if demo and i.status == "succeeded" and i.item_id not in successes
    ]
    for item_id in missing_evidence:
        unaccounted[item_id] = "succeeded in the store, but the workload never reported a success"
    return {
        "succeeded": sum(1 for i in status.items if i.status == "succeeded") - len(missing_evidence),
        "failed": failed,
        "failed_unexpectedly": failed_unexpectedly,
        "succeeded_unexpectedly": succeeded_unexpectedly,
        "unaccounted": unaccounted,
        "duplicate_successes": duplicates,
        "duplicates_explained": explained,
        "redelivered": sum(1 for i in status.items if i.attempts > 1),
        "interruptions": sum(i.interruptions for i in status.items),
        "resumed": sum(1 for e in events if e["event"] == "resume"),
    }


@dataclass
class Chaos:
    """While the job runs, every `every_s`, in turn: SIGKILL one node that is up (busy or idle), send
    one a spot notice, or send a second copy of an unfinished item's message (SQS delivers at
    least once)."""

    rng: random.Random
    every_s: float = 3.0
    killed: set[str] = field(default_factory=set)
    noticed: set[str] = field(default_factory=set)
    duplicated: list[str] = field(default_factory=list)  # items whose message was sent twice
    strikes: int = 0

    def run(self, launcher: Launcher, env: Environment, job_id: str, done: threading.Event) -> None:
        """Strike every `every_s` until `done`, on its own thread: the pace does not depend on
        how long the watcher takes to read the job."""
        while not done.wait(self.every_s):
            try:
                self.strike(launcher, env, job_id)
            except Exception as err:  # noqa: BLE001 - chaos must not end the demo; the summary counts what happened
                logging.getLogger("tidefleet.sandbox").warning("chaos strike failed: %s", err)

    def strike(self, launcher: Launcher, env: Environment, job_id: str) -> None:
        turn, self.strikes = self.strikes % 3, self.strikes + 1
        if turn == 2:
            self.duplicate(env, job_id)
            return
        up = [n.instance_id for n in launcher.snapshot() if n.state == "up" and n.fate == ""]
        if not up:
            return
        victim = self.rng.choice(sorted(up))
        if turn == 0:
            self.killed.add(victim)
            launcher.kill(victim)
        else:
            self.noticed.add(victim)
            launcher.send_spot_notice(victim)

    def duplicate(self, env: Environment, job_id: str, count: int = 5) -> None:
        """Copies of the messages some unfinished items have now (their counters and sequence numbers)."""
        cloud = for_env(env)
        job = cloud.store.job(job_id)
        unfinished = [i for i in cloud.store.items(job_id) if i.status in ("queued", "running")] if job else []
        chosen = self.rng.sample(unfinished, min(count, len(unfinished)))
        copies = [sdk.ItemMessage(i.job_id, i.item_id, i.args, failures=i.failures, interruptions=i.interruptions,
                                  lost=i.lost, seq=i.seq) for i in chosen]  # fmt: skip
        if copies:
            sdk.send_messages(cloud, job.queue, copies)
            self.duplicated += [i.item_id for i in chosen]


def held_up(env, left_s: float) -> list[str]:
    """Why the fleet may not reach zero in the `left_s` the time limit left once every item was
    final: a pool's min keeps nodes, a scale-in delay longer than that keeps idle ones."""
    out = [f"pool {name}: min = {pool.min} keeps nodes up; the fleet never reaches zero, so the run ends at "
           "--time-limit (exit 2) however its items ended" for name, pool in env.pools.items() if pool.min]
    for name in env.pools:
        delay = env.idle_timeout_s(name)
        if delay is not None and delay > left_s:
            out.append(f"pool {name}: its idle timeout ({delay} s) keeps idle nodes longer than the {left_s:.0f} s "
                       "--time-limit left after the last item; give a longer --time-limit")  # fmt: skip
    return out


def run_demo(
    sandbox: Sandbox,
    *,
    items: int,
    deadline: float,
    chaos: Chaos | None,
    on_progress: Callable[[dict], None],
    seed: int = 7,
) -> Summary:
    started = time.time()
    queue = next(iter(sandbox.env.queues))
    demo = is_demo_workload(sandbox.env, queue)
    specs, doomed = make_inputs(sandbox.workdir, items, seed, fail_every=FAIL_EVERY if demo else 0)
    submitted_at = time.time()
    job_done = threading.Event()
    if chaos is not None:  # from the start: a big job's nodes are busy long before its submit returns
        threading.Thread(target=chaos.run, args=(sandbox.launcher, sandbox.env, sdk.job_id_for(DEMO_JOB), job_done),
                         daemon=True).start()  # fmt: skip
    job = sdk.submit(sandbox.env, DEMO_JOB, queue, specs)
    status = sdk.status(sandbox.env, job.job_id, items=True)
    done_at = zero_at = None
    stray_in_flight_s = 0.0  # messages in flight after every item finished: they hold a node up
    while time.time() < deadline:
        now = time.time()
        status = sdk.status(sandbox.env, job.job_id, items=True)
        if status.done and done_at is None:
            done_at = now
            job_done.set()
        at_zero = sandbox.fleet_at_zero()
        queues = sandbox.queue_depths()
        if done_at is not None and any(in_flight for _, in_flight, _ in queues.values()):
            stray_in_flight_s = now - done_at
        on_progress({"status": status, "queues": queues, "job": job.job_id})
        if done_at is not None and at_zero:
            zero_at = now
            break
        time.sleep(0.5)
    job_done.set()
    notes = [f"scaler error: {sandbox.tick_error}"] if sandbox.tick_error else []
    if done_at is not None and zero_at is None:
        notes += held_up(sandbox.env, deadline - done_at)
    if stray_in_flight_s > 2:
        notes.append(
            f"a message stayed in flight {stray_in_flight_s:.0f}s after every item had finished, "
            "keeping a node up until its visibility timeout"
        )

    events = read_events(sandbox.workdir)
    starts = [e["at"] for e in events if e["event"] == "start"]
    finished = [i.updated_at for i in status.items if i.status in ("succeeded", "failed")]
    last_finish = max(finished) if finished else None
    killed = chaos.killed if chaos else set()
    return Summary(
        items=items,
        **account(status, doomed, events, killed, demo=demo),
        demo_workload=demo,
        peak_nodes=sandbox.launcher.peak_nodes,
        node_seconds=round(sandbox.launcher.node_seconds(time.time()), 1),
        submit_to_first_start_s=round(min(starts) - submitted_at, 2) if starts else None,
        last_finish_to_zero_s=round(zero_at - last_finish, 2) if zero_at and last_finish else None,
        items_per_s=round(len(finished) / (last_finish - submitted_at), 2) if last_finish else None,
        nodes_killed=len(killed),
        spot_notices=len(chaos.noticed) if chaos else 0,
        duplicate_messages=len(chaos.duplicated) if chaos else 0,
        time_limit_hit=zero_at is None,
        fleet_at_zero=zero_at is not None,
        wall_s=round(time.time() - started, 1),
        workdir=str(sandbox.workdir),
        notes=notes,
    )
