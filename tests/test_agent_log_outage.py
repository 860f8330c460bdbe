"""A log service that takes the connection and never answers (CloudWatch Logs black-holed, all else
healthy) costs an item its logs, never its heartbeat, its claim or a second run: a real agent
process against the moto server, its logs endpoint a silent port."""

from __future__ import annotations

import pytest
from agent_harness import Harness, wait_until
from bad_endpoints import silent

from tidefleet.jobs import sdk
from tidefleet.records import FINAL

pytestmark = pytest.mark.moto

# Prints a line every 0.1 s for 15 s: sends are due all along, the first within a second.
CHATTY = r"""
import json, os, time
with open(os.environ["LEDGER"], "a") as f:
    f.write(json.dumps({"event": "start", "node": os.environ["TIDEFLEET_NODE_ID"]}) + "\n")
for n in range(150):
    print(f"line {n}", flush=True)
    time.sleep(0.1)
"""


def the_item(h: Harness, job: str, statuses):
    """The job's one item once its status is one of `statuses`; None before."""
    item = h.items(job)["000000"]
    return item if item.status in statuses else None


def test_a_silent_log_endpoint_keeps_neither_the_heartbeat_nor_the_item_waiting(tmp_path, aws):
    h = Harness(tmp_path, aws, workload=CHATTY)
    job = sdk.submit(h.env, "quiet-logs", "work", sdk.read_items([[]]), kick=False).job_id
    with silent() as logs_endpoint:
        try:
            h.start_agent("node-a", AWS_ENDPOINT_URL_CLOUDWATCH_LOGS=logs_endpoint)
            running = wait_until(lambda: the_item(h, job, {"running"}), 30, "the item to run")
            # Renewed every heartbeat (0.5 s) while sends hang: a send takes 3 tries of 8 s to fail.
            wait_until(lambda: h.items(job)["000000"].lease_until > running.lease_until + 8, 20,
                       "the claim to be renewed while the log service hangs")  # fmt: skip
            item = wait_until(lambda: the_item(h, job, FINAL), 30, "the item to end")
        finally:
            h.stop_agents()
    assert item.status == "succeeded" and item.attempts == 1 and len(item.history) == 1
    assert [e["node"] for e in h.events("start")] == ["node-a"]
