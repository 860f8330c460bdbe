"""The team's data on AWS: bucket grants per pool, the shared file system, and the traffic a
training pool's nodes send each other.

Grants are per pool role and per prefix (`pools.X.data.read/write`): a pool reads what its
config names and nothing else. The file system (EFS, or FSx for Lustre for training data)
admits NFS/Lustre only from the node security group; nodes mount it at boot
(templates/user-data.sh.j2).
"""

from __future__ import annotations

from cdktn_provider_aws.efs_file_system import EfsFileSystem
from cdktn_provider_aws.efs_mount_target import EfsMountTarget
from cdktn_provider_aws.fsx_lustre_file_system import FsxLustreFileSystem
from cdktn_provider_aws.security_group import SecurityGroup, SecurityGroupEgress, SecurityGroupIngress
from cdktn_provider_aws.vpc_security_group_egress_rule import VpcSecurityGroupEgressRule
from cdktn_provider_aws.vpc_security_group_ingress_rule import VpcSecurityGroupIngressRule
from constructs import Construct

from stacks.aws.iam import AwsContext, Statement
from tidefleet import naming
from tidefleet.config import PoolData, SharedFs

# The ports each file system serves (NFS; Lustre's LNet and its client-side range).
FS_PORTS = {"efs": ((2049, 2049),), "fsx-lustre": ((988, 988), (1018, 1023))}
# FSx for Lustre PERSISTENT_2: MB/s per TiB of storage (125 is the smallest, cheapest step).
LUSTRE_THROUGHPUT = 125


def data_statements(ctx: AwsContext, data: PoolData) -> list[Statement]:
    """Read (and, where configured, write) under each configured prefix; listing only there."""
    objects = lambda locations: [f"arn:{ctx.partition}:s3:::{bucket}/{prefix}*" for bucket, prefix, _ in locations]
    locations = data.locations()
    if not locations:
        return []
    out = [Statement("ReadData", ["s3:GetObject"], objects(locations))]
    writable = [loc for loc in locations if loc[2]]
    if writable:
        out.append(Statement("WriteData", ["s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"], objects(writable)))
    prefixes: dict[str, list[str]] = {}
    for bucket, prefix, _ in locations:
        prefixes.setdefault(bucket, []).append(prefix)
    for i, (bucket, bucket_prefixes) in enumerate(sorted(prefixes.items())):
        # A whole bucket ("s3://b/") lists without condition; else only the named prefixes.
        whole = "" in bucket_prefixes
        condition = [] if whole else [{"test": "StringLike", "variable": "s3:prefix", "values": [f"{p}*" for p in bucket_prefixes]}]
        out.append(Statement(f"ListData{i}", ["s3:ListBucket"], [f"arn:{ctx.partition}:s3:::{bucket}"], condition))
    return out


def fs_egress(fs: SharedFs, fs_security_group_id: str) -> list[SecurityGroupEgress]:
    """The node security group's rules out to the file system (inline, beside its HTTPS rule)."""
    return [
        SecurityGroupEgress(description=f"{fs.kind} from the nodes", protocol="tcp", from_port=low, to_port=high,
                            security_groups=[fs_security_group_id])
        for low, high in FS_PORTS[fs.kind]
    ]  # fmt: skip


class SharedFileSystem(Construct):
    """Exposes `security_group_id` (create it before the node group: the nodes' egress names it),
    then, after `attach(...)`, `mount_source`: what a node mounts (`host:/` or `host@tcp:/name`)."""

    def __init__(self, scope: Construct, id: str, *, env_name: str, vpc_id: str, fs: SharedFs) -> None:
        super().__init__(scope, id)
        self.fs, self.env_name = fs, env_name
        # Its rules are resources of their own, never inline: inline rules beside rule resources
        # (the nodes' ingress, `attach`) make each apply revoke the others'. Terraform removes the
        # default allow-all egress of a group it creates.
        self.security_group = SecurityGroup(
            self, "security-group", name=naming.stack_resource(env_name, "shared-fs"), vpc_id=vpc_id,
            description=f"tidefleet shared {fs.kind}: the nodes' file traffic in, nothing out",
        )  # fmt: skip
        self.security_group_id = sg = self.security_group.id
        if fs.kind == "fsx-lustre":
            for direction, rule in (("in", VpcSecurityGroupIngressRule), ("out", VpcSecurityGroupEgressRule)):
                rule(self, f"lustre-servers-{direction}", security_group_id=sg, referenced_security_group_id=sg,
                     ip_protocol="tcp", from_port=988, to_port=1023, description="Lustre servers talk to each other")

    def attach(self, *, node_security_group_id: str, subnet_ids: list[str], key_arn: str) -> None:
        fs, sg = self.fs, self.security_group_id
        for i, (low, high) in enumerate(FS_PORTS[fs.kind]):
            VpcSecurityGroupIngressRule(
                self, f"from-nodes-{i}", security_group_id=sg, referenced_security_group_id=node_security_group_id,
                ip_protocol="tcp", from_port=low, to_port=high, description=f"{fs.kind} from the nodes",
            )  # fmt: skip
        name = naming.stack_resource(self.env_name, "shared")
        if fs.kind == "efs":
            efs = EfsFileSystem(self, "efs", encrypted=True, kms_key_id=key_arn, throughput_mode="elastic",
                                tags={"Name": name})  # fmt: skip
            for i, subnet in enumerate(subnet_ids):
                EfsMountTarget(self, f"mount-{i}", file_system_id=efs.id, subnet_id=subnet, security_groups=[sg])
            self.mount_source = f"{efs.dns_name}:/"
        else:
            # One subnet: a Lustre file system lives in one zone (training pools use one zone too).
            lustre = FsxLustreFileSystem(
                self, "lustre", storage_capacity=fs.size_gb, subnet_ids=subnet_ids[:1], security_group_ids=[sg],
                deployment_type="PERSISTENT_2", per_unit_storage_throughput=LUSTRE_THROUGHPUT, kms_key_id=key_arn,
                data_compression_type="LZ4", tags={"Name": name},
            )  # fmt: skip
            self.mount_source = f"{lustre.dns_name}@tcp:/{lustre.mount_name}"


def gang_security_group(scope: Construct, id: str, *, env_name: str, pool_name: str, vpc_id: str) -> str:
    """All traffic among one training pool's nodes (NCCL, EFA, the rendezvous), nothing else."""
    return SecurityGroup(
        scope, id, name=naming.stack_resource(env_name, f"{pool_name}-gang"), vpc_id=vpc_id,
        description=f"tidefleet {pool_name}: all traffic among the pool's own nodes",
        ingress=[SecurityGroupIngress(description="the pool's own nodes (NCCL, EFA)", protocol="-1", from_port=0,
                                      to_port=0, self_attribute=True)],
        egress=[SecurityGroupEgress(description="the pool's own nodes (NCCL, EFA)", protocol="-1", from_port=0,
                                    to_port=0, self_attribute=True)],
    ).id  # fmt: skip
