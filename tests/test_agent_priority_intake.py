"""A real agent fills its free slots from the highest-priority queue that has items, even when a
receive of that queue returns messages that take no slot (a cancelled job's, which it drops
without a warning: the cancel recorded them)."""

from __future__ import annotations

import pytest
from agent_harness import Harness, wait_until

from tidefleet.jobs import sdk
from tidefleet.records import FINAL

pytestmark = pytest.mark.moto


def test_dropped_messages_of_a_high_priority_queue_do_not_hand_its_slots_to_a_lower_one(tmp_path, aws, request):
    h = Harness(tmp_path, aws)  # one node of 2 slots; queue "work" priority 10, "short" priority 1
    request.addfinalizer(h.stop_agents)
    cancelled = sdk.submit(h.env, "gone", "work", sdk.read_items([["steps=1"], ["steps=1"]]), kick=False).job_id
    sdk.cancel(h.env, cancelled)  # its 2 messages stay queued, first in line: the agent drops them
    urgent = sdk.submit(h.env, "urgent", "work", sdk.read_items([["steps=30"], ["steps=30"]]), kick=False).job_id
    low = sdk.submit(h.env, "low", "short", sdk.read_items([["steps=1"], ["steps=1"]]), kick=False).job_id
    h.start_agent("node-a")
    wait_until(lambda: all(i.status in FINAL for i in h.items(low).values()), 60, "the low-priority items")
    started = [e["job"] for e in h.events("start")]
    # Both urgent items took the two slots before any low-priority item started (each runs ~3 s).
    assert started == [urgent, urgent, low, low], started
    assert all(i.status == "cancelled" for i in h.items(cancelled).values())
    # The cancel recorded its waiting items: their messages are dropped without a warning each.
    assert "WARNING" not in h.agent_log("node-a"), h.agent_log("node-a")
