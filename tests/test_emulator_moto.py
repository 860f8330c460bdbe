"""The moto server the sandbox runs (`tidefleet.emulator.start_moto`) under the job store's heaviest
use: settling thousands of items one TransactWriteItems each (a cancel, the agents' results).

Unpatched, moto 5.2.5 deep-copies the whole table for every transaction action and keeps every copy
(`patch_moto`): ~6 MB a transaction on 3,000 items, and a cancel of a big job ran the server out of
memory. Each test starts its own server, so its memory is the test's alone.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from tidefleet import emulator
from tidefleet.cloud.aws.autoscaling import AutoScalingFleet
from tidefleet.cloud.aws.dynamodb import DynamoStore, create_table
from tidefleet.cloud.aws.endpoint import READ_TIMEOUT_S
from tidefleet.cloud.aws.provision import provision
from tidefleet.config import load_environment
from tidefleet.emulator import MotoServer, start_moto
from tidefleet.records import Item, Job

pytestmark = pytest.mark.moto

ENV = "sandbox"
REGION = "us-east-1"
WAITING = ("pending", "queued")
# One try of the clients' read timeout: a call moto answers too slowly fails here, not after retries.
IMPATIENT = Config(read_timeout=READ_TIMEOUT_S, retries={"mode": "standard", "total_max_attempts": 1})


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[MotoServer]:
    server = start_moto()
    for key, value in server.env(REGION).items():
        monkeypatch.setenv(key, value)
    try:
        yield server
    finally:
        server.stop()


def rss_mb(server: MotoServer) -> float:
    for line in Path(f"/proc/{server.process.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def job_of(n: int) -> DynamoStore:
    """A store whose table holds job "j" with n waiting items; its calls wait READ_TIMEOUT_S, once."""
    create_table(ENV, REGION)
    store = DynamoStore(ENV, table=boto3.resource("dynamodb", region_name=REGION, config=IMPATIENT).Table(f"tidefleet-{ENV}"))
    store.put_job(Job("j", "items", "demo", 0.0, n, counted=True))
    store.create_items([Item("j", f"{i:06d}", args=["--seed", str(i)]) for i in range(n)], unseen=True)
    return store


def cancel(store: DynamoStore, item_id: str) -> bool:
    """As `tidefleet cancel` cancels a waiting item: one transaction of the item and its job's count."""
    return store.update_item("j", item_id, only_from=WAITING, status="cancelled", reason="cancelled") is not None


def test_transactions_on_a_big_table_keep_the_servers_memory_bounded(server):
    store = job_of(3000)
    cancel(store, "000000")  # moto's lazy imports of the transaction path: before the baseline
    before = rss_mb(server)
    for n in range(1, 501):
        assert cancel(store, f"{n:06d}")
        if n % 25 == 0:  # unpatched, the bound is crossed within ~50 transactions: stop there
            assert rss_mb(server) - before < 300, f"moto grew {rss_mb(server) - before:.0f} MB in {n} transactions"
    assert store.job("j").n_cancelled == 501


def test_cancelling_a_thousand_waiting_items_answers_every_call_within_the_read_timeout(server):
    """Every call on one try of READ_TIMEOUT_S: the item listing (in pages) and 1,000 transactions."""
    store = job_of(1000)
    before, started = rss_mb(server), time.monotonic()
    waiting = [i.item_id for i in store.items("j") if i.status in WAITING]
    for n, item_id in enumerate(waiting, 1):
        assert cancel(store, item_id)
        if n % 100 == 0:
            assert rss_mb(server) - before < 300, f"moto grew {rss_mb(server) - before:.0f} MB in {n} transactions"
    assert len(waiting) == 1000 and store.job("j").n_cancelled == 1000
    assert {i.status for i in store.items("j")} == {"cancelled"}
    assert time.monotonic() - started < 60


def test_a_cancelled_transaction_leaves_every_item_it_touched_as_it_was(server):
    """The patched transaction restores only what it touched: an update, a put and a delete that
    landed before another action's condition failed are all undone, as DynamoDB does."""
    store = job_of(3)
    client = boto3.client("dynamodb", region_name=REGION)
    table = f"tidefleet-{ENV}"

    def key(item_id: str) -> dict:
        return {"pk": {"S": "JOB#j"}, "sk": {"S": f"ITEM#{item_id}"}}

    before = store.items("j")
    actions = [
        {"Update": {"TableName": table, "Key": key("000000"), "UpdateExpression": "SET #s = :s",
                    "ExpressionAttributeNames": {"#s": "status"}, "ExpressionAttributeValues": {":s": {"S": "running"}}}},
        {"Put": {"TableName": table, "Item": {**key("000009"), "job_id": {"S": "j"}, "item_id": {"S": "000009"},
                                              "status": {"S": "pending"}}}},
        {"Delete": {"TableName": table, "Key": key("000001")}},
        {"Update": {"TableName": table, "Key": key("000002"), "UpdateExpression": "SET #s = :s",
                    "ConditionExpression": "#s = :never", "ExpressionAttributeNames": {"#s": "status"},
                    "ExpressionAttributeValues": {":s": {"S": "running"}, ":never": {"S": "succeeded"}}}},
    ]  # fmt: skip
    with pytest.raises(ClientError, match="TransactionCanceledException"):
        client.transact_write_items(TransactItems=actions)
    assert store.items("j") == before
    with pytest.raises(ClientError, match="ValidationException"):  # the same item twice: refused whole
        client.transact_write_items(TransactItems=[actions[0], actions[0]])
    assert store.items("j") == before
    client.transact_write_items(TransactItems=actions[:3])
    assert [(i.item_id, i.status) for i in store.items("j")] == [("000000", "running"), ("000002", "pending"),
                                                                ("000009", "pending")]  # fmt: skip


def test_a_moto_whose_internals_changed_runs_unpatched_and_says_so_in_one_line(monkeypatch, capsys):
    """A newer moto the patch does not fit must not keep the sandbox or the tests from starting:
    the server runs unpatched (only a big job notices its memory) and its log says why."""
    from moto import server
    from moto.dynamodb import models

    monkeypatch.setattr(models.DynamoDBBackend, "transact_write_items", lambda self, transact_items: None)
    with pytest.raises(RuntimeError, match=r"DynamoDB internals changed; .* no longer applies"):
        emulator.patch_moto()
    started = []
    monkeypatch.setattr(server, "main", started.append)
    emulator.serve(["-p", "0"])
    assert started == [["-p", "0"]]
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].endswith("running unpatched: its memory grows with every DynamoDB transaction"), err


def test_terminating_a_weighted_node_lowers_desired_by_its_weight_and_stops_no_other(server):
    """As AWS: desired counts weighted units (a g5.12xlarge is 4), so a terminate with decrement
    lowers it by 4. moto lowered it by 1, launched a replacement, and the scaler's next
    set_desired then stopped the first unprotected node: an idle one it had kept, or one that had
    just joined a gang (the flaky `sandbox --train`)."""
    env = load_environment("sandbox-train")
    (pool,) = [name for name, p in env.pools.items() if p.instance_types[0].weight == 4]
    provision(env, user_data={name: "#!/bin/sh\n" for name in env.pools})
    fleet = AutoScalingFleet(env)
    fleet.set_desired(pool, 12)
    (group,) = fleet.groups([pool], since=0).values()
    before = sorted(i.id for i in group.instances)
    assert (group.desired, len(before)) == (12, 3)
    assert fleet.terminate(pool, (before[0],)) == (before[0],)
    (group,) = fleet.groups([pool], since=0).values()
    assert (group.desired, sorted(i.id for i in group.instances)) == (8, before[1:])
    fleet.set_desired(pool, 8)  # what the tick sets next: nothing more to start or stop
    (group,) = fleet.groups([pool], since=0).values()
    assert (group.desired, sorted(i.id for i in group.instances)) == (8, before[1:])


def test_a_moto_whose_autoscaling_changed_runs_unpatched_and_says_so_in_one_line(monkeypatch, capsys):
    from moto import server
    from moto.autoscaling.models import AutoScalingBackend

    monkeypatch.setattr(AutoScalingBackend, "detach_instances", lambda self, group_name, instance_ids: [])
    with pytest.raises(RuntimeError, match=r"Auto Scaling internals changed; .* no longer applies"):
        emulator.patch_weighted_terminate()
    monkeypatch.setattr(server, "main", lambda argv: None)
    monkeypatch.setattr(emulator, "patch_moto", lambda: None)
    emulator.serve([])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].endswith("terminating a weighted node may replace it or stop another"), (
        err
    )


def test_the_emulator_serves_one_call_at_a_time_while_a_long_poll_waits_beside_them(monkeypatch):
    """moto's server runs each request in a thread and its backends take no locks: a Query copying
    an item while an UpdateItem added an attribute to it answered HTTP 500 ("dictionary changed
    size during iteration") and ended a CI run's sandbox. Calls are served one at a time now, but a
    ReceiveMessage (a long poll sleeps inside moto for up to 20 s) does not hold the others up."""
    import threading

    from moto.core.responses import BaseResponse

    inside, most, polling, poll_started = [0], [0], threading.Event(), threading.Event()
    count = threading.Lock()

    def recorded(self):  # stands for moto's own: counts the calls inside it at once
        if self.action == "ReceiveMessage":
            poll_started.set()
            assert polling.wait(30), "a long poll was never let go"
            return 200, {}, ""
        with count:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        time.sleep(0.02)
        with count:
            inside[0] -= 1
        return 200, {}, ""

    class Call:  # a request of one service and action; its call_action is the patched one, set below
        def __init__(self, service_name: str, action: str):
            self.service_name, self.action = service_name, action

        def _get_action(self) -> str:
            return self.action

    monkeypatch.setattr(BaseResponse, "call_action", recorded)
    emulator.patch_one_call_at_a_time()
    Call.call_action = BaseResponse.call_action
    poll = threading.Thread(target=Call("sqs", "ReceiveMessage").call_action)
    poll.start()
    try:
        assert poll_started.wait(10)
        calls = [threading.Thread(target=Call(service, action).call_action)
                 for service, action in [("dynamodb", "Query"), ("dynamodb", "UpdateItem"), ("sqs", "SendMessage"),
                                         ("autoscaling", "SetDesiredCapacity")] * 3]  # fmt: skip
        for thread in calls:
            thread.start()
        deadline = time.monotonic() + 5  # 12 calls of 20 ms, one at a time
        for thread in calls:
            thread.join(max(0.0, deadline - time.monotonic()))
        assert not any(thread.is_alive() for thread in calls), "a call waited on the long poll"
    finally:
        polling.set()
    poll.join(10)
    assert not poll.is_alive() and most[0] == 1, f"{most[0]} calls ran at once"


def test_a_moto_whose_request_handling_changed_runs_unpatched_and_says_so_in_one_line(monkeypatch, capsys):
    from moto import server
    from moto.core.responses import BaseResponse

    monkeypatch.delattr(BaseResponse, "_get_action")
    with pytest.raises(RuntimeError, match=r"request handling changed; .* no longer applies"):
        emulator.patch_one_call_at_a_time()
    monkeypatch.setattr(server, "main", lambda argv: None)
    monkeypatch.setattr(emulator, "patch_moto", lambda: None)
    monkeypatch.setattr(emulator, "patch_weighted_terminate", lambda: None)
    emulator.serve([])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].endswith("running unpatched: two calls at once may fail with HTTP 500"), err
