"""Where an environment keeps its state: the KMS key, the work queues, the job table, the
artifacts bucket and the log groups. All encrypted, none public.

Every name and setting comes from `tidefleet.resources` (the sandbox creates the same);
queues use SQS-managed encryption (see `QueueSpec.encryption`), everything else the key.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from cdktn_provider_aws.cloudwatch_log_group import CloudwatchLogGroup
from cdktn_provider_aws.dynamodb_table import (
    DynamodbTable,
    DynamodbTableAttribute,
    DynamodbTableGlobalSecondaryIndex,
)
from cdktn_provider_aws.kms_alias import KmsAlias
from cdktn_provider_aws.kms_key import KmsKey
from cdktn_provider_aws.s3_bucket import S3Bucket
from cdktn_provider_aws.s3_bucket_lifecycle_configuration import (
    S3BucketLifecycleConfiguration,
    S3BucketLifecycleConfigurationRule,
    S3BucketLifecycleConfigurationRuleAbortIncompleteMultipartUpload,
    S3BucketLifecycleConfigurationRuleFilter,
    S3BucketLifecycleConfigurationRuleNoncurrentVersionExpiration,
)
from cdktn_provider_aws.s3_bucket_ownership_controls import S3BucketOwnershipControls
from cdktn_provider_aws.s3_bucket_policy import S3BucketPolicy
from cdktn_provider_aws.s3_bucket_public_access_block import S3BucketPublicAccessBlock
from cdktn_provider_aws.s3_bucket_server_side_encryption_configuration import (
    S3BucketServerSideEncryptionConfigurationA,
    S3BucketServerSideEncryptionConfigurationRuleA,
)
from cdktn_provider_aws.s3_bucket_versioning import S3BucketVersioningA
from cdktn_provider_aws.sqs_queue import SqsQueue
from constructs import Construct

from stacks.aws.iam import AwsContext, policy_document
from tidefleet import naming
from tidefleet.resources import BucketSpec, QueueSpec, TableSpec

# What the account (through IAM policies) may do with the key: administer it and use it.
# Listed, not "kms:*", so no statement anywhere carries a wildcard action.
KEY_ACCOUNT_ACTIONS = [
    "kms:CancelKeyDeletion", "kms:CreateAlias", "kms:CreateGrant", "kms:Decrypt", "kms:DeleteAlias",
    "kms:DescribeKey", "kms:DisableKey", "kms:DisableKeyRotation", "kms:EnableKey", "kms:EnableKeyRotation",
    "kms:Encrypt", "kms:GenerateDataKey", "kms:GenerateDataKeyWithoutPlaintext", "kms:GetKeyPolicy",
    "kms:GetKeyRotationStatus", "kms:ListGrants", "kms:ListResourceTags", "kms:PutKeyPolicy",
    "kms:ReEncryptFrom", "kms:ReEncryptTo", "kms:RetireGrant", "kms:RevokeGrant", "kms:ScheduleKeyDeletion",
    "kms:TagResource", "kms:UntagResource", "kms:UpdateAlias", "kms:UpdateKeyDescription",
]  # fmt: skip
KEY_USE_ACTIONS = ["kms:Encrypt", "kms:Decrypt", "kms:ReEncryptFrom", "kms:ReEncryptTo", "kms:GenerateDataKey",
                   "kms:GenerateDataKeyWithoutPlaintext", "kms:DescribeKey"]  # fmt: skip


class EnvironmentKey(Construct):
    """The environment's customer-managed KMS key (rotated) for the table, bucket, logs,
    function settings and the alerts topic. CloudWatch Logs may use it only for this environment's log groups."""

    def __init__(self, scope: Construct, id: str, *, env_name: str, ctx: AwsContext, log_group_patterns: Sequence[str]):
        super().__init__(scope, id)
        # In a key policy, resource "*" means "this key".
        policy = policy_document(
            self,
            "policy",
            [
                {
                    "sid": "AccountAdministersAndUsesTheKeyThroughIam",
                    "effect": "Allow",
                    "actions": KEY_ACCOUNT_ACTIONS,
                    "resources": ["*"],
                    "principals": [{"type": "AWS", "identifiers": [f"arn:{ctx.partition}:iam::{ctx.account_id}:root"]}],
                },
                {
                    # An alarm publishing to the environment's encrypted alerts topic.
                    "sid": "AlarmsPublishToTheEncryptedTopic",
                    "effect": "Allow",
                    "actions": ["kms:Decrypt", "kms:GenerateDataKey"],
                    "resources": ["*"],
                    "principals": [{"type": "Service", "identifiers": ["cloudwatch.amazonaws.com"]}],
                },
                {
                    "sid": "LogsEncryptThisEnvironmentsLogGroups",
                    "effect": "Allow",
                    "actions": KEY_USE_ACTIONS,
                    "resources": ["*"],
                    "principals": [{"type": "Service", "identifiers": [f"logs.{ctx.region}.amazonaws.com"]}],
                    "condition": [
                        {
                            "test": "ArnLike",
                            "variable": "kms:EncryptionContext:aws:logs:arn",
                            "values": [ctx.arn("logs", f"log-group:{p}") for p in log_group_patterns],
                        }
                    ],
                },
            ],
        )
        self.key = KmsKey(
            self,
            "key",
            description=f"tidefleet {env_name}: job table, artifacts, logs, function settings",
            enable_key_rotation=True,
            deletion_window_in_days=30,
            policy=policy.json,
        )
        KmsAlias(self, "alias", name=f"alias/{naming.stack_resource(env_name, 'key')}", target_key_id=self.key.key_id)
        self.arn = self.key.arn


def encrypted_queue(scope: Construct, id: str, *, name: str, retention_s: int, **settings) -> SqsQueue:
    return SqsQueue(
        scope, id, name=name, sqs_managed_sse_enabled=True, message_retention_seconds=retention_s, **settings
    )


class WorkQueue(Construct):
    """One configured queue and its dead-letter queue."""

    def __init__(self, scope: Construct, id: str, *, spec: QueueSpec):
        super().__init__(scope, id)
        self.dead_letter = encrypted_queue(self, "dead-letter", name=spec.dead_letter_name, retention_s=spec.retention_s)
        self.queue = encrypted_queue(
            self,
            "queue",
            name=spec.name,
            retention_s=spec.retention_s,
            visibility_timeout_seconds=spec.visibility_timeout_s,
            redrive_policy=json.dumps(
                {"deadLetterTargetArn": self.dead_letter.arn, "maxReceiveCount": spec.max_receive_count}
            ),
        )
        self.name = spec.name
        self.arns = [self.queue.arn, self.dead_letter.arn]


class JobTable(Construct):
    """Jobs, items and node heartbeats (keys: see tidefleet/cloud/aws/dynamodb.py)."""

    def __init__(self, scope: Construct, id: str, *, spec: TableSpec, key_arn: str):
        super().__init__(scope, id)
        self.table = DynamodbTable(
            self,
            "table",
            name=spec.name,
            billing_mode=spec.billing_mode,
            hash_key=spec.hash_key,
            range_key=spec.range_key,
            attribute=[DynamodbTableAttribute(name=k, type=t) for k, t in spec.key_types.items()],
            global_secondary_index=[DynamodbTableGlobalSecondaryIndex(
                name=index.name, hash_key=index.hash_key, range_key=index.range_key, projection_type=index.projection)
                for index in spec.indexes],
            point_in_time_recovery={"enabled": spec.point_in_time_recovery},
            server_side_encryption={"enabled": True, "kms_key_arn": key_arn},
            ttl={"attribute_name": spec.ttl_attribute, "enabled": True} if spec.ttl_attribute else None,
        )
        self.arn = self.table.arn


class ArtifactsBucket(Construct):
    """The agent wheel (`agent/`) and workload checkpoints (`checkpoints/`)."""

    def __init__(self, scope: Construct, id: str, *, spec: BucketSpec, key_arn: str):
        super().__init__(scope, id)
        self.name = spec.name
        self.bucket = S3Bucket(self, "bucket", bucket=self.name)
        bucket_id = self.bucket.id
        S3BucketPublicAccessBlock(
            self, "public-access-block", bucket=bucket_id, block_public_acls=True, block_public_policy=True,
            ignore_public_acls=True, restrict_public_buckets=True,
        )  # fmt: skip
        S3BucketOwnershipControls(self, "ownership", bucket=bucket_id, rule={"object_ownership": "BucketOwnerEnforced"})
        versioning = "Enabled" if spec.versioned else "Suspended"
        S3BucketVersioningA(self, "versioning", bucket=bucket_id, versioning_configuration={"status": versioning})
        S3BucketServerSideEncryptionConfigurationA(
            self,
            "encryption",
            bucket=bucket_id,
            rule=[
                S3BucketServerSideEncryptionConfigurationRuleA(
                    apply_server_side_encryption_by_default={"sse_algorithm": "aws:kms", "kms_master_key_id": key_arn},
                    bucket_key_enabled=True,
                )
            ],
        )
        S3BucketLifecycleConfiguration(
            self,
            "lifecycle",
            bucket=bucket_id,
            rule=[
                S3BucketLifecycleConfigurationRule(
                    id="expire-old-versions-and-uploads",
                    status="Enabled",
                    filter=[S3BucketLifecycleConfigurationRuleFilter(prefix="")],
                    noncurrent_version_expiration=[S3BucketLifecycleConfigurationRuleNoncurrentVersionExpiration(noncurrent_days=spec.noncurrent_version_expiration_days)],
                    abort_incomplete_multipart_upload=[
                        S3BucketLifecycleConfigurationRuleAbortIncompleteMultipartUpload(days_after_initiation=spec.abort_incomplete_upload_days)
                    ],
                )
            ],
        )
        tls_only = policy_document(
            self,
            "tls-only",
            [
                {
                    "sid": "DenyPlainHttp",
                    "effect": "Deny",
                    "actions": ["s3:*"],
                    "resources": [self.bucket.arn, f"{self.bucket.arn}/*"],
                    "principals": [{"type": "*", "identifiers": ["*"]}],
                    "condition": [{"test": "Bool", "variable": "aws:SecureTransport", "values": ["false"]}],
                }
            ],
        )
        S3BucketPolicy(self, "policy", bucket=bucket_id, policy=tls_only.json)
        self.arn = self.bucket.arn


def log_group(scope: Construct, id: str, *, name: str, retention_days: int, key_arn: str) -> CloudwatchLogGroup:
    return CloudwatchLogGroup(scope, id, name=name, retention_in_days=retention_days, kms_key_id=key_arn)
