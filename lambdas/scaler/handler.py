"""Scaler function: one control tick per trigger.

Triggers: the EventBridge schedule (every tick_s), the queue-depth alarm (alarm action), and
a "kick" the job SDK sends asynchronously after a submit so scale-out starts in seconds:
    {"tidefleet": "kick", "env": "<env>", "reason": "<why>"}
Anything else is logged and ignored; the function returns normally so the asynchronous
invoke is not retried (no retry storm on a bad event). Settings load once per cold start
from environments/<TIDEFLEET_ENV>.toml, packaged beside the code.

Only the library the tick needs is imported here (boto3, pydantic, the policy): no click,
jinja2 or cdktn on this path; see benchmarks/bench_cold_import.py.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from tidefleet.cloud.aws import lambda_runtime
from tidefleet.control import tick

log = logging.getLogger("tidefleet.scaler")
logging.getLogger("tidefleet").setLevel(logging.INFO)  # Lambda's root logger stops at WARNING


@dataclass(frozen=True, slots=True)
class Trigger:
    kind: str  # schedule | alarm | kick
    detail: str  # rule, alarm and state, or the kick's reason
    env: str | None = None  # a kick names its environment


@dataclass(frozen=True, slots=True)
class Ignored:
    reason: str


def parse(event: object) -> Trigger | Ignored:
    if not isinstance(event, dict):
        return Ignored(f"event is a {type(event).__name__}, not an object")
    if not all(isinstance(key, str) for key in event):
        return Ignored("event has keys that are not strings")
    if event.get("source") == "aws.events" and event.get("detail-type") == "Scheduled Event":
        resources = event.get("resources")
        names = [r for r in resources if isinstance(r, str)] if isinstance(resources, list) else []
        return Trigger("schedule", ",".join(names) or "schedule")
    if event.get("source") == "aws.cloudwatch" and isinstance(event.get("alarmData"), dict):
        alarm = event["alarmData"]
        state = alarm.get("state")
        value = state.get("value", "?") if isinstance(state, dict) else "?"
        return Trigger("alarm", f"{alarm.get('alarmName', '?')} -> {value}")
    if event.get("tidefleet") == "kick":
        if not isinstance(event.get("env"), str):
            return Ignored("kick without a string 'env'")
        return Trigger("kick", str(event.get("reason") or "kick"), env=event["env"])
    return Ignored(f"unknown event (source {str(event.get('source'))[:100]!r}, keys {sorted(event)[:8]})")


def handler(event, context=None) -> dict:
    return run(parse(event), lambda_runtime)


def run(trigger: Trigger | Ignored, runtime: Callable[[], tuple]) -> dict:
    """One tick for a parsed trigger; `runtime()` gives (env, ports) loaded once per cold start.
    Shared by the AWS and GCP functions: only the trigger parsing and the ports differ."""
    if isinstance(trigger, Ignored):
        log.warning(json.dumps({"ignored": trigger.reason}))
        return {"ignored": trigger.reason}
    env, ports = runtime()
    if trigger.env is not None and trigger.env != env.name:
        reason = f"kick for environment {trigger.env!r} reached the function of {env.name!r}"
        log.warning(json.dumps({"ignored": reason}))
        return {"ignored": reason}
    started = time.time()
    decisions = tick(env, ports, started)
    summary = {
        "trigger": trigger.kind,
        "detail": trigger.detail,
        "env": env.name,
        "desired": {d.pool: d.desired for d in decisions},
        "terminated": sum(len(d.terminate) for d in decisions),
        "ms": round((time.time() - started) * 1000),
    }
    log.info(json.dumps(summary))
    return summary
