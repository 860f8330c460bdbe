"""The sandbox's view of EC2 on the emulator: which group instances are in service, their
user-data, and EC2's own reclaim. The sandbox's launcher turns these records into local node
processes (`tidefleet.sandbox.launcher`); on AWS, EC2 itself does that.
"""

from __future__ import annotations

import base64

import boto3

from tidefleet import naming
from tidefleet.config import Environment


class EmulatedMachines:
    def __init__(self, env: Environment):
        self.env = env
        self.ec2 = boto3.client("ec2", region_name=env.region)
        self.autoscaling = boto3.client("autoscaling", region_name=env.region)
        self.sqs = boto3.client("sqs", region_name=env.region)

    def in_service(self) -> dict[str, tuple[str, str]]:
        """instance id -> (pool, instance type) for every in-service instance of every pool."""
        names = {naming.group(self.env.name, pool): pool for pool in self.env.pools}
        groups = self.autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=list(names))
        return {
            i["InstanceId"]: (names[g["AutoScalingGroupName"]], i["InstanceType"])
            for g in groups["AutoScalingGroups"]
            for i in g["Instances"]
            if i["LifecycleState"] == "InService"
        }

    def is_spot(self, instance_id: str) -> bool:
        """The same answer the scaler reads. (The emulator launches group instances on demand.)"""
        found = self.ec2.describe_instances(Filters=[{"Name": "instance-id", "Values": [instance_id]}])
        return any(i.get("InstanceLifecycle") == "spot" for r in found["Reservations"] for i in r["Instances"])

    def user_data(self, instance_id: str) -> str:
        raw = self.ec2.describe_instance_attribute(InstanceId=instance_id, Attribute="userData")
        return base64.b64decode(raw["UserData"]["Value"]).decode()

    def reclaim(self, instance_id: str) -> None:
        """Terminated outside the group's own scale-in: the group launches a replacement."""
        self.ec2.terminate_instances(InstanceIds=[instance_id])

    def queue_depth(self, queue: str) -> tuple[int, int, int]:
        """(visible, in flight, dead-lettered) messages of a configured queue."""

        def depth(name: str, *attributes: str) -> list[int]:
            url = self.sqs.get_queue_url(QueueName=name)["QueueUrl"]
            found = self.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=list(attributes))["Attributes"]
            return [int(found[a]) for a in attributes]

        visible, in_flight = depth(naming.queue(self.env.name, queue), "ApproximateNumberOfMessages",
                                   "ApproximateNumberOfMessagesNotVisible")  # fmt: skip
        (dead,) = depth(naming.dead_letter_queue(self.env.name, queue), "ApproximateNumberOfMessages")
        return visible, in_flight, dead
