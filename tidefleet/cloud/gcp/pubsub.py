"""The work queues on GCP: Pub/Sub (google-cloud-pubsub's GAPIC clients over REST).

Each configured queue is a topic and a pull subscription of the same name (naming.queue), and
its dead letters a topic and subscription named naming.dead_letter_queue (stacks/gcp/messaging).

Hand-back on Pub/Sub, decided: PUBLISH A NEW MESSAGE AND ACK THE OLD ONE, exactly as on SQS,
not a nack. A nack (ack deadline 0) raises the message's delivery attempt, and the
subscription's dead-letter policy moves a message to the dead-letter topic after
`max_delivery_attempts` (5 for a queue with the default retries): an item handed back on five
Spot preemptions would be dead-lettered by Pub/Sub itself, which the product forbids. A fresh
message starts at delivery attempt 1 and is pullable at once, so another node still gets the
item immediately; and the agent's rule stays one rule on both clouds: a message delivered more
than once was held by a node that vanished, which counts as a failed attempt. `release` (the
nack) is used only where that is wanted: other jobs' messages put back on the dead-letter
subscription by retry-failed (that subscription has no dead-letter policy).
"""

from __future__ import annotations

import requests
from google.api_core import exceptions as gexc
from google.pubsub_v1.services.publisher import PublisherClient
from google.pubsub_v1.services.subscriber import SubscriberClient
from google.pubsub_v1.types import PubsubMessage

from tidefleet import naming
from tidefleet.cloud.gcp.calls import RETRY, RETRY_REFUSED, TRY_S
from tidefleet.config import Environment
from tidefleet.ports import Delivery
from tidefleet.resources import PUBSUB_ACK_DEADLINE_S

PUBLISH_BATCH = 100  # messages per publish call (Pub/Sub takes up to 1000 and 10 MB)
SHORT_PULL_S = 1  # a "no wait" receive: how long an empty subscription may hold the pull


class PublishRefused(gexc.GoogleAPICallError):
    """A publish that answered fewer message ids than it was given messages: a Google API call
    error, so that every caller treats it as any refused call (the cloud's `errors`, `explain`)."""

    def __str__(self) -> str:
        return self.message  # no HTTP status: the call itself answered 200


def publish(env: Environment, topic: str, bodies: list[bytes], *, client: PublisherClient | None = None) -> list[str]:
    """Publish each body to the topic (a cloud resource name), in batches; their message ids, in
    order. Raises on refusal."""
    client = client or PublisherClient(transport="rest")
    path = client.topic_path(env.project, topic)
    out: list[str] = []
    for start in range(0, len(bodies), PUBLISH_BATCH):
        batch = bodies[start : start + PUBLISH_BATCH]
        ids = client.publish(topic=path, messages=[PubsubMessage(data=b) for b in batch], retry=RETRY,
                             timeout=TRY_S).message_ids
        if len(ids) != len(batch):
            raise PublishRefused(f"Pub/Sub accepted {len(ids)} of {len(batch)} message(s) on {topic}")
        out += ids
    return out


class PubSubWorkQueues:
    # No limit from the receive (an ack deadline can be extended again and again), but Pub/Sub
    # drops a message `resources.PUBSUB_RETENTION_S` (7 days) after its publish, leased or not: an
    # item that waited, then runs long, would outlive its message (ack and extend then reach
    # nothing, and if its node dies nothing brings the item back). So the agent replaces a message
    # it has held for half of this, 1 day (`Agent._refresh`): a held message is at most its wait
    # + ~1 day old, a fresh copy at most ~1 day. Left: an item received after waiting over ~6 days
    # can lose its message before its first refresh (max_wait_s, below 7 days, alarms first).
    # Not shorter: each refresh costs a publish, a record write, an ack and a pull, and a copy the
    # holder does not pull back waits visible until another node hands it over.
    max_hold_s: int | None = 2 * 24 * 3600

    def __init__(self, env: Environment, *, subscriber: SubscriberClient | None = None,
                 publisher: PublisherClient | None = None):  # fmt: skip
        self.env = env
        self.subscriber = subscriber or SubscriberClient(transport="rest")
        self.publisher = publisher or PublisherClient(transport="rest")
        self._leases: dict[str, int] = {}

    def _name(self, queue: str, dead_letter: bool) -> str:
        return naming.dead_letter_queue(self.env.name, queue) if dead_letter else naming.queue(self.env.name, queue)

    def _subscription(self, queue: str, dead_letter: bool = False) -> str:
        return self.subscriber.subscription_path(self.env.project, self._name(queue, dead_letter))

    def lease_s(self, queue: str) -> int:
        if queue not in self._leases:
            found = self.subscriber.get_subscription(subscription=self._subscription(queue), retry=RETRY, timeout=TRY_S)
            self._leases[queue] = found.ack_deadline_seconds
        return self._leases[queue]

    def receive(self, queue, max_messages, wait_s, *, dead_letter=False, hold_s=None) -> list[Delivery]:
        subscription = self._subscription(queue, dead_letter)
        try:
            # Pull has no wait parameter: the server holds it until messages are there or its own
            # wait ends, so the client's timeout is the wait (return_immediately is deprecated).
            got = self.subscriber.pull(subscription=subscription, max_messages=max_messages,
                                       timeout=max(wait_s, SHORT_PULL_S), retry=RETRY_REFUSED)  # fmt: skip
        except (gexc.DeadlineExceeded, requests.exceptions.Timeout):  # the REST transport's timeout
            return []
        received = list(got.received_messages)
        if received and hold_s is not None:
            self.extend_on(subscription, [r.ack_id for r in received], hold_s)
        # delivery_attempt is 0 on a subscription without a dead-letter policy: a first delivery.
        return [Delivery(r.ack_id, r.message.data.decode(errors="replace"), max(1, r.delivery_attempt),
                         r.message.message_id) for r in received]

    def extend_on(self, subscription: str, ack_ids: list[str], seconds: int) -> None:
        """Pub/Sub refuses a deadline past 600 s (an agent's hide or hand-over with a slow heartbeat
        asks for more): held the most it allows, and held again at the next heartbeat."""
        seconds = min(int(seconds), PUBSUB_ACK_DEADLINE_S[1])
        self.subscriber.modify_ack_deadline(subscription=subscription, ack_ids=ack_ids, ack_deadline_seconds=seconds,
                                            retry=RETRY, timeout=TRY_S)  # fmt: skip

    def extend(self, queue, handles, seconds) -> dict[str, str]:
        # All or nothing: an error raises (the agent logs it and tries again next heartbeat).
        self.extend_on(self._subscription(queue), handles, seconds)
        return {}

    def delete(self, queue, handles, *, dead_letter=False) -> list[str]:
        try:
            self.subscriber.acknowledge(subscription=self._subscription(queue, dead_letter), ack_ids=handles,
                                        retry=RETRY, timeout=TRY_S)  # fmt: skip
        except gexc.GoogleAPICallError as err:  # as SQS: report, the message just comes back
            return [str(err)] * len(handles)
        return []

    def send(self, queue, bodies, *, dead_letter=False) -> list[str]:
        return publish(self.env, self._name(queue, dead_letter), [b.encode() for b in bodies], client=self.publisher)

    def counts(self, queue, *, dead_letter=False) -> None:
        """None: a subscription's counts are Cloud Monitoring's, minutes late (`WorkQueues.counts`)."""

    def release(self, queue, handles, *, dead_letter=False) -> None:
        self.extend_on(self._subscription(queue, dead_letter), handles, 0)
