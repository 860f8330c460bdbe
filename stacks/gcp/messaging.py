"""Per queue: a Pub/Sub topic and pull subscription with a dead-letter topic (and a
subscription on it, so dead-lettered items are kept and can be sent back).

Pub/Sub dead-letters a message after `max_delivery_attempts` deliveries: the queue's receive
count from `tidefleet.resources` (the same backstop as SQS's redrive: the agent dead-letters
real failures itself), clamped there into the 5..100 Pub/Sub accepts; likewise the ack deadline
and the retention.
"""

from __future__ import annotations

from cdktn_provider_google.pubsub_subscription import PubsubSubscription
from cdktn_provider_google.pubsub_subscription_iam_member import PubsubSubscriptionIamMember
from cdktn_provider_google.pubsub_topic import PubsubTopic
from cdktn_provider_google.pubsub_topic_iam_member import PubsubTopicIamMember
from constructs import Construct

from tidefleet.resources import QueueSpec


class WorkTopic(Construct):
    """Exposes `topic`, `subscription`, `dead_letter_topic`, `dead_letter_subscription`."""

    def __init__(self, scope: Construct, id: str, *, spec: QueueSpec,
                 pubsub_agent: str, kms_key_id: str, labels: dict[str, str]) -> None:  # fmt: skip
        """pubsub_agent: the project's Pub/Sub service agent, which moves messages to the dead-letter topic."""
        super().__init__(scope, id)
        name, dlq_name, retention = spec.name, spec.dead_letter_name, f"{spec.retention_s}s"
        self.topic = PubsubTopic(self, "topic", name=name, kms_key_name=kms_key_id, labels=labels,
                                 message_retention_duration=retention)  # fmt: skip
        self.dead_letter_topic = PubsubTopic(self, "dlq-topic", name=dlq_name, kms_key_name=kms_key_id, labels=labels,
                                             message_retention_duration=retention)  # fmt: skip
        never_expire = {"ttl": ""}  # an idle subscription must not vanish after 31 days
        self.subscription = PubsubSubscription(
            self, "subscription", name=name, topic=self.topic.id, labels=labels,
            ack_deadline_seconds=spec.visibility_timeout_s, message_retention_duration=retention,
            expiration_policy=never_expire,
            dead_letter_policy={"dead_letter_topic": self.dead_letter_topic.id,
                                "max_delivery_attempts": spec.max_receive_count},
            retry_policy={"minimum_backoff": "10s", "maximum_backoff": "60s"},
        )  # fmt: skip
        self.dead_letter_subscription = PubsubSubscription(
            self, "dlq-subscription", name=dlq_name, topic=self.dead_letter_topic.id, labels=labels,
            ack_deadline_seconds=60, message_retention_duration=retention, expiration_policy=never_expire,
        )  # fmt: skip
        # Dead-lettering is done by Pub/Sub's own agent: it must publish to the DLQ topic and
        # acknowledge on the source subscription.
        PubsubTopicIamMember(self, "dlq-publish", topic=self.dead_letter_topic.id, role="roles/pubsub.publisher",
                             member=pubsub_agent)  # fmt: skip
        PubsubSubscriptionIamMember(self, "dlq-forward", subscription=self.subscription.id,
                                    role="roles/pubsub.subscriber", member=pubsub_agent)  # fmt: skip

    def grant_submitter(self, id: str, member: str) -> None:
        """What a submit from a function needs (the scaler's: scheduled runs, released --after
        jobs): publish to the topic, read the subscription's ack deadline (`lease_s`)."""
        PubsubTopicIamMember(self, f"{id}-publish", topic=self.topic.id, role="roles/pubsub.publisher", member=member)
        PubsubSubscriptionIamMember(self, f"{id}-viewer", subscription=self.subscription.id, role="roles/pubsub.viewer",
                                    member=member)  # fmt: skip

    def grant_worker(self, id: str, member: str) -> None:
        """What a node's agent needs: pull/ack/extend on the subscription, read its ack
        deadline, publish retries to the topic and give-ups to the dead-letter topic."""
        for role in ("roles/pubsub.subscriber", "roles/pubsub.viewer"):
            PubsubSubscriptionIamMember(self, f"{id}-{role.split('.')[-1]}", subscription=self.subscription.id,
                                        role=role, member=member)  # fmt: skip
        for topic in (self.topic, self.dead_letter_topic):
            PubsubTopicIamMember(self, f"{id}-publish-{topic.node.id}", topic=topic.id, role="roles/pubsub.publisher",
                                 member=member)  # fmt: skip
