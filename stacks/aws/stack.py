"""One environment's AWS stack: state, network, node pools, control functions, alarms, dashboard."""

from __future__ import annotations

import json
from collections.abc import Callable

from cdktn import Fn, LocalBackend, S3Backend, TerraformLocal, TerraformStack
from cdktn_provider_aws.cloudwatch_dashboard import CloudwatchDashboard
from cdktn_provider_aws.provider import AwsProvider, AwsProviderDefaultTags
from constructs import Construct

from stacks.aws.alarms import Alarms, dashboard
from stacks.aws.functions import ControlFunctions, LaunchGrants, QueueRef
from stacks.aws.iam import AwsContext
from stacks.aws.network import NodeNetwork
from stacks.aws.pool import NodePool
from stacks.aws.schedules import ScheduledJobs
from stacks.aws.storage import ArtifactsBucket, EnvironmentKey, JobTable, WorkQueue, log_group
from stacks.terraform import require_terraform
from tidefleet import naming
from tidefleet.config import Environment
from tidefleet.resources import resources
from tidefleet.userdata import SHARED_FS_PLACEHOLDER

# Rendered scripts carry this where the bucket name goes; the name holds the account id,
# known to Terraform only, so it is spliced back in as an interpolation.
BUCKET_PLACEHOLDER = "TIDEFLEET-ARTIFACTS-BUCKET-PLACEHOLDER"


def terraform_literal(text: str) -> str:
    """`text` as a Terraform JSON string that Terraform will not interpolate."""
    return text.replace("${", "$${").replace("%{", "%%{")


class AwsFleetStack(TerraformStack):
    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        env: Environment,
        archive_path: str,
        local_state_path: str,
        user_data: Callable[[str, str], str],
    ) -> None:
        """archive_path: the functions zip, relative to the synthesized stack directory.
        local_state_path: state file for the local backend, likewise relative.
        user_data(pool_name, artifacts_bucket): the pool's boot script."""
        super().__init__(scope, id)
        require_terraform(self)
        self._backend(env, local_state_path)
        ctx = AwsContext(self, "account", region=env.region)
        spec = resources(env, account=ctx.account_id)
        AwsProvider(self, "aws", region=env.region, default_tags=[AwsProviderDefaultTags(tags=spec.tags)])
        key = EnvironmentKey(
            self, "key", env_name=env.name, ctx=ctx,
            log_group_patterns=[f"/{naming.PREFIX}/{env.name}/*", f"/aws/lambda/{naming.function(env.name, '')}*"],
        )  # fmt: skip
        self.queues = {
            name: WorkQueue(self, f"queue-{name}", spec=queue) for name, queue in sorted(spec.queues.items())
        }
        self.table = JobTable(self, "jobs", spec=spec.table, key_arn=key.arn)
        self.artifacts = ArtifactsBucket(self, "artifacts", spec=spec.artifacts, key_arn=key.arn)
        self.item_logs = log_group(self, "item-logs", name=spec.item_logs.name, retention_days=spec.item_logs.retention_days,
                                   key_arn=key.arn)  # fmt: skip
        network = NodeNetwork(self, "network", env_name=env.name, network=env.network, ctx=ctx, key_arn=key.arn,
                              log_retention_days=spec.log_retention_days, shared_fs=env.shared_fs)  # fmt: skip

        self.pools = {}
        for pool_name in sorted(env.pools):
            script = terraform_literal(user_data(pool_name, BUCKET_PLACEHOLDER)).replace(BUCKET_PLACEHOLDER, self.artifacts.name)
            if network.shared_fs:
                script = script.replace(SHARED_FS_PLACEHOLDER, network.shared_fs.mount_source)
            script_local = TerraformLocal(self, f"user-data-{pool_name}", script)
            self.pools[pool_name] = NodePool(
                self, f"pool-{pool_name}", env=env, pool_name=pool_name, spec=spec.pools[pool_name], ctx=ctx, subnet_ids=network.subnet_ids,
                vpc_id=network.vpc_id, security_group_id=network.security_group_id, user_data_base64=Fn.base64encode(script_local.as_string),
                queue_arns=[arn for q in env.queues_of(pool_name) for arn in self.queues[q].arns],
                table_arn=self.table.arn, item_log_group_arn=self.item_logs.arn,
                artifacts_bucket_arn=self.artifacts.arn, key_arn=key.arn,
            )  # fmt: skip
        self.functions = ControlFunctions(
            self, "control", env=env, spec=spec, ctx=ctx, archive_path=archive_path,
            queues={name: QueueRef(q.name, q.queue.arn) for name, q in self.queues.items()},
            group_names=[p.group_name for p in self.pools.values()], group_arns=[p.group_arn for p in self.pools.values()],
            launch=LaunchGrants(template_arns=[p.template_arn for p in self.pools.values()],
                                node_role_arns=[p.role.arn for p in self.pools.values()],
                                image_parameter_arns=[p.image_parameter_arn for p in self.pools.values() if p.image_parameter_arn]),
            table_arn=self.table.arn, key_arn=key.arn,
        )  # fmt: skip
        self.alarms = Alarms(
            self, "alarms", env=env, ctx=ctx, key_arn=key.arn,
            dead_letter_queues={name: spec.queues[name].dead_letter_name for name in self.queues},
            queues={name: spec.queues[name].name for name in self.queues},
        )  # fmt: skip
        ScheduledJobs(self, "schedules", env=env, spec=spec, ctx=ctx, archive_path=archive_path,
                      queue_arns=[q.queue.arn for q in self.queues.values()], table_arn=self.table.arn,
                      key_arn=key.arn, failures_arn=self.functions.failures.arn)  # fmt: skip
        CloudwatchDashboard(self, "dashboard", dashboard_name=naming.stack_resource(env.name, "fleet"),
                            dashboard_body=json.dumps(dashboard(env)))  # fmt: skip

    def _backend(self, env: Environment, local_state_path: str) -> None:
        state = env.state
        if state.backend == "s3":
            # Without a lock table, Terraform >= 1.10 locks with a lock file beside the state.
            lock = {"dynamodb_table": state.lock_table} if state.lock_table else {"use_lockfile": True}
            S3Backend(self, bucket=state.bucket, key=state.key or f"tidefleet/{env.name}.tfstate",
                      region=state.region or env.region, encrypt=True, **lock)  # fmt: skip
        else:
            LocalBackend(self, path=local_state_path)

    def _allocate_logical_id(self, element) -> str:
        # Readable, hash-free addresses (aws_sqs_queue.queue-render_queue): the checkov
        # suppressions and the tests name resources by them.
        return "_".join(element.node.path.split("/")[1:])
