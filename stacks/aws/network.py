"""Where nodes run: the configured subnets, or a VPC the stack creates.

Default when `network.subnet_ids` is empty: one private subnet per zone across `az_count`
zones, and egress through ONE NAT gateway in a small public subnet. Nodes need the open
internet (dnf, PyPI, container registries such as ghcr.io), which VPC endpoints cannot
give; one NAT gateway instead of one per zone trades zone-failure tolerance of egress for
cost, acceptable for batch work that is retried anyway. Nodes never get public addresses
here, the default security group is emptied, flow logs go to an encrypted log group, and
the node security group admits nothing in and lets only HTTPS out (and, with a shared file
system, its NFS/Lustre ports to that file system only). Gateway endpoints for S3 and DynamoDB
keep the data and the job store off the NAT (its $0.045/GB), on a VPC the stack creates; with
configured subnets, add them to your route tables yourself.
"""

from __future__ import annotations

import ipaddress

from cdktn import Fn
from cdktn_provider_aws.data_aws_availability_zones import (
    DataAwsAvailabilityZones,
    DataAwsAvailabilityZonesFilter,
)
from cdktn_provider_aws.data_aws_subnet import DataAwsSubnet
from cdktn_provider_aws.default_security_group import DefaultSecurityGroup
from cdktn_provider_aws.eip import Eip
from cdktn_provider_aws.flow_log import FlowLog
from cdktn_provider_aws.internet_gateway import InternetGateway
from cdktn_provider_aws.nat_gateway import NatGateway
from cdktn_provider_aws.route_table import RouteTable, RouteTableRoute
from cdktn_provider_aws.route_table_association import RouteTableAssociation
from cdktn_provider_aws.security_group import SecurityGroup, SecurityGroupEgress
from cdktn_provider_aws.subnet import Subnet
from cdktn_provider_aws.vpc import Vpc
from cdktn_provider_aws.vpc_endpoint import VpcEndpoint
from constructs import Construct

from stacks.aws.data import SharedFileSystem, fs_egress
from stacks.aws.iam import AwsContext, ServiceRole, Statement
from stacks.aws.storage import log_group
from tidefleet import naming
from tidefleet.config import Network, SharedFs

# Free gateway endpoints: traffic to these services skips the NAT gateway.
GATEWAY_ENDPOINTS = ("s3", "dynamodb")


class NodeNetwork(Construct):
    """Exposes `subnet_ids`, `vpc_id`, `security_group_id` and `shared_fs` (None, or the
    SharedFileSystem with its `mount_source`) for the node pools."""

    def __init__(self, scope: Construct, id: str, *, env_name: str, network: Network, ctx: AwsContext, key_arn: str,
                 log_retention_days: int, shared_fs: SharedFs | None = None):  # fmt: skip
        super().__init__(scope, id)
        if network.subnet_ids:
            self.subnet_ids = list(network.subnet_ids)
            self.vpc_id = DataAwsSubnet(self, "first-subnet", id=network.subnet_ids[0]).vpc_id
        else:
            self._create_vpc(env_name, network, ctx, key_arn, log_retention_days)
        self.shared_fs = shared_fs and SharedFileSystem(self, "shared-fs", env_name=env_name, vpc_id=self.vpc_id, fs=shared_fs)
        self.security_group_id = SecurityGroup(
            self,
            "nodes",
            name=naming.stack_resource(env_name, "nodes"),
            description="tidefleet nodes: nothing in, HTTPS out",
            vpc_id=self.vpc_id,
            egress=[
                SecurityGroupEgress(
                    description="HTTPS to AWS APIs, package mirrors and container registries",
                    protocol="tcp", from_port=443, to_port=443, cidr_blocks=["0.0.0.0/0"],
                ),
                *(fs_egress(shared_fs, self.shared_fs.security_group_id) if shared_fs else []),
            ],
        ).id  # fmt: skip
        if self.shared_fs:
            self.shared_fs.attach(node_security_group_id=self.security_group_id, subnet_ids=self.subnet_ids, key_arn=key_arn)

    def _create_vpc(self, env_name: str, network: Network, ctx: AwsContext, key_arn: str, log_retention_days: int) -> None:
        region = ctx.region
        name = naming.stack_resource(env_name, "network")
        vpc = Vpc(self, "vpc", cidr_block=network.vpc_cidr, enable_dns_hostnames=True, enable_dns_support=True,
                  tags={"Name": name})  # fmt: skip
        self.vpc_id = vpc.id
        DefaultSecurityGroup(self, "default-security-group", vpc_id=vpc.id, ingress=[], egress=[])
        zones = DataAwsAvailabilityZones(
            self, "zones", filter=[DataAwsAvailabilityZonesFilter(name="zone-name", values=naming.stack_zones(region))]
        ).names
        cidrs = ipaddress.ip_network(network.vpc_cidr).subnets(prefixlen_diff=4)
        public = Subnet(
            self, "public", vpc_id=vpc.id, cidr_block=str(next(cidrs)), availability_zone=Fn.element(zones, 0),
            map_public_ip_on_launch=False, tags={"Name": f"{name}-public"},
        )  # fmt: skip
        gateway = InternetGateway(self, "internet-gateway", vpc_id=vpc.id, tags={"Name": name})
        self._route([public.id], "public", vpc.id, {"gateway_id": gateway.id}, f"{name}-public")
        nat = NatGateway(
            self, "nat", subnet_id=public.id, allocation_id=Eip(self, "nat-address", domain="vpc").allocation_id,
            tags={"Name": name}, depends_on=[gateway],
        )  # fmt: skip
        self.subnet_ids = []
        for i in range(network.az_count):
            subnet = Subnet(
                self, f"private-{i}", vpc_id=vpc.id, cidr_block=str(next(cidrs)), availability_zone=Fn.element(zones, i),
                map_public_ip_on_launch=False, tags={"Name": f"{name}-private-{i}"},
            )  # fmt: skip
            self.subnet_ids.append(subnet.id)
        private = self._route(self.subnet_ids, "private", vpc.id, {"nat_gateway_id": nat.id}, f"{name}-private")
        endpoint_prefix = "cn.com.amazonaws" if region.startswith("cn-") else "com.amazonaws"
        for service in GATEWAY_ENDPOINTS:
            VpcEndpoint(self, f"{service}-endpoint", vpc_id=vpc.id, service_name=f"{endpoint_prefix}.{region}.{service}",
                        vpc_endpoint_type="Gateway", route_table_ids=[private.id], tags={"Name": f"{name}-{service}"})  # fmt: skip

        flow_logs = log_group(self, "flow-logs", name=naming.flow_log_group(env_name), retention_days=log_retention_days,
                              key_arn=key_arn)  # fmt: skip
        delivery = ServiceRole(
            self,
            "flow-log-delivery",
            name=naming.stack_resource(env_name, "flow-logs"),
            service="vpc-flow-logs.amazonaws.com",
            statements=[
                Statement(
                    "WriteFlowLogs",
                    ["logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"],
                    [flow_logs.arn, f"{flow_logs.arn}:log-stream:*"],
                )
            ],
        )
        FlowLog(self, "flow-log", vpc_id=vpc.id, traffic_type="ALL", log_destination=flow_logs.arn,
                iam_role_arn=delivery.arn)  # fmt: skip

    def _route(self, subnet_ids: list[str], id: str, vpc_id: str, target: dict, name: str) -> RouteTable:
        """A route table sending 0.0.0.0/0 to `target`, associated with the given subnets."""
        table = RouteTable(self, f"{id}-routes", vpc_id=vpc_id, route=[RouteTableRoute(cidr_block="0.0.0.0/0", **target)],
                           tags={"Name": name})  # fmt: skip
        for i, subnet_id in enumerate(subnet_ids):
            RouteTableAssociation(self, f"{id}-routes-{i}", subnet_id=subnet_id, route_table_id=table.id)
        return table
