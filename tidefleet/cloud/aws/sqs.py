"""SQS on AWS: the work queues the agent and the SDK use (`SqsWorkQueues`), and the backlog
the control tick reads (`SqsQueues`).

Backlog is read from SQS queue attributes directly: CloudWatch's SQS metrics lag by minutes
and would delay every scale-out. boto3 honours AWS_ENDPOINT_URL, so the same code runs
against AWS and the moto server.
"""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

from tidefleet import naming
from tidefleet.cloud.aws.endpoint import READ_TIMEOUT_S, SQS_MAX_WAIT_S, NotAws
from tidefleet.ports import Backlog, Delivery

if TYPE_CHECKING:  # settings are loaded (pydantic) by the runtime, not on import
    from tidefleet.config import Environment

SQS_BATCH = 10
# A long poll is silent for up to its wait: its client reads for longer than any wait, where
# every other call gives up after READ_TIMEOUT_S (CLIENT_CONFIG, merged with this).
LONG_POLL = Config(read_timeout=SQS_MAX_WAIT_S + READ_TIMEOUT_S)
# ChangeMessageVisibility refuses to hide a message past 12 h after the receive that gave its handle.
MAX_HOLD_S = 12 * 3600


# What SQS answers about a queue that is not there (the query protocol's code, the JSON protocol's).
NO_QUEUE = {"AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist"}


class QueueMissing(LookupError):
    """A queue of the environment file that SQS does not have, named with the fix (AWS's own
    "The specified queue does not exist" does not say which)."""

    @classmethod
    def of(cls, env: Environment, queue: str, *, dead_letter: bool = False) -> QueueMissing:
        from tidefleet.config import env_argument  # settings load at run time, not on import

        name = naming.dead_letter_queue(env.name, queue) if dead_letter else naming.queue(env.name, queue)
        return cls(f"queues.{queue}: SQS {'dead-letter ' if dead_letter else ''}queue {name!r} does not exist in "
                   f"{env.region}; deploy the environment first (invoke deploy --env {env_argument(env)})")


class SendRefused(ClientError):
    """SendMessageBatch answered, but refused some of its entries (its `Failed` list): a
    ClientError with the first refusal's code and message, so that every caller treats it as it
    treats a refused call (the cloud's `errors`, `explain`), a transient one included
    (InternalError, ServiceUnavailable). The rest of the bodies may have been sent."""

    def __init__(self, failed: list[dict], of: int):
        first = failed[0]
        message = f"SQS refused {len(failed)} of {of} message(s): {first.get('Message') or first.get('Code', '?')}"
        super().__init__({"Error": {"Code": first.get("Code", "?"), "Message": message}}, "SendMessageBatch")


class SqsQueues:
    def __init__(self, env: Environment, *, client=None):
        self.env = env
        self.sqs = client or boto3.client("sqs", region_name=env.region)
        self._urls: dict[str, str] = {}  # a warm function keeps them between ticks

    def _url(self, queue: str) -> str:
        if queue not in self._urls:
            self._list_urls()
        if queue not in self._urls:
            raise QueueMissing.of(self.env, queue)
        return self._urls[queue]

    def _list_urls(self) -> None:
        """Every configured queue's URL from ListQueues by the environment's prefix: one call per
        1000 queues, where GetQueueUrl is one call per queue (a cold start at 1k queues)."""
        by_name = {naming.queue(self.env.name, q): q for q in self.env.queues}
        pages = self.sqs.get_paginator("list_queues")
        for page in pages.paginate(QueueNamePrefix=naming.queue(self.env.name, ""), PaginationConfig={"PageSize": 1000}):
            for url in page.get("QueueUrls", []):
                name = url.rsplit("/", 1)[-1]
                if name in by_name:
                    self._urls[by_name[name]] = url

    def backlog(self, queue: str) -> Backlog:
        attrs = self.sqs.get_queue_attributes(
            QueueUrl=self._url(queue),
            AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
        )["Attributes"]
        return Backlog(
            visible=int(attrs["ApproximateNumberOfMessages"]),
            in_flight=int(attrs["ApproximateNumberOfMessagesNotVisible"]),
        )


class SqsWorkQueues:
    max_hold_s: int | None = MAX_HOLD_S

    def __init__(self, env: Environment, *, client=None):
        self.env = env
        self.sqs = client or boto3.client("sqs", region_name=env.region)
        self._given = client is not None
        self._urls: dict[str, str] = {}

    @cached_property
    def _poll(self):
        """The client of long polls (`LONG_POLL`): built by the first receive that waits."""
        return self.sqs if self._given else boto3.client("sqs", region_name=self.env.region, config=LONG_POLL)

    def url(self, queue: str, *, dead_letter: bool = False) -> str:
        name = naming.dead_letter_queue(self.env.name, queue) if dead_letter else naming.queue(self.env.name, queue)
        if name not in self._urls:
            try:
                url = self.sqs.get_queue_url(QueueName=name).get("QueueUrl")
            except ClientError as err:
                if err.response["Error"]["Code"] in NO_QUEUE:
                    raise QueueMissing.of(self.env, queue, dead_letter=dead_letter) from None
                raise
            if not url:  # a well-formed answer without it: not SQS
                raise NotAws(endpoint=self.sqs.meta.endpoint_url, status=200)
            self._urls[name] = url
        return self._urls[name]

    def lease_s(self, queue: str) -> int:
        attrs = self.sqs.get_queue_attributes(QueueUrl=self.url(queue), AttributeNames=["VisibilityTimeout"])
        return int(attrs["Attributes"]["VisibilityTimeout"])

    def counts(self, queue: str, *, dead_letter: bool = False) -> Backlog:
        """The queue's messages now: visible, and hidden (received and not yet deleted: held).
        Approximate, as SQS says, but not sampled as a short poll is."""
        attrs = self.sqs.get_queue_attributes(
            QueueUrl=self.url(queue, dead_letter=dead_letter),
            AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
        )["Attributes"]
        return Backlog(visible=int(attrs["ApproximateNumberOfMessages"]),
                       in_flight=int(attrs["ApproximateNumberOfMessagesNotVisible"]))  # fmt: skip

    def receive(self, queue, max_messages, wait_s, *, dead_letter=False, hold_s=None) -> list[Delivery]:
        kwargs = {"VisibilityTimeout": hold_s} if hold_s is not None else {}
        messages = (self._poll if wait_s else self.sqs).receive_message(
            QueueUrl=self.url(queue, dead_letter=dead_letter), MaxNumberOfMessages=max_messages, WaitTimeSeconds=wait_s,
            MessageSystemAttributeNames=["ApproximateReceiveCount"], **kwargs,
        ).get("Messages", [])  # fmt: skip
        return [Delivery(m["ReceiptHandle"], m["Body"], int(m.get("Attributes", {}).get("ApproximateReceiveCount", "1")),
                         m.get("MessageId", "")) for m in messages]  # fmt: skip

    def _batches(self, method, queue: str, dead_letter: bool, entries: list[dict]) -> list[dict]:
        """One batch call per ten entries (ids are positions); returns every failed entry."""
        failed = []
        for start in range(0, len(entries), SQS_BATCH):
            batch = [{"Id": str(start + i), **e} for i, e in enumerate(entries[start : start + SQS_BATCH])]
            failed += method(QueueUrl=self.url(queue, dead_letter=dead_letter), Entries=batch).get("Failed", [])
        return failed

    def extend(self, queue, handles, seconds) -> dict[str, str]:
        entries = [{"ReceiptHandle": h, "VisibilityTimeout": seconds} for h in handles]
        failed = self._batches(self.sqs.change_message_visibility_batch, queue, False, entries)
        return {handles[int(f["Id"])]: f.get("Message", f.get("Code", "?")) for f in failed}

    def delete(self, queue, handles, *, dead_letter=False) -> list[str]:
        failed = self._batches(self.sqs.delete_message_batch, queue, dead_letter, [{"ReceiptHandle": h} for h in handles])
        return [f.get("Message", f.get("Code", "?")) for f in failed]

    def send(self, queue, bodies, *, dead_letter=False) -> list[str]:
        ids: dict[str, str] = {}  # entry id (a position) -> message id

        def send_batch(**request):
            answer = self.sqs.send_message_batch(**request)
            ids.update((s["Id"], s["MessageId"]) for s in answer.get("Successful", []))
            return answer

        failed = self._batches(send_batch, queue, dead_letter, [{"MessageBody": b} for b in bodies])
        if failed:
            raise SendRefused(failed, len(bodies))
        return [ids[str(n)] for n in range(len(bodies))]

    def release(self, queue, handles, *, dead_letter=False) -> None:
        entries = [{"ReceiptHandle": h, "VisibilityTimeout": 0} for h in handles]
        self._batches(self.sqs.change_message_visibility_batch, queue, dead_letter, entries)


