"""Scheduled jobs and job dependencies: the pure decisions.

A schedule fires (EventBridge Scheduler on AWS, Cloud Scheduler on GCP, the sandbox's own
loop): `fire` decides from the schedule, the fire time and the schedule's unfinished runs
whether to submit a run, skip it (the previous one still going under `admission = "skip"`) or
hold it behind that run until it has finished (`"queue"`), and which overdue runs to cancel as
timed out. Every minute the watch looks at the few jobs that need looking after (waiting on
another job, or a scheduled run with a deadline): `watch` decides, per job, release / cancel /
keep / forget. No clock, no SDK, no store here: the caller passes what it read
(`tidefleet.jobs.scheduled` does the I/O).

Cron is the 5-field kind (minute hour day-of-month month day-of-week, UTC) with `*`, `a-b`,
`a,b` and `/n`; a rate is "N minutes|hours|days".
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

CRON_FIELDS = (("minute", 0, 59), ("hour", 0, 23), ("day of month", 1, 31), ("month", 1, 12), ("day of week", 0, 6))
RATE = re.compile(r"([1-9][0-9]{0,5}) (minute|hour|day)s?")
RATE_UNIT_S = {"minute": 60, "hour": 3600, "day": 86400}
LOOKBACK_DAYS = 4 * 366  # a cron that matches no day in four years (a leap day) matches none: 31 February


# -- cron and rate ------------------------------------------------------------------------------
def _cron_field(text: str, low: int, high: int) -> frozenset[int]:
    """The values one cron field allows; ValueError says what is wrong."""
    out: set[int] = set()
    for part in text.split(","):
        body, _, step_text = part.partition("/")
        step = int(step_text) if step_text.isdigit() and int(step_text) > 0 else None
        if step_text and step is None:
            raise ValueError(f"step {step_text!r} is not a whole number > 0")
        if body == "*":
            first, last = low, high
        elif re.fullmatch(r"\d+-\d+", body):
            first, last = map(int, body.split("-"))
        elif body.isdigit():
            first = last = int(body)
            if step:  # "5/15" means from 5 to the end in steps of 15
                last = high
        else:
            raise ValueError(f"{part!r} is not *, a number, a range a-b or a list")
        if not low <= first <= last <= high:
            raise ValueError(f"{part!r} is outside {low}-{high}")
        out.update(range(first, last + 1, step or 1))
    return frozenset(out)


@dataclass(frozen=True)
class Cron:
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday
    any_day: bool  # day of month is '*'
    any_weekday: bool  # day of week is '*'

    @classmethod
    def parse(cls, text: str) -> Cron:
        words = text.split()
        if len(words) != 5:
            raise ValueError(f"has {len(words)} field(s), not 5 (minute hour day-of-month month day-of-week)")
        values = []
        for word, (what, low, high) in zip(words, CRON_FIELDS, strict=True):
            weekday = what == "day of week"  # read over 0-7: 7 is Sunday too in most crons ('5-7', '*/7')
            try:
                allowed = _cron_field(word, low, 7 if weekday else high)
            except ValueError as err:
                raise ValueError(f"{what}: {err}") from None
            values.append(frozenset(day % 7 for day in allowed) if weekday else allowed)
        return cls(*values, any_day=words[2] == "*", any_weekday=words[4] == "*")

    def _day_matches(self, day: datetime) -> bool:
        if day.month not in self.months:
            return False
        by_date, by_weekday = day.day in self.days, (day.isoweekday() % 7) in self.weekdays
        if self.any_day or self.any_weekday:  # cron's rule: both restricted means either one
            return by_date and by_weekday
        return by_date or by_weekday

    def latest(self, at: float) -> float | None:
        """The latest minute at or before `at` that the expression matches."""
        moment = datetime.fromtimestamp(at, UTC).replace(second=0, microsecond=0)
        day = moment.replace(hour=0, minute=0)
        for back in range(LOOKBACK_DAYS):
            here = day - timedelta(days=back)
            if not self._day_matches(here):
                continue
            for hour in sorted(self.hours, reverse=True):
                for minute in sorted(self.minutes, reverse=True):
                    when = here.replace(hour=hour, minute=minute)
                    if when <= moment:
                        return when.timestamp()
        return None


def cron_problem(text: str) -> str | None:
    try:
        cron = Cron.parse(text)
    except ValueError as err:
        return str(err)
    return None if cron.latest(datetime(2030, 1, 1, tzinfo=UTC).timestamp()) is not None else "matches no date"


def rate_seconds(text: str) -> int | None:
    """"10 hours" -> 36000; None if it is not a rate."""
    match = RATE.fullmatch(text)
    return int(match.group(1)) * RATE_UNIT_S[match.group(2)] if match else None


def fire_time(cron: str | None, rate: str | None, at: float) -> float:
    """The schedule's fire time that `at` belongs to: for a cron its latest match, for a rate
    `at` truncated to the period (counted from the epoch, as the sandbox and GCP fire it)."""
    if cron is not None:
        latest = Cron.parse(cron).latest(at)
        return at if latest is None else latest
    period = rate_seconds(rate or "") or 60
    return at - at % period


# A scheduler sends a fire once its time has come, or later (a retried delivery): a fire time more
# than this after the fire runs is none it sent (a typo such as year 9998, a hand-written event),
# and would name the run after a time to come and put its deadline there. A minute: clocks' skew.
FIRE_AHEAD_S = 60


def fire_time_for(cron: str | None, rate: str | None, *, said: float | None, now: float) -> float:
    """The fire time of a fire that runs at `now`: the one the scheduler's `said` time belongs to,
    or the one `now` belongs to where it said none, or a time more than FIRE_AHEAD_S after `now`."""
    return fire_time(cron, rate, said if said is not None and said <= now + FIRE_AHEAD_S else now)


# A scheduler's fire says its slot's time, or a few seconds after (Cloud Scheduler's publish and
# its own retries, seconds apart). One that says a time this long after the schedule's latest slot
# is no slot of the schedule as it is now: sent under the schedule before a change (a deploy that
# moved the run from 03:00 to 04:00, the old job's 03:00 fire coming while it applies), which would
# submit yesterday's 04:00 run already past its deadline.
STALE_FIRE_S = 600


def stale_fire(cron: str | None, rate: str | None, *, said: float | None, now: float) -> bool:
    """Whether a fire that says `said` belongs to no slot of this schedule (`STALE_FIRE_S`)."""
    used = said is not None and said <= now + FIRE_AHEAD_S
    return used and said - fire_time(cron, rate, said) > STALE_FIRE_S


def run_id(schedule: str, fired_at: float) -> str:
    """One job per fire: a retried delivery of the same fire submits nothing twice."""
    return f"{schedule}-{datetime.fromtimestamp(fired_at, UTC):%Y%m%dt%H%M}"


# -- what a decision sees -----------------------------------------------------------------------
@dataclass(frozen=True)
class JobView:
    """What the decisions need of a job: read by the caller from the store."""

    job_id: str
    done: bool  # every item final
    failed: bool  # done, with failed items
    cancelled: bool
    submitting: bool = False  # its submit has not finished recording
    waiting: bool = False  # recorded, messages held back until `after` allows
    after: str = ""
    after_finished: bool = False
    deadline: float = 0.0  # 0: no whole-job timeout
    schedule: str = ""
    created_at: float = 0.0  # when its job record was written: its submit began
    resumed_at: float = 0.0  # when a continuation of its stopped submit last began; 0: none


@dataclass(frozen=True)
class Cancel:
    job_id: str
    reason: str


@dataclass(frozen=True)
class Fire:
    submit: str | None  # the run's job id, or None when skipped
    deadline: float  # of the new run; 0 = none
    cancel: tuple[Cancel, ...]
    reason: str
    after: str = ""  # admission "queue": the run it is held behind, released once that one finished


# A fire's submit runs within one call of its function (at most 300 s on AWS, 120 s on GCP; the
# sandbox's in its own loop), and a failed fire is retried within minutes. A scheduled run still
# `submitting` this long after its submit began has no submit going any more: it stopped part-way
# (an error after the job record was written: a throttled send, a function cut off), and would
# hold its schedule for good. The watch or the next fire continues it (the SDK's submit is
# idempotent and continues a job whose items were not all sent); before this, it might still be
# running, and a second submit beside it would send its items twice. A continuation claims the
# run first (`resumed_at`) and counts as its submit beginning anew: the SDK's submit is written for
# one at a time, and a big run's continuation goes on past the next watch.
SUBMIT_STALLED_S = 900


def submit_began(job: JobView, now: float) -> float:
    """When a scheduled run's submit, or the latest continuation of it, began, on the clock of
    `now`: its record's time, or its fire time (in its id) where the record is over a minute ahead
    of `now`, a clock not the writer's (a test's or a replay's); or its continuation's, if later
    (written on the clock of the watch or fire that began it)."""
    return max(_recorded(job, now), job.resumed_at)


def _recorded(job: JobView, now: float) -> float:
    if job.created_at <= now + FIRE_AHEAD_S:
        return job.created_at
    try:
        fired = datetime.strptime(job.job_id.removeprefix(f"{job.schedule}-"), "%Y%m%dt%H%M")
    except ValueError:
        return job.created_at
    return fired.replace(tzinfo=UTC).timestamp()


def stalled(job: JobView, now: float) -> bool:
    """A scheduled run whose submit stopped part-way: still `submitting` past SUBMIT_STALLED_S.
    A job submitted `--after` by hand is its submitter's to run again, as the CLI told them."""
    return (bool(job.schedule) and job.submitting and not job.cancelled and not job.done
            and now - submit_began(job, now) >= SUBMIT_STALLED_S)  # fmt: skip


def _ago(seconds: float) -> str:
    for unit, size in (("day", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            count = int(seconds // size)
            return f"{count} {unit}{'s' if unit == 'day' and count > 1 else ''}"
    return f"{int(seconds)} s"


def stopped_part_way(job: JobView, now: float) -> str:
    """Why a stalled run is continued or cancelled, for the schedule's log line."""
    return f"its submit stopped part-way (unfinished {_ago(now - submit_began(job, now))} after it began)"


def timed_out(job: JobView, now: float) -> Cancel | None:
    if job.deadline and now >= job.deadline and not job.done and not job.cancelled:
        return Cancel(job.job_id, f"timed out: past its deadline {_utc(job.deadline)}")
    return None


def fire(name: str, *, admission: str, timeout_s: int | None, fired_at: float, now: float,
         runs: list[JobView]) -> Fire:  # fmt: skip
    """One fire of schedule `name`; `runs` are its earlier runs that were not seen finished."""
    job_id = run_id(name, fired_at)
    overdue = tuple(c for c in (timed_out(r, now) for r in runs if r.job_id != job_id) if c)
    going = [r.job_id for r in runs if r.job_id != job_id and not r.done and not r.cancelled
             and r.job_id not in {c.job_id for c in overdue}]  # fmt: skip
    deadline = fired_at + timeout_s if timeout_s else 0.0
    if going and admission == "skip":
        return Fire(None, 0.0, overdue, f"skipped: {', '.join(going)} still running (admission 'skip')")
    if not going:
        return Fire(job_id, deadline, overdue, f"submit {job_id}")
    # Behind the latest run (ids sort by fire time), itself held behind the one before: one at a time, in order.
    behind = max(going)
    return Fire(job_id, deadline, overdue, f"submit {job_id}; queued behind {behind}", after=behind)


@dataclass(frozen=True)
class Watch:
    action: str  # keep | release | cancel | forget | resume (continue its submit, stopped part-way)
    reason: str


def watch(job: JobView | None, *, now: float, parent: JobView | None) -> Watch:
    """What to do with one watched job: release a waiting job once the job it waits for has
    succeeded (or finished, with `after_finished`), cancel it when that can no longer happen,
    cancel a run past its deadline, forget a job that needs no more looking after (a released
    job; a scheduled run once finished). A scheduled run whose submit stopped part-way is
    continued (`resume`), or cancelled when past its deadline; one whose submit may still be
    going is left to it."""
    if job is None:
        return Watch("forget", "the job no longer exists")
    if job.cancelled or job.done:
        return Watch("forget", "finished" if job.done else "cancelled")
    if job.submitting and not stalled(job, now):
        return Watch("keep", "still being recorded by its submit")
    if (overdue := timed_out(job, now)) is not None:
        return Watch("cancel", overdue.reason)
    if job.submitting:
        return Watch("resume", stopped_part_way(job, now))
    if not job.waiting:  # a scheduled run stays watched until seen finished: the next fire looks for it
        return Watch("keep" if job.schedule else "forget", "running")
    if parent is None:
        return Watch("cancel", f"the job it waits for, {job.after}, does not exist")
    if not parent.done and not parent.cancelled:
        return Watch("keep", f"waiting for {job.after}")
    if job.after_finished:
        return Watch("release", f"{job.after} finished")
    if parent.cancelled or parent.failed:
        return Watch("cancel", f"{job.after} {'was cancelled' if parent.cancelled else 'failed'}; "
                               "submit with --after-finished to run after any outcome")  # fmt: skip
    return Watch("release", f"{job.after} succeeded")


def _utc(at: float) -> str:
    return f"{datetime.fromtimestamp(at, UTC):%Y-%m-%d %H:%M:%S} UTC"
