"""One node pool on GCP: a least-privilege service account, a Spot and a standard
instance template, and two regional managed instance groups (Spot, and on-demand for the
pool's on-demand base and the policy's spot fallback).

A template is either Spot or standard, so the on-demand share is a second group; the fleet
adapter presents both as one pool to the control tick. Terraform creates the groups and then
ignores their size: the scaler owns `target_size`. Spot VMs are deleted on preemption (no
stopped VMs to pay disks for) and nothing restarts them; the group recreates capacity only
when the scaler asks.
"""

from __future__ import annotations

from cdktn import TerraformResourceLifecycle
from cdktn_provider_google.artifact_registry_repository_iam_member import ArtifactRegistryRepositoryIamMember
from cdktn_provider_google.compute_instance_template import (
    ComputeInstanceTemplate,
    ComputeInstanceTemplateDisk,
    ComputeInstanceTemplateGuestAccelerator,
    ComputeInstanceTemplateNetworkInterface,
    ComputeInstanceTemplateNetworkInterfaceAccessConfig,
)
from cdktn_provider_google.compute_region_instance_group_manager import (
    ComputeRegionInstanceGroupManager,
    ComputeRegionInstanceGroupManagerVersion,
)
from cdktn_provider_google.compute_region_instance_group_manager import (
    ComputeRegionInstanceGroupManagerInstanceFlexibilityPolicyInstanceSelections as Selection,
)
from cdktn_provider_google.project_iam_custom_role import ProjectIamCustomRole
from cdktn_provider_google.project_iam_member import ProjectIamMember
from cdktn_provider_google.service_account import ServiceAccount
from constructs import Construct

from tidefleet import naming, registries
from tidefleet.config import Environment
from tidefleet.resources import PoolSpec

# Google's recommended scope: the service account's IAM roles are what limit a node.
NODE_SCOPES = ["https://www.googleapis.com/auth/cloud-platform"]
# Regional groups accept 0 or at least the number of zones; no region has more than 4 today.
MAX_UNAVAILABLE = 10


def _scheduling(spot: bool, gpus: int) -> dict:
    if spot:
        return {"provisioning_model": "SPOT", "preemptible": True, "automatic_restart": False,
                "on_host_maintenance": "TERMINATE", "instance_termination_action": "DELETE"}  # fmt: skip
    # GPUs cannot live-migrate.
    return {"provisioning_model": "STANDARD", "preemptible": False, "automatic_restart": True,
            "on_host_maintenance": "TERMINATE" if gpus else "MIGRATE"}  # fmt: skip


# What a node needs to delete itself from its group: read the group and its instances, then
# deleteInstances (which acts on the instance too).
LEAVE_PERMISSIONS = ["compute.instanceGroupManagers.get", "compute.instanceGroupManagers.update",
                     "compute.instances.delete"]


def own_group_condition(project: str, region: str, group: str) -> dict:
    groups = f"projects/{project}/regions/{region}/instanceGroupManagers/{group}"
    return {"title": f"only {group}", "description": "The pool's own groups and their VMs.",
            "expression": f'resource.name.startsWith("{groups}") || (resource.type == "compute.googleapis.com/Instance"'
                          f' && resource.name.extract("/instances/{{name}}").startsWith("{group}"))'}  # fmt: skip


class NodePool(Construct):
    """Exposes `service_account` (email, member), `groups` (spot, on_demand) and `templates`."""

    def __init__(self, scope: Construct, id: str, *, env: Environment, pool_name: str, spec: PoolSpec, subnetwork: str,
                 startup_script: str, labels: dict[str, str], kms_key_id: str) -> None:  # fmt: skip
        super().__init__(scope, id)
        pool = env.pools[pool_name]
        self.service_account = ServiceAccount(
            self, "node", account_id=naming.service_account(env.name, f"{pool_name}-node"),
            display_name=f"tidefleet {env.name} {pool_name} nodes",
            description="Worker agents of one pool: its own queues, the job store, item logs, the artifacts bucket.",
        )  # fmt: skip
        self.member = self.service_account.member
        first = pool.instance_types[0]
        gpus = first.gpus
        pool_labels = {**labels, "tidefleet-pool": pool_name, "tidefleet-team": pool.team}
        self.templates = {}
        self.groups = {}
        for kind, spot, group_name, size in (
            ("spot", True, spec.group_name, spec.initial_desired),
            ("on-demand", False, naming.on_demand_group(env.name, pool_name), spec.on_demand_base),
        ):
            template = ComputeInstanceTemplate(
                self, f"template-{kind}", name_prefix=naming.instance_template_prefix(env.name, pool_name, kind),
                machine_type=first.type, labels={**pool_labels, "tidefleet-lifecycle": kind},
                disk=[ComputeInstanceTemplateDisk(
                    boot=True, auto_delete=True, source_image=pool.image, disk_size_gb=pool.disk_gb,
                    disk_type="pd-balanced", disk_encryption_key={"kms_key_self_link": kms_key_id})],
                # No access_config: no external IP; the subnet's Cloud NAT reaches the internet.
                network_interface=[ComputeInstanceTemplateNetworkInterface(
                    subnetwork=subnetwork,
                    access_config=[ComputeInstanceTemplateNetworkInterfaceAccessConfig()] if pool.public_ip else None)],
                scheduling=_scheduling(spot, gpus),
                guest_accelerator=[ComputeInstanceTemplateGuestAccelerator(type=first.accelerator, count=gpus)]
                if first.accelerator else None,
                shielded_instance_config={"enable_secure_boot": True, "enable_vtpm": True,
                                          "enable_integrity_monitoring": True},
                service_account={"email": self.service_account.email, "scopes": NODE_SCOPES},
                metadata={"startup-script": startup_script, "block-project-ssh-keys": "true",
                          "enable-oslogin": "TRUE", "serial-port-enable": "false"},
                can_ip_forward=False,
                lifecycle=TerraformResourceLifecycle(create_before_destroy=True),
            )  # fmt: skip
            # More types than the template's: the group may use them too, in the configured order.
            ranked = [Selection(name=f"rank-{i}", rank=i, machine_types=[t.type]) for i, t in enumerate(pool.instance_types)]
            self.templates[kind] = template
            self.groups[kind] = ComputeRegionInstanceGroupManager(
                self, f"group-{kind}", name=group_name, base_instance_name=group_name, region=env.region,
                version=[ComputeRegionInstanceGroupManagerVersion(name=kind, instance_template=template.self_link_unique)],
                target_size=size // first.weight,
                # ANY: put Spot VMs in whichever zones have capacity (needs redistribution NONE);
                # a cluster pool's in one zone GCP picks with capacity for them all, as its gangs talk
                # to each other (GCP's compact placement policies fit few machine series and sizes).
                distribution_policy_target_shape="ANY_SINGLE_ZONE" if pool.placement == "cluster" else "ANY",
                # Both groups pick their zone on their own: `zone` keeps them in one (a gang on both kinds).
                distribution_policy_zones=[pool.zone] if pool.zone else None,
                update_policy={"type": "OPPORTUNISTIC", "minimal_action": "REPLACE",
                               "instance_redistribution_type": "NONE", "max_surge_fixed": 0,
                               "max_unavailable_fixed": MAX_UNAVAILABLE},
                instance_flexibility_policy={"instance_selections": ranked} if len(ranked) > 1 else None,
                wait_for_instances=False,
                # Terraform never fights the scaler over the size.
                lifecycle=TerraformResourceLifecycle(ignore_changes=["target_size"]),
            )  # fmt: skip
        # Rule 4 between ticks: an idle node deletes itself from its group on the scaler's leave
        # grant (`GceNode.retire`). GCE has no per-group IAM: a project role, held only on this
        # pool's groups and their VMs (the on-demand group's name extends the Spot one's).
        leave = ProjectIamCustomRole(
            self, "leave-role", role_id=naming.custom_role(env.name, f"{pool_name}_leave"),
            title=f"tidefleet {env.name} {pool_name} node leave", permissions=LEAVE_PERMISSIONS,
        )  # fmt: skip
        ProjectIamMember(self, "leave", project=env.project, role=leave.name, member=self.member,
                         condition=own_group_condition(env.project, env.region, spec.group_name))  # fmt: skip
        # Pulls of the pool's private images: read on each Artifact Registry repository they name
        # in the project (`tidefleet.registries`); the boot script points docker's helper at gcloud.
        for repo in registries.pulls(env, pool_name):
            ArtifactRegistryRepositoryIamMember(
                self, f"pull-{repo.location}-{repo.name}", project=repo.owner, location=repo.location,
                repository=repo.name, role=registries.READER, member=self.member,
            )  # fmt: skip
