"""GCP scaler function (2nd gen, CloudEvent from the environment's kick topic): one control tick.

Packaged as `main.py` at the root of its own archive (stacks/package.py), beside `tidefleet/`
and `environments/`: the Python buildpack's default source, whose directory the Functions
Framework puts on sys.path. It imports nothing of AWS.

Messages: Cloud Scheduler's {"tidefleet": "schedule"} every minute, and the job SDK's kick
after a submit, {"tidefleet": "kick", "env": "<env>", "reason": "<why>"}; and for scheduled jobs
(stacks/gcp/schedules.py), Cloud Scheduler's {"tidefleet": "fire", "schedule": "<name>"} and the
minute's {"tidefleet": "watch"}. Parsing, the tick and
the policy are the core's (`tidefleet.triggers`), as on AWS; only the ports differ. What a tick saw
and decided is written as Cloud Monitoring custom metrics (`tidefleet.metrics`). Anything
else is logged and ignored. A tick that fails is logged as one error line and the function
returns normally: the next tick supersedes it. The function answers every message it ran, so
only a delivery the platform failed (the function busy, a timeout) is redelivered, as its
trigger's RETRY_POLICY_RETRY says: a message that failed the request would come back until it
expired.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import time
from dataclasses import replace

from tidefleet.cloud import for_env
from tidefleet.cloud.gcp import failed_for_now, function_metrics, function_runtime
from tidefleet.triggers import Ignored, Trigger, function_failure_line, iso_time, parse, run, run_jobs

log = logging.getLogger("tidefleet.scaler")
logging.basicConfig(level=logging.INFO, format="%(message)s")


def message_of(cloud_event) -> Trigger | Ignored:
    """The Pub/Sub message inside the CloudEvent, parsed as every scaler function parses its events.
    Any other shape (no data, data.message or its data not what Pub/Sub sends) is `Ignored`, saying which."""
    data = getattr(cloud_event, "data", None)
    if data is not None and not isinstance(data, dict):
        return Ignored(f"not a Pub/Sub message event (data is a {type(data).__name__}, not an object)")
    message = data.get("message") if data is not None else None
    if message is not None and not isinstance(message, dict):
        return Ignored(f"not a Pub/Sub message event (data.message is a {type(message).__name__}, not an object)")
    encoded = message.get("data") if message is not None else None
    if encoded is None:
        return Ignored("not a Pub/Sub message event")
    if not isinstance(encoded, str):
        return Ignored(f"not a Pub/Sub message event (data.message.data is a {type(encoded).__name__}, not a string)")
    try:
        trigger = parse(json.loads(base64.b64decode(encoded, validate=True)))
    except ValueError:  # not base64 (a non-ASCII character too), not UTF-8, not JSON
        return Ignored(f"message data is not base64 JSON ({encoded[:60]!r})")
    except RecursionError:
        return Ignored(f"message data nests deeper than a JSON reader goes ({len(encoded)} base64 characters)")
    # Cloud Scheduler's fire says no time (a Pub/Sub target's data is fixed); Pub/Sub's publishTime is
    # when it fired, kept on redelivery. From when it runs instead, a fire delayed past the next slot
    # (the function busy with a tick, a Google outage) took that slot's id: two fires, one run.
    if isinstance(trigger, Trigger) and trigger.kind == "fire" and trigger.at is None:
        trigger = replace(trigger, at=iso_time(message.get("publishTime")))
    return trigger


def _time_left(started: float):
    """Seconds until this request's timeout, from the `TIDEFLEET_TIMEOUT_S` the stack sets (a
    Cloud Function cannot ask its runtime); None without it: one whole tick, no re-ticks."""
    try:
        timeout = float(os.environ["TIDEFLEET_TIMEOUT_S"])
    except (KeyError, ValueError):
        return None
    return lambda: started + timeout - time.time()


def on_kick(cloud_event) -> dict:
    """The entry point (an event-triggered 2nd-gen function gets a CloudEvent). A schedule's fire
    and the minute watch (Cloud Scheduler messages) go to the scheduled-job code, the rest to a tick."""
    trigger = message_of(cloud_event)
    try:
        if isinstance(trigger, Trigger) and trigger.kind in ("fire", "watch"):
            env, _ = function_runtime()
            return run_jobs(trigger, env, for_env(env), time.time())
        return run(trigger, function_runtime, emit=function_metrics, time_left=_time_left(time.time()))
    except Exception as err:  # any failure of a tick: one line, then the next tick (a fire's, below)
        failed = {"severity": "ERROR", "trigger": getattr(trigger, "kind", None),
                  "failed": function_failure_line(err) or f"{type(err).__name__}: {err}"}  # fmt: skip
        log.error(json.dumps(failed))
        # A schedule's fire has no next tick: answered, it is gone (a night's run missed). Raised, the
        # trigger's retry policy delivers it again, which submits it once (its job id is its fire
        # time). Only where Google itself failed for now; a refusal would fail every time.
        if isinstance(trigger, Trigger) and trigger.kind == "fire" and failed_for_now(err):
            raise
        return failed
