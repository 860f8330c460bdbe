"""Cloud function entry points: thin handlers over the tidefleet library.

Every AWS handler is wrapped by `lambda_handler`: a failure the library can explain (the settings,
an AWS call, a tick's failed actions, a job not submitted) is logged as one line and raised as
`FunctionFailed` with that line, so the invocation still fails (the functions' Errors alarms, the
asynchronous retry, the failure queue) while Lambda reports the line, not a traceback of the
library. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import json
from functools import wraps

from tidefleet.triggers import function_failure_line


class FunctionFailed(Exception):
    """The invocation failed; the message says what failed and what to do, in one line."""


def lambda_handler(log):
    """Decorate a Lambda handler `(event, context) -> dict`; its failure line goes to `log`."""

    def decorate(body):
        @wraps(body)
        def handler(event, context=None):
            try:
                return body(event, context)
            except Exception as err:  # the explained ones; the rest is raised as it is
                line = function_failure_line(err)
                if line is None:
                    raise
                log.error(json.dumps({"failed": line}))
                # From None, and raised here: Lambda reports this line and this one frame.
                raise FunctionFailed(line) from None

        return handler

    return decorate

