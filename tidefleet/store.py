"""The job store: one DynamoDB table per environment holding jobs, items and node heartbeats.

Keys (pk, sk), all strings:
  JOB#<job_id>   JOB              the job: name, queue, created_at, total, cancelled
  JOB#<job_id>   ITEM#<item_id>   an item: status, attempts, interruptions, exit_code, reason, ...
  POOL#<pool>    NODE#<node_id>   a node's heartbeat: see `Heartbeat`

Node heartbeats are written by the agent and read by the scaler; `draining` is also set by
the interruption function. Numbers go through Decimal because DynamoDB wants it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from decimal import Decimal

import boto3

from tidefleet import naming


@dataclass(frozen=True)
class Heartbeat:
    node_id: str
    pool: str
    at: float  # when the agent wrote it
    slots: int
    busy_slots: int
    idle_since: float | None  # None while busy
    draining: bool = False
    instance_type: str = ""
    spot: bool = True
    gpus: int = 0


def _to_dynamo(value):
    if isinstance(value, float):
        return Decimal(repr(value))
    return value


def _from_dynamo(value):
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    return value


class Store:
    def __init__(self, env_name: str, region: str | None = None, *, table=None):
        self.env_name = env_name
        self.table = table or boto3.resource("dynamodb", region_name=region).Table(naming.table(env_name))

    # -- node heartbeats --------------------------------------------------------------
    def put_heartbeat(self, hb: Heartbeat) -> None:
        item = {k: _to_dynamo(v) for k, v in asdict(hb).items() if v is not None}
        # draining is sticky: once the interruption function (or the agent) set it, a later
        # heartbeat must not clear it, so it is only ever written as True.
        if not hb.draining:
            item.pop("draining")
        update = ", ".join(f"#{k} = :{k}" for k in item if k not in ("node_id", "pool"))
        remove = "" if hb.idle_since is not None else " REMOVE #idle_since"
        names = {f"#{k}": k for k in item if k not in ("node_id", "pool")}
        if remove:
            names["#idle_since"] = "idle_since"
        self.table.update_item(
            Key={"pk": f"POOL#{hb.pool}", "sk": f"NODE#{hb.node_id}"},
            UpdateExpression=f"SET {update}{remove}",
            ExpressionAttributeNames=names,
            ExpressionAttributeValues={f":{k}": v for k, v in item.items() if k not in ("node_id", "pool")},
        )

    def heartbeats(self, pool: str) -> dict[str, Heartbeat]:
        """Every heartbeat of a pool, by node id (paginated query)."""
        out: dict[str, Heartbeat] = {}
        kwargs = {
            "KeyConditionExpression": "pk = :pk AND begins_with(sk, :node)",
            "ExpressionAttributeValues": {":pk": f"POOL#{pool}", ":node": "NODE#"},
        }
        while True:
            page = self.table.query(**kwargs)
            for raw in page["Items"]:
                if "at" not in raw:
                    # Only a draining mark (the interruption function got there before the
                    # agent's first heartbeat): not a heartbeat yet. The mark is sticky, so
                    # the first heartbeat comes back with draining set.
                    continue
                node_id = raw["sk"].removeprefix("NODE#")
                fields = {k: _from_dynamo(v) for k, v in raw.items() if k in Heartbeat.__dataclass_fields__}
                fields.setdefault("idle_since", None)
                out[node_id] = Heartbeat(node_id=node_id, pool=pool, **fields)
            if "LastEvaluatedKey" not in page:
                return out
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]

    def mark_draining(self, pool: str, node_id: str) -> None:
        """Idempotent: the node takes no new items; the scaler stops counting it as capacity."""
        self.table.update_item(
            Key={"pk": f"POOL#{pool}", "sk": f"NODE#{node_id}"},
            UpdateExpression="SET draining = :t",
            ExpressionAttributeValues={":t": True},
        )

    def forget_node(self, pool: str, node_id: str) -> None:
        self.table.delete_item(Key={"pk": f"POOL#{pool}", "sk": f"NODE#{node_id}"})


def create_table(env_name: str, region: str | None = None) -> None:
    """The table as the stack declares it (pk/sk strings, on-demand). For the sandbox and tests."""
    client = boto3.client("dynamodb", region_name=region)
    client.create_table(
        TableName=naming.table(env_name),
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}, {"AttributeName": "sk", "AttributeType": "S"}],
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
        BillingMode="PAY_PER_REQUEST",
    )
    client.get_waiter("table_exists").wait(TableName=naming.table(env_name))
