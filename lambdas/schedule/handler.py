"""Schedule function: a `[schedules.NAME]` fire from EventBridge Scheduler, and the minute watch
that releases jobs waiting on another job and cancels scheduled runs past their deadline.

Events: {"tidefleet": "fire", "schedule": "<name>", "at": "<aws.scheduler.scheduled-time>"} and
{"tidefleet": "watch"}. Parsing and the decisions are the core's (`tidefleet.triggers`,
`tidefleet.schedules`); the submit is the job SDK's. Anything else is logged and ignored; the
function returns normally so a bad event is not retried. A fire or watch that fails is one line,
and fails the invocation (one retry, then the failure queue): `lambdas.lambda_handler`. A run
whose submit stopped part-way (the retry failing too) does not hold its schedule: the watch or
the next fire continues it once no submit can still be going (`tidefleet.jobs.scheduled.resume`). Its role
may send to the queues of its environment and write its job store, nothing more.
"""

from __future__ import annotations

import json
import logging
import time
from functools import cache

from lambdas import lambda_handler
from tidefleet.cloud import for_env
from tidefleet.triggers import Ignored, function_environment, parse, run_jobs

log = logging.getLogger("tidefleet.schedules")
logging.getLogger("tidefleet").setLevel(logging.INFO)  # Lambda's root logger stops at WARNING


@cache
def runtime():
    """Settings and clients, once per cold start: the environment named by TIDEFLEET_ENV."""
    env = function_environment()
    return env, for_env(env)


@lambda_handler(log)
def handler(event, context=None) -> dict:
    trigger = parse(event)
    if isinstance(trigger, Ignored) or trigger.kind not in ("fire", "watch"):
        reason = trigger.reason if isinstance(trigger, Ignored) else f"a {trigger.kind} event is the scaler's"
        log.warning(json.dumps({"ignored": reason}))
        return {"ignored": reason}
    env, cloud = runtime()
    return run_jobs(trigger, env, cloud, time.time())
