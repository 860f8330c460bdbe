"""`tidefleet status` of a job with failed items reads those items alone to show why they failed,
not every item of the job: on AWS through the job table's failed-items index
(`resources.FAILED_INDEX`), whenever it finds as many as the job counts. Where it cannot (a table
deployed before the index, items that failed before it was added, an index a moment behind), every
item is read as before. DynamoDB through the moto server; GCP's query is in the job-store contract."""

from __future__ import annotations

import pytest
from test_jobs_listing import old_table

from tidefleet.cloud.aws.dynamodb import DynamoStore, create_table
from tidefleet.config import load_environment
from tidefleet.jobs import sdk
from tidefleet.records import Item, Job

pytestmark = pytest.mark.moto

ENV = load_environment("sandbox")


def big_job(store: DynamoStore) -> None:
    """A counted job of 40 items: 37 succeeded, 3 failed (by the writes the agent makes)."""
    store.put_job(Job("big", "big", "demo", 10.0, 40, counted=True))
    store.create_items([Item("big", f"{n:06d}", ["x"], status="running") for n in range(40)], unseen=True)
    for n in range(40):
        failed = n in (3, 17, 29)
        store.update_item("big", f"{n:06d}", status="failed" if failed else "succeeded", reason=f"exit {n}" * failed)


def reads_no_items(monkeypatch) -> None:
    monkeypatch.setattr(DynamoStore, "items", lambda *_: pytest.fail("read every item of the job"))


def test_status_reads_the_failed_items_alone_and_shows_why(aws, monkeypatch):
    create_table(ENV.name, ENV.region)
    big_job(DynamoStore(ENV.name, ENV.region))
    reads_no_items(monkeypatch)
    status = sdk.status(ENV, "big", reconcile=False)
    assert (status.state, status.counts["failed"], status.counts["succeeded"]) == ("failed", 3, 37)
    assert [(i.item_id, i.reason) for i in status.items] == [("000003", "exit 3"), ("000017", "exit 17"),
                                                             ("000029", "exit 29")]  # fmt: skip


def test_items_that_failed_before_the_index_are_found_by_reading_every_item(aws):
    """An item written failed by an earlier version has no index key: the index finds fewer than the
    job counts, so every item is read and each failure is shown."""
    create_table(ENV.name, ENV.region)
    store = DynamoStore(ENV.name, ENV.region)
    big_job(store)
    store.table.update_item(Key={"pk": "JOB#big", "sk": "ITEM#000017"}, UpdateExpression="REMOVE failed_in")
    assert [i.item_id for i in store.failed_items("big")] == ["000003", "000029"]
    status = sdk.status(ENV, "big", reconcile=False)
    assert [i.item_id for i in status.items if i.status == "failed"] == ["000003", "000017", "000029"]
    assert len(status.items) == 40 and status.counts["failed"] == 3


def test_a_table_deployed_before_the_index_reads_every_item_and_says_a_deploy_adds_it(aws, caplog):
    old_table()
    store = DynamoStore(ENV.name, ENV.region)
    big_job(store)
    with caplog.at_level("WARNING", logger="tidefleet.store"):
        status = sdk.status(ENV, "big", reconcile=False)
    assert [i.item_id for i in status.items if i.status == "failed"] == ["000003", "000017", "000029"]
    (said,) = [r.getMessage() for r in caplog.records]
    assert "has no 'failed' index" in said and "deploy the environment again" in said, said


def test_the_status_command_shows_the_failures_from_the_index(aws, monkeypatch):
    from click.testing import CliRunner

    from tidefleet.cli import main

    create_table(ENV.name, ENV.region)
    big_job(DynamoStore(ENV.name, ENV.region))
    reads_no_items(monkeypatch)
    out = CliRunner().invoke(main, ["status", "--env", "sandbox", "big"])  # its queues are not there: a warning
    assert "failed 000017: exit 17" in out.output and "Traceback" not in out.output, out.output
