"""Interruption function: spot interruption warnings, rebalance recommendations and the
group's terminate lifecycle action. The pure `action_for` decides; `control.drain` marks
the node draining, releases an idle node held by the hook, and when its pool still has
backlog kicks the scaler function (asynchronously), whose tick launches the replacement:
one writer of desired capacity, and no scaling rights needed here. A busy node stays held
until its agent has handed its items back and completes the lifecycle action itself.

Unknown or malformed events are logged and ignored (the function returns normally, so
EventBridge does not retry them). A notice it could not act on is one line, and fails the
invocation (the interruption-errors alarm, one retry): `lambdas.lambda_handler`.
"""

from __future__ import annotations

import json
import logging
import time

from lambdas import lambda_handler
from tidefleet.cloud.aws import lambda_runtime
from tidefleet.control import drain
from tidefleet.jobs.sdk import kick_scaler
from tidefleet.policy.interruption import Ignore, action_for

log = logging.getLogger("tidefleet.interruption")
logging.getLogger("tidefleet").setLevel(logging.INFO)  # Lambda's root logger stops at WARNING


@lambda_handler(log)
def handler(event, context=None) -> dict:
    env, ports = lambda_runtime()
    action = action_for(event, env)
    if isinstance(action, Ignore):
        log.warning(json.dumps({"ignored": action.reason}))
        return {"ignored": action.reason}
    return drain(
        env, ports, action, time.time(), replace=lambda pool: kick_scaler(env, f"{pool}: {action.reason}")
    )
