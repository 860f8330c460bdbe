"""The GCP adapters through the real google-cloud clients, against a faked HTTP transport
(tests/gcp_fake.py) that asserts the exact requests; and the SAME control tick and policy
as on AWS, run on the GCP ports."""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime

import google.auth
import pytest
import responses
from google.auth.credentials import AnonymousCredentials
from google.auth.transport.requests import AuthorizedSession

from tests.gcp_fake import COMPUTE, FakeGcp, FakeVm
from tidefleet.cloud.gcp import control_ports
from tidefleet.cloud.gcp.firestore import FirestoreNodes, FirestoreStore
from tidefleet.cloud.gcp.mig import MigFleet
from tidefleet.cloud.gcp.monitoring import MonitoringQueues
from tidefleet.config import load_environment
from tidefleet.control import tick
from tidefleet.ports import Ports
from tidefleet.records import Heartbeat

ENV = load_environment("gcp-dev")
IGM = f"/compute/v1/projects/{ENV.project}/regions/{ENV.region}/instanceGroupManagers"
NOW = 1_800_000_000.0


@pytest.fixture
def gcp(monkeypatch):
    # Application default credentials are the only thing not real: no Google account here.
    monkeypatch.setattr(google.auth, "default", lambda *a, **k: (AnonymousCredentials(), ENV.project))
    fake = FakeGcp(ENV.project, ENV.region)
    with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
        fake.install(mock)
        yield fake


def ports() -> Ports:
    creds = AnonymousCredentials()
    return Ports(
        queues=MonitoringQueues(ENV, session=AuthorizedSession(creds)),
        fleet=MigFleet(ENV, credentials=creds),
        nodes=FirestoreNodes(ENV, credentials=creds),
    )


def calls(gcp: FakeGcp, method: str, suffix: str) -> list[dict]:
    return [c for m, path, c in gcp.calls if m == method and path.endswith(suffix)]


def test_backlog_is_the_subscriptions_undelivered_messages(gcp):
    gcp.undelivered["tidefleet-gcp-dev-default"] = 7
    backlog = ports().queues.backlog("default")
    assert (backlog.visible, backlog.in_flight) == (7, 0)
    (call,) = calls(gcp, "GET", "/timeSeries")
    assert call["query"]["filter"] == (
        'metric.type = "pubsub.googleapis.com/subscription/num_undelivered_messages" AND '
        'resource.labels.subscription_id = "tidefleet-gcp-dev-default"'
    )


def test_spot_and_on_demand_groups_are_one_pool_in_the_ticks_words(gcp):
    gcp.groups |= {"tidefleet-gcp-dev-cpu": 2, "tidefleet-gcp-dev-cpu-od": 1}
    gcp.vms["tidefleet-gcp-dev-cpu"] = [FakeVm("tidefleet-gcp-dev-cpu-aaaa"), FakeVm("tidefleet-gcp-dev-cpu-bbbb", action="CREATING", status="")]
    gcp.vms["tidefleet-gcp-dev-cpu-od"] = [FakeVm("tidefleet-gcp-dev-cpu-od-cccc", action="DELETING")]
    gcp.errors["tidefleet-gcp-dev-cpu"] = [
        {"timestamp": "2027-01-15T08:00:00Z", "error": {"code": "ZONE_RESOURCE_POOL_EXHAUSTED", "message": "no spot"}},
        {"timestamp": "2027-01-15T08:00:00Z", "error": {"code": "QUOTA_EXCEEDED", "message":
                                                         "Quota 'CPUS_ALL_REGIONS' exceeded.  Limit: 24.0 globally."}},
    ]
    (group,) = ports().fleet.groups(["cpu"], since=0).values()
    assert (group.desired, group.on_demand_base, group.min, group.max) == (3, 1, 0, 10)
    states = {i.id: (i.lifecycle_state, i.spot, i.protected, i.instance_type) for i in group.instances}
    assert states == {
        "tidefleet-gcp-dev-cpu-aaaa": ("InService", True, False, "n2-standard-4"),
        "tidefleet-gcp-dev-cpu-bbbb": ("Pending", True, False, "n2-standard-4"),
        "tidefleet-gcp-dev-cpu-od-cccc": ("Terminating", False, False, "n2-standard-4"),
    }
    assert len(group.spot_failures) == 1, "only a Spot shortage counts: a quota on-demand would hit too does not"


QUOTA = "Quota '{}' exceeded.  Limit: 0.0 in region us-central1."


@pytest.mark.parametrize("code,message,counted", [
    ("ZONE_RESOURCE_POOL_EXHAUSTED", "The zone does not have enough resources available", True),
    ("ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS", "The zone does not have enough resources available", True),
    ("QUOTA_EXCEEDED", QUOTA.format("PREEMPTIBLE_CPUS"), True),  # Spot VMs' own quota: on-demand has its own
    ("QUOTA_EXCEEDED", QUOTA.format("PREEMPTIBLE_NVIDIA_T4_GPUS"), True),
    ("QUOTA_EXCEEDED", QUOTA.format("PREEMPTIBLE_NVIDIA_H100_GPUS"), True),
    ("QUOTA_EXCEEDED", QUOTA.format("CPUS"), False),  # on-demand VMs count against it too
    ("QUOTA_EXCEEDED", QUOTA.format("CPUS_ALL_REGIONS"), False),
    ("QUOTA_EXCEEDED", QUOTA.format("NVIDIA_T4_GPUS"), False),
    ("QUOTA_EXCEEDED", QUOTA.format("IN_USE_ADDRESSES"), False),
    ("QUOTA_EXCEEDED", "quota", False),
])  # fmt: skip
def test_a_spot_quota_counts_as_a_spot_failure_and_a_quota_on_demand_shares_does_not(gcp, caplog, code, message,
                                                                                     counted):  # fmt: skip
    """Spot VMs count against their own preemptible quota (PREEMPTIBLE_CPUS, PREEMPTIBLE_NVIDIA_*_GPUS) where
    one is granted, on-demand VMs never: a Spot group refused on it is a reason to launch on demand, as a
    stockout is (AWS counts any failed spot launch, MaxSpotInstanceCountExceeded too). A quota both kinds
    use would refuse the on-demand group as well."""
    gcp.groups |= {"tidefleet-gcp-dev-cpu": 1, "tidefleet-gcp-dev-cpu-od": 0}
    gcp.errors["tidefleet-gcp-dev-cpu"] = [{"timestamp": "2027-01-15T08:00:00Z",
                                            "error": {"code": code, "message": message}}]  # fmt: skip
    with caplog.at_level(logging.WARNING, "tidefleet"):
        (group,) = ports().fleet.groups(["cpu"], since=0).values()
    assert group.spot_failures == ((1_800_000_000.0,) if counted else ())
    quota = [r.getMessage() for r in caplog.records if "quota" in r.getMessage()]
    if counted and code == "QUOTA_EXCEEDED":
        name = message.split("'")[1]
        assert len(quota) == 1 and name in quota[0] and "tidefleet-gcp-dev-cpu" in quota[0], quota
        assert "on-demand" in quota[0], quota


def test_an_undeployed_pool_is_left_out(gcp):
    assert ports().fleet.groups(["cpu", "gpu"], since=0) == {}


def test_terminate_deletes_exactly_the_chosen_running_instances_skipping_vanished_ones(gcp):
    gcp.groups |= {"tidefleet-gcp-dev-cpu": 3, "tidefleet-gcp-dev-cpu-od": 0}
    gcp.vms["tidefleet-gcp-dev-cpu"] = [FakeVm("tidefleet-gcp-dev-cpu-aaaa"), FakeVm("tidefleet-gcp-dev-cpu-bbbb"),
                                        FakeVm("tidefleet-gcp-dev-cpu-cccc", action="DELETING")]
    done = ports().fleet.terminate("cpu", ("tidefleet-gcp-dev-cpu-aaaa", "tidefleet-gcp-dev-cpu-cccc", "elsewhere-1"))
    assert done == ("tidefleet-gcp-dev-cpu-aaaa",)
    (delete,) = calls(gcp, "POST", "/deleteInstances")
    assert delete["body"] == {
        "instances": [f"{COMPUTE}/projects/{ENV.project}/zones/us-central1-a/instances/tidefleet-gcp-dev-cpu-aaaa"],
        "skipInstancesOnValidationError": True,
    }
    assert gcp.groups["tidefleet-gcp-dev-cpu"] == 2, "deleteInstances lowered the target with the instance"
    assert not calls(gcp, "POST", "/resize")


def test_desired_capacity_is_split_between_the_on_demand_group_and_the_spot_group(gcp):
    gcp.groups |= {"tidefleet-gcp-dev-gpu": 0, "tidefleet-gcp-dev-gpu-od": 0}
    fleet = ports().fleet
    fleet.set_on_demand_base("gpu", 1)
    fleet.set_desired("gpu", 4)
    assert gcp.groups == {"tidefleet-gcp-dev-gpu": 3, "tidefleet-gcp-dev-gpu-od": 1}
    assert [c["query"]["size"] for c in calls(gcp, "POST", "/resize")] == ["1", "3"]


def test_group_of_maps_an_instance_name_to_its_group():
    fleet = MigFleet(ENV, groups=object(), instances=object())
    assert fleet.group_of("tidefleet-gcp-dev-gpu-od-x1y2") == "tidefleet-gcp-dev-gpu-od"
    assert fleet.group_of("tidefleet-gcp-dev-gpu-x1y2") == "tidefleet-gcp-dev-gpu"
    assert fleet.group_of("someone-else-1") is None


def test_heartbeats_round_trip_and_draining_is_sticky(gcp):
    nodes = ports().nodes
    nodes.put_heartbeat(Heartbeat("vm-1", "cpu", at=NOW, slots=2, busy_slots=0, idle_since=NOW - 5, instance_type="n2-standard-4"))
    nodes.mark_draining("cpu", "vm-1")
    nodes.put_heartbeat(Heartbeat("vm-1", "cpu", at=NOW + 5, slots=2, busy_slots=1, idle_since=None))
    nodes.mark_draining("cpu", "vm-2")  # before vm-2's first heartbeat: not a heartbeat
    beats = nodes.heartbeats("cpu")
    assert list(beats) == ["vm-1"]
    assert (beats["vm-1"].at, beats["vm-1"].busy_slots, beats["vm-1"].idle_since, beats["vm-1"].draining) == (NOW + 5, 1, None, True)
    assert nodes.heartbeat("cpu", "vm-9") is None
    patch = calls(gcp, "PATCH", "/nodes/vm-1")[-1]
    assert "draining" not in patch["query"].get("updateMask.fieldPaths", "") and "idle_since" not in patch["body"]["fields"]


# -- the same control tick and policy, on GCP ports ---------------------------------------
def test_tick_scales_out_from_zero_on_gcp_backlog(gcp):
    gcp.groups |= {"tidefleet-gcp-dev-cpu": 0, "tidefleet-gcp-dev-cpu-od": 0}
    gcp.undelivered["tidefleet-gcp-dev-default"] = 7  # 7 items, 2 slots a node: 4 nodes
    (decision,) = tick(ENV, ports(), NOW, pools=["cpu"])
    assert decision.desired == 4 and gcp.groups["tidefleet-gcp-dev-cpu"] == 4
    assert any("default" in r for r in decision.reasons)


def test_tick_deletes_only_the_idle_node_and_keeps_the_busy_one_on_gcp(gcp):
    gcp.groups |= {"tidefleet-gcp-dev-cpu": 2, "tidefleet-gcp-dev-cpu-od": 0}
    old = "2027-01-15T00:00:00Z"
    gcp.vms["tidefleet-gcp-dev-cpu"] = [FakeVm("tidefleet-gcp-dev-cpu-busy", created=old), FakeVm("tidefleet-gcp-dev-cpu-idle", created=old)]
    gcp.undelivered["tidefleet-gcp-dev-default"] = 1  # the busy node's item
    nodes = ports().nodes
    nodes.put_heartbeat(Heartbeat("tidefleet-gcp-dev-cpu-busy", "cpu", at=NOW, slots=2, busy_slots=1, idle_since=None))
    nodes.put_heartbeat(Heartbeat("tidefleet-gcp-dev-cpu-idle", "cpu", at=NOW, slots=2, busy_slots=0, idle_since=NOW - 3600))
    (decision,) = tick(ENV, ports(), NOW, pools=["cpu"])
    assert decision.terminate == ("tidefleet-gcp-dev-cpu-idle",)
    (delete,) = calls(gcp, "POST", "/deleteInstances")
    assert [u.rsplit("/", 1)[-1] for u in delete["body"]["instances"]] == ["tidefleet-gcp-dev-cpu-idle"]
    assert gcp.groups["tidefleet-gcp-dev-cpu"] == 1


def test_dry_run_tick_changes_nothing_on_gcp(gcp):
    gcp.groups |= {"tidefleet-gcp-dev-cpu": 0, "tidefleet-gcp-dev-cpu-od": 0}
    gcp.undelivered["tidefleet-gcp-dev-default"] = 3
    tick(ENV, ports(), NOW, pools=["cpu"], dry_run=True)
    assert not [c for m, p, c in gcp.calls if m != "GET" and not p.endswith("/listManagedInstances")]


def test_a_spot_shortage_moves_the_new_capacity_to_the_on_demand_group_in_one_full_tick(gcp):
    """The function's own ports (`control_ports`): Monitoring, both groups, their errors, Firestore."""
    now = time.time()
    spot, on_demand = "tidefleet-gcp-dev-cpu", "tidefleet-gcp-dev-cpu-od"
    gcp.groups |= {spot: 2, on_demand: 0}
    hour_ago = datetime.fromtimestamp(now - 3600, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    gcp.vms[spot] = [FakeVm(f"{spot}-aaaa", created=hour_ago), FakeVm(f"{spot}-bbbb", created=hour_ago)]
    gcp.errors[spot] = [{"timestamp": datetime.fromtimestamp(now - 60, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                         "error": {"code": "ZONE_RESOURCE_POOL_EXHAUSTED", "message": "no Spot capacity"}}]  # fmt: skip
    ports = control_ports(ENV)
    for vm in gcp.vms[spot]:
        ports.nodes.put_heartbeat(Heartbeat(vm.name, "cpu", at=now, slots=2, busy_slots=2, idle_since=None))
    FirestoreStore(ENV).record_item_seconds("default", 3600.0)  # items run an hour: no turnover within the target
    gcp.undelivered["tidefleet-gcp-dev-default"] = 8  # 4 running on the two nodes, 4 waiting: 2 more nodes
    (decision,) = tick(ENV, ports, now, pools=["cpu"])
    assert (decision.desired, decision.on_demand_base) == (4, 2)
    assert any("spot short (1 spot launch failure(s)" in r for r in decision.reasons)
    assert gcp.groups == {spot: 2, on_demand: 2}, "the two new nodes come from the on-demand group"


def test_a_spot_quota_moves_the_new_capacity_to_the_on_demand_group_in_one_full_tick(gcp):
    now = time.time()
    spot, on_demand = "tidefleet-gcp-dev-cpu", "tidefleet-gcp-dev-cpu-od"
    gcp.groups |= {spot: 2, on_demand: 0}
    hour_ago = datetime.fromtimestamp(now - 3600, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    gcp.vms[spot] = [FakeVm(f"{spot}-aaaa", created=hour_ago), FakeVm(f"{spot}-bbbb", created=hour_ago)]
    gcp.errors[spot] = [{"timestamp": datetime.fromtimestamp(now - 60, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                         "error": {"code": "QUOTA_EXCEEDED",
                                   "message": QUOTA.format("PREEMPTIBLE_CPUS")}}]  # fmt: skip
    ports = control_ports(ENV)
    for vm in gcp.vms[spot]:
        ports.nodes.put_heartbeat(Heartbeat(vm.name, "cpu", at=now, slots=2, busy_slots=2, idle_since=None))
    FirestoreStore(ENV).record_item_seconds("default", 3600.0)
    gcp.undelivered["tidefleet-gcp-dev-default"] = 8
    (decision,) = tick(ENV, ports, now, pools=["cpu"])
    assert (decision.desired, decision.on_demand_base) == (4, 2), decision.reasons
    assert gcp.groups == {spot: 2, on_demand: 2}, "the two new nodes come from the on-demand group"


def test_once_spot_is_healthy_again_the_busy_on_demand_nodes_are_kept_in_a_full_tick(gcp):
    now = time.time()
    spot, on_demand = "tidefleet-gcp-dev-cpu", "tidefleet-gcp-dev-cpu-od"
    gcp.groups |= {spot: 2, on_demand: 2}  # after a shortage: the base is 2, the configured one 0
    hour_ago = datetime.fromtimestamp(now - 3600, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    gcp.vms[spot] = [FakeVm(f"{spot}-aaaa", created=hour_ago), FakeVm(f"{spot}-bbbb", created=hour_ago)]
    gcp.vms[on_demand] = [FakeVm(f"{on_demand}-cccc", created=hour_ago), FakeVm(f"{on_demand}-dddd", created=hour_ago)]
    ports = control_ports(ENV)
    for vm in gcp.vms[spot] + gcp.vms[on_demand]:
        ports.nodes.put_heartbeat(Heartbeat(vm.name, "cpu", at=now, slots=2, busy_slots=2, idle_since=None))
    gcp.undelivered["tidefleet-gcp-dev-default"] = 8  # every slot busy, nothing waiting
    (decision,) = tick(ENV, ports, now, pools=["cpu"])
    assert (decision.desired, decision.on_demand_base) == (4, 0), "the policy restores the configured base"
    assert gcp.groups == {spot: 2, on_demand: 2}, "but no busy on-demand VM is deleted for it"
    assert all(vm.action == "NONE" for vm in gcp.vms[spot] + gcp.vms[on_demand])


def test_recording_many_items_is_one_batch_read_and_one_commit_per_chunk(gcp):
    from tidefleet.cloud.gcp.firestore import COMMIT_WRITES
    from tidefleet.records import Item, ItemWrite, Job

    store = FirestoreStore(ENV, credentials=AnonymousCredentials())
    store.put_job(Job("j", "items", "default", 0.0, 3, counted=True))
    n = COMMIT_WRITES + 5
    store.create_items([Item("j", f"{i:06d}", args=[], status="running") for i in range(n)], unseen=True)
    gcp.calls.clear()
    assert store.update_items([ItemWrite("j", f"{i:06d}", {"status": "succeeded"}) for i in range(n)]) == [True] * n
    assert [(m, p.rsplit(":", 1)[-1]) for m, p, _ in gcp.calls] == [("POST", "batchGet"), ("POST", "commit")] * 2
    assert store.job("j").n_succeeded == n


def test_a_hold_past_pubsubs_600_s_is_asked_as_600():
    """An agent's hide or hand-over with a slow heartbeat (`lease_s` = 6 heartbeats) asks for more
    than Pub/Sub's most: the call was refused, the message left to come back at its old deadline."""
    from tidefleet.cloud.gcp.pubsub import PubSubWorkQueues

    asked = []

    class Subscriber:
        def modify_ack_deadline(self, **call):
            asked.append(call["ack_deadline_seconds"])

    queues = PubSubWorkQueues(ENV, subscriber=Subscriber(), publisher=object())
    for seconds in (900, 600, 30):
        queues.extend_on("projects/p/subscriptions/s", ["ack-1"], seconds)
    assert asked == [600, 600, 30]
