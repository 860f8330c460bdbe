"""Multi-node items on real agent processes against the moto server: the nodes of a gang
rendezvous through the job store, start together with disjoint ranks, reach each other at the
lead's address, and stop together; a spot notice on one member sends the item back whole and it
resumes from its checkpoint and succeeds once; an elastic gang goes on without a lost member; a
member's failure fails the attempt."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import replace

import pytest
from agent_harness import Harness, Imds, wait_until
from botocore.exceptions import ClientError

from tidefleet import costs
from tidefleet.agent import worker
from tidefleet.agent.gang import Beacon
from tidefleet.agent.worker import Agent, Settings
from tidefleet.cloud.aws.dynamodb import DynamoStore
from tidefleet.cloud.aws.imds import Metadata
from tidefleet.jobs import sdk
from tidefleet.records import FINAL, Fence, Heartbeat

pytestmark = pytest.mark.moto

# Each node's part: note the rank environment, meet at MASTER_ADDR:MASTER_PORT (rank 0 serves,
# the others connect and say their rank, as torch.distributed's TCP store does), then step; rank
# 0 saves progress in the checkpoint the gang shares, and every rank resumes from it.
GANG_WORKLOAD = r'''
import json, os, pathlib, socket, sys, time, urllib.parse
from tidefleet.agent import checkpoint

args = dict(a.split("=", 1) for a in sys.argv[1:])
names = ("RANK", "NODE_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TIDEFLEET_NNODES",
         "TIDEFLEET_GANG_NODES", "TIDEFLEET_RDZV_ID")
env = {k: os.environ.get(k) for k in names}
rank, nodes = int(env["NODE_RANK"]), int(env["TIDEFLEET_GANG_NODES"])
saved = pathlib.Path(urllib.parse.urlparse(checkpoint.checkpoint_uri()).path) / "progress"
start = int(saved.read_text()) if saved.exists() else 0

def record(event, **extra):
    with open(os.environ["LEDGER"], "a") as f:
        f.write(json.dumps({"event": event, "item": os.environ["TIDEFLEET_ITEM_ID"], "attempt": checkpoint.attempt(),
                            "node": os.environ["TIDEFLEET_NODE_ID"], "rank": rank, **extra}) + "\n")

record("start", env=env, resumed_from=start)
if rank == 0:
    server = socket.create_server((env["MASTER_ADDR"], int(env["MASTER_PORT"])))
    server.settimeout(30)
    peers = []
    for _ in range(nodes - 1):
        conn, _ = server.accept()
        peers.append(int(conn.recv(16)))
        conn.close()
    record("rendezvous", peers=sorted(peers))
else:
    for _ in range(150):
        try:
            with socket.create_connection((env["MASTER_ADDR"], int(env["MASTER_PORT"])), timeout=1) as s:
                s.sendall(str(rank).encode())
            break
        except OSError:
            time.sleep(0.2)
    else:
        sys.exit(5)
if rank == int(args.get("fail_rank", -1)):
    print("rank failed on purpose", flush=True)
    sys.exit(4)
for step in range(start, int(args.get("steps", 0))):
    if checkpoint.should_stop():
        if rank == 0:
            saved.write_text(str(step))
            record("checkpoint", step=step)
        checkpoint.exit_interrupted()
    time.sleep(0.1)
record("done")
'''

GANG_ENV = """
region = "us-east-1"

[pools.cpu]
max = 4
command = "{python} {workload}"
env = {{ LEDGER = "{ledger}" }}
instance_types = [{{ type = "c6i.large", weight = 1 }}]

[queues.train]
pool = "cpu"
max_retries = {max_retries}
item_timeout_s = 120
nodes_per_item = 2

[queues.wide]
pool = "cpu"
max_retries = {max_retries}
item_timeout_s = 120
nodes_per_item = 3

[queues.elastic]
pool = "cpu"
max_retries = {max_retries}
item_timeout_s = 120
nodes_per_item = {{ min = 2, max = 3 }}
"""


@pytest.fixture
def gang(tmp_path, aws, request) -> Harness:
    h = Harness(tmp_path, aws, env_toml=GANG_ENV, workload=GANG_WORKLOAD, max_retries=1)
    request.addfinalizer(h.stop_agents)
    return h


def _final(h: Harness, job_id: str):
    item = h.items(job_id)["000000"]
    return item.status in FINAL and item


def _starts(h: Harness, attempt: int) -> dict[int, dict]:
    return {e["rank"]: e for e in h.events("start") if e["attempt"] == attempt}


def test_a_two_node_gang_starts_together_with_disjoint_ranks_meets_at_the_lead_and_succeeds_once(gang):
    h = gang
    job = sdk.submit(h.env, "gang", "train", sdk.read_items([["steps=20"]]), kick=False).job_id
    h.start_agent("node-a")
    h.start_agent("node-b")
    item = wait_until(lambda: _final(h, job), 60, "the gang item to finish")
    assert item.status == "succeeded" and item.attempts == 1
    starts = _starts(h, 1)
    assert sorted(starts) == [0, 1] and starts[0]["node"] != starts[1]["node"]
    lead, member = starts[0]["env"], starts[1]["env"]
    assert (lead["NODE_RANK"], member["NODE_RANK"], lead["WORLD_SIZE"], member["WORLD_SIZE"]) == ("0", "1", "2", "2")
    assert (lead["RANK"], member["RANK"], lead["LOCAL_WORLD_SIZE"]) == ("0", "1", "1")
    assert lead["MASTER_ADDR"] == member["MASTER_ADDR"] == "127.0.0.1" and lead["MASTER_PORT"] == member["MASTER_PORT"]
    assert lead["TIDEFLEET_NNODES"] == "2" and lead["TIDEFLEET_RDZV_ID"] == member["TIDEFLEET_RDZV_ID"]
    assert [e["peers"] for e in h.events("rendezvous")] == [[1]]  # the member reached the lead's port
    assert Counter(e["rank"] for e in h.events("done")) == {0: 1, 1: 1}
    assert item.members[0]["node"] == starts[0]["node"] and item.gang == "running"
    wait_until(lambda: h.queue_depth("train") == 0, 10, "the message deleted")
    # Each node's part is billed: the lead's history entry covers the lead's node, the member's part its own.
    store = DynamoStore(h.env.name, h.env.region)
    parts = wait_until(lambda: store.parts(job), 10, "the member's part")
    assert [e["node"] for e in item.history] == [starts[0]["node"]] and list(parts) == ["000000"]
    [part] = parts["000000"]
    assert (part["node"], part["rank"], part["attempt"], part["exit_code"]) == (starts[1]["node"], 1, 1, 0)
    charged = costs.charges(h.env, store.job(job), [item], parts=parts)
    assert [(c.instance_type, c.share) for c in charged] == [("c6i.large", 1.0)] * 2
    assert all(c.seconds >= 2.0 for c in charged), "20 steps of 0.1 s on each node"


def test_a_spot_notice_on_one_member_stops_the_whole_gang_and_the_item_resumes_once_from_its_checkpoint(gang):
    h, notices = gang, {n: Imds(n) for n in ("node-a", "node-b")}
    try:
        job = sdk.submit(h.env, "gang", "train", sdk.read_items([["steps=80"]]), kick=False).job_id
        agents = {n: h.start_agent(n, notices[n].url) for n in notices}
        starts = wait_until(lambda: len(_starts(h, 1)) == 2 and _starts(h, 1), 60, "the gang to start")
        member = starts[1]["node"]
        notices[member].spot_action = {"action": "terminate", "time": "2030-01-01T00:00:00Z"}
        assert agents[member].wait(timeout=30) == 0
        # The lead hands it back whole (and, free again, may well lead its next attempt at once).
        item = wait_until(lambda: h.items(job)["000000"].interruptions == 1 and h.items(job)["000000"], 30,
                          "the lead to hand the item back")  # fmt: skip
        assert item.failures == 0 and item.history[0]["outcome"] == "interrupted"
        assert [e["rank"] for e in h.events("checkpoint")] == [0]  # the lead saved the gang's progress
        h.start_agent("node-c")  # capacity comes back: the gang forms again on the lead and the new node
        item = wait_until(lambda: _final(h, job), 90, "the resumed gang to finish")
        assert (item.status, item.attempts, item.interruptions, item.failures) == ("succeeded", 2, 1, 0)
        resumed = _starts(h, 2)
        assert sorted(resumed) == [0, 1] and all(e["resumed_from"] > 0 for e in resumed.values())
        assert member not in {e["node"] for e in resumed.values()}
        assert Counter(e["rank"] for e in h.events("done")) == {0: 1, 1: 1}  # succeeded once
        assert "a node of its gang was interrupted" in str(item.history)
        parts = Counter(e["attempt"] for e in DynamoStore(h.env.name, h.env.region).parts(job)["000000"])
        assert parts == {1: 1, 2: 1}, "each attempt's member billed, the one its spot notice stopped too"
    finally:
        for imds in notices.values():
            imds.close()


def test_an_elastic_gang_goes_on_without_a_reclaimed_member_while_min_remain(gang):
    h, notices = gang, {n: Imds(n) for n in ("node-a", "node-b", "node-c")}
    try:
        job = sdk.submit(h.env, "elastic", "elastic", sdk.read_items([["steps=60"]]), kick=False).job_id
        agents = {n: h.start_agent(n, notices[n].url) for n in notices}
        # The lead's start is waited for too: its workload may write its event after two members' do.
        starts = wait_until(lambda: len(s := _starts(h, 1)) >= 2 and 0 in s and s, 60, "the gang to start")
        assert starts[0]["env"]["TIDEFLEET_NNODES"] == "2:3"
        # The third node joins the running gang (torchrun would restart its rendezvous with it).
        starts = wait_until(lambda: len(_starts(h, 1)) == 3 and _starts(h, 1), 30, "the gang to grow to 3")
        leaving = starts[max(starts)]["node"]
        notices[leaving].spot_action = {"action": "terminate", "time": "2030-01-01T00:00:00Z"}
        assert agents[leaving].wait(timeout=30) == 0
        item = wait_until(lambda: _final(h, job), 60, "the gang to finish without it")
        assert (item.status, item.attempts, item.interruptions) == ("succeeded", 1, 0)
        assert {e["node"] for e in item.left} >= {leaving}
    finally:
        for imds in notices.values():
            imds.close()


def test_a_member_that_fails_fails_the_attempt_with_its_node_and_exit_code(gang):
    h = gang
    job = sdk.submit(h.env, "gang", "train", sdk.read_items([["steps=100", "fail_rank=1"]]), kick=False).job_id
    h.start_agent("node-a")
    h.start_agent("node-b")
    item = wait_until(lambda: h.items(job)["000000"].failures >= 1 and h.items(job)["000000"], 60, "a failed attempt")
    failed = [e for e in item.history if e["outcome"] == "failed"]
    assert failed and "gang member failed" in failed[0]["reason"] and "(rank 1) exited 4" in failed[0]["reason"]
    assert item.interruptions == 0


# -- faults, in-process: whatever breaks while a gang forms, the item goes back and the node is free
def _agent(h: Harness, node_id: str) -> Agent:
    node = Agent(h.env, "cpu", Settings(node_id=node_id, instance_type="c6i.large", spot=True, work_dir=h.tmp / node_id,
                                        checkpoint_root=h.tmp / "checkpoints", heartbeat_s=0.5, wait_s=0),
                 metadata=Metadata("http://127.0.0.1:9"))  # fmt: skip
    node._prepare()
    return node


def _wait_both_free(lead: Agent, member: Agent) -> None:
    """Beat both (the heartbeats that stop a short gang and end the member's part) until neither
    holds a part of the gang."""

    def both_free() -> bool:
        lead._beat()
        member._beat()
        return not lead.runs and not member.members

    wait_until(both_free, 60, "both nodes' slots to come free")


def test_an_error_while_a_gang_forms_gives_the_item_back_unspent_and_frees_the_lead(gang, monkeypatch):
    h = gang
    job = sdk.submit(h.env, "gang", "train", sdk.read_items([["steps=5"]]), kick=False).job_id
    lead = _agent(h, "node-lead")
    monkeypatch.setattr(lead.store, "heartbeats", lambda pool: (_ for _ in ()).throw(KeyError("boom")))
    assert lead._receive("train", h.env.queues["train"], wait_s=1) == 1
    wait_until(lambda: not lead.runs, 30, "the lead's slots to come free")
    item = h.items(job)["000000"]
    assert (item.status, item.failures, item.gang) == ("queued", 0, "released")
    assert item.history[-1]["outcome"] == "released" and "could not be formed" in item.history[-1]["reason"]
    lead.acks.flush()
    assert h.queue_depth("train") == 1  # the item's message is back: the next node leads it


def _forming_gang(h: Harness) -> tuple[str, DynamoStore]:
    """A gang item of queue train that node-lead leads, forming, its beacon in its heartbeat."""
    job = sdk.submit(h.env, "gang", "train", sdk.read_items([["steps=5"]]), kick=False).job_id
    store = DynamoStore(h.env.name, h.env.region)
    store.update_item(job, "000000", status="running", attempts=1, lease_until=9e9, gang="forming",
                      members=[{"node": "node-lead", "addr": "127.0.0.1", "port": 1}])  # fmt: skip
    store.put_heartbeat(Heartbeat("node-lead", "cpu", at=time.time(), slots=1, busy_slots=1,
                                  idle_since=None, gang=Beacon("train", job, "000000", 1, 1.0, True).record()))  # fmt: skip
    return job, store


def test_a_member_that_leaves_as_its_gang_starts_gives_the_item_back_unspent_not_run_short(gang, monkeypatch):
    """A member's node stopped between the lead's last look at the roster and its "running" write.
    The lead used to start the gang below min anyway, stop it at its next heartbeat and hand the
    item back as an interruption of an attempt that never ran whole."""
    h = gang
    job = sdk.submit(h.env, "wide", "wide", sdk.read_items([["steps=50"]]), kick=False).job_id
    store = DynamoStore(h.env.name, h.env.region)
    lead, member = _agent(h, "node-lead"), _agent(h, "node-m")
    monkeypatch.setenv("TIDEFLEET_NODE_ID", "in-process")  # the workload's, which both nodes here run
    write = lead.store.update_item

    def leaves_as_it_starts(job_id, item_id, **kw):
        if kw.get("gang") != "running":
            return write(job_id, item_id, **kw)
        # node-x leaves (as `_mark_left`) right before the write; node-m sees the gang running and
        # starts its part before the lead looks at what it wrote.
        store.update_item(job_id, item_id, fence=Fence(attempt=kw["fence"].attempt),
                          append={"left": {"node": "node-x"}})  # fmt: skip
        written = write(job_id, item_id, **kw)
        wait_until(lambda: _starts(h, 1), 20, "node-m to start its part")
        return written

    monkeypatch.setattr(lead.store, "update_item", leaves_as_it_starts)
    execute, started = lead._execute, []
    monkeypatch.setattr(lead, "_execute", lambda run, queue, env=None: (started.append(env), execute(run, queue, env)))
    fail_gang, failed = member._fail_gang, []
    monkeypatch.setattr(member, "_fail_gang", lambda part, why: (failed.append(why), fail_gang(part, why)))
    assert lead._receive("wide", h.env.queues["wide"], wait_s=1) == 1
    wait_until(lambda: lead.beacon, 10, "the lead's beacon")
    store.update_item(job, "000000", append={"members": {"node": "node-x", "addr": "127.0.0.1", "port": 1}})
    assert member._join_gang([("wide", h.env.queues["wide"])])
    _wait_both_free(lead, member)
    assert started == []  # the lead never started its workload short
    assert sorted(_starts(h, 1)) == [1]  # node-m's part alone
    assert not h.events("done") and failed == []  # node-m's part was stopped (the attempt ended), not failed
    item = store.item(job, "000000")
    assert (item.status, item.gang, item.interruptions, item.failures, item.gang_failure) == \
        ("queued", "released", 0, 0, "")  # fmt: skip
    assert item.history[-1]["outcome"] == "released"
    assert "2 node(s) left, below min 3" in item.history[-1]["reason"]
    assert [e["node"] for e in store.parts(job)["000000"]] == ["node-m"], "its part ran: billed"
    assert lead.idle_since is not None and member.idle_since is not None
    lead.acks.flush()
    assert h.queue_depth("wide") == 1  # its message is back: a full gang runs it
    for node in ("node-a", "node-b", "node-c"):
        h.start_agent(node)
    item = wait_until(lambda: _final(h, job), 90, "a full gang to run it")
    assert (item.status, item.attempts, item.interruptions, item.failures) == ("succeeded", 2, 0, 0)
    assert sorted(_starts(h, 2)) == [0, 1, 2]


def test_a_member_that_cannot_read_its_gang_waits_and_then_leaves_without_failing_it(gang, monkeypatch):
    h = gang
    job, store = _forming_gang(h)
    member = _agent(h, "node-m")
    monkeypatch.setattr(worker, "MIN_LEASE_S", 0.0)  # give up as soon as the boot timeout is over
    throttled = ClientError({"Error": {"Code": "ThrottlingException", "Message": "slow down"}}, "GetItem")
    monkeypatch.setattr(member.store, "item", lambda *a: (_ for _ in ()).throw(throttled))
    member.pool = member.pool.model_copy(update={"boot_timeout_s": 2})
    assert member._join_gang([("train", h.env.queues["train"])])
    assert member.members
    wait_until(lambda: not member.members, 30, "the member to give up")
    item = store.item(job, "000000")
    assert item.gang_failure == "" and [m["node"] for m in item.left] == ["node-m"]


def test_a_forming_leads_heartbeat_says_how_many_members_its_gang_still_waits_for(gang):
    """The scaler places the missing members on wholly free nodes (or launches them) from this."""
    h = gang
    job = sdk.submit(h.env, "wide", "wide", sdk.read_items([["steps=5"]]), kick=False).job_id
    store = DynamoStore(h.env.name, h.env.region)
    lead = _agent(h, "node-lead")
    lead.pool = lead.pool.model_copy(update={"boot_timeout_s": 6})

    def beacon() -> Beacon | None:
        beat = store.heartbeats("cpu").get("node-lead")
        return Beacon.parse(beat.gang) if beat is not None and beat.gang else None

    assert lead._receive("wide", h.env.queues["wide"], wait_s=1) == 1
    first = wait_until(beacon, 10, "the lead's beacon")
    assert (first.queue, first.forming, first.short) == ("wide", True, 2)
    store.update_item(job, "000000", append={"members": {"node": "node-x", "addr": "127.0.0.1", "port": 1}})
    wait_until(lambda: lead.beacon.get("short") == 1, 10, "the lead to count the member that joined")
    lead._beat()
    assert beacon().short == 1
    wait_until(lambda: not lead.runs, 30, "the gang given back: it did not form within the boot timeout")


def test_an_idle_node_the_scaler_lets_go_joins_no_gang(gang):
    """The flaky `sandbox --train`'s second hand-back: a node the tick was terminating as idle joined
    the gang's next attempt, whose lead then stopped it when the member left."""
    h = gang
    job, store = _forming_gang(h)
    member = _agent(h, "node-m")
    member._beat()
    assert store.let_idle_go("cpu", "node-m", store.heartbeat("cpu", "node-m").idle_since)
    assert not member._join_gang([("train", h.env.queues["train"])])
    assert not member.members and member.stopping.is_set()
    assert [m["node"] for m in store.item(job, "000000").members] == ["node-lead"]


def test_a_member_whose_node_cannot_run_items_leaves_its_gang_without_failing_it_and_stops_taking_items(gang, monkeypatch):
    """Its item user gone since the agent started (or its dockerd): the node's fault, as for an item
    of its own (`_unfit`): the gang's attempt is not failed for it, and the node drains."""
    h = gang
    job = sdk.submit(h.env, "gang", "train", sdk.read_items([["steps=50"]]), kick=False).job_id
    store = DynamoStore(h.env.name, h.env.region)
    lead, member = _agent(h, "node-lead"), _agent(h, "node-m")
    monkeypatch.setenv("TIDEFLEET_NODE_ID", "in-process")  # the workload's, which both nodes here run
    member.s = replace(member.s, item_user="gone-user")  # userdel after the agent started
    fail_gang, failed = member._fail_gang, []
    monkeypatch.setattr(member, "_fail_gang", lambda part, why: (failed.append(why), fail_gang(part, why)))
    assert lead._receive("train", h.env.queues["train"], wait_s=1) == 1
    wait_until(lambda: lead.beacon, 10, "the lead's beacon")
    lead._beat()  # its beacon in the heartbeat the member reads
    assert member._join_gang([("train", h.env.queues["train"])])
    _wait_both_free(lead, member)
    assert failed == [] and member.stopping.is_set()
    item = store.item(job, "000000")
    assert (item.failures, item.gang_failure) == (0, ""), (item.status, item.reason, item.history)


def test_a_member_whose_part_breaks_after_it_started_is_still_billed_its_time(gang, monkeypatch):
    """Its workload ran, then the agent's wait on it raised (a log stream that broke, a dockerd
    that stopped answering): the node was busy all that time, so its part is recorded, priced."""
    h = gang
    job = sdk.submit(h.env, "gang", "train", sdk.read_items([["steps=20"]]), kick=False).job_id
    store = DynamoStore(h.env.name, h.env.region)
    lead, member = _agent(h, "node-lead"), _agent(h, "node-m")
    monkeypatch.setenv("TIDEFLEET_NODE_ID", "in-process")  # the workload's, which both nodes here run
    wait = worker.Workload.wait

    def breaks_on_the_member(self, stream):
        if not self.workdir.name.endswith("-member"):
            return wait(self, stream)
        time.sleep(0.5)  # it ran a while
        self.proc.kill()
        self.proc.wait()
        raise RuntimeError("the log stream broke")

    monkeypatch.setattr(worker.Workload, "wait", breaks_on_the_member)
    assert lead._receive("train", h.env.queues["train"], wait_s=1) == 1
    wait_until(lambda: lead.beacon, 10, "the lead's beacon")
    lead._beat()
    assert member._join_gang([("train", h.env.queues["train"])])
    (part,) = wait_until(lambda: store.parts(job).get("000000"), 30, "the member's part")
    assert (part["node"], part.get("exit_code"), part["instance_type"]) == ("node-m", None, "c6i.large")
    assert "RuntimeError: the log stream broke" in part["reason"] and part["seconds"] >= 0.5
    (charge,) = costs.charges(h.env, store.job(job), [store.item(job, "000000")], parts={"000000": [part]})[-1:]
    assert charge.seconds == part["seconds"] and charge.cost_usd > 0
    _wait_both_free(lead, member)
