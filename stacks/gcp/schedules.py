"""Scheduled jobs on GCP: Cloud Scheduler publishes each `[schedules.NAME]`'s fire, and the
one-minute watch, to the kick topic; the scaler function runs them (lambdas/gcp_scaler/main.py
`on_kick` -> `tidefleet.triggers.run_jobs`). The messages are AWS's, less the fire time, which
Cloud Scheduler cannot fill in: the function takes the fire the time it runs belongs to
(`tidefleet.schedules.fire_time`, counted from the epoch for a rate).
"""

from __future__ import annotations

import base64
import json
from collections import defaultdict

from cdktn_provider_google.cloud_scheduler_job import CloudSchedulerJob
from constructs import Construct

from tidefleet import naming
from tidefleet.config import Environment
from tidefleet.schedules import CRON_FIELDS, Cron, rate_seconds
from tidefleet.triggers import WATCH_EVENT, fire_event

WATCH_EVERY = "* * * * *"
FIRE_RETRIES = 2  # a fire delivered twice submits nothing twice


def _field(values: frozenset[int], low: int, high: int, *, star: bool = True) -> str:
    """Values as a unix-cron field: '*', '*/n', 'a-b', 'a-b/n' or a list. `star=False` keeps a
    restricted day field from reading as '*' (cron ORs two restricted day fields, else ANDs)."""
    ordered = sorted(values)
    step = ordered[1] - ordered[0] if len(ordered) > 1 else 1
    if star and ordered == list(range(low, high + 1, step)) and (high + 1 - low) % step == 0:
        return "*" if step == 1 else f"*/{step}"
    if len(ordered) > 2 and ordered == list(range(ordered[0], ordered[-1] + 1, step)):
        return f"{ordered[0]}-{ordered[-1]}" + (f"/{step}" if step > 1 else "")
    return ",".join(map(str, ordered))


def unix_crons(cron: str | None, rate: str | None) -> list[str]:
    """Cloud Scheduler's unix-cron for a schedule, written from the values tidefleet's own cron
    reads (7 as Sunday, '5/15' from 5 to the end): one expression, or, for a rate that divides
    the day but not the hour ("45 minutes"), one per set of hours that fire at the same minutes."""
    if cron is not None:
        c = Cron.parse(cron)
        (_, *minute), (_, *hour), (_, *day), (_, *month), (_, *weekday) = CRON_FIELDS
        return [" ".join((_field(c.minutes, *minute), _field(c.hours, *hour),
                          "*" if c.any_day else _field(c.days, *day, star=False), _field(c.months, *month),
                          "*" if c.any_weekday else _field(c.weekdays, *weekday, star=False)))]  # fmt: skip
    period = rate_seconds(rate or "") // 60  # the config holds a rate on GCP to one dividing the day
    hours_at: dict[int, set[int]] = defaultdict(set)
    for at in range(0, 24 * 60, period):
        hours_at[at % 60].add(at // 60)
    minutes_of: dict[frozenset[int], set[int]] = defaultdict(set)
    for minute, hours in hours_at.items():
        minutes_of[frozenset(hours)].add(minute)
    return [f"{_field(frozenset(minutes), 0, 59)} {_field(hours, 0, 23)} * * *"
            for hours, minutes in sorted(minutes_of.items(), key=lambda hm: (min(hm[0]), min(hm[1])))]  # fmt: skip


def publish_on_schedule(scope: Construct, id: str, *, name: str, region: str, schedule: str, topic_id: str,
                        message: dict, retries: int, after: list | None = None) -> CloudSchedulerJob:  # fmt: skip
    """A Cloud Scheduler job that publishes `message` (JSON) to the topic, in UTC; created `after`
    those resources (a fire published before the function's trigger subscribes is dropped)."""
    return CloudSchedulerJob(
        scope, id, name=name, region=region, schedule=schedule, time_zone="Etc/UTC",
        retry_config={"retry_count": retries},
        pubsub_target={"topic_name": topic_id, "data": base64.b64encode(json.dumps(message).encode()).decode()},
        depends_on=after,
    )  # fmt: skip


class ScheduledJobs(Construct):
    """Exposes `jobs` (schedule name -> its Cloud Scheduler jobs, usually one) and `watch`."""

    def __init__(self, scope: Construct, id: str, *, env: Environment, topic_id: str, after: list) -> None:
        super().__init__(scope, id)
        # After the scaler function, whose trigger's subscription is what delivers them: on a first
        # deploy a fire published before it exists reaches no one (the topic keeps no message).
        job = lambda id, name, when, message, retries: publish_on_schedule(
            self, id, name=name, region=env.region, schedule=when, topic_id=topic_id, message=message, retries=retries,
            after=after)  # fmt: skip
        # Its own id and name: a schedule may be called "watch" ("fire-watch", "…-schedule-watch").
        self.watch = job("watch", naming.watch_schedule(env.name), WATCH_EVERY, WATCH_EVENT, 0)
        self.jobs = {
            schedule_name: [
                job(f"fire-{schedule_name}" + (f"_{part}" if part > 1 else ""), naming.schedule(env.name, schedule_name, part),
                    when, fire_event(schedule_name), FIRE_RETRIES)
                for part, when in enumerate(unix_crons(s.cron, s.rate), 1)
            ]
            for schedule_name, s in sorted(env.schedules.items())
        }  # fmt: skip
