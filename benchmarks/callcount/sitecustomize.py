"""Loaded by a benchmarked child process (on its PYTHONPATH): counts every AWS API call it
makes, by service and operation, and writes them as JSON to $TIDEFLEET_CALL_COUNT at exit."""

import atexit
import collections
import json
import os

import botocore.client

calls: collections.Counter = collections.Counter()
_make_api_call = botocore.client.BaseClient._make_api_call


def _counted(self, operation, params):
    calls[f"{self.meta.service_model.service_name}.{operation}"] += 1
    return _make_api_call(self, operation, params)


botocore.client.BaseClient._make_api_call = _counted
atexit.register(lambda: open(os.environ["TIDEFLEET_CALL_COUNT"], "w").write(json.dumps(calls)))  # noqa: SIM115
