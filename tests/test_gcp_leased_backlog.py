"""On GCP the backlog is Pub/Sub's num_undelivered_messages, which counts the messages agents hold
for running items. The agents say how many they hold (`Heartbeat.leased`), `MonitoringQueues`
says its count includes them (`Backlog.counts_leased`), and the tick moves them to in flight:
running items are never aged as waiting, and never doubled the nodes after a boot (the audit's
s9_running_counted_waiting.py)."""

from __future__ import annotations

import time

from google.auth.credentials import AnonymousCredentials
from google.auth.transport.requests import AuthorizedSession

from tests.gcp_fake import FakeVm
from tests.test_gcp_agent import env, run_agent  # noqa: F401 - env is a fixture
from tests.test_gcp_agent_metadata import metadata_server  # noqa: F401 - a fixture
from tests.test_gcp_jobs import ENV, SUB, calls, gcp  # noqa: F401 - gcp is a fixture
from tidefleet.agent import worker
from tidefleet.cloud import for_env
from tidefleet.cloud.gcp.firestore import FirestoreStore
from tidefleet.cloud.gcp.mig import MigFleet
from tidefleet.cloud.gcp.monitoring import MonitoringQueues
from tidefleet.control import tick
from tidefleet.jobs import sdk
from tidefleet.ports import Ports
from tidefleet.records import Heartbeat

NODE = "tidefleet-gcp-dev-cpu-aaaa"


def two_nodes(fake) -> tuple[FirestoreStore, MonitoringQueues, Ports]:
    """gcp-dev's cpu pool with two Spot VMs, and the tick's ports on the fake."""
    creds = AnonymousCredentials()
    store = FirestoreStore(ENV, credentials=creds)
    queues = MonitoringQueues(ENV, session=AuthorizedSession(creds))
    ports = Ports(queues=queues, fleet=MigFleet(ENV, credentials=creds), nodes=store, stats=store)
    fake.groups |= {"tidefleet-gcp-dev-cpu": 2, "tidefleet-gcp-dev-cpu-od": 0}
    fake.vms["tidefleet-gcp-dev-cpu"] = [FakeVm(f"tidefleet-gcp-dev-cpu-{n}", created="2026-11-26T00:00:00Z")
                                       for n in ("aaaa", "bbbb")]  # fmt: skip
    return store, queues, ports


def test_busy_nodes_running_items_whose_messages_count_as_undelivered_get_no_more_nodes(gcp):  # noqa: F811
    store, queues, ports = two_nodes(gcp)
    gcp.undelivered[SUB] = 4  # the 4 running items' leased messages, nothing else
    assert queues.backlog("default").counts_leased
    t0 = time.time()
    for dt in (0, 600, 1860, 2400):  # past max_wait_s (1800 s) and a boot
        for n in ("aaaa", "bbbb"):
            store.put_heartbeat(Heartbeat(f"tidefleet-gcp-dev-cpu-{n}", "cpu", at=t0 + dt, slots=2, busy_slots=2,
                                          idle_since=None, instance_type="n2-standard-4", spot=True,
                                          running={"j": 2}, leased={"default": 2}))  # fmt: skip
        (decision,) = tick(ENV, ports, t0 + dt, pools=["cpu"])
        assert decision.desired == 2, (dt, decision.reasons)
        assert not any("waited" in r for r in decision.reasons), decision.reasons
    assert store.waiting_marks(["default"]) == {}, "no running item was ever aged as waiting"


def test_a_running_items_agent_says_it_holds_its_message_until_it_is_acked(gcp, env, tmp_path, metadata_server):  # noqa: F811
    url, _ = metadata_server
    job = sdk.submit(env, "one", "default", sdk.read_items([["ok"]]), kick=False).job_id
    seen: list[dict] = []

    def release_once_leased(store):
        beat = store.heartbeat("cpu", NODE)
        if beat is not None and store.item(job, "000000").status == "running":
            seen.append(beat.leased)
            if beat.leased and calls(gcp, "POST", f"{SUB}:modifyAckDeadline"):
                (tmp_path / "release").touch()
        return store.item(job, "000000").status == "succeeded" and not gcp.bodies(SUB)

    run_agent(env, tmp_path, NODE, url, release_once_leased)
    assert {"default": 1} in seen
    assert for_env(env).store.heartbeat("cpu", NODE).leased == {}, "acked: held no more"


class _Held:
    """What `Agent._beat` reads of an agent, without a cloud: its runs, gang parts and records."""

    def __init__(self, runs, members, waiting):
        import threading

        self.lock = threading.RLock()
        self.runs, self.members, self.streams = runs, members, set()
        self.idle_since = None
        self.records = type("R", (), {"waiting": lambda _self: waiting})()
        self.written: dict = {}


def test_leased_counts_a_leads_gang_message_once_no_members_and_unrecorded_ends():
    from tidefleet.agent.attempt import Attempt
    from tidefleet.jobs.sdk import ItemMessage

    def run(queue, receipt, gang=None):
        return worker.Run(queue, receipt, message=ItemMessage("j", receipt, []), state=Attempt(60, 5), workload=None, gang=gang)

    member = worker.Member("gang", "j", "1", 1, slots=2, gang=(2, 2), state=Attempt(60, 5), workload=None)
    fake = _Held(
        runs=[run("plain", "h1"), run("plain", "h2"), run("gang", "h3", gang=(2, 2)), run("plain", "")],
        members=[member], waiting={"plain": ["h9"], "other": ["h7", "h8"]},
    )
    captured: dict = {}
    for step in ("_forget_placed", "_watch_gangs", "_kill_overdue", "_extend_visibility", "_keep_hidden",
                 "_renew_leases", "_refresh_due", "_stop_cancelled", "_record_item_seconds", "_protect"):
        setattr(fake, step, lambda *a, **k: None)
    fake.s = type("S", (), {"heartbeat_s": 5.0})()
    fake.finished = type("F", (), {"is_set": lambda _self: False})()
    fake._step = worker.Agent._step
    fake._write_heartbeat = lambda busy, idle, running, leased=None: captured.update(leased=leased)
    worker.Agent._beat(fake)
    # two plain runs and an unrecorded end hold plain's; a fresh copy whose handle never came back
    # (receipt "") holds none; the lead holds its gang's one message, the member none
    assert captured["leased"] == {"plain": 3, "gang": 1, "other": 2}


def test_a_trailing_count_of_finished_work_launches_nothing_once_an_idle_node_said_it_found_none(gcp):  # noqa: F811
    """Cloud Monitoring's newest point was sampled two minutes ago, when 40 items were still there;
    the job is done and both nodes have been idle since. The tick wanted the pool's max for them."""
    store, queues, ports = two_nodes(gcp)
    gcp.undelivered[SUB], gcp.undelivered_lag_s = 40, 120
    now = time.time()
    backlog = queues.backlog("default")
    assert backlog.visible == 40 and abs(backlog.as_of - (now - 120)) < 5, backlog
    for n in ("aaaa", "bbbb"):
        store.put_heartbeat(Heartbeat(f"tidefleet-gcp-dev-cpu-{n}", "cpu", at=now - 5, slots=2, busy_slots=0,
                                      idle_since=now - 60, instance_type="n2-standard-4", spot=True))  # fmt: skip
    (decision,) = tick(ENV, ports, now, pools=["cpu"])
    assert decision.desired <= 2, decision.reasons
    assert not any("waiting" in r or "waited" in r for r in decision.reasons), decision.reasons
