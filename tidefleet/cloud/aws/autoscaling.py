"""Auto Scaling on AWS: a pool is one group (mixed instances, spot-first); the control tick's
`FleetPort`, and the node side of it (scale-in protection, the drain lifecycle hook)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import boto3
from botocore.exceptions import ClientError

from tidefleet import naming
from tidefleet.fanout import each
from tidefleet.ports import GroupInstance, GroupState

if TYPE_CHECKING:  # settings are loaded (pydantic) by the runtime, not on import
    from tidefleet.config import Environment

# States from which TerminateInstanceInAutoScalingGroup takes an instance out cleanly.
TERMINABLE = frozenset({"InService"})
FILTER_VALUES_MAX = 200  # EC2 DescribeInstances: values per filter
GROUP_NAMES_MAX = 100  # DescribeAutoScalingGroups: names per call
INSTANCE_IDS_MAX = 50  # DescribeAutoScalingInstances: ids per call, and records per page (moto checks neither)
# Calls in flight at once where a tick makes one call per pool, queue or chunk (100 pools:
# 100 scaling-activity reads); boto3 clients are thread-safe. The tick's ports use it too.
CALLS_IN_FLIGHT = 16
FACTS_KEPT = 100_000  # instances whose launch facts a warm function remembers (~10 MB)


def _chunks(items: list[str], size: int) -> list[list[str]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def _is_spot_failure(activity: dict) -> bool:
    text = f"{activity.get('StatusMessage', '')} {activity.get('Description', '')}"
    return activity.get("StatusCode") == "Failed" and "spot" in text.lower()


def _already_leaving(err: ClientError) -> bool:
    message = err.response["Error"].get("Message", "")
    return err.response["Error"]["Code"] == "ValidationError" and (
        "No managed instance found" in message or "is not in InService or Standby" in message
    )


def _no_active_action(err: ClientError) -> bool:
    """AWS's answer to CompleteLifecycleAction once the action was completed (by the node's own
    agent, or for an earlier delivery of the same event) or its instance is gone."""
    return err.response["Error"]["Code"] == "ValidationError" and "No active Lifecycle Action found" in (
        err.response["Error"].get("Message", "")
    )


class AutoScalingFleet:
    def __init__(self, env: Environment, *, autoscaling=None, ec2=None):
        self.env = env
        self.asg = autoscaling or boto3.client("autoscaling", region_name=env.region)
        self.ec2 = ec2 or boto3.client("ec2", region_name=env.region)
        # Launch time and spot-ness never change for an instance: a warm function describes only
        # the instances it has not seen (at 10k nodes DescribeInstances is most of a tick).
        self._facts: dict[str, tuple[float | None, bool]] = {}

    def _group_name(self, pool: str) -> str:
        return naming.group(self.env.name, pool)

    def _describe_groups(self, names: list[str]) -> list[dict]:
        out: list[dict] = []
        pages = self.asg.get_paginator("describe_auto_scaling_groups")
        for chunk in _chunks(names, GROUP_NAMES_MAX):
            for page in pages.paginate(AutoScalingGroupNames=chunk):
                out += page["AutoScalingGroups"]
        return out

    def _ec2_facts(self, instance_ids: list[str]) -> dict[str, tuple[float | None, bool]]:
        """Launch time and spot-ness, which the group's own listing does not carry; remembered
        (one EC2 does not list yet is asked again next tick)."""
        pages = self.ec2.get_paginator("describe_instances")

        def chunk_facts(chunk: list[str]) -> dict[str, tuple[float | None, bool]]:
            # A filter, not InstanceIds: an instance that vanished since the group listing must
            # not fail the whole call.
            return {
                inst["InstanceId"]: (inst["LaunchTime"].timestamp(), inst.get("InstanceLifecycle") == "spot")
                for page in pages.paginate(Filters=[{"Name": "instance-id", "Values": chunk}])
                for reservation in page["Reservations"]
                for inst in reservation["Instances"]
            }

        facts = {i: self._facts[i] for i in instance_ids if i in self._facts}
        unseen = [i for i in instance_ids if i not in facts]
        for found in each(chunk_facts, _chunks(unseen, FILTER_VALUES_MAX), CALLS_IN_FLIGHT):
            facts |= found
        if len(self._facts) > FACTS_KEPT:  # instances come and go: forget the long gone now and then
            self._facts = {}
        self._facts |= facts
        return facts

    def _spot_failures(self, group: str, since: float) -> tuple[float, ...]:
        # Newest first; one page covers the failure window at a one-minute tick.
        activities = self.asg.describe_scaling_activities(AutoScalingGroupName=group, MaxRecords=50)[
            "Activities"
        ]
        return tuple(
            sorted(
                a["StartTime"].timestamp()
                for a in activities
                if _is_spot_failure(a) and a["StartTime"].timestamp() >= since
            )
        )

    def groups(self, pools: list[str], since: float) -> dict[str, GroupState]:
        by_name = {self._group_name(p): p for p in pools}
        raw = self._describe_groups(list(by_name))
        facts = self._ec2_facts([i["InstanceId"] for g in raw for i in g["Instances"]])
        failures = each(lambda g: self._spot_failures(g["AutoScalingGroupName"], since), raw, CALLS_IN_FLIGHT)
        out: dict[str, GroupState] = {}
        for g, spot_failures in zip(raw, failures, strict=True):
            distribution = (g.get("MixedInstancesPolicy") or {}).get("InstancesDistribution", {})
            instances = []
            for i in g["Instances"]:
                launched_at, spot = facts.get(i["InstanceId"], (None, False))
                weight = i.get("WeightedCapacity")
                instances.append(
                    GroupInstance(
                        id=i["InstanceId"],
                        instance_type=i["InstanceType"],
                        lifecycle_state=i["LifecycleState"],
                        spot=spot,
                        launched_at=launched_at,
                        protected=bool(i.get("ProtectedFromScaleIn")),
                        weight=int(weight) if weight else None,
                    )
                )
            out[by_name[g["AutoScalingGroupName"]]] = GroupState(
                name=g["AutoScalingGroupName"],
                desired=g["DesiredCapacity"],
                min=g["MinSize"],
                max=g["MaxSize"],
                on_demand_base=int(distribution.get("OnDemandBaseCapacity", 0)),
                instances=tuple(instances),
                spot_failures=spot_failures,
            )
        return out

    def set_desired(self, pool: str, desired: int) -> None:
        # HonorCooldown=False: the policy owns cooldowns; the group's would only delay scale-out.
        self.asg.set_desired_capacity(
            AutoScalingGroupName=self._group_name(pool), DesiredCapacity=desired, HonorCooldown=False
        )

    def terminate(self, pool: str, instance_ids: tuple[str, ...]) -> tuple[str, ...]:
        if not instance_ids:
            return ()
        group = self._group_name(pool)
        # Re-read just before acting: another tick (or the group) may have removed some since
        # we observed them, and a second terminate would decrement desired twice.
        current = [i for chunk in _chunks(list(instance_ids), INSTANCE_IDS_MAX)
                   for i in self.asg.describe_auto_scaling_instances(InstanceIds=chunk)["AutoScalingInstances"]]  # fmt: skip
        live = [
            i["InstanceId"]
            for i in current
            if i["AutoScalingGroupName"] == group and i["LifecycleState"] in TERMINABLE
        ]
        done = []
        for instance_id in live:
            try:
                self.asg.terminate_instance_in_auto_scaling_group(
                    InstanceId=instance_id, ShouldDecrementDesiredCapacity=True
                )
                done.append(instance_id)
            except ClientError as err:
                # Gone or already leaving since the re-read (another tick got there first):
                # AWS refuses without decrementing, and the goal is reached.
                if not _already_leaving(err):
                    raise
        return tuple(done)

    def set_on_demand_base(self, pool: str, units: int) -> None:
        group = self._group_name(pool)
        (g,) = self._describe_groups([group])
        policy = g["MixedInstancesPolicy"]
        # Send the described policy back with only the base changed. AWS also takes the
        # distribution alone, but moto does not; and the describe output names the template
        # by id and name, while an update must give exactly one of them.
        spec = dict(policy["LaunchTemplate"]["LaunchTemplateSpecification"])
        if "LaunchTemplateId" in spec:
            spec.pop("LaunchTemplateName", None)
        self.asg.update_auto_scaling_group(
            AutoScalingGroupName=group,
            MixedInstancesPolicy={
                **policy,
                "LaunchTemplate": {**policy["LaunchTemplate"], "LaunchTemplateSpecification": spec},
                "InstancesDistribution": {
                    **policy.get("InstancesDistribution", {}),
                    "OnDemandBaseCapacity": units,
                },
            },
        )

    def group_of(self, instance_id: str) -> str | None:
        found = self.asg.describe_auto_scaling_instances(InstanceIds=[instance_id])["AutoScalingInstances"]
        return found[0]["AutoScalingGroupName"] if found else None

    def complete_lifecycle_action(self, pool: str, instance_id: str, hook: str, token: str | None) -> bool:
        """True: released now; False: nothing held it any more (already completed, or gone), which
        is the goal too: an event delivered twice, or an agent that completed it first."""
        ident = {"LifecycleActionToken": token} if token else {"InstanceId": instance_id}
        try:
            self.asg.complete_lifecycle_action(
                AutoScalingGroupName=self._group_name(pool),
                LifecycleHookName=hook,
                LifecycleActionResult="CONTINUE",
                **ident,
            )
        except ClientError as err:
            if not _no_active_action(err):
                raise
            return False
        return True
