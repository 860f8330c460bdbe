"""What to do with a received message, before and around the claim: pure rules, no I/O.

An attempt starts only by a conditional write to the item's record (`records.Fence`): the item
exists and is not final, the message is not older than the newest one sent for it (`seq`), and
it is not running under another attempt's live lease. The agent (`worker.py`) reads what these
rules need, asks them, and carries out the answer through its ports.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tidefleet.records import FINAL, names

DEFER_S = 30  # a spot node hides an item left to on-demand capacity this long (`Defer`), then sees it again

if TYPE_CHECKING:
    from tidefleet.jobs.sdk import ItemMessage
    from tidefleet.ports import Delivery
    from tidefleet.records import Item, Job


@dataclass(frozen=True)
class Poison:
    """It can never run: to the dead-letter queue once, wrapped with the reason."""

    reason: str


@dataclass(frozen=True)
class Drop:
    """A duplicate: delete it."""

    why: str


@dataclass(frozen=True)
class Hide:
    """Not ours to run now, not a duplicate either: let it come back in `seconds`."""

    seconds: int
    why: str = ""


@dataclass(frozen=True)
class Defer:
    """Interrupted too often for spot: a spot node leaves it to an on-demand node of the pool,
    hidden for `DEFER_S`. `resend`: each hide costs a receive, and the queue's redrive would
    dead-letter it soon: a fresh copy (receive count 1, the same seq) replaces it instead."""

    why: str
    resend: bool = False


@dataclass(frozen=True)
class Adopt:
    """Our own running attempt's message (the one its record names, `records.names`), back
    because its visibility ran out or we replaced it (a fresh copy, `WorkQueues.max_hold_s`): its
    newest handle is the one that deletes it."""


@dataclass(frozen=True)
class HandOver:
    """Another node's running attempt's message, back while that node lives: hidden until the
    holder's lease would lapse (it comes back only if the holder is gone), and its handle written
    to the item's record, where the holder takes it at its next heartbeat. Hidden only, it would
    come back again and again while the attempt runs, each receive counting toward the queue's
    redrive."""

    seconds: int
    why: str


@dataclass(frozen=True)
class Cancel:
    """Its job was cancelled: record it cancelled and delete the message."""


@dataclass(frozen=True)
class Claim:
    """Try the conditional write that makes this delivery the item's next attempt."""


Intake = Poison | Cancel | Claim
Refusal = Poison | Drop | Hide | Adopt | HandOver


def on_receipt(msg: ItemMessage, job: Job | None) -> Intake:
    """A parsed message, given its job's record (None: not in the store)."""
    if job is None:
        return Poison(f"job {msg.job!r} is not in the job store (never submitted, or deleted)")
    if job.cancelled:
        return Cancel()
    return Claim()


def on_spot(msg: ItemMessage, delivery: Delivery, *, after: int | None, max_receives: int) -> Defer | None:
    """A message received on a spot node, of a queue whose items go on demand once interrupted
    `after` times (None: never): spot reclaims and drains, never the scaler's preemptions or moves
    (`attempt.handed_back`); `max_receives`: the queue's redrive count."""
    if after is None or msg.interruptions < after:
        return None
    why = (f"{msg.job}/{msg.item} was interrupted {msg.interruptions} time(s) (on_demand_after_interruptions "
           f"{after}): left to an on-demand node")  # fmt: skip
    return Defer(why, resend=delivery.deliveries >= max_receives - 1)


def on_refusal(current: Item | None, msg: ItemMessage, delivery: Delivery, *, now: float, heartbeat_s: float,
               mine: bool) -> Refusal:  # fmt: skip
    """The claim was refused: why, and what to do with the message. `current` is the item's record
    read after the refusal; `mine`: this agent runs that record's attempt."""
    where = f"{msg.job}/{msg.item}"
    if current is None:
        return Poison(f"item {where} is not in the job store (never submitted)")
    if current.status in FINAL or current.seq > msg.seq:
        why = f"already {current.status}" if current.status in FINAL else f"superseded by message {current.seq}"
        return Drop(f"{where} is {why}; dropping the duplicate message")
    if current.status == "running" and current.lease_until > now:
        left = current.lease_until - now
        if msg.seq > current.seq:
            # The holder's retry or hand-back, sent just before it records the end of its attempt:
            # not a copy. Look again soon (doubling, so that if the holder died right there its
            # lease lapses within a few receives, well before the queue's redrive).
            return Hide(min(2**delivery.deliveries, int(left) + 1))
        hide = int(left + heartbeat_s) + 1
        if names(current.message_id, current.copy, delivery.message_id, msg.copy):
            if mine:
                return Adopt()
            return HandOver(hide, f"{where} runs on {current.node} (lease {int(left)}s left); handing its message "
                                  "back to it")  # fmt: skip
        if not current.message_id:
            # Its holder is replacing its message (`Agent._refresh`: the copy's name recorded, its
            # id not yet): this may be the message it replaces, still its only one if the copy's
            # send fails. Hidden like the holder's own; once the copy's id is recorded it is dropped.
            return Hide(hide, f"{where} runs on {current.node} (lease {int(left)}s left), replacing its message; "
                              f"this one comes back in {hide}s")  # fmt: skip
        return Drop(f"{where} runs on {current.node}; dropping a duplicate copy of its message")
    return Hide(1)  # it changed between the claim and the read: look again shortly


def node_lost(before: Item | None) -> bool:
    """A redelivered message whose item still said running (under a lapsed lease, or the claim
    would have been refused) before this claim: its holder died mid-attempt. That is a lost node,
    not a failed attempt."""
    return before is not None and before.status == "running"


NODE_LOST = "node lost mid-attempt (no result before the visibility timeout)"
