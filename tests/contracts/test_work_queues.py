"""The WorkQueues contract (`tidefleet.ports.WorkQueues`), on every work queue adapter: SQS on the
moto server, Pub/Sub through the real clients on the GCP fake. What the agent relies on: a
received message stays hidden while it is held, comes back when let go, counts its deliveries,
keeps its id across them, and a send either lands or raises."""

from __future__ import annotations

import pytest


def receive_all(q, *, dead_letter: bool = False, hold_s: int | None = None):
    return q.queues.receive(q.queue, 10, 0, dead_letter=dead_letter, hold_s=hold_s)


def test_sent_bodies_are_received_once_each_as_first_deliveries_with_the_id_their_send_gave(work_queues):
    q = work_queues
    ids = q.queues.send(q.queue, ["one", "two", "three"])
    got = receive_all(q)
    assert {d.body: d.message_id for d in got} == dict(zip(["one", "two", "three"], ids, strict=True))
    assert {d.deliveries for d in got} == {1}
    assert all(d.message_id for d in got) and len({d.message_id for d in got}) == 3
    assert len({d.handle for d in got}) == 3
    assert receive_all(q) == [], "a received message stays hidden from other receivers while it is held"


def test_an_empty_queue_answers_nothing(work_queues):
    assert receive_all(work_queues) == []


def test_the_lease_is_the_queues_own(work_queues):
    assert work_queues.queues.lease_s(work_queues.queue) == work_queues.lease_s


def test_a_released_message_comes_back_at_once_as_a_second_delivery_of_the_same_message(work_queues):
    q = work_queues
    q.queues.send(q.queue, ["x"])
    (first,) = receive_all(q)
    q.queues.release(q.queue, [first.handle])
    (again,) = receive_all(q)
    assert (again.body, again.message_id, again.deliveries) == ("x", first.message_id, 2)


def test_a_message_held_past_its_lease_comes_back_and_hold_s_overrides_the_lease(work_queues):
    q = work_queues
    q.queues.send(q.queue, ["x"])
    (first,) = receive_all(q, hold_s=1)
    q.pass_time(1.2)
    (again,) = receive_all(q)
    assert (again.message_id, again.deliveries) == (first.message_id, 2)


def test_an_extended_message_stays_hidden_past_its_first_lease(work_queues):
    q = work_queues
    q.queues.send(q.queue, ["x"])
    (held,) = receive_all(q, hold_s=1)
    assert q.queues.extend(q.queue, [held.handle], 60) == {}
    q.pass_time(1.2)
    assert receive_all(q) == []


def test_a_deleted_message_never_comes_back(work_queues):
    q = work_queues
    q.queues.send(q.queue, ["x", "y"])
    got = receive_all(q, hold_s=1)
    assert q.queues.delete(q.queue, [d.handle for d in got]) == []
    q.pass_time(1.2)
    assert receive_all(q) == []


def test_the_dead_letter_side_is_a_queue_of_its_own(work_queues):
    q = work_queues
    q.queues.send(q.queue, ["dead"], dead_letter=True)
    assert receive_all(q) == []
    (held,) = receive_all(q, dead_letter=True)
    assert held.body == "dead" and receive_all(q, dead_letter=True) == []
    q.queues.release(q.queue, [held.handle], dead_letter=True)
    (again,) = receive_all(q, dead_letter=True)
    assert again.message_id == held.message_id
    assert again.deliveries == (2 if q.counts_dead_letter_deliveries else 1)
    assert q.queues.delete(q.queue, [again.handle], dead_letter=True) == []
    q.pass_time(1.2)
    assert receive_all(q, dead_letter=True) == []


def test_the_queue_itself_dead_letters_a_message_after_its_redrive_receives(work_queues):
    """The backstop behind the agent: a message no node ever finishes ends on the dead-letter side
    after `Cloud.redrive_receives` deliveries (Pub/Sub clamps it to 5..100; SQS takes any)."""
    q = work_queues
    q.queues.send(q.queue, ["poison"])
    for n in range(1, q.redrive_receives + 1):
        (d,) = receive_all(q)
        assert d.deliveries == n
        q.queues.release(q.queue, [d.handle])
    assert receive_all(q) == []
    assert [d.body for d in receive_all(q, dead_letter=True)] == ["poison"]


def test_more_bodies_than_one_batch_holds_all_land(work_queues):
    q = work_queues
    bodies = [f"b{n:02}" for n in range(23)]
    ids = q.queues.send(q.queue, bodies)
    got = []
    while batch := receive_all(q):
        got += batch
    assert sorted((d.body, d.message_id) for d in got) == list(zip(bodies, ids, strict=True))
    assert q.queues.extend(q.queue, [d.handle for d in got], 60) == {}
    assert q.queues.delete(q.queue, [d.handle for d in got]) == []


def test_a_refused_send_raises_one_of_the_clouds_errors(work_queues):
    with pytest.raises(work_queues.errors):
        work_queues.queues.send("not-deployed", ["x"])


def test_a_send_refused_in_part_raises_one_of_the_clouds_errors(work_queues):
    """Refused in part, a send is a refused call like any other (the agent treats the cloud's
    errors as transient: the message it holds comes back), not an error of the agent's own, which
    it would take for a message that breaks it."""
    q = work_queues
    q.refuse_in_part()
    with pytest.raises(q.errors) as refused:
        q.queues.send(q.queue, ["one", "two"])
    assert "1 of 2" in str(refused.value), refused.value
    assert q.queues.send(q.queue, ["three"]), "the next send is answered in full"


def test_counts_are_the_queues_visible_and_held_messages_or_none_where_it_cannot_say(work_queues, request):
    """SQS counts at once; Pub/Sub cannot (Cloud Monitoring's counts are minutes late): None, and
    the SDK then concludes nothing from a count (`sdk._dead_letter_counts`)."""
    q = work_queues
    q.queues.send(q.queue, ["a", "b", "c"])
    assert len(q.queues.receive(q.queue, 1, 0)) == 1
    counts, dead = q.queues.counts(q.queue), q.queues.counts(q.queue, dead_letter=True)
    if request.node.callspec.params["work_queues"] == "pubsub":
        assert (counts, dead) == (None, None)
    else:
        assert (counts.visible, counts.in_flight, dead.visible, dead.in_flight) == (2, 1, 0, 0)
