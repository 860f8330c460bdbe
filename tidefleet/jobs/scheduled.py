"""The I/O around `tidefleet.schedules`: fire one schedule, and the minute watch that releases
jobs waiting on another job and cancels scheduled runs past their deadline.

One small function runs both: AWS's schedule function (lambdas/schedule, EventBridge Scheduler:
one schedule per `[schedules.NAME]` plus a one-minute watch), GCP's scaler function (Cloud
Scheduler, routed by `tidefleet.triggers`), and the sandbox's own loop (`ScheduledJobs` in
tidefleet.sandbox.run: the watch every tick, each schedule at its fire times).

Idempotent and crash-safe: a fire's job id derives from its fire time, so a repeated delivery
submits nothing twice (and a submit stopped midway is continued by the next delivery; with none,
as on GCP, where a failed fire is not delivered again, by the watch or the next fire once no
submit can still be going: `schedules.SUBMIT_STALLED_S`, `resume`); a
release sends the held items, then clears `waiting`, so a release cut short is repeated by the
next watch (the items it already sent get a duplicate message, which the agent's fences drop).
"""

from __future__ import annotations

import contextlib
import json
import logging
from dataclasses import replace
from datetime import UTC, datetime
from itertools import islice

from tidefleet import schedules
from tidefleet.config import Environment
from tidefleet.jobs.sdk import (
    CHUNK,
    ItemMessage,
    JobError,
    _settled,
    cancel,
    kick_scaler,
    read_items,
    send_messages,
    submit,
)
from tidefleet.ports import Cloud
from tidefleet.records import Job

log = logging.getLogger("tidefleet.schedules")


def view(env: Environment, cloud: Cloud, job: Job | None) -> schedules.JobView | None:
    """What the decisions need of a job: from its settled-item counters (items are read only
    for jobs submitted before them; heartbeats never)."""
    if job is None:
        return None
    done = failed = False
    if not job.waiting and not job.submitting:
        # No heartbeat read for what runs: every minute, per watched job, a read of its whole pool's.
        status = _settled(cloud, env, job)
        done, failed = status.done, status.state == "failed"
    return schedules.JobView(job.job_id, done=done, failed=failed, cancelled=job.cancelled, submitting=job.submitting,
                             waiting=job.waiting, after=job.after, after_finished=job.after_finished,
                             deadline=job.deadline, schedule=job.schedule, created_at=job.created_at,
                             resumed_at=job.resumed_at)  # fmt: skip


def fire(env: Environment, cloud: Cloud, name: str, at: float, *, fired_at: float | None = None) -> schedules.Fire:
    """Fire schedule `name` at `at` (`fired_at`: the scheduler's own fire time, when it says)."""
    schedule = env.schedules[name]
    if schedules.stale_fire(schedule.cron, schedule.rate, said=fired_at, now=at):
        when = datetime.fromtimestamp(fired_at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        decided = schedules.Fire(None, 0.0, (), f"ignored: fired at {when}, no time of the schedule as it is now "
                                 "(a fire sent before the schedule changed)")  # fmt: skip
        log.info(json.dumps({"schedule": name, "decision": decided.reason, "cancelled": []}))
        return decided
    fired = schedules.fire_time_for(schedule.cron, schedule.rate, said=fired_at, now=at)
    this = schedules.run_id(name, fired)
    runs = [view(env, cloud, cloud.store.job(job_id)) for job_id in cloud.store.watched()]
    runs = [r for r in runs if r is not None and r.schedule == name]
    # An earlier run whose submit stopped part-way is continued first (or cancelled when it cannot
    # be), so that it runs and the decision sees it as it now is; this fire's own run is its submit's.
    said, abandoned = [], []
    for run in [r for r in runs if r.job_id != this and schedules.stalled(r, at) and not schedules.timed_out(r, at)]:
        try:
            job = cloud.store.job(run.job_id)
            if job is None:  # deleted since it was read: nothing to continue
                continue
            action, detail = resume(env, cloud, job, schedules.stopped_part_way(run, at), at)
        except cloud.errors as err:  # still stuck: counted as going; the watch or the next fire tries again
            said.append(f"failed to continue {run.job_id}, whose submit stopped part-way: {_one_line(err)}")
            continue
        said.append(f"{action} {run.job_id}: {detail}")
        abandoned += [run.job_id] if action == "cancelled" else []
    if said:
        runs = [view(env, cloud, cloud.store.job(r.job_id)) for r in runs]
        runs = [r for r in runs if r is not None]
    decided = schedules.fire(name, admission=schedule.admission, timeout_s=schedule.timeout_s, fired_at=fired, now=at,
                             runs=runs)  # fmt: skip
    for overdue in decided.cancel:
        cancel(env, overdue.job_id, reason=overdue.reason, cloud=cloud)
        cloud.store.unwatch(overdue.job_id)
    if decided.submit is not None:
        # A run is watched until seen finished: the next fire finds its previous run there. Watched
        # before its submit writes anything, so a submit that stops after its job record, before its
        # own watch write, still leaves the run where the watch and the next fire find it.
        # A queued run waits for the previous one to finish however it ended: runs are repeats, not
        # steps of a pipeline, so one failed or timed-out run must not cancel every run queued behind it.
        try:
            cloud.store.watch(decided.submit)
            submit(env, f"{name} {decided.submit}", schedule.queue, read_items(schedule.items), job_id=decided.submit,
                   schedule=name, deadline=decided.deadline, after=decided.after or None, after_finished=True)  # fmt: skip
        except Exception as err:  # the fire fails (its own line); what it did to an earlier run is said first
            if said:
                log.info(json.dumps({"schedule": name, "decision": "; ".join([*said, f"{decided.reason}: failed"]),
                                     "cancelled": abandoned + [c.job_id for c in decided.cancel],
                                     "failed": f"{type(err).__name__}: {_one_line(err)}"}))  # fmt: skip
            raise
    if said:
        decided = replace(decided, reason="; ".join([*said, decided.reason]),
                          cancel=tuple(schedules.Cancel(j, "its submit stopped part-way") for j in abandoned) + decided.cancel)  # fmt: skip
    log.info(json.dumps({"schedule": name, "decision": decided.reason,
                         "cancelled": [c.job_id for c in decided.cancel]}))  # fmt: skip
    return decided


def resume(env: Environment, cloud: Cloud, job: Job, why: str, now: float) -> tuple[str, str]:
    """Continue a scheduled run whose submit stopped part-way (`why`), with its schedule's items,
    as its fire submitted them: the SDK's submit sends what the stopped one did not, and nothing
    twice. A run the SDK will not continue (its schedule gone, or its items or queue changed since
    it fired) is cancelled with the reason, so it no longer holds the schedule. Returns what was
    done ("resumed", "cancelled", or "skipped": another continuation claimed it first) and why; a
    cloud's error goes to the caller (the run stays for the next try)."""
    # One continuation at a time (the SDK's submit writes a job's later chunks unconditionally):
    # the watch and a fire, or two ticks, may both have read the run stalled.
    if not cloud.store.claim_resume(job.job_id, now, stale_before=now - schedules.SUBMIT_STALLED_S):
        return "skipped", f"{why}; another continuation of it began under {schedules.SUBMIT_STALLED_S // 60} min ago: left to it"
    schedule = env.schedules.get(job.schedule)
    try:
        if schedule is None:
            raise JobError(f"environment {env.name!r} no longer has schedule {job.schedule!r}")
        done = submit(env, job.name, job.queue, read_items(schedule.items), job_id=job.job_id, schedule=job.schedule,
                      deadline=job.deadline, after=job.after or None, after_finished=True)  # fmt: skip
    except JobError as err:
        reason = f"{why} and cannot be continued from schedule {job.schedule!r}: {_one_line(err)}"
        cancel(env, job.job_id, reason=reason, cloud=cloud)
        cloud.store.unwatch(job.job_id)
        return "cancelled", reason
    except Exception:
        # Over: the SDK's submit lets the chunks it started finish before it raises. The next
        # watch may try again at once; should this write fail too, the claim lapses on its own.
        with contextlib.suppress(*cloud.errors):
            cloud.store.release_resume(job.job_id, now)
        raise
    what = (f"{done.total} item(s) recorded, held behind {job.after}" if done.held
            else f"{done.sent} item(s) sent, {done.total} in all")  # fmt: skip
    return "resumed", f"{why}; continued it from schedule {job.schedule!r}: {what}"


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split())


def release(env: Environment, cloud: Cloud, job: Job) -> int:
    """Send a waiting job's held (`pending`) items, then clear `waiting`; returns how many."""
    held = (i for i in cloud.store.items(job.job_id) if i.status == "pending")
    sent = 0
    for batch in iter(lambda: list(islice(held, CHUNK)), []):
        send_messages(cloud, job.queue, [ItemMessage(job.job_id, i.item_id, i.args) for i in batch])
        sent += len(batch)
    cloud.store.end_wait(job.job_id)
    return sent


def watch(env: Environment, cloud: Cloud, now: float) -> dict[str, str]:
    """One pass over the watched jobs: what was done to each (job id -> decision)."""
    out: dict[str, str] = {}
    for job_id in cloud.store.watched():
        decided = None
        try:  # its reads too: a throttled read of one job stopped the pass for the jobs after it
            job = cloud.store.job(job_id)
            mine = view(env, cloud, job)
            parent = view(env, cloud, cloud.store.job(job.after)) if job is not None and job.waiting and job.after else None
            decided = schedules.watch(mine, now=now, parent=parent)
            if decided.action == "resume":
                out[job_id] = ": ".join(resume(env, cloud, job, decided.reason, now))
                continue
            if decided.action == "release":
                sent = release(env, cloud, job)
                kick_scaler(env, f"released {job_id}: {decided.reason}")
                out[job_id] = f"released {sent} item(s): {decided.reason}"  # the next pass forgets it
                continue
            if decided.action == "cancel":
                cancel(env, job_id, reason=decided.reason, cloud=cloud)
            if decided.action in ("cancel", "forget"):
                cloud.store.unwatch(job_id)
        except (JobError, *cloud.errors) as err:  # one job's trouble never stops the others
            out[job_id] = (f"failed to continue its submit, stopped part-way: {_one_line(err)}; the next watch tries again"
                           if decided is not None and decided.action == "resume" else f"failed: {err}")  # fmt: skip
            continue
        out[job_id] = f"{decided.action}: {decided.reason}"
    if out:
        log.info(json.dumps({"watch": out}))
    return out
