"""`tidefleet cost` and `rightsize` read the items only of jobs with an attempt that may have ended in
their window: each write of an attempt's end moves its job's `last_attempt_at` (the job-store
contract checks every such write), and a job whose stamp is more than `costs.ATTEMPT_STAMP_SLACK_S`
before `--since` is left unread. A job recorded before the stamp was kept has none and is read
whole. DynamoDB through the moto server; which jobs' items are read is seen at `DynamoStore.items`."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner
from terminal import read_until_closed

from tidefleet.cli import main
from tidefleet.cloud.aws.dynamodb import DynamoStore, create_table
from tidefleet.config import load_environment
from tidefleet.jobs.cost_cli import collect
from tidefleet.records import Item, Job

pytestmark = pytest.mark.moto

ENV = load_environment("sandbox")
DAY = 86400.0


def attempt(ended_at: float, seconds: float = 3600.0) -> dict:
    """An hour of a whole c6i.large spot node, as the agent records it (`Worker._placement`)."""
    return {"attempt": 1, "node": "i-1", "outcome": "succeeded", "seconds": seconds, "instance_type": "c6i.large",
            "spot": True, "slots": 2, "node_slots": 2, "ended_at": ended_at}  # fmt: skip


@pytest.fixture
def store(aws, monkeypatch) -> tuple[DynamoStore, list[str]]:
    """Three jobs, each with one item of one recorded attempt: `recent` ended now; `old` and
    `legacy` 40 days ago, `old` stamped then (its stamp moved back as if written then), `legacy`
    with no stamp (recorded before it was kept). Returns the store and the jobs whose items are read."""
    create_table(ENV.name, ENV.region)
    s = DynamoStore(ENV.name, ENV.region)
    now = time.time()
    for job_id, ended in (("old", now - 40 * DAY), ("legacy", now - 40 * DAY), ("recent", now)):
        s.put_job(Job(job_id, job_id, "demo", ended - 3600, 1, counted=True))
        s.put_item_if_new(Item(job_id, "000000", args=["x"], status="running", attempts=1))
        s.update_item(job_id, "000000", status="succeeded", append={"history": attempt(ended)})
    s.table.update_item(Key={"pk": "JOB#old", "sk": "JOB"}, UpdateExpression="SET last_attempt_at = :at",
                        ExpressionAttributeValues={":at": int(now - 40 * DAY)})  # fmt: skip
    s.table.update_item(Key={"pk": "JOB#legacy", "sk": "JOB"}, UpdateExpression="REMOVE last_attempt_at")
    read: list[str] = []
    items = DynamoStore.items
    monkeypatch.setattr(DynamoStore, "items", lambda self, job_id: read.append(job_id) or items(self, job_id))
    return s, read


def test_a_job_whose_last_attempt_ended_before_the_window_is_not_read_and_one_without_a_stamp_is(store):
    _, read = store
    found, _ = collect(ENV, since=time.time() - 30 * DAY)
    assert [(c.job_id, round(c.cost_usd, 6)) for c in found] == [("recent", 0.034)], "an hour of a $0.034 node"
    assert sorted(read) == ["legacy", "recent"], read
    read.clear()
    found, _ = collect(ENV, since=0.0)
    assert sorted(c.job_id for c in found) == sorted(read) == ["legacy", "old", "recent"], "--since all: every job"


def test_a_late_attempt_of_an_old_job_moves_its_stamp_and_is_charged(store):
    """A late attempt of an item another node settled long ago keeps only its history entry
    (`Worker._record`'s fallback): it moves no counter, but it ended now and costs now."""
    s, read = store
    s.update_item("old", "000000", never_from=(), append={"history": attempt(time.time(), seconds=1800.0)})
    found, _ = collect(ENV, since=time.time() - 30 * DAY)
    assert sorted((c.job_id, round(c.cost_usd, 6)) for c in found) == [("old", 0.017), ("recent", 0.034)]
    assert "old" in read


def test_the_cost_command_reports_what_the_window_holds(store):
    _, read = store
    out = CliRunner().invoke(main, ["cost", "--env", "sandbox", "--by", "job", "--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    assert [(r["key"], round(r["cost_usd"], 6)) for r in doc["rows"]] == [("recent", 0.034)]
    assert "old" not in read


def test_on_a_terminal_a_bar_shows_the_jobs_being_read_and_piped_output_is_only_the_report(store):
    """A job of 250k items takes minutes to read: on a terminal's stderr a bar says so while it is
    read; stdout, and stderr when piped (test_the_cost_command_reports_what_the_window_holds), carry
    only the report."""
    main_fd, child = pty.openpty()
    run = subprocess.Popen([sys.executable, "-m", "tidefleet.cli", "cost", "--env", "sandbox", "--by", "job"],
                           stdout=subprocess.PIPE, stderr=child, env={**os.environ, "COLUMNS": "120"})  # fmt: skip
    os.close(child)
    terminal = read_until_closed(main_fd, 120)
    report = run.communicate(timeout=60)[0].decode()
    assert run.returncode == 0, terminal.decode(errors="replace")
    assert "reading the jobs' attempts" in terminal.decode(errors="replace")
    assert report.splitlines()[1].startswith("recent ") and "total $0.0340" in report, report
