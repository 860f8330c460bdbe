"""A real agent process skips the queues the scaler holds (a team at its quota) and takes their
items again once released."""

from __future__ import annotations

import pytest
from agent_harness import Harness, wait_until

from tidefleet.cloud.aws.dynamodb import DynamoStore
from tidefleet.jobs import sdk
from tidefleet.records import FINAL

pytestmark = pytest.mark.moto


def test_an_agent_takes_nothing_from_a_held_queue_until_the_scaler_releases_it(tmp_path, aws, request):
    h = Harness(tmp_path, aws)
    request.addfinalizer(h.stop_agents)
    store = DynamoStore(h.env.name, h.env.region)
    store.mark_held("work", 1_800_000_000.0)
    held = sdk.submit(h.env, "held", "work", sdk.read_items([["steps=1"]]), kick=False).job_id
    free = sdk.submit(h.env, "free", "short", sdk.read_items([["steps=1"]]), kick=False).job_id
    h.start_agent("node-a")
    wait_until(lambda: all(i.status in FINAL for i in h.items(free).values()), 30, "the free queue's item")
    # The agent beats every 0.5 s: several beats read the hold while its item stayed queued.
    wait_until(lambda: h.agent_log("node-a").count("queues held by the scaler") >= 1, 10, "the hold read back")
    assert [i.status for i in h.items(held).values()] == ["queued"] and h.queue_depth("work") == 1
    store.mark_held("work", None)
    wait_until(lambda: all(i.status in FINAL for i in h.items(held).values()), 30, "the released queue's item")
