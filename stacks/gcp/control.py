"""The control plane on GCP: the scaler as a 2nd-gen Cloud Function (the same control tick
and policy as the AWS function) and its least-privilege service account.

It is triggered by messages on the environment's "kick" topic: Cloud Scheduler publishes one
every minute (and the scheduled jobs' fires and watch, stacks/gcp/schedules.py), and the job
SDK publishes one after a submit (the counterpart of the AWS asynchronous invoke), so scale-out
starts in seconds (a producer needs roles/pubsub.publisher on that topic, granted outside this
stack). Eventarc delivers them with an OIDC identity that may only invoke this function, and the
function accepts internal traffic only.
"""

from __future__ import annotations

import math

from cdktn import Fn
from cdktn_provider_google.cloud_run_service_iam_member import CloudRunServiceIamMember
from cdktn_provider_google.cloudfunctions2_function import Cloudfunctions2Function
from cdktn_provider_google.project_iam_custom_role import ProjectIamCustomRole
from cdktn_provider_google.project_iam_member import ProjectIamMember
from cdktn_provider_google.pubsub_topic import PubsubTopic
from cdktn_provider_google.service_account import ServiceAccount
from cdktn_provider_google.service_account_iam_member import ServiceAccountIamMember
from cdktn_provider_google.storage_bucket_iam_member import StorageBucketIamMember
from cdktn_provider_google.storage_bucket_object import StorageBucketObject
from constructs import Construct

from stacks.gcp.schedules import publish_on_schedule
from tidefleet import naming
from tidefleet.config import Environment

RUNTIME = "python312"
ENTRY_POINT = "on_kick"  # in the archive's main.py, the buildpack's default source (stacks/package.py)
PUBLISHED = "google.cloud.pubsub.topic.v1.messagePublished"
SCHEDULE_MESSAGE = {"tidefleet": "schedule"}
# A run ticks again while items wait, for up to 60 s after its first tick, plus one tick.
TIMEOUT_S = 120
# What Cloud Build needs to build the function from its source (Google's list for a build service
# account): write its logs and push the image (to gcf-artifacts, which the first build creates:
# no repository to scope to yet); reading the source object is granted on the bucket.
BUILD_ROLES = ["roles/logging.logWriter", "roles/artifactregistry.writer"]
# What one tick does to the fleet, and nothing else: read the groups and their instances,
# resize, delete chosen instances. GCE has no per-group IAM, so this is a project role.
FLEET_PERMISSIONS = [
    "compute.instanceGroupManagers.get",
    "compute.instanceGroupManagers.update",  # resize, deleteInstances
    "compute.instances.delete",  # deleteInstances acts on the chosen instances
    "compute.instances.get",
    "compute.instances.list",  # launch time and machine type of the listed instances
    "compute.regionOperations.get",
]


def schedule(tick_s: int) -> str:
    """Cloud Scheduler's finest is one minute; faster ticks come from kicks."""
    minutes = max(1, math.ceil(tick_s / 60))
    if minutes >= 60:  # config: a tick divides an hour, so an hour at most; the minute field stops at 59
        return "0 * * * *"
    return "* * * * *" if minutes == 1 else f"*/{minutes} * * * *"


def database_condition(project: str, database: str) -> dict:
    return {"title": f"only {database}", "description": "The environment's own Firestore database.",
            "expression": f'resource.name.startsWith("projects/{project}/databases/{database}")'}  # fmt: skip


class ScalerFunction(Construct):
    """Exposes `function`, `kick_topic` and `service_account`."""

    def __init__(self, scope: Construct, id: str, *, env: Environment, archive_path: str, bucket: str,
                 source_condition: dict, pubsub_agent: str, kms_key_id: str, labels: dict[str, str]) -> None:  # fmt: skip
        """source_condition: an IAM condition holding a bucket role to the function's source (`functions/`).
        pubsub_agent: the project's Pub/Sub service agent (member), which signs the trigger's pushes."""
        super().__init__(scope, id)
        self.kick_topic = PubsubTopic(self, "kick", name=naming.kick_topic(env.name),
                                      kms_key_name=kms_key_id, labels=labels)  # fmt: skip
        project = env.project
        self.service_account = ServiceAccount(
            self, "scaler", account_id=naming.service_account(env.name, "scaler"),
            display_name=f"tidefleet {env.name} scaler",
            description="Control tick: reads backlog, groups and heartbeats; resizes groups; deletes idle nodes.",
        )  # fmt: skip
        member = self.service_account.member
        role = ProjectIamCustomRole(
            self, "fleet-role", role_id=naming.custom_role(env.name, "scaler"),
            title=f"tidefleet {env.name} scaler", permissions=FLEET_PERMISSIONS,
        )  # fmt: skip
        ProjectIamMember(self, "fleet", project=project, role=role.name, member=member)
        ProjectIamMember(self, "backlog", project=project, role="roles/monitoring.viewer", member=member)
        # The tick's decisions as custom metrics (tidefleet.metrics); the role only writes series.
        ProjectIamMember(self, "metrics", project=project, role="roles/monitoring.metricWriter", member=member)
        ProjectIamMember(self, "heartbeats", project=project, role="roles/datastore.user", member=member,
                         condition=database_condition(project, naming.table(env.name)))  # fmt: skip
        source = StorageBucketObject(
            self, "source", bucket=bucket, source=archive_path,
            # The digest in the name makes a new archive a new object, hence a new build.
            name=f"functions/scaler-{Fn.filemd5(archive_path)}.zip",
        )  # fmt: skip
        # Builds run as an account of their own: the project's default one (Compute Engine's, in
        # projects made since mid-2024) holds no role where the organization forbids default grants.
        builder = ServiceAccount(
            self, "build", account_id=naming.service_account(env.name, "build"),
            display_name=f"tidefleet {env.name} scaler build", description="Only builds the scaler function's source.",
        )  # fmt: skip
        build_grants = [
            ProjectIamMember(self, f"build-{role.split('/')[1].split('.')[0]}", project=project, role=role,
                             member=builder.member)
            for role in BUILD_ROLES
        ]  # fmt: skip
        build_grants.append(StorageBucketIamMember(self, "build-source", bucket=bucket, role="roles/storage.objectViewer",
                                                   member=builder.member, condition=source_condition))  # fmt: skip
        invoker = ServiceAccount(
            self, "trigger", account_id=naming.service_account(env.name, "tick"),
            display_name=f"tidefleet {env.name} tick trigger", description="Only delivers kicks to the scaler function.",
        )  # fmt: skip
        self.function = Cloudfunctions2Function(
            self, "function", name=naming.function(env.name, "scaler"), location=env.region, labels=labels,
            description=f"tidefleet {env.name}: one control tick per kick",
            build_config={"runtime": RUNTIME, "entry_point": ENTRY_POINT, "service_account": builder.id,
                          "source": {"storage_source": {"bucket": bucket, "object": source.name}}},
            service_config={
                # One tick at a time (its actions are idempotent, but two would race each other).
                "max_instance_count": 1, "min_instance_count": 0, "max_instance_request_concurrency": 1,
                "available_memory": "512Mi", "timeout_seconds": TIMEOUT_S,
                "service_account_email": self.service_account.email,
                "ingress_settings": "ALLOW_INTERNAL_ONLY", "all_traffic_on_latest_revision": True,
                # The function cannot ask its runtime how long it has left; the loop stops in time by this.
                "environment_variables": {"TIDEFLEET_ENV": env.name, "LOG_EXECUTION_ID": "true",
                                          "TIDEFLEET_TIMEOUT_S": str(TIMEOUT_S)},
            },
            event_trigger={
                "trigger_region": env.region, "event_type": PUBLISHED, "pubsub_topic": self.kick_topic.id,
                "service_account_email": invoker.email,
                # The function answers every event it ran, failed ticks included (on_kick logs them):
                # a failed delivery is the platform's (busy: one request at a time, a timeout), and
                # without a retry it is dropped, a schedule's fire with it. Every message is
                # idempotent (a fire's job id is its fire time; ticks set desired absolutely).
                "retry_policy": "RETRY_POLICY_RETRY",
            },
            depends_on=build_grants,  # the build starts as the function is created
        )  # fmt: skip
        # Pub/Sub signs each push with the trigger's identity; its agent holds this by itself only
        # in projects made since 2021-04-08 (Eventarc's docs), so it is granted, on this account alone.
        ServiceAccountIamMember(self, "trigger-tokens", service_account_id=invoker.name,
                                role="roles/iam.serviceAccountTokenCreator", member=pubsub_agent)  # fmt: skip
        CloudRunServiceIamMember(self, "trigger-invokes", location=env.region, service=self.function.name,
                                 role="roles/run.invoker", member=invoker.member)  # fmt: skip
        publish_on_schedule(self, "schedule", name=naming.stack_resource(env.name, "tick"), region=env.region,
                            schedule=schedule(env.scaler.tick_s), topic_id=self.kick_topic.id,
                            message=SCHEDULE_MESSAGE, retries=0)  # fmt: skip
