"""What every job store adapter must do with claims and fences (DynamoDB on the moto server,
Firestore through the real client on the GCP fake): the rules that keep an item running once."""

from __future__ import annotations

from tidefleet.records import Fence, Item, Job


def check_claims_and_fences(store, job: str) -> None:
    """`job` exists with item 000000 queued (seq 0); nothing else is assumed."""
    now = 1000.0

    def claim(node: str, seq: int, at: float):
        return store.update_item(job, "000000", status="running", node=node, seq=seq, lease_until=at + 30,
                                 message_id="m-1", add={"attempts": 1}, fence=Fence(claim_at=at, seq=seq))

    first = claim("node-a", 0, now)
    assert (first.status, first.node, first.attempts, first.lease_until) == ("running", "node-a", 1, now + 30)
    assert claim("node-b", 0, now + 5) is None, "a second delivery must not start while A's lease is live"
    assert claim("node-b", 0, now + 31).node == "node-b", "a lapsed lease may be claimed: A is gone"
    # A comes back: its records are fenced on attempt 1, B holds attempt 2.
    assert store.update_item(job, "000000", status="queued", fence=Fence(attempt=1)) is None
    assert store.update_item(job, "000000", lease_until=now + 60, fence=Fence(attempt=1)) is None
    assert store.item(job, "000000").node == "node-b"
    # B hands it back with message seq 1: a stale copy of message 0 can no longer claim it.
    assert store.update_item(job, "000000", status="queued", seq=1, lease_until=None, fence=Fence(attempt=2)).seq == 1
    assert claim("node-c", 0, now + 100) is None, "a stale duplicate (older seq) must not run"
    assert claim("node-c", 1, now + 100).attempts == 3
    # Final is final, and no write creates an item that was never submitted.
    assert store.update_item(job, "000000", status="succeeded", fence=Fence(attempt=3)).status == "succeeded"
    assert claim("node-d", 1, now + 200) is None
    assert store.update_item(job, "no-such-item", status="running", add={"attempts": 1}) is None
    assert store.item(job, "no-such-item") is None
    assert store.update_item("no-such-job", "000000", status="failed") is None
    assert store.item("no-such-job", "000000") is None


def queued_item(job: str) -> Item:
    return Item(job, "000000", ["a"], status="queued")


def check_jobs_listing(store) -> list[Job]:
    """Listing jobs: oldest first, filtered by queue, items never listed as jobs. Returns them all,
    so the caller can compare what two stores list."""
    store.put_job(Job("b-new", "new", "work", 20.0, 1))
    store.put_job(Job("a-old", "old", "other", 10.0, 2, cancelled=False, items_digest="sha256:x"))
    store.put_job(Job("c-same-time", "same", "work", 20.0, 1))
    store.put_item_if_new(Item("b-new", "000000", ["a"]))
    store.cancel_job("c-same-time")
    jobs = store.jobs()
    assert [j.job_id for j in jobs] == ["a-old", "b-new", "c-same-time"]
    assert [j.job_id for j in store.jobs("work")] == ["b-new", "c-same-time"]
    assert store.jobs("nope") == []
    assert jobs[2].cancelled and jobs[0].items_digest == "sha256:x" and jobs[0].total == 2
    return jobs
