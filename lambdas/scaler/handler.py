"""Scaler function: one control tick per trigger.

Triggers: the EventBridge schedule (every tick_s), the queue-depth alarm (alarm action), and
the job SDK's asynchronous kick after a submit. Parsing and the tick are the core's
(`tidefleet.triggers`, shared with the GCP function); only the ports are AWS's. Anything else
is logged and ignored; the function returns normally so the asynchronous invoke is not retried.
A tick that fails is one line, and fails the invocation (the scaler-errors alarm): `lambdas.lambda_handler`.
What the tick saw and decided goes to stdout as Embedded Metric Format lines (`tidefleet.metrics`).
Settings load once per cold start from environments/<TIDEFLEET_ENV>.toml, packaged beside the code.

Only the library the tick needs is imported here (boto3, pydantic, the policy): no click,
jinja2 or cdktn on this path; see benchmarks/bench_cold_import.py.
"""

from __future__ import annotations

import logging

from lambdas import lambda_handler
from tidefleet.cloud.aws import lambda_runtime
from tidefleet.triggers import log, parse, run

logging.getLogger("tidefleet").setLevel(logging.INFO)  # Lambda's root logger stops at WARNING


def emit(env, points) -> None:
    # The metric set loads with the settings, on the first tick: not on the cold import.
    from tidefleet.cloud.aws.metrics import emf_stdout

    emf_stdout(env, points)


@lambda_handler(log)
def handler(event, context=None) -> dict:
    # Lambda's context says how long the invocation has left: the run may then tick again while
    # items wait, and leaves to the next tick what its time does not hold (`tidefleet.triggers.run`).
    # Without one (a direct call), one whole tick.
    remaining = getattr(context, "get_remaining_time_in_millis", None)
    time_left = (lambda: remaining() / 1000) if callable(remaining) else None
    return run(parse(event), lambda_runtime, emit=emit, time_left=time_left)
