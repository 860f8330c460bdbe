"""submit's `threads`: below 1 it is refused before anything is written (it used to wait forever
for a free thread, at 100 % CPU), and a job an earlier version stored with window 0 can still be
continued by running its submit again. Against the moto server."""

from __future__ import annotations

import threading
import time

import pytest
from agent_harness import Harness

from tidefleet.cloud import for_env
from tidefleet.jobs import sdk
from tidefleet.records import Job


@pytest.fixture
def h(tmp_path, aws):
    return Harness(tmp_path, aws)


def finishes(fn, seconds: float = 10.0):
    """fn()'s result or error, or a failure if it runs longer than `seconds` (a hang)."""
    out: dict = {}

    def call() -> None:
        try:
            out["result"] = fn()
        except BaseException as err:  # noqa: BLE001 - handed to the test
            out["error"] = err

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds}s"
    if "error" in out:
        raise out["error"]
    return out["result"]


@pytest.mark.parametrize("threads", [0, -1, 1.5, True, "4"])
def test_submit_refuses_threads_that_are_not_a_whole_number_of_1_or_more_before_anything_is_written(h, threads):
    items = sdk.read_items(["s3://b/0", "s3://b/1"])
    with pytest.raises(sdk.JobError) as refused:
        finishes(lambda: sdk.submit(h.env, "zero-threads", "work", items, kick=False, threads=threads))
    assert str(refused.value) == (f"threads: must be a whole number of 1 or more (got {threads!r}); "
                                  f"leave it out for {sdk.THREADS}, or give 1 to write one chunk at a time")
    assert for_env(h.env).store.job(sdk.job_id_for("zero-threads")) is None, "nothing written"


def test_a_job_stored_with_window_0_is_continued_by_running_its_submit_again(h):
    items = sdk.read_items([f"s3://b/{i}" for i in range(3)])
    job_id = sdk.job_id_for("stuck")
    store = for_env(h.env).store
    store.put_job(Job(job_id, "stuck", "work", time.time(), len(items), items_digest=items.digest, chunk=sdk.CHUNK,
                      window=0, submitting=True, counted=True))  # what a submit with threads=0 left behind
    done = finishes(lambda: sdk.submit(h.env, "stuck", "work", items, kick=False))
    assert (done.new_items, done.sent, done.total) == (3, 3, 3)
    assert not store.job(job_id).submitting
    assert h.queue_depth("work") == 3
