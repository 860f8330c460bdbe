"""What starts a control tick, for every cloud's scaler function: the trigger parsed from the
function's event, and one tick run for it. Only the event shapes and the ports differ between
clouds; the AWS handler and the GCP function both call `parse` and `run` from here.

No cloud SDK is imported here (the GCP function must not load boto3, nor the AWS one google).

Triggers: AWS's EventBridge schedule and queue-depth alarm, GCP's Cloud Scheduler message, and
the "kick" the job SDK sends after a submit so scale-out starts in seconds:
    {"tidefleet": "kick", "env": "<env>", "reason": "<why>"}
Scheduled jobs (`tidefleet.jobs.scheduled`): a schedule's fire and the minute watch,
    {"tidefleet": "fire", "schedule": "<name>", "at": "<ISO time the scheduler fired>"}
    {"tidefleet": "watch"}
run by AWS's schedule function and, on GCP, by the scaler function (`run_jobs`).
Anything else is `Ignored`: logged, and the function returns normally, so the platform does
not retry it (no retry storm on a bad event).

A function's own failures (settings that do not load, a tick whose actions failed, a job the
schedule could not submit) are said in one line by `failure_line`; each cloud adds its own.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tidefleet.config import Environment
    from tidefleet.policy.model import PoolDecision

log = logging.getLogger("tidefleet.scaler")
# A fire and the watch are the scheduled jobs' (tidefleet.jobs.scheduled), on either cloud.
jobs_log = logging.getLogger("tidefleet.schedules")
# An event's free text (a kick's reason, an unknown event's source) is cut to this in the log line.
DETAIL_CHARS = 100
# A fire time outside these years is not one a scheduler sent (a typo, a forged event): the run's
# job id (`schedules.run_id`) and a cron's look-back (`schedules.LOOKBACK_DAYS`) could not hold it.
FIRE_YEARS = range(1970, 9999)


@dataclass(frozen=True, slots=True)
class Trigger:
    kind: str  # schedule | alarm | kick | fire | watch
    detail: str  # rule, alarm and state, the kick's reason or the fire's schedule: each cut (`clip`) for the log
    env: str | None = None  # a kick names its environment
    at: float | None = None  # a fire: when the scheduler fired it (EventBridge Scheduler says so)


@dataclass(frozen=True, slots=True)
class Ignored:
    reason: str


def parse(event: object) -> Trigger | Ignored:
    """A decoded event: AWS's schedule and alarm events, GCP's schedule message, or a kick."""
    if not isinstance(event, dict):
        return Ignored(f"event is a {type(event).__name__}, not an object")
    if not all(isinstance(key, str) for key in event):
        return Ignored("event has keys that are not strings")
    if event.get("source") == "aws.events" and event.get("detail-type") == "Scheduled Event":
        resources = event.get("resources")
        names = [r for r in resources if isinstance(r, str)] if isinstance(resources, list) else []
        return Trigger("schedule", clip(",".join(names)) or "schedule")
    if event.get("source") == "aws.cloudwatch" and isinstance(event.get("alarmData"), dict):
        alarm = event["alarmData"]
        state = alarm.get("state")
        value = state.get("value", "?") if isinstance(state, dict) else "?"
        return Trigger("alarm", f"{clip(str(alarm.get('alarmName', '?')))} -> {clip(str(value))}")
    if event.get("tidefleet") == "schedule":  # Cloud Scheduler's message on GCP
        return Trigger("schedule", "cloud scheduler")
    if event.get("tidefleet") == "fire":
        if not isinstance(event.get("schedule"), str):
            return Ignored("fire without a string 'schedule'")
        # Cut, a name longer than DETAIL_CHARS still matches no schedule (config.NAME: at most 31 characters).
        return Trigger("fire", clip(event["schedule"]), env=None, at=iso_time(event.get("at")))
    if event.get("tidefleet") == "watch":
        return Trigger("watch", "watch")
    if event.get("tidefleet") == "kick":
        if not isinstance(event.get("env"), str):
            return Ignored("kick without a string 'env'")
        return Trigger("kick", _reason(event.get("reason")), env=event["env"])
    return Ignored(f"unknown event (source {str(event.get('source'))[:DETAIL_CHARS]!r}, keys {sorted(event)[:8]})")


def _reason(reason: object) -> str:
    """A kick's reason, for the log line: a string cut to DETAIL_CHARS; anything else is not
    a reason (the kick still ticks: only its `env` matters)."""
    if not reason:
        return "kick"
    if not isinstance(reason, str):
        return f"kick (its reason is a {type(reason).__name__}, not a string)"
    return clip(reason)


def clip(text: str) -> str:
    """An event's free text, for a log line: cut to DETAIL_CHARS, saying how long it was."""
    return text if len(text) <= DETAIL_CHARS else f"{text[:DETAIL_CHARS]}... ({len(text)} characters)"


WATCH_EVENT = {"tidefleet": "watch"}


def fire_event(schedule: str, at: str | None = None) -> dict:
    """What a scheduler sends when `schedule` fires. `at`: its fire time where the scheduler can
    fill one in (EventBridge Scheduler's placeholder); without it the fire's time is when it runs."""
    return {"tidefleet": "fire", "schedule": schedule} | ({"at": at} if at else {})


def iso_time(value: object) -> float | None:
    """The fire time an event says; None (the fire's time is then when it runs) when it says none
    that can be used: not ISO 8601, or outside FIRE_YEARS in UTC."""
    try:
        at = datetime.fromisoformat(str(value)).timestamp() if value else None
        return at if at is not None and datetime.fromtimestamp(at, UTC).year in FIRE_YEARS else None
    except (ValueError, OverflowError, OSError):  # the last two: beyond what the platform's clock holds
        return None


def run_jobs(trigger: Trigger, env, cloud, now: float) -> dict:
    """A schedule's fire or the minute watch (tidefleet.jobs.scheduled); `cloud` is the
    environment's Cloud (submit, cancel, the watch list)."""
    from tidefleet.jobs import scheduled  # the scaler's own ticks never load the job SDK

    if trigger.kind == "watch":
        return {"trigger": "watch", "env": env.name, "watched": scheduled.watch(env, cloud, now)}
    if trigger.detail not in env.schedules:
        reason = f"fire for schedule {trigger.detail!r}, which environment {env.name!r} does not have"
        jobs_log.warning(json.dumps({"ignored": reason}))
        return {"ignored": reason}
    decided = scheduled.fire(env, cloud, trigger.detail, now, fired_at=trigger.at)
    return {"trigger": "fire", "schedule": trigger.detail, "env": env.name, "decision": decided.reason,
            "cancelled": [c.job_id for c in decided.cancel]}  # fmt: skip


def function_environment() -> Environment:
    """The environment a cloud function serves: the one TIDEFLEET_ENV names (its stack sets it).
    Raises ConfigError, as for any environment that does not load."""
    from tidefleet.config import ConfigError, environments_dir, known_environments, load_environment

    name = os.environ.get("TIDEFLEET_ENV")
    if not name:
        problem = "not set; the function's stack sets it to its environment's name"
        raise ConfigError("TIDEFLEET_ENV", [f"{problem}: deploy the environment again (invoke deploy --env <env>)"])
    try:
        return load_environment(name)
    except ConfigError as err:
        if err.source != "env":  # a file's problems: its path names it
            raise
        # The name is the function's setting, not a --env the person typed: no path is a fix here.
        packaged = ", ".join(known_environments(environments_dir())) or "none"
        problem = (f"no environment {name!r} in the function's package (it has: {packaged}); the stack sets it to the "
                   "name it packaged: deploy the environment again (invoke deploy --env <env>)")  # fmt: skip
        raise ConfigError("TIDEFLEET_ENV", [problem]) from None


def failure_line(err: BaseException, explain: Callable[[Exception], str | None] | None = None) -> str | None:
    """One line for a function's failure that the library can explain: its settings do not load,
    some actions or job-store reads of a tick failed, a schedule's run could not be submitted.
    None for anything else: a cloud's error (the cloud's `explain` says those) or a bug (its
    traceback says where). `explain(exception)`, the function's cloud's words for one of its
    errors or None, says each failed action's or read's error, as a failed observe is said."""
    from tidefleet.config import ConfigError
    from tidefleet.control import TickError
    from tidefleet.jobs.sdk import JobError

    if isinstance(err, ConfigError):
        return f"{err.source}: {'; '.join(err.problems)}"
    if isinstance(err, TickError):  # `<pool>: <action>: <error>` per failed action or read, all on one line
        said = [f"{where}: {(explain and explain(e)) or f'{type(e).__name__}: {e}'}" for where, e in err.failures]
        said += [out_of_time(err.cut)] if err.cut else []
        return f"{err.summary}, the next tick tries them again: {'; '.join(' '.join(s.split()) for s in said)}"
    if isinstance(err, JobError):
        return " ".join(str(err).split())
    return None


def out_of_time(cut: dict) -> str:
    """What a tick out of time left to the next (`control.Deadline.cut`), and why, in words."""
    skipped = [f"pools {', '.join(cut['skipped'])}"] if cut["skipped"] else []
    return f"out of time, skipped {' and '.join(skipped + cut.get('not_written', []))}: {cut['out_of_time']}"


def function_failure_line(err: BaseException) -> str | None:
    """`failure_line` in a cloud function: its cloud's errors, each of a tick's failed actions
    included, in that cloud's words (`Cloud.explain`: in a function, the fix its operator makes
    there, such as its role or a redeploy); None for a bug. The settings loaded before any call
    to the cloud could fail, so the environment loads here."""
    from tidefleet.cloud import for_env

    cloud = None

    def explain(e: BaseException) -> str | None:
        nonlocal cloud
        if cloud is None:  # once, for a tick's many failed actions
            cloud = for_env(function_environment())
        return cloud.explain(e) if isinstance(e, cloud.errors) else None

    return failure_line(err, explain) or explain(err)


Emit = Callable[[object, list], object]  # (env, tidefleet.metrics points): the cloud's metrics writer
# A run ticks again while items wait for at most this long after its first tick: the stacks size
# the function's timeout (120 s) and its slow-tick alarm (80 % of it) on one loop plus one tick.
MAX_LOOP_S = 60.0
# Seconds kept in hand past the next tick's expected end before the function's own timeout.
LOOP_MARGIN_S = 5.0


def run(
    trigger: Trigger | Ignored,
    runtime: Callable[[], tuple],
    emit: Emit | None = None,
    time_left: Callable[[], float] | None = None,
) -> dict:
    """A tick for a parsed trigger; `runtime()` gives (env, ports), loaded once per cold start.
    `emit(env, points)` writes what the tick saw and decided as metrics (`tidefleet.metrics`),
    also when some action failed; a metrics write that fails is logged, never fails the tick.

    With `time_left()` (seconds until the function's timeout), a tick that saw items waiting is
    followed by another `scaler.waiting_tick_s` later (`control.retick_in`), within MAX_LOOP_S
    of the first and the next scheduled tick, while the time left holds the wait and twice the
    last tick. Without it there is one tick. And the run ends in its own lines before the
    timeout: a tick acts on a pool, or writes after the pools (the metrics too), only while the
    time left holds what such a step took at most in this run (`control.Deadline`), and leaves the
    rest to the next tick, which the summary names (`skipped`, `not_written`, `out_of_time`)."""
    if isinstance(trigger, Ignored):
        log.warning(json.dumps({"ignored": trigger.reason}))
        return {"ignored": trigger.reason}
    # The tick, the policy, the metric set and the settings (pydantic) load on the first trigger, not on import.
    from tidefleet import metrics
    from tidefleet.control import Deadline, retick_in, tick

    env, ports = runtime()
    if trigger.env is not None and trigger.env != env.name:
        reason = f"kick for environment {trigger.env!r} reached the function of {env.name!r}"
        log.warning(json.dumps({"ignored": reason}))
        return {"ignored": reason}
    first = started = time.time()
    seen: list = []  # the last tick's fleet view
    acted: dict[str, dict] = {}  # per pool, what the last tick's act did (`control.act`)
    deadline = Deadline(time_left, LOOP_MARGIN_S) if time_left is not None else Deadline()

    def report(fleet, decided) -> None:
        seen[:] = [fleet]
        if emit is not None:
            deadline.write("metrics", partial(write_metrics, fleet, decided))

    def write_metrics(fleet, decided) -> None:
        done = {d.pool: acted[d.pool] for d in decided if d.pool in acted}  # not a pool this tick left out
        try:
            emit(env, metrics.tick_points(env, fleet, decided, started, done))  # what act set, not the decision
        except Exception as err:  # noqa: BLE001 - metrics are for people; the tick's work is done
            log.warning(json.dumps({"metrics": f"not written: {type(err).__name__}: {err}"}))

    ticks, terminated, slowest, dry_run = 1, 0, 0.0, env.scaler.dry_run
    scheduled = env.scaler.scheduled_tick_s  # a function's schedule, whatever tick_s asks below a minute
    while True:
        decisions = tick(env, ports, started, report=report, acted=acted.__setitem__, tick_s=scheduled,
                         deadline=deadline)  # fmt: skip
        # The nodes really terminated: the fleet skips those already gone or not in service.
        terminated += sum(len(d.terminate) if dry_run else len(acted[d.pool]["terminated"]) for d in decisions)
        took = time.time() - started
        slowest = max(slowest, took)
        wait = retick_in(env, seen[0]) if time_left is not None and seen else None
        if (
            wait is None
            or deadline.cut  # out of time already
            or time.time() + wait > first + min(MAX_LOOP_S, scheduled) - wait  # the next run is near
            or time_left() < wait + 2 * took + LOOP_MARGIN_S
        ):
            break
        time.sleep(wait)
        started, ticks = time.time(), ticks + 1
    summary = {
        "trigger": trigger.kind,
        "detail": trigger.detail,
        "env": env.name,
        **_desired(decisions, acted, dry_run),
        "terminated": terminated,
        "ms": round(slowest * 1000),  # the slowest tick's
        "ticks": ticks,
        **(deadline.cut or {}),  # what the last tick left to the next, and why
    }
    log.info(json.dumps(summary))
    return summary


def _desired(decisions: tuple[PoolDecision, ...], acted: dict[str, dict], dry_run: bool) -> dict:
    """The summary's desired capacity per pool: what act set (or left, when the group already had
    it), not the policy's decision, which the group may not take: `held` says why a pool's differs
    (a group MaxSize below the config's max, running nodes it would otherwise pick from). A tick
    whose set failed raises instead (`failure_line`). A dry run sets nothing: what it decided, as
    its `terminated` counts the nodes it decided to terminate."""
    if dry_run:
        return {"desired": {d.pool: d.desired for d in decisions}, "dry_run": True}
    held = {d.pool: acted[d.pool]["held"] for d in decisions if "held" in acted[d.pool]}
    return {"desired": {d.pool: acted[d.pool]["desired_after"] for d in decisions}} | ({"held": held} if held else {})
