"""A Spot group that cannot create its VMs (a stockout, its Spot quota) keeps a managed instance for
each one it could not create: CREATING, no VM (instanceStatus empty: 'empty when the instance does
not exist'), its last attempt's errors saying why, retried for as long as the target size asks.
On AWS such a launch is a failed scaling activity and no instance at all, so the group is short and
the policy's spot fallback moves those units to on-demand at the next tick. Reported as booting
nodes they held the group's capacity up, and the fallback waited for the boot timeout (it came at
the first tick before only because such instances were reported as launched in 1970).

Now the adapter leaves an instance whose creation failed out of the group's instances, as AWS does,
and when the Spot group's target comes down it deletes those first (deleteInstances, which lowers
the target with them), so a resize never picks a running VM while a failed creation is there to go."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime

import google.auth
import pytest
import responses
from google.auth.credentials import AnonymousCredentials

from tests.gcp_fake import FakeGcp, FakeVm
from tidefleet.cloud.gcp import control_ports
from tidefleet.cloud.gcp.firestore import FirestoreStore
from tidefleet.config import load_environment
from tidefleet.control import tick
from tidefleet.records import Heartbeat

ENV = load_environment("gcp-dev")
SPOT, ON_DEMAND = "tidefleet-gcp-dev-cpu", "tidefleet-gcp-dev-cpu-od"
STOCKOUT = {"code": "ZONE_RESOURCE_POOL_EXHAUSTED", "message": "The zone 'us-central1-a' does not have enough resources"}


@pytest.fixture
def gcp(monkeypatch):
    """The fake, where an instance without a status has no VM to list, and an instance named in
    `failed` reports its last creation attempt's error, as listManagedInstances does."""
    monkeypatch.setattr(google.auth, "default", lambda *a, **k: (AnonymousCredentials(), ENV.project))
    fake = FakeGcp(ENV.project, ENV.region)
    fake.failed = {}  # instance name -> its last attempt's error
    listed, igm = fake._aggregated, fake._igm

    def aggregated(request):
        every = {g: list(v) for g, v in fake.vms.items()}
        fake.vms.update({g: [vm for vm in v if vm.status] for g, v in every.items()})
        try:
            return listed(request)
        finally:
            fake.vms.update(every)

    def managed(request):
        code, headers, body = igm(request)
        if code == 200 and request.url.split("?")[0].endswith("/listManagedInstances"):
            answer = json.loads(body)
            for m in answer.get("managedInstances", []):
                if m["name"] in fake.failed and m["currentAction"] == "CREATING":
                    m["lastAttempt"] = {"errors": {"errors": [fake.failed[m["name"]]]}}
            body = json.dumps(answer)
        return code, headers, body

    fake._aggregated, fake._igm = aggregated, managed
    with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
        fake.install(mock)
        yield fake


def stamp(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


SPOT_QUOTA = {"code": "QUOTA_EXCEEDED", "message": "Quota 'PREEMPTIBLE_CPUS' exceeded.  Limit: 0.0 in region us-central1."}


@pytest.mark.parametrize("error", [STOCKOUT, SPOT_QUOTA], ids=["stockout", "spot quota"])
def test_units_spot_could_not_create_move_to_on_demand_at_the_next_tick(gcp, error):
    now = time.time()
    gcp.groups |= {SPOT: 4, ON_DEMAND: 0}
    # Listed first: a resize down to 2 would take the fake's last two, the running ones.
    gcp.vms[SPOT] = [FakeVm(f"{SPOT}-cccc", action="CREATING", status=""), FakeVm(f"{SPOT}-dddd", action="CREATING", status=""),
                     FakeVm(f"{SPOT}-aaaa", created=stamp(now - 3600)), FakeVm(f"{SPOT}-bbbb", created=stamp(now - 3600))]  # fmt: skip
    gcp.failed |= {f"{SPOT}-cccc": error, f"{SPOT}-dddd": error}
    gcp.errors[SPOT] = [{"timestamp": stamp(now - 30), "error": error}]
    ports = control_ports(ENV)
    (group,) = ports.fleet.groups(["cpu"], since=now - 600).values()
    assert {i.id for i in group.instances} == {f"{SPOT}-aaaa", f"{SPOT}-bbbb"}, "failed creations are no instances"
    assert (group.desired, len(group.spot_failures)) == (4, 1)
    for name in (f"{SPOT}-aaaa", f"{SPOT}-bbbb"):
        ports.nodes.put_heartbeat(Heartbeat(name, "cpu", at=now, slots=2, busy_slots=2, idle_since=None))
    FirestoreStore(ENV).record_item_seconds("default", 3600.0)  # items run an hour: no turnover within the target
    gcp.undelivered["tidefleet-gcp-dev-default"] = 8  # 4 running on the two nodes, 4 waiting: 2 more nodes
    (decision,) = tick(ENV, ports, now, pools=["cpu"])
    assert (decision.desired, decision.on_demand_base) == (4, 2), decision.reasons
    assert not any(r.startswith("replace") for r in decision.reasons), decision.reasons
    assert gcp.groups == {SPOT: 2, ON_DEMAND: 2}, "the two Spot could not create come from the on-demand group"
    actions = {vm.name: vm.action for vm in gcp.vms[SPOT]}
    assert actions == {f"{SPOT}-cccc": "DELETING", f"{SPOT}-dddd": "DELETING", f"{SPOT}-aaaa": "NONE",
                       f"{SPOT}-bbbb": "NONE"}, "the failed creations went, never a running VM"  # fmt: skip


def test_an_instance_still_being_created_without_an_error_is_a_booting_node(gcp):
    gcp.groups |= {SPOT: 1, ON_DEMAND: 0}
    gcp.vms[SPOT] = [FakeVm(f"{SPOT}-aaaa", action="CREATING", status="")]
    (group,) = control_ports(ENV).fleet.groups(["cpu"], since=0).values()
    assert [(i.id, i.lifecycle_state) for i in group.instances] == [(f"{SPOT}-aaaa", "Pending")]


def test_lowering_the_spot_group_without_failed_creations_is_one_resize(gcp):
    now = time.time()
    gcp.groups |= {SPOT: 3, ON_DEMAND: 0}  # a third unit not created yet: no instance listed for it
    gcp.vms[SPOT] = [FakeVm(f"{SPOT}-{c * 4}", created=stamp(now - 3600)) for c in "ab"]
    control_ports(ENV).fleet.set_desired("cpu", 2)
    assert gcp.groups[SPOT] == 2
    assert not [p for m, p, c in gcp.calls if p.endswith("/deleteInstances")]


CPU_QUOTA = {"code": "QUOTA_EXCEEDED", "message": "Quota 'CPUS' exceeded.  Limit: 8.0 in region us-central1."}


@pytest.mark.parametrize("units", [0, 1])
def test_the_on_demand_base_comes_down_past_a_failed_on_demand_creation_which_goes_by_name(gcp, units):
    """groups() leaves the on-demand group's failed creations out too, so the base never stays up for
    one: a VM the policy does not count, retried until quota frees and then launched unasked."""
    now = time.time()
    gcp.groups |= {SPOT: 0, ON_DEMAND: 2}
    # Listed first: a resize down to 1 would take the fake's last one, the running VM.
    gcp.vms[ON_DEMAND] = [FakeVm(f"{ON_DEMAND}-bbbb", action="CREATING", status=""),
                          FakeVm(f"{ON_DEMAND}-aaaa", created=stamp(now - 3600))]  # fmt: skip
    gcp.failed |= {f"{ON_DEMAND}-bbbb": CPU_QUOTA}
    fleet = control_ports(ENV).fleet
    (group,) = fleet.groups(["cpu"], since=now - 600).values()
    assert [i.id for i in group.instances] == [f"{ON_DEMAND}-aaaa"], "a failed creation is no instance"
    fleet.set_on_demand_base("cpu", units)
    assert gcp.groups[ON_DEMAND] == 1, "down to the VM it runs, never below it"
    actions = {vm.name: vm.action for vm in gcp.vms[ON_DEMAND]}
    assert actions == {f"{ON_DEMAND}-bbbb": "DELETING", f"{ON_DEMAND}-aaaa": "NONE"}, "the failed creation went, by name"


@pytest.mark.parametrize("waiting", [0, 2])
def test_the_spot_group_is_never_sized_below_its_vms_by_on_demand_creations_that_failed(gcp, waiting):
    """The Spot group was sized to desired less the on-demand group's target, which counts the
    instances it could not create (a quota): 3 busy Spot VMs, an on-demand base of 2 that never
    came, demand for 3 nodes, and the resize to 1 deleted two busy VMs of the group's choosing."""
    now = time.time()
    gcp.groups |= {SPOT: 3, ON_DEMAND: 2}
    gcp.vms[SPOT] = [FakeVm(f"{SPOT}-{c * 4}", created=stamp(now - 3600)) for c in "abc"]
    gcp.vms[ON_DEMAND] = [FakeVm(f"{ON_DEMAND}-{c * 4}", action="CREATING", status="") for c in "xy"]
    gcp.failed |= {f"{ON_DEMAND}-xxxx": CPU_QUOTA, f"{ON_DEMAND}-yyyy": CPU_QUOTA}
    gcp.errors[SPOT] = [{"timestamp": stamp(now - 30), "error": STOCKOUT}]  # spot short: the base stays
    ports = control_ports(ENV)
    for c in "abc":
        ports.nodes.put_heartbeat(Heartbeat(f"{SPOT}-{c * 4}", "cpu", at=now, slots=2, busy_slots=2, idle_since=None,
                                            leased={"default": 2}))  # fmt: skip
    gcp.undelivered["tidefleet-gcp-dev-default"] = 6 + waiting
    tick(ENV, ports, now, pools=["cpu"])
    assert {vm.name: vm.action for vm in gcp.vms[SPOT]} == {f"{SPOT}-{c * 4}": "NONE" for c in "abc"}
    assert gcp.groups[SPOT] >= 3
