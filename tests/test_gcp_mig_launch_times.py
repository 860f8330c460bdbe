"""A managed instance the group is still CREATING has no VM yet (GCE lists no Instance for it, so
the aggregated list the adapter reads its creation time from does not either), and may have none
for a long while (a quota or a stockout: the group keeps trying). Its launch time is unknown, not
1970: reported as launched_at 0.0 the policy replaced it every tick as 'no heartbeat 1.8e9 s
after launch' and the stuck-booting metric blamed the image. Now the adapter reports when it
first saw the instance, the same on every tick of a warm function, so the boot timeout and the
spot fallback count from then and are not restarted each tick (None would be: control takes
`now` for it)."""

from __future__ import annotations

import re
import time

import google.auth
import pytest
import responses
from google.auth.credentials import AnonymousCredentials
from google.auth.transport.requests import AuthorizedSession

from tests.gcp_fake import FakeGcp, FakeVm
from tidefleet.cloud.gcp.firestore import FirestoreNodes
from tidefleet.cloud.gcp.mig import MigFleet
from tidefleet.cloud.gcp.monitoring import MonitoringQueues
from tidefleet.config import load_environment
from tidefleet.control import tick
from tidefleet.ports import Ports

ENV = load_environment("gcp-dev")
SPOT = "tidefleet-gcp-dev-cpu"


@pytest.fixture
def gcp(monkeypatch):
    """The fake, where a managed instance without a status (being created) has no VM to list."""
    monkeypatch.setattr(google.auth, "default", lambda *a, **k: (AnonymousCredentials(), ENV.project))
    fake = FakeGcp(ENV.project, ENV.region)
    listed = fake._aggregated

    def aggregated(request):
        every = {g: list(v) for g, v in fake.vms.items()}
        fake.vms.update({g: [vm for vm in v if vm.status] for g, v in every.items()})
        try:
            return listed(request)
        finally:
            fake.vms.update(every)

    fake._aggregated = aggregated
    with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
        fake.install(mock)
        yield fake


def ports(fleet: MigFleet | None = None) -> Ports:
    creds = AnonymousCredentials()
    return Ports(queues=MonitoringQueues(ENV, session=AuthorizedSession(creds)),
                 fleet=fleet or MigFleet(ENV, credentials=creds), nodes=FirestoreNodes(ENV, credentials=creds))  # fmt: skip


def creating(*names: str) -> list[FakeVm]:
    return [FakeVm(name, action="CREATING", status="") for name in names]


def test_an_instance_without_a_vm_yet_is_launched_when_first_seen_and_stays_so(gcp):
    gcp.groups |= {SPOT: 2, f"{SPOT}-od": 0}
    gcp.vms[SPOT] = creating(f"{SPOT}-aaaa", f"{SPOT}-bbbb")
    fleet = MigFleet(ENV, credentials=AnonymousCredentials())
    before = time.time()
    (first,) = fleet.groups(["cpu"], since=0).values()
    after = time.time()
    seen = {i.id: i.launched_at for i in first.instances}
    assert all(before <= t <= after for t in seen.values()), seen
    time.sleep(0.01)
    (again,) = fleet.groups(["cpu"], since=0).values()
    assert {i.id: i.launched_at for i in again.instances} == seen, "the same on the next tick"
    # Its VM is created: the VM's own creation time from then on.
    gcp.vms[SPOT][0] = FakeVm(f"{SPOT}-aaaa", created="2027-01-15T08:00:00.000-00:00")
    (created,) = fleet.groups(["cpu"], since=0).values()
    times = {i.id: i.launched_at for i in created.instances}
    assert times[f"{SPOT}-aaaa"] == 1_800_000_000.0 and times[f"{SPOT}-bbbb"] == seen[f"{SPOT}-bbbb"]


def test_the_tick_waits_for_instances_being_created_instead_of_replacing_them(gcp):
    gcp.groups |= {SPOT: 4, f"{SPOT}-od": 0}
    gcp.vms[SPOT] = creating(*(f"{SPOT}-{c * 4}" for c in "abcd"))
    gcp.undelivered[f"{SPOT.removesuffix('-cpu')}-default"] = 7
    p = ports()
    now = time.time()
    (decision,) = tick(ENV, p, now, pools=["cpu"])
    assert decision.terminate == () and not any(r.startswith("replace") for r in decision.reasons), \
        decision.reasons  # fmt: skip
    # Past the boot timeout with still no VM (the same warm adapter): now they are late.
    later = now + ENV.pools["cpu"].boot_timeout_s + 60
    (late,) = tick(ENV, p, later, pools=["cpu"])
    waited = [float(m.group(1)) for r in late.reasons if (m := re.search(r"no heartbeat (\d+)s after launch", r))]
    expected = ENV.pools["cpu"].boot_timeout_s + 60
    assert len(waited) == 4 and all(expected - 5 <= w <= expected for w in waited), late.reasons
