"""The control tick's ports on GCP: the pool's managed instance groups (`MigFleet`). The Pub/Sub
backlog from Cloud Monitoring (`MonitoringQueues`) is in `tidefleet.cloud.gcp.monitoring`. The tick
and the policy are the AWS ones.

- Fleet (google-cloud-compute, REST): a pool is two regional managed instance groups, Spot
  and on-demand (a template is one or the other). The port shows them as one group: desired =
  both target sizes, on-demand base = the on-demand group's. Instances are reported in the
  tick's lifecycle words (Pending / InService / Terminating / Terminated). GCE has no scale-in
  protection: only the policy's chosen instances go, by `deleteInstances` (which lowers the
  target size with them) with skip-instances-on-validation-error, so one that is already gone
  is skipped instead of failing the call; a target size is never lowered below the instances
  left (the tick guarantees it for desired; `set_on_demand_base` for the on-demand group), so
  the group never picks a victim of its own.
  A managed instance the group is still creating has no VM yet (none listed, so no creation
  time) and may have none for long (a quota, a stockout: the group keeps trying): its launch
  time is when this adapter first saw it, the same on every tick of a warm function (a cold
  start sees it anew, as just launched), so the boot timeout and the spot fallback count from
  then instead of from 1970 or from each tick. One the group could not create (a stockout, a
  quota: no VM, its last attempt's errors; the group retries as long as its target asks) is no
  instance, as a failed launch on AWS: the policy sees the group short and, spot being short,
  moves those units to on-demand; `set_on_demand_base` and `set_desired` delete such instances
  first (by name) whenever either group comes down, so a resize never picks a running VM, and
  the on-demand base is never held up for one.
- Heartbeats (google-cloud-firestore's GAPIC client, REST): documents
  `pools/<pool>/nodes/<node>` in the environment's database, the same fields as DynamoDB's.
"""

from __future__ import annotations

import logging
import math
import re
import time
from datetime import datetime

from google.api_core import exceptions as gexc
from google.cloud import compute_v1

from tidefleet import naming
from tidefleet.cloud.gcp.calls import RETRY, RETRY_REFUSED, TRY_S
from tidefleet.config import Environment
from tidefleet.ports import GroupInstance, GroupState

log = logging.getLogger(__name__)

# What a managed instance is doing, in the tick's (Auto Scaling's) words.
PENDING_ACTIONS = frozenset({"CREATING", "CREATING_WITHOUT_RETRIES", "RECREATING", "VERIFYING", "RESTARTING",
                             "REFRESHING", "RESUMING", "STARTING"})  # fmt: skip
GOING_ACTIONS = frozenset({"DELETING", "ABANDONING", "STOPPING", "SUSPENDING"})
# Errors of a Spot group that mean "no Spot capacity now", as the policy's spot failures.
SPOT_SHORTAGE = ("ZONE_RESOURCE_POOL_EXHAUSTED", "STOCKOUT", "RESOURCE_POOL_EXHAUSTED")
# A quota only Spot (preemptible) VMs count against, named in a QUOTA_EXCEEDED error's message
# ("Quota 'PREEMPTIBLE_NVIDIA_T4_GPUS' exceeded. Limit: 0.0 in region ..."): PREEMPTIBLE_CPUS,
# PREEMPTIBLE_NVIDIA_*_GPUS, PREEMPTIBLE_LOCAL_SSD_GB (compute_v1.Quota.Metric). On-demand VMs never
# use it, so it is a spot failure too: on-demand is the way round, as after AWS's
# MaxSpotInstanceCountExceeded. A quota both kinds use (CPUS, CPUS_ALL_REGIONS, NVIDIA_T4_GPUS where no
# preemptible quota is granted, IN_USE_ADDRESSES) would refuse the on-demand group too: not counted.
SPOT_QUOTA = re.compile(r"\bPREEMPTIBLE_[A-Z0-9_]+")
QUOTA_SAID_KEPT = 10_000


def _epoch(rfc3339: str) -> float:
    return datetime.fromisoformat(rfc3339).timestamp() if rfc3339 else 0.0


def _last(url: str) -> str:
    return url.rsplit("/", 1)[-1]


def creation_failed(managed: compute_v1.ManagedInstance) -> bool:
    """The group could not create this instance's VM (a stockout, a quota) and is trying again: no
    VM (instanceStatus is empty when the instance does not exist) and its last attempt's errors. In
    AWS's words a failed launch, which is no instance."""
    return not managed.instance_status and bool(managed.last_attempt.errors.errors)


def lifecycle_state(managed: compute_v1.ManagedInstance) -> str:
    action, status = managed.current_action, managed.instance_status
    if action in GOING_ACTIONS or status in ("STOPPING", "SUSPENDING"):
        return "Terminating"
    if status in ("TERMINATED", "STOPPED", "SUSPENDED"):
        return "Terminated"
    if action in PENDING_ACTIONS or status != "RUNNING":
        return "Pending"
    return "InService"


class MigFleet:
    """FleetPort over a pool's Spot and on-demand regional managed instance groups."""

    def __init__(self, env: Environment, *, groups=None, instances=None, credentials=None):
        self.env, self.project, self.region = env, env.project, env.region
        self.migs = groups or compute_v1.RegionInstanceGroupManagersClient(credentials=credentials)
        self.instances = instances or compute_v1.InstancesClient(credentials=credentials)
        # Per group: when each of its instances without a VM yet was first seen, by instance URL.
        self._first_seen: dict[str, dict[str, float]] = {}
        self._quota_said: set[tuple[str, str, str]] = set()  # Spot quota errors logged: (group, time, quota)

    def _names(self, pool: str) -> tuple[str, str]:
        return naming.group(self.env.name, pool), naming.on_demand_group(self.env.name, pool)

    def _weight(self, pool: str) -> int:
        return self.env.pools[pool].instance_types[0].weight  # one weight per GCP pool (config rule)

    def _where(self, group: str) -> dict:
        return {"project": self.project, "region": self.region, "instance_group_manager": group}

    def _get(self, group: str) -> compute_v1.InstanceGroupManager | None:
        try:
            return self.migs.get(**self._where(group), retry=RETRY, timeout=TRY_S)
        except gexc.NotFound:
            return None

    def _managed(self, group: str) -> list[compute_v1.ManagedInstance]:
        return list(self.migs.list_managed_instances(**self._where(group), retry=RETRY, timeout=TRY_S))

    def _facts(self) -> dict[str, compute_v1.Instance]:
        """Creation time and machine type of the environment's instances, by self link: one
        aggregated list per tick (the group's listing carries neither)."""
        request = compute_v1.AggregatedListInstancesRequest(
            project=self.project, filter=f'labels.tidefleet-env = "{self.env.name}"'
        )
        pages = self.instances.aggregated_list(request=request, retry=RETRY, timeout=TRY_S)
        return {i.self_link: i for _, scoped in pages for i in scoped.instances}

    def _spot_failures(self, group: str, since: float) -> tuple[float, ...]:
        failures = []
        for e in self.migs.list_errors(**self._where(group), retry=RETRY, timeout=TRY_S):
            at = _epoch(e.timestamp)
            if at < since:
                continue
            if any(code in e.error.code for code in SPOT_SHORTAGE):
                failures.append(at)
            elif quota := SPOT_QUOTA.search(e.error.message):
                failures.append(at)
                # The policy's reason counts spot failures without their cause: the log names the quota,
                # once per error a warm function sees.
                if len(self._quota_said) > QUOTA_SAID_KEPT:  # errors age out of the window: forget now and then
                    self._quota_said.clear()
                if (group, e.timestamp, quota.group()) not in self._quota_said:
                    self._quota_said.add((group, e.timestamp, quota.group()))
                    log.warning("%s: the Spot quota %s is exhausted (%s: %s); counted as a spot launch failure, so "
                                "the policy launches on-demand instead; raise the quota to launch Spot again", group,
                                quota.group(), e.error.code, " ".join(e.error.message.split())[:200])  # fmt: skip
        return tuple(sorted(failures))

    def groups(self, pools: list[str], since: float) -> dict[str, GroupState]:
        found = {p: (self._get(self._names(p)[0]), self._get(self._names(p)[1])) for p in pools}
        found = {p: pair for p, pair in found.items() if pair[0] is not None}
        facts = self._facts() if found else {}
        out = {}
        for pool, (spot_group, od_group) in found.items():
            weight = self._weight(pool)
            instances = []
            for group, spot in ((spot_group, True), (od_group, False)):
                if group is None:
                    continue
                seen, self._first_seen[group.name] = self._first_seen.get(group.name, {}), {}
                for managed in self._managed(group.name):
                    if creation_failed(managed):  # not capacity; deleted first when its group comes down
                        continue
                    fact = facts.get(managed.instance)
                    if fact and fact.creation_timestamp:
                        launched_at = _epoch(fact.creation_timestamp)
                    else:  # no VM yet: when first seen (kept only while it is still without one)
                        launched_at = self._first_seen[group.name][managed.instance] = seen.get(managed.instance,
                                                                                                time.time())
                    instances.append(GroupInstance(
                        id=_last(managed.instance), lifecycle_state=lifecycle_state(managed), spot=spot,
                        instance_type=_last(fact.machine_type) if fact else self.env.pools[pool].instance_types[0].type,
                        launched_at=launched_at,
                        protected=False,  # GCE has none; busy nodes are kept by their heartbeats
                        weight=weight,
                    ))  # fmt: skip
            od_size = od_group.target_size if od_group else 0
            out[pool] = GroupState(
                name=spot_group.name, desired=(spot_group.target_size + od_size) * weight,
                min=self.env.pools[pool].min, max=self.env.pools[pool].max, on_demand_base=od_size * weight,
                instances=tuple(instances), spot_failures=self._spot_failures(spot_group.name, since),
            )  # fmt: skip
        return out

    def set_desired(self, pool: str, desired: int) -> None:
        """Size the Spot group to what the on-demand group leaves of `desired`: its target less the
        instances it could not create (a quota), which are no capacity, as `groups` reports them;
        subtracted, they sized the Spot group below its own VMs, and a resize deletes VMs of the
        group's choosing, busy ones too. Never below the Spot group's own VMs either (the tick keeps
        desired above the instances it reported: this holds where the two groups' split moved)."""
        spot, on_demand = self._names(pool)
        nodes = math.ceil(desired / self._weight(pool))
        od_group = self._get(on_demand)
        od_share = od_group.target_size - len(self._failed(on_demand)) if od_group is not None else 0
        size = max(0, nodes - od_share)
        group = self._get(spot)
        if group is not None:
            managed = self._managed(spot)
            size = max(size, len(self._vms(spot, managed)))
            # Lowered: the instances it could not create go first.
            self._delete_failed(spot, group.target_size - size, managed)
        self.migs.resize(**self._where(spot), size=size, retry=RETRY, timeout=TRY_S)

    def _failed(self, group: str, managed: list[compute_v1.ManagedInstance] | None = None) -> list[str]:
        """The group's instances it could not create (a stockout, a quota), which it keeps trying."""
        return [m.instance for m in (self._managed(group) if managed is None else managed) if creation_failed(m)]

    def _vms(self, group: str, managed: list[compute_v1.ManagedInstance] | None = None) -> list[str]:
        """The group's instances that are VMs, running or on their way: not one it could not create."""
        return [m.instance for m in (self._managed(group) if managed is None else managed)
                if lifecycle_state(m) in ("InService", "Pending") and not creation_failed(m)]  # fmt: skip

    def _delete(self, group: str, urls: list[str]) -> None:
        self.migs.delete_instances(
            **self._where(group),
            region_instance_group_managers_delete_instances_request_resource=(
                compute_v1.RegionInstanceGroupManagersDeleteInstancesRequest(
                    instances=urls, skip_instances_on_validation_error=True)
            ),
            retry=RETRY_REFUSED, timeout=TRY_S,
        )  # fmt: skip

    def _delete_failed(self, group: str, up_to: int, managed: list[compute_v1.ManagedInstance] | None = None) -> None:
        """Delete up to `up_to` of the group's instances it could not create, by name (deleteInstances
        lowers the target with them): whenever a group's target comes down, or its units move to the
        other group, these go first, so a resize never picks a running VM while one of them is there.
        `managed`: the group's listing, when the caller has just read it."""
        if up_to <= 0:
            return
        failed = self._failed(group, managed)
        if failed:
            self._delete(group, failed[:up_to])

    def set_on_demand_base(self, pool: str, units: int) -> None:
        """Size the on-demand group to the base; the tick's set_desired that follows sizes the Spot
        group to the rest. Never below the on-demand VMs it runs: a resize below them would delete
        some of the group's own choosing, busy ones too. Those leave when the policy terminates
        them (on-demand first, once idle), and the base comes down with them. An instance it could
        not create (a quota) is none of them: the policy does not count it (groups leaves it out),
        so lowered, those go first, by name, instead of holding the base up and launching a VM
        nobody asked for once the quota frees.
        Raised, the Spot group's instances it could not create go, as many as the raise: the
        units the on-demand group now brings are theirs (the policy counted them as not there, as
        on AWS), and the tick calls no set_desired when desired itself stays."""
        spot, on_demand = self._names(pool)
        size = math.ceil(units / self._weight(pool))
        group = self._get(on_demand)
        if group is not None and size < group.target_size:
            managed = self._managed(on_demand)
            size = max(size, len(self._vms(on_demand, managed)))
            if size == group.target_size:
                return
            self._delete_failed(on_demand, group.target_size - size, managed)
        self.migs.resize(**self._where(on_demand), size=size, retry=RETRY, timeout=TRY_S)
        raised = size - (group.target_size if group is not None else 0)
        if raised > 0 and self._get(spot) is not None:
            self._delete_failed(spot, raised)

    def terminate(self, pool: str, instance_ids: tuple[str, ...]) -> tuple[str, ...]:
        if not instance_ids:
            return ()
        wanted, done = set(instance_ids), []
        for group in self._names(pool):
            if self._get(group) is None:
                continue
            # Re-read just before acting: only instances still running in this group, so a
            # second tick never deletes (and lowers the target for) the same node twice.
            urls = [m.instance for m in self._managed(group)
                    if _last(m.instance) in wanted and lifecycle_state(m) == "InService"]  # fmt: skip
            if urls:
                self._delete(group, urls)
                done += [_last(u) for u in urls]
        return tuple(done)

    def group_of(self, instance_id: str) -> str | None:
        """Instances of a group are named `<group>-<suffix>`; the longest matching group wins
        (the on-demand group's name extends the Spot group's)."""
        names = sorted((n for p in self.env.pools for n in self._names(p)), key=len, reverse=True)
        return next((n for n in names if instance_id.startswith(f"{n}-")), None)

    def complete_lifecycle_action(self, pool: str, instance_id: str, hook: str, token: str | None) -> None:
        """GCE has no lifecycle hooks: nothing holds a node, so there is nothing to release."""
