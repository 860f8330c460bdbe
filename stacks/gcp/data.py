"""The team's data on GCP: bucket grants per pool, the shared Filestore, and the traffic a
training pool's nodes send each other. Nodes reach Cloud Storage through Private Google
Access on the stack's subnet, never through Cloud NAT."""

from __future__ import annotations

from cdktn import Fn
from cdktn_provider_google.compute_firewall import ComputeFirewall, ComputeFirewallAllow
from cdktn_provider_google.filestore_instance import FilestoreInstance
from cdktn_provider_google.storage_bucket_iam_member import StorageBucketIamMember
from constructs import Construct

from tidefleet import naming
from tidefleet.config import PoolData, SharedFs

SHARE = "shared"  # the one file share's name: nodes mount <address>:/shared


def grant_data(scope: Construct, id: str, *, member: str, data: PoolData, condition) -> None:
    """objectViewer (read) or objectUser (read-write) on each configured bucket, held to its
    prefixes by `condition(bucket, prefixes, title)`; a whole bucket ("gs://b/") unconditioned."""
    grouped: dict[tuple[str, bool], list[str]] = {}
    for bucket, prefix, writable in data.locations():
        grouped.setdefault((bucket, writable), []).append(prefix)
    for i, ((bucket, writable), prefixes) in enumerate(sorted(grouped.items())):
        kind = "read-write" if writable else "read only"
        StorageBucketIamMember(
            scope, f"{id}-data-{i}", bucket=bucket, member=member,
            role="roles/storage.objectUser" if writable else "roles/storage.objectViewer",
            condition=None if "" in prefixes else condition(bucket, prefixes, f"team data, {kind}"),
        )  # fmt: skip


def shared_filestore(scope: Construct, id: str, *, env_name: str, region: str, network_name: str, fs: SharedFs,
                     kms_key_id: str, labels: dict[str, str]) -> str:  # fmt: skip
    """A regional Filestore instance on the stack's network; returns what a node mounts."""
    instance = FilestoreInstance(
        scope, id, name=naming.stack_resource(env_name, "shared"), location=region, tier="REGIONAL",
        file_shares={"name": SHARE, "capacity_gb": fs.size_gb},
        networks=[{"network": network_name, "modes": ["MODE_IPV4"]}], kms_key_name=kms_key_id, labels=labels,
    )  # fmt: skip
    return f"{Fn.element(instance.networks.get(0).ip_addresses, 0)}:/{SHARE}"


def gang_firewall(scope: Construct, id: str, *, env_name: str, pool_name: str, network_id: str, service_account: str) -> None:
    """All traffic among one training pool's nodes (NCCL, the rendezvous), nothing else."""
    ComputeFirewall(
        scope, id, name=naming.stack_resource(env_name, f"{pool_name}-gang"), network=network_id, direction="INGRESS",
        priority=1000, allow=[ComputeFirewallAllow(protocol="all")],
        source_service_accounts=[service_account], target_service_accounts=[service_account],
        log_config={"metadata": "INCLUDE_ALL_METADATA"},
    )  # fmt: skip
