"""GCP scaler function (2nd gen, CloudEvent from the environment's kick topic): one control tick.

Messages: Cloud Scheduler's {"tidefleet": "schedule"} every minute, and the job SDK's kick
after a submit, {"tidefleet": "kick", "env": "<env>", "reason": "<why>"}. Parsing is the AWS
handler's (`lambdas.scaler.handler.parse`), and so are the tick and the policy; only the
ports differ. Anything else is logged and ignored, and the function returns normally, so
Eventarc never retries it (the trigger also says do-not-retry).
"""

from __future__ import annotations

import base64
import binascii
import json
import logging

from lambdas.scaler.handler import Ignored, Trigger, parse, run
from tidefleet.cloud.gcp import function_runtime

log = logging.getLogger("tidefleet.scaler")
logging.basicConfig(level=logging.INFO, format="%(message)s")


def message_of(cloud_event) -> Trigger | Ignored:
    """The Pub/Sub message inside the CloudEvent, parsed as the AWS handler parses its events."""
    data = getattr(cloud_event, "data", None)
    encoded = ((data or {}).get("message") or {}).get("data") if isinstance(data, dict) else None
    if not isinstance(encoded, str):
        return Ignored("not a Pub/Sub message event")
    try:
        event = json.loads(base64.b64decode(encoded, validate=True))
    except (binascii.Error, UnicodeDecodeError, json.JSONDecodeError):
        return Ignored(f"message data is not base64 JSON ({encoded[:60]!r})")
    if isinstance(event, dict) and event.get("tidefleet") == "schedule":
        return Trigger("schedule", "cloud scheduler")
    return parse(event)


def on_kick(cloud_event) -> dict:
    """The entry point (an event-triggered 2nd-gen function gets a CloudEvent)."""
    return run(message_of(cloud_event), function_runtime)
