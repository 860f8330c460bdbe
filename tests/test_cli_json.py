"""The CLI as something to script, against the moto server: `status` exit codes, --watch with
--time-limit, failure summaries, and the `--json` schemas of status, nodes, logs, validate and jobs."""

from __future__ import annotations

import pytest
from agent_harness import Harness
from click.testing import CliRunner

from tidefleet.cli import main
from tidefleet.jobs import cli as jobs_cli
from tidefleet.jobs import sdk
from tidefleet.store import Store


@pytest.fixture
def h(tmp_path, aws):
    return Harness(tmp_path, aws)


def run(h: Harness, *args: str):
    env = {"TIDEFLEET_ENV": str(h.env_path), "TIDEFLEET_KICK_URL": "http://127.0.0.1:9/"}
    return CliRunner().invoke(main, list(args), env=env)


def job_with(h: Harness, name: str, *statuses: str) -> str:
    """A job whose items have `statuses`; "failed:REASON" gives a reason (default "exit code 1")."""
    job_id = sdk.submit(h.env, name, "work", sdk.read_items([f"s3://b/{n}" for n in range(len(statuses))]),
                        kick=False).job_id
    store = Store(h.env.name, h.env.region)
    for n, status in enumerate(statuses):
        status, _, reason = status.partition(":")
        if status != "queued":
            store.update_item(job_id, f"{n:06d}", status=status, reason=reason or "exit code 1")
    return job_id


# -- status: exit codes, --watch, failures ------------------------------------------------------
@pytest.mark.parametrize(
    "statuses, exit_code",
    [
        (("succeeded", "succeeded"), 0),  # done, nothing failed
        (("succeeded", "cancelled"), 0),  # cancelled is not failed
        (("succeeded", "failed"), 1),  # done with a failed item
        (("failed", "queued"), 0),  # still running: no verdict yet
        (("running", "queued"), 0),
    ],
)
def test_status_exits_1_only_when_the_job_is_done_with_failed_items(h, statuses, exit_code):
    out = run(h, "status", job_with(h, "exit-" + "-".join(statuses), *statuses))
    assert out.exit_code == exit_code, out.output
    assert "Traceback" not in out.output


def test_watch_gives_up_at_the_time_limit_with_exit_1_and_a_line_saying_so(h):
    job_id = job_with(h, "slow", "queued")
    out = run(h, "status", job_id, "--watch", "--time-limit", "0.2")
    assert out.exit_code == 1
    assert f"gave up after --time-limit 0.2s: job {job_id} not done (0/1 items final)" in out.output


def test_watch_redraws_until_done_then_exits_like_status(h, monkeypatch):
    job_id = job_with(h, "finishing", "running", "running")
    store = Store(h.env.name, h.env.region)
    pending = ["000000", "000001"]

    def one_item_finishes(seconds):  # each refresh sees one more item final
        store.update_item(job_id, pending.pop(0), status="failed", reason="boom")

    monkeypatch.setattr(jobs_cli.time, "sleep", one_item_finishes)
    out = run(h, "status", job_id, "--watch")
    assert out.exit_code == 1 and not pending
    assert "failed 2" in out.output and "failed 000001: boom" in out.output


def test_status_summarises_failures_and_lists_them_all_with_failed(h):
    job_id = job_with(h, "many-failed", *["failed"] * 11, "failed:out of memory", "succeeded")
    out = run(h, "status", job_id)
    assert out.exit_code == 1
    assert "top failure reasons:" in out.output and "11 x exit code 1" in out.output and "1 x out of memory" in out.output
    assert "failed 000009: exit code 1" in out.output and "failed 000010" not in out.output
    assert "... and 2 more failed item(s): --failed lists them all" in out.output
    out = run(h, "status", job_id, "--failed")
    assert "failed 000011: out of memory" in out.output and "more failed item(s)" not in out.output


def test_time_limit_without_watch_is_refused(h):
    out = run(h, "status", "x", "--time-limit", "5")
    assert out.exit_code == 2 and "only applies with --watch" in out.output
