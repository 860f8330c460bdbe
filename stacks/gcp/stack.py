"""One environment's GCP stack: state, KMS key, network, queues, job store, artifacts bucket,
item logs, node pools, the scaler function, scheduled jobs, alert policies and the dashboard."""

from __future__ import annotations

import re
from collections.abc import Callable

from cdktn import GcsBackend, LocalBackend, TerraformStack
from cdktn_provider_google.compute_firewall import ComputeFirewall, ComputeFirewallDeny
from cdktn_provider_google.compute_network import ComputeNetwork
from cdktn_provider_google.compute_router import ComputeRouter
from cdktn_provider_google.compute_router_nat import ComputeRouterNat
from cdktn_provider_google.compute_subnetwork import ComputeSubnetwork
from cdktn_provider_google.data_google_project import DataGoogleProject
from cdktn_provider_google.data_google_storage_project_service_account import (
    DataGoogleStorageProjectServiceAccount,
)
from cdktn_provider_google.firestore_database import FirestoreDatabase
from cdktn_provider_google.kms_crypto_key import KmsCryptoKey
from cdktn_provider_google.kms_crypto_key_iam_member import KmsCryptoKeyIamMember
from cdktn_provider_google.kms_key_ring import KmsKeyRing
from cdktn_provider_google.logging_metric import LoggingMetric, LoggingMetricMetricDescriptorLabels
from cdktn_provider_google.logging_project_bucket_config import LoggingProjectBucketConfig
from cdktn_provider_google.logging_project_sink import LoggingProjectSink
from cdktn_provider_google.project_iam_member import ProjectIamMember
from cdktn_provider_google.provider import GoogleProvider
from cdktn_provider_google.storage_bucket import StorageBucket, StorageBucketLifecycleRule
from cdktn_provider_google.storage_bucket_iam_member import StorageBucketIamMember
from constructs import Construct

from stacks.gcp.alarms import Alerts
from stacks.gcp.control import ScalerFunction, database_condition
from stacks.gcp.data import gang_firewall, grant_data, shared_filestore
from stacks.gcp.messaging import WorkTopic
from stacks.gcp.pool import NodePool
from stacks.gcp.schedules import ScheduledJobs
from stacks.terraform import require_terraform
from tidefleet import naming
from tidefleet.config import Environment
from tidefleet.resources import EnvResources, resources
from tidefleet.userdata import SHARED_FS_PLACEHOLDER

KEY_ROTATION = "7776000s"  # 90 days


def labels(env: Environment) -> dict[str, str]:
    """Tags as GCP labels: lowercase keys and values of [a-z0-9_-]."""
    clean = lambda text: re.sub(r"[^a-z0-9_-]", "-", text.lower())[:63]
    return {clean(k): clean(v) for k, v in {**env.tags, "tidefleet-env": env.name}.items()}


def prefix_condition(bucket: str, prefixes: list[str], title: str) -> dict:
    """An IAM condition holding a bucket role to objects under `prefixes`, and to listings of
    those prefixes (a listing is authorized on the bucket, with the asked prefix as attribute)."""
    objects = [f'resource.name.startsWith("projects/_/buckets/{bucket}/objects/{p}")' for p in prefixes]
    listings = [f'api.getAttribute("storage.googleapis.com/objectListPrefix", "").startsWith("{p}")' for p in prefixes]
    return {"title": title[:100], "description": f"objects under {', '.join(prefixes)}",
            "expression": " || ".join(objects + listings)}  # fmt: skip


def terraform_literal(text: str) -> str:
    """`text` as a Terraform JSON string that Terraform will not interpolate."""
    return text.replace("${", "$${").replace("%{", "%%{")


class GcpFleetStack(TerraformStack):
    def __init__(self, scope: Construct, id: str, *, env: Environment, archive_path: str, local_state_path: str,
                 user_data: Callable[[str, str], str]) -> None:  # fmt: skip
        """archive_path: the scaler's zip (build/gcp-scaler-<env>.zip, stacks/package.py archive_name),
        relative to the synthesized stack directory.
        user_data(pool_name, artifacts_bucket): the pool's startup script."""
        super().__init__(scope, id)
        require_terraform(self)
        project, region = env.project, env.region
        tags = labels(env)
        spec = resources(env, account=project)
        GoogleProvider(self, "google", project=project, region=region, default_labels=tags)
        self._backend(env, local_state_path)
        number = DataGoogleProject(self, "project", project_id=project).number
        agent = lambda service: f"serviceAccount:service-{number}@{service}.iam.gserviceaccount.com"

        ring = KmsKeyRing(self, "keyring", name=naming.stack_resource(env.name, "keys"), location=region)
        self.key = KmsCryptoKey(self, "key", name=naming.stack_resource(env.name, "data"), key_ring=ring.id,
                                rotation_period=KEY_ROTATION, labels=tags)  # fmt: skip
        # The Google services that encrypt with it on our behalf. Each checks its agent may use the key
        # when a resource is created: a resource takes the key id from its service's grant (the same
        # id), so Terraform creates the grant first. Cloud Storage makes its agent on first asking
        # (the data source asks); Filestore's is granted only where a file system is made.
        storage_agent = DataGoogleStorageProjectServiceAccount(self, "storage-agent", project=project)
        services = {"pubsub": agent("gcp-sa-pubsub"), "compute": agent("compute-system"),
                    "storage": f"serviceAccount:{storage_agent.email_address}",
                    **({"filestore": agent("cloud-filer")} if env.shared_fs else {})}  # fmt: skip
        key_for = {
            service: KmsCryptoKeyIamMember(self, f"key-user-{service}", crypto_key_id=self.key.id,
                                           role="roles/cloudkms.cryptoKeyEncrypterDecrypter", member=member).crypto_key_id
            for service, member in services.items()
        }  # fmt: skip

        self.queues = {
            name: WorkTopic(self, f"queue-{name}", spec=queue, pubsub_agent=agent("gcp-sa-pubsub"),
                            kms_key_id=key_for["pubsub"], labels=tags)
            for name, queue in sorted(spec.queues.items())
        }  # fmt: skip
        self.database = FirestoreDatabase(
            self, "jobs", name=naming.table(env.name), location_id=region, type="FIRESTORE_NATIVE",
            point_in_time_recovery_enablement="POINT_IN_TIME_RECOVERY_ENABLED",
            delete_protection_state="DELETE_PROTECTION_ENABLED",
        )  # fmt: skip
        bucket_name = spec.artifacts.name
        self.artifacts = StorageBucket(
            self, "artifacts", name=bucket_name, location=region.upper(), labels=tags,
            uniform_bucket_level_access=True, public_access_prevention="enforced",
            versioning={"enabled": True}, encryption={"default_kms_key_name": key_for["storage"]},
            lifecycle_rule=[StorageBucketLifecycleRule(action={"type": "Delete"},
                                                       condition={"days_since_noncurrent_time": spec.artifacts.noncurrent_version_expiration_days})],
        )  # fmt: skip
        self._item_logs(env, spec)
        subnetwork = self._network(env)
        mount_source = env.shared_fs and shared_filestore(
            self, "shared-fs", env_name=env.name, region=region, network_name=self.network_name, fs=env.shared_fs,
            kms_key_id=key_for["filestore"], labels=tags,
        )  # fmt: skip

        self.pools = {}
        for pool_name in sorted(env.pools):
            script = terraform_literal(user_data(pool_name, bucket_name))
            pool = NodePool(self, f"pool-{pool_name}", env=env, pool_name=pool_name, spec=spec.pools[pool_name],
                            subnetwork=subnetwork,
                            startup_script=script.replace(SHARED_FS_PLACEHOLDER, mount_source) if mount_source else script,
                            labels=tags, kms_key_id=key_for["compute"])  # fmt: skip
            self._grant_node(env, pool_name, pool.member)
            if env.pools[pool_name].placement == "cluster":
                gang_firewall(self, f"gang-{pool_name}", env_name=env.name, pool_name=pool_name, network_id=self.network_id,
                              service_account=pool.service_account.email)  # fmt: skip
            self.pools[pool_name] = pool

        self.scaler = ScalerFunction(
            self, "control", env=env, archive_path=archive_path, bucket=self.artifacts.name,
            source_condition=prefix_condition(bucket_name, ["functions/"], "the scaler's source, read only"),
            pubsub_agent=agent("gcp-sa-pubsub"), kms_key_id=key_for["pubsub"], labels=tags,
        )  # fmt: skip
        # Its function also fires [schedules] and releases --after jobs: it submits to every queue.
        for queue_name in sorted(self.queues):
            self.queues[queue_name].grant_submitter("scaler", self.scaler.service_account.member)
        self.schedules = ScheduledJobs(self, "schedules", env=env, topic_id=self.scaler.kick_topic.id,
                                       after=[self.scaler.function])  # fmt: skip
        self.alerts = Alerts(self, "alerts", env=env, labels=tags)

    def _grant_node(self, env: Environment, pool_name: str, member: str) -> None:
        """A node's agent: its own queues, the job store, item logs, the artifacts bucket."""
        id = f"node-{pool_name}"
        for queue_name in sorted(env.queues_of(pool_name)):
            self.queues[queue_name].grant_worker(id, member)
        ProjectIamMember(self, f"{id}-jobs", project=env.project, role="roles/datastore.user", member=member,
                         condition=database_condition(env.project, naming.table(env.name)))  # fmt: skip
        # Log writing has no finer scope than the project; it can only append.
        ProjectIamMember(self, f"{id}-logs", project=env.project, role="roles/logging.logWriter", member=member)
        # The agent's wheels, which boot installs as root: read only. Checkpoints of its own
        # queues' items: read and write. Nothing else in the bucket (the scaler's source is there).
        bucket, name = self.artifacts.name, naming.artifacts_bucket(env.name, env.project)
        StorageBucketIamMember(self, f"{id}-agent", bucket=bucket, role="roles/storage.objectViewer", member=member,
                               condition=prefix_condition(name, ["agent/"], "the agent, read only"))  # fmt: skip
        prefixes = [naming.checkpoint_prefix(q) for q in sorted(env.queues_of(pool_name))]
        StorageBucketIamMember(self, f"{id}-checkpoints", bucket=bucket, role="roles/storage.objectUser", member=member,
                               condition=prefix_condition(name, prefixes, "its own queues' checkpoints"))  # fmt: skip
        grant_data(self, id, member=member, data=env.pools[pool_name].data, condition=prefix_condition)

    def _network(self, env: Environment) -> str:
        """The subnet nodes use: the configured one, or a private subnet with Cloud NAT."""
        self.network_id = self.network_name = None  # a configured subnet's network is not ours to change
        if env.network.subnet_ids:
            return env.network.subnet_ids[0]
        name = naming.stack_resource(env.name, "nodes")
        network = ComputeNetwork(self, "network", name=name, auto_create_subnetworks=False)
        self.network_id, self.network_name = network.id, network.name
        subnet = ComputeSubnetwork(
            self, "subnet", name=name, network=network.id, region=env.region, ip_cidr_range=env.network.vpc_cidr,
            private_ip_google_access=True,
            log_config={"aggregation_interval": "INTERVAL_5_MIN", "flow_sampling": 0.5, "metadata": "INCLUDE_ALL_METADATA"},
        )  # fmt: skip
        # Nodes only pull work; nothing may connect to them.
        ComputeFirewall(self, "deny-ingress", name=f"{name}-deny-ingress", network=network.id, direction="INGRESS",
                        priority=65534, source_ranges=["0.0.0.0/0"], deny=[ComputeFirewallDeny(protocol="all")],
                        log_config={"metadata": "INCLUDE_ALL_METADATA"})  # fmt: skip
        router = ComputeRouter(self, "router", name=name, network=network.id, region=env.region)
        ComputeRouterNat(self, "nat", name=name, router=router.name, region=env.region,
                         nat_ip_allocate_option="AUTO_ONLY", source_subnetwork_ip_ranges_to_nat="ALL_SUBNETWORKS_ALL_IP_RANGES",
                         log_config={"enable": True, "filter": "ERRORS_ONLY"})  # fmt: skip
        return subnet.id

    def _item_logs(self, env: Environment, spec: EnvResources) -> None:
        """Every item's output lands in the environment's own log bucket (one year), and a
        log-based metric counts finished attempts by outcome."""
        log_id = spec.item_logs.name
        bucket = LoggingProjectBucketConfig(
            self, "item-logs", project=env.project, location="global", bucket_id=log_id,
            retention_days=spec.item_logs.retention_days, description="tidefleet item output, one entry per line",
        )  # fmt: skip
        log_filter = f'logName="projects/{env.project}/logs/{log_id}"'
        LoggingProjectSink(self, "item-logs-sink", name=log_id, filter=log_filter, unique_writer_identity=True,
                           destination=f"logging.googleapis.com/{bucket.id}")  # fmt: skip
        LoggingMetric(
            self, "item-outcomes", name=naming.stack_resource(env.name, "item-outcomes"),
            filter=f"{log_filter} AND jsonPayload.outcome:*",
            metric_descriptor={"metric_kind": "DELTA", "value_type": "INT64",
                               "labels": [LoggingMetricMetricDescriptorLabels(key=k, value_type="STRING")
                                          for k in ("outcome", "queue")]},
            label_extractors={"outcome": "EXTRACT(jsonPayload.outcome)", "queue": "EXTRACT(jsonPayload.queue)"},
        )  # fmt: skip

    def _backend(self, env: Environment, local_state_path: str) -> None:
        if env.state.backend == "gcs":
            GcsBackend(self, bucket=env.state.bucket, prefix=env.state.key or f"tidefleet/{env.name}")
        else:
            LocalBackend(self, path=local_state_path)

    def _allocate_logical_id(self, element) -> str:
        # Readable, hash-free addresses: the checkov suppressions and the tests name resources by them.
        return "_".join(element.node.path.split("/")[1:])
