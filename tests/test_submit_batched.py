"""Chunked submit on both job stores (DynamoDB + SQS on the moto server, Firestore + Pub/Sub
through the real clients on the GCP fake): a submit stopped at any step (an error, Ctrl-C) is
continued by running it again, every item ends up sent, and nothing is sent twice except the
one chunk per thread whose send was accepted but not yet marked. Each check runs on both clouds."""

from __future__ import annotations

import json
import tracemalloc
from collections import Counter

import boto3
import google.auth
import pytest
import responses
from agent_harness import Harness
from google.auth.credentials import AnonymousCredentials

from tests.gcp_fake import FakeGcp
from tidefleet import naming
from tidefleet.cloud import for_env
from tidefleet.config import load_environment
from tidefleet.jobs import sdk

GCP_ENV = load_environment("gcp-dev")
GCP_SUB = "tidefleet-gcp-dev-default"
ITEMS = 55  # chunks of 10 (patched below): six chunks, the last one short
CHUNK = 10
THREADS = 2


class Injected(Exception):
    pass


class Cloud:
    """One cloud under test: its environment and queue, and what waits in that queue."""

    def __init__(self, env, queue: str, bodies, fake: FakeGcp | None = None):
        self.env, self.queue, self.bodies, self.fake = env, queue, bodies, fake


@pytest.fixture(params=["aws", "gcp"])
def cloud(request, tmp_path, monkeypatch):
    monkeypatch.setattr(sdk, "CHUNK", CHUNK)
    if request.param == "aws":
        h = Harness(tmp_path, request.getfixturevalue("aws"))
        sqs = boto3.client("sqs", region_name=h.env.region)
        url = sqs.get_queue_url(QueueName=naming.queue(h.env.name, "work"))["QueueUrl"]

        received: list[dict] = []

        def sqs_bodies() -> list[dict]:  # every message sent so far (receiving hides them: kept here)
            while got := sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=600).get("Messages"):
                received.extend(json.loads(m["Body"]) for m in got)
            return list(received)

        yield Cloud(h.env, "work", sqs_bodies)
        return
    monkeypatch.setattr(google.auth, "default", lambda *a, **k: (AnonymousCredentials(), GCP_ENV.project))
    fake = FakeGcp(GCP_ENV.project, GCP_ENV.region)
    fake.add_queue(GCP_SUB, ack_deadline_s=600, max_delivery_attempts=5)
    with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
        fake.install(mock)
        yield Cloud(GCP_ENV, "default", lambda: [json.loads(b) for b in fake.bodies(GCP_SUB)], fake)


def items(n: int = ITEMS) -> sdk.ItemList:
    return sdk.read_items([f"s3://b/{i}" for i in range(n)])


def failing(monkeypatch, method: str, nth: int, error: type[BaseException]) -> None:
    """The `nth` call of a store or queue method raises `error` (the adapters the submit gets)."""
    real_for_env, calls = sdk.for_env, Counter()

    def for_env_failing(env):
        adapters = real_for_env(env)
        target = adapters.queues if method == "send" else adapters.store
        real = getattr(target, method)

        def maybe_fail(*args, **kwargs):
            calls[method] += 1
            if calls[method] == nth:
                raise error(f"injected at {method} #{nth}")
            return real(*args, **kwargs)

        setattr(target, method, maybe_fail)
        return adapters

    monkeypatch.setattr(sdk, "for_env", for_env_failing)


# (method that fails, which call, what is raised, duplicates allowed on the re-run)
STOPS = [
    ("put_job", 1, Injected, 0),  # nothing written
    ("create_items", 1, Injected, 0),  # the first chunk's records
    ("create_items", 3, KeyboardInterrupt, 0),  # Ctrl-C, chunks before it out
    ("send", 2, Injected, 0),  # a chunk recorded, not sent
    ("mark_sent", 2, Injected, CHUNK),  # a chunk sent, not marked: the one duplicate window
    ("mark_sent", 6, KeyboardInterrupt, CHUNK),  # the last chunk
    ("end_submit", 1, Injected, 0),  # every chunk out, the job not closed
]


@pytest.mark.parametrize(("method", "nth", "error", "duplicates"), STOPS, ids=[f"{m}-{n}" for m, n, *_ in STOPS])
def test_a_submit_stopped_at_any_step_is_continued_by_running_it_again(cloud, monkeypatch, method, nth, error,
                                                                       duplicates):  # fmt: skip
    given = items()
    with monkeypatch.context() as patch:
        failing(patch, method, nth, error)
        with pytest.raises(error):
            sdk.submit(cloud.env, "stopped", cloud.queue, given, kick=False, threads=THREADS)
    job_id = sdk.job_id_for("stopped")
    started = None
    if method != "put_job":
        stopped = sdk.status(cloud.env, job_id, reconcile=False)
        assert stopped.submitting and not stopped.done and stopped.sent < ITEMS + (method == "end_submit") * ITEMS
    if early := cloud.bodies():  # an agent took the newest item sent so far: the re-run must leave it alone
        started = early[-1]["item"]
        assert for_env(cloud.env).store.update_item(job_id, started, status="running")
    done = sdk.submit(cloud.env, "stopped", cloud.queue, given, kick=False, threads=THREADS)
    sent = Counter(m["item"] for m in cloud.bodies())
    assert set(sent) == {s.item_id for s in given}, "every item sent"
    assert sum(sent.values()) - ITEMS <= duplicates, f"sent twice: {[i for i, n in sent.items() if n > 1]}"
    final = sdk.status(cloud.env, job_id, reconcile=False, items=True)  # "running" as its record says: no agent here
    assert not final.submitting and final.sent == ITEMS
    if started:
        assert sent[started] == 1 and for_env(cloud.env).store.item(job_id, started).status == "running"
    assert final.counts["queued"] == ITEMS - bool(started)
    assert (done.total, final.job.total) == (ITEMS, ITEMS)
    again = sdk.submit(cloud.env, "stopped", cloud.queue, given, kick=False, threads=THREADS)
    assert (again.new_items, again.sent) == (0, 0)


def test_a_fresh_job_reads_no_item_and_a_rerun_reads_only_the_uncertain_chunks(cloud, monkeypatch):
    reads = Counter()
    real_for_env = sdk.for_env

    def counting(env):
        adapters = real_for_env(env)
        real = adapters.store.items_by_id
        adapters.store.items_by_id = lambda job, ids: reads.update(ids) or real(job, ids)
        return adapters

    monkeypatch.setattr(sdk, "for_env", counting)
    with monkeypatch.context() as patch:
        failing(patch, "mark_sent", 3, Injected)
        with pytest.raises(Injected):
            sdk.submit(cloud.env, "reads", cloud.queue, items(), kick=False, threads=THREADS)
    assert not reads, "a job created by this call has nothing to read"
    monkeypatch.setattr(sdk, "for_env", counting)
    sdk.submit(cloud.env, "reads", cloud.queue, items(), kick=False, threads=THREADS)
    assert 0 < len(reads) <= THREADS * CHUNK, "only the first `window` unmarked chunks may hold records"


def test_a_resubmit_of_a_finished_job_reads_and_sends_nothing(cloud):
    sdk.submit(cloud.env, "twice", cloud.queue, items(), kick=False)
    before = len(cloud.fake.calls) if cloud.fake else None
    again = sdk.submit(cloud.env, "twice", cloud.queue, items(), kick=False)
    assert (again.new_items, again.sent, again.kick) == (0, 0, "not needed")
    if cloud.fake:  # the job's record only: read, found finished (no create, no queue lookup)
        assert [m for m, *_ in cloud.fake.calls[before:]] == ["GET"]


def test_the_job_is_told_before_any_item_is_written_and_progress_reaches_the_total(cloud):
    seen, told = [], []
    sdk.submit(cloud.env, "told", cloud.queue, items(), kick=False,
               on_job=lambda job: seen.append((job.job_id, job.submitting, len(cloud.bodies()))), progress=told.append)
    assert seen == [(sdk.job_id_for("told"), True, 0)]
    assert sum(told) == ITEMS


def test_throttled_firestore_writes_are_retried_until_written(cloud):
    if cloud.fake is None:
        pytest.skip("the GCP fake models per-write throttling of batchWrite")
    cloud.fake.unavailable_writes = 7
    done = sdk.submit(cloud.env, "throttled", cloud.queue, items(), kick=False)
    assert (done.new_items, done.sent) == (ITEMS, ITEMS)
    assert len(for_env(cloud.env).store.items(done.job_id)) == ITEMS


def test_items_reordered_are_another_job_since_a_rerun_continues_by_position(cloud):
    sdk.submit(cloud.env, "ordered", cloud.queue, sdk.read_items(["a", "b"]), kick=False)
    with pytest.raises(sdk.JobError, match="in the same order"):
        sdk.submit(cloud.env, "ordered", cloud.queue, [sdk.ItemSpec("000001", ["b"]), sdk.ItemSpec("000000", ["a"])],
                   kick=False)  # fmt: skip


def test_a_large_items_file_is_read_in_flat_memory(tmp_path):
    path = tmp_path / "items.txt"
    n = 100_000
    path.write_text("".join(f"s3://renders/frame-{i:07d}.exr\n" for i in range(n)))
    tracemalloc.start()
    got = sdk.read_items(path)
    count = sum(1 for _ in got)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert count == len(got) == n
    assert peak < 4 << 20, f"reading {n} items peaked at {peak >> 20} MiB: items must stream, not pile up"


def test_a_duplicate_id_deep_in_a_file_is_found_with_its_first_line(tmp_path):
    path = tmp_path / "items.txt"
    path.write_text("".join(f'{{"id": "k{i}", "args": []}}\n' for i in range(5000)) + '{"id": "k17", "args": []}\n')
    with pytest.raises(sdk.JobError, match=r"items.txt:5001: item id 'k17' already used on line 18"):
        sdk.read_items(path)
