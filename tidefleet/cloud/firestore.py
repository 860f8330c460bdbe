"""Node heartbeats in Firestore: the GCP counterpart of `tidefleet.store.Store`'s node part.

Documents `pools/<pool>/nodes/<node_id>` in the environment's database (naming.table), with
the `Heartbeat` fields. Same rules as on DynamoDB: `draining` is sticky (a heartbeat never
writes it as False, so a mark set by anyone survives), and a draining mark written before a
node's first heartbeat is not a heartbeat. Uses the GAPIC client over REST (the high-level
client is gRPC only), so the tests drive the real client through a faked HTTP transport.
"""

from __future__ import annotations

from dataclasses import asdict

from google.api_core import exceptions as gexc
from google.cloud.firestore_v1.services.firestore import FirestoreClient
from google.cloud.firestore_v1.types import Document, DocumentMask, Value

from tidefleet import naming
from tidefleet.config import Environment
from tidefleet.store import Heartbeat

PAGE = 300


def to_value(value) -> Value:
    if isinstance(value, bool):
        return Value(boolean_value=value)
    if isinstance(value, int):
        return Value(integer_value=value)
    if isinstance(value, float):
        return Value(double_value=value)
    return Value(string_value=str(value))


def from_value(value: Value):
    kind = Value.pb(value).WhichOneof("value_type")
    return None if kind in (None, "null_value") else getattr(value, kind)


class FirestoreNodes:
    """NodeStatePort (heartbeats, mark_draining) plus what the agent writes."""

    def __init__(self, env: Environment, *, client: FirestoreClient | None = None, credentials=None):
        self.client = client or FirestoreClient(transport="rest", credentials=credentials)
        self.root = f"projects/{env.project}/databases/{naming.table(env.name)}/documents"

    def _doc(self, pool: str, node_id: str) -> str:
        return f"{self.root}/pools/{pool}/nodes/{node_id}"

    def put_heartbeat(self, hb: Heartbeat) -> None:
        fields = {k: v for k, v in asdict(hb).items() if k not in ("node_id", "pool") and v is not None}
        mask = [k for k in Heartbeat.__dataclass_fields__ if k not in ("node_id", "pool")]
        if not hb.draining:  # sticky: never written as False
            fields.pop("draining")
            mask.remove("draining")
        # idle_since in the mask but not in the fields: Firestore deletes it (busy again).
        self.client.update_document(
            document=Document(name=self._doc(hb.pool, hb.node_id), fields={k: to_value(v) for k, v in fields.items()}),
            update_mask=DocumentMask(field_paths=mask),
        )

    def _heartbeat(self, pool: str, doc: Document) -> Heartbeat | None:
        values = {k: from_value(v) for k, v in doc.fields.items() if k in Heartbeat.__dataclass_fields__}
        if "at" not in values:  # only a draining mark so far
            return None
        values.setdefault("idle_since", None)
        return Heartbeat(node_id=doc.name.rsplit("/", 1)[-1], pool=pool, **values)

    def heartbeats(self, pool: str) -> dict[str, Heartbeat]:
        pages = self.client.list_documents(
            request={"parent": f"{self.root}/pools/{pool}", "collection_id": "nodes", "page_size": PAGE}
        )
        beats = (self._heartbeat(pool, doc) for doc in pages)
        return {hb.node_id: hb for hb in beats if hb is not None}

    def heartbeat(self, pool: str, node_id: str) -> Heartbeat | None:
        try:
            return self._heartbeat(pool, self.client.get_document(request={"name": self._doc(pool, node_id)}))
        except gexc.NotFound:
            return None

    def mark_draining(self, pool: str, node_id: str) -> None:
        """Idempotent: the node takes no new items; the scaler stops counting it as capacity."""
        self.client.update_document(
            document=Document(name=self._doc(pool, node_id), fields={"draining": to_value(True)}),
            update_mask=DocumentMask(field_paths=["draining"]),
        )

    def forget_node(self, pool: str, node_id: str) -> None:
        self.client.delete_document(request={"name": self._doc(pool, node_id)})
