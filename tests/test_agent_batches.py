"""`worker.Batches`: what the agent sends per queue in batches (deletes, outcome metrics)."""

from __future__ import annotations

import logging
import time

from tidefleet.agent import worker
from tidefleet.agent.worker import Batches


class Sink:
    def __init__(self, errors=None, raises=None):
        self.calls, self.errors, self.raises = [], errors or [], raises

    def __call__(self, queue, entries):
        self.calls.append((queue, list(entries)))
        if self.raises:
            raise self.raises
        return self.errors


def test_a_full_batch_goes_at_once_one_call_per_queue():
    sink = Sink()
    batches = Batches(sink, 3, "send")
    for n in range(3):
        batches.add("a", n)
    batches.add("b", "x")
    assert sink.calls == [("a", [0, 1, 2])]  # "b" waits for its time
    batches.flush()
    assert sink.calls == [("a", [0, 1, 2]), ("b", ["x"])]
    batches.flush()
    assert len(sink.calls) == 2  # nothing pending: no call


def test_a_due_only_flush_waits_for_the_oldest_entry_to_be_due(monkeypatch):
    sink = Sink()
    batches = Batches(sink, 100, "send")
    batches.add("a", 1)
    batches.flush(due_only=True)
    assert sink.calls == []
    now = time.monotonic() + worker.ACK_FLUSH_S
    monkeypatch.setattr(worker.time, "monotonic", lambda: now)
    batches.flush(due_only=True)
    assert sink.calls == [("a", [1])]


def test_a_failed_send_is_logged_in_one_line_never_raised_nor_resent(caplog):
    caplog.set_level(logging.WARNING, "tidefleet.agent")
    for sink in (Sink(errors=["ReceiptHandleIsInvalid"]), Sink(raises=RuntimeError("throttled\nmore"))):
        batches = Batches(sink, 100, "delete recorded messages")
        batches.add("a", 1)
        batches.add("a", 2)
        batches.flush()
        batches.flush()
        assert len(sink.calls) == 1
    assert [r.getMessage() for r in caplog.records] == [
        "could not delete recorded messages: 1 of a (ReceiptHandleIsInvalid)",
        "could not delete recorded messages: 2 of a (throttled)",
    ]


def test_a_send_that_raises_without_a_message_is_logged_by_its_type_not_raised(caplog):
    # str(RuntimeError()) is "": its first line was [""][0] of [] (IndexError), raised from the
    # handler, which ended the flush instead of logging the failure.
    caplog.set_level(logging.WARNING, "tidefleet.agent")
    sink = Sink(raises=RuntimeError())
    batches = Batches(sink, 100, "delete recorded messages")
    batches.add("a", 1)
    batches.flush()
    assert [r.getMessage() for r in caplog.records] == ["could not delete recorded messages: 1 of a (RuntimeError)"]


def test_a_step_that_raises_without_a_message_is_logged_by_its_type_not_raised(caplog):
    caplog.set_level(logging.WARNING, "tidefleet.agent")

    def fails() -> None:
        raise RuntimeError()

    worker.Agent._step("record the gang member's part", fails)
    assert [r.getMessage() for r in caplog.records] == ["record the gang member's part failed: RuntimeError"]
