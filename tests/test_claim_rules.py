"""The rules for a received message (`tidefleet.agent.claim`): what it is before the claim, and
what to do with it when the claim is refused, read from the item's record."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tidefleet.agent.claim import (
    Adopt,
    Cancel,
    Claim,
    Defer,
    Drop,
    HandOver,
    Hide,
    Poison,
    node_lost,
    on_receipt,
    on_refusal,
    on_spot,
)
from tidefleet.jobs.sdk import ItemMessage
from tidefleet.ports import Delivery
from tidefleet.records import Item, Job

NOW = 1000.0
MSG = ItemMessage("job-1", "000001", [], seq=2)


def item(status: str, *, seq: int = 2, lease_left: float = 0.0, message_id: str = "m-1", copy: str = "") -> Item:
    return Item("job-1", "000001", status=status, seq=seq, attempts=3, node="node-b", lease_until=NOW + lease_left,
                message_id=message_id, copy=copy)  # fmt: skip


RECEIPTS = [
    ("a job not in the store is poison", None, Poison("job 'job-1' is not in the job store (never submitted, or deleted)")),
    ("a cancelled job's item is cancelled", Job("job-1", "n", "q", 0.0, 1, cancelled=True), Cancel()),
    ("a live job's item is claimed", Job("job-1", "n", "q", 0.0, 1), Claim()),
]  # fmt: skip


@pytest.mark.parametrize(("case", "job", "expected"), RECEIPTS, ids=[r[0] for r in RECEIPTS])
def test_a_received_message(case, job, expected):
    assert on_receipt(MSG, job) == expected


REFUSALS = [
    ("an item not in the store is poison", None, 1, "m-1", False,
     Poison("item job-1/000001 is not in the job store (never submitted)")),
    ("a final item's message is a duplicate", item("succeeded"), 1, "m-1", False,
     Drop("job-1/000001 is already succeeded; dropping the duplicate message")),
    ("a message older than the newest sent is a duplicate", item("queued", seq=3), 1, "m-9", False,
     Drop("job-1/000001 is superseded by message 3; dropping the duplicate message")),
    ("the holder's retry, sent before it recorded, comes back soon, doubling per delivery",
     item("running", seq=1, lease_left=25), 3, "m-2", False, Hide(8)),
    ("... but never later than the holder's lease lapses", item("running", seq=1, lease_left=2.5), 3, "m-2", False,
     Hide(3)),
    ("the holder's own message goes back to it, hidden until its lease would lapse", item("running", lease_left=20), 2,
     "m-1", False, HandOver(26, "job-1/000001 runs on node-b (lease 20s left); handing its message back to it")),
    ("... a fresh copy of it too (first delivered)", item("running", lease_left=20), 1, "m-1", False,
     HandOver(26, "job-1/000001 runs on node-b (lease 20s left); handing its message back to it")),
    ("our own running attempt's message is adopted", item("running", lease_left=20), 2, "m-1", True, Adopt()),
    ("another copy of a running item's message is a duplicate", item("running", lease_left=20), 2, "m-7", False,
     Drop("job-1/000001 runs on node-b; dropping a duplicate copy of its message")),
    ("a copy without a message id is a duplicate too", item("running", lease_left=20), 2, "", False,
     Drop("job-1/000001 runs on node-b; dropping a duplicate copy of its message")),
    ("an item that changed between the claim and the read is looked at again shortly", item("queued"), 1, "m-1",
     False, Hide(1)),
    ("a running item whose lease just lapsed is looked at again shortly", item("running", lease_left=0), 2, "m-1",
     False, Hide(1)),
]  # fmt: skip


@pytest.mark.parametrize(("case", "current", "deliveries", "message_id", "mine", "expected"), REFUSALS,
                         ids=[r[0] for r in REFUSALS])  # fmt: skip
def test_a_refused_claim(case, current, deliveries, message_id, mine, expected):
    delivery = Delivery("handle", MSG.body(), deliveries, message_id)
    assert on_refusal(current, MSG, delivery, now=NOW, heartbeat_s=5, mine=mine) == expected


HANDED = HandOver(26, "job-1/000001 runs on node-b (lease 20s left); handing its message back to it")
REPLACING = Hide(26, "job-1/000001 runs on node-b (lease 20s left), replacing its message; this one comes back in 26s")
DUPLICATE = Drop("job-1/000001 runs on node-b; dropping a duplicate copy of its message")
COPIES = [
    ("a fresh copy whose name is recorded and not yet its id goes back to its holder",
     item("running", lease_left=20, message_id="", copy="3.1"), "3.1", "m-2", False, HANDED),
    ("... and is adopted by its holder", item("running", lease_left=20, message_id="", copy="3.1"), "3.1", "m-2", True,
     Adopt()),
    ("the message its holder is replacing is hidden like its own, never dropped before the copy is out",
     item("running", lease_left=20, message_id="", copy="3.1"), "", "m-1", False, REPLACING),
    ("... an earlier copy of it too", item("running", lease_left=20, message_id="", copy="3.2"), "3.1", "m-2", False,
     REPLACING),
    ("once the copy's id is recorded, the message it replaced is a duplicate",
     item("running", lease_left=20, message_id="m-2", copy="3.1"), "", "m-1", False, DUPLICATE),
    ("... and the copy goes back to its holder by its id", item("running", lease_left=20, message_id="m-2", copy="3.1"),
     "3.1", "m-2", False, HANDED),
    ("a second message of the copy's name (a spot node's re-send) is a duplicate once its id is recorded",
     item("running", lease_left=20, message_id="m-2", copy="3.1"), "3.1", "m-5", False, DUPLICATE),
    ("a copy an earlier attempt sent is a duplicate of the message this one claimed",
     item("running", lease_left=20, message_id="m-1"), "2.1", "m-9", False, DUPLICATE),
    ("a message an earlier attempt replaced is a duplicate of the copy this one claimed",
     item("running", lease_left=20, message_id="m-9", copy="2.1"), "", "m-1", False, DUPLICATE),
]  # fmt: skip


@pytest.mark.parametrize(("case", "current", "copy", "message_id", "mine", "expected"), COPIES, ids=[c[0] for c in COPIES])
def test_a_refused_claim_of_a_running_items_message_while_its_holder_replaces_it(case, current, copy, message_id, mine,
                                                                                 expected):  # fmt: skip
    """`Agent._refresh` records a fresh copy's name before it sends it: whichever node receives
    the copy first knows it for the holder's, and the message it replaces is kept until the
    copy's id is recorded."""
    msg = replace(MSG, copy=copy)
    delivery = Delivery("handle", msg.body(), 1, message_id)
    assert on_refusal(current, msg, delivery, now=NOW, heartbeat_s=5, mine=mine) == expected


@pytest.mark.parametrize(("before", "lost"), [(None, False), (item("running"), True), (item("queued"), False),
                                              (item("succeeded"), False)])  # fmt: skip
def test_a_node_was_lost_only_if_the_item_still_said_running_before_this_claim(before, lost):
    assert node_lost(before) is lost


LEFT = "job-1/000001 was interrupted 3 time(s) (on_demand_after_interruptions 3): left to an on-demand node"
ON_SPOT = [
    ("an item of a queue without the setting is taken", 9, None, 1, None),
    ("an item interrupted fewer times than the setting is taken", 2, 3, 1, None),
    ("an item interrupted as often as the setting is left to an on-demand node", 3, 3, 1, Defer(LEFT)),
    ("... by a fresh copy once the queue's redrive nears, which would dead-letter it", 3, 3, 5, Defer(LEFT, resend=True)),
]  # fmt: skip


@pytest.mark.parametrize(("case", "interruptions", "after", "deliveries", "expected"), ON_SPOT,
                         ids=[r[0] for r in ON_SPOT])  # fmt: skip
def test_a_message_received_on_a_spot_node(case, interruptions, after, deliveries, expected):
    msg = ItemMessage("job-1", "000001", [], interruptions=interruptions)
    delivery = Delivery("handle", msg.body(), deliveries)
    assert on_spot(msg, delivery, after=after, max_receives=6) == expected
