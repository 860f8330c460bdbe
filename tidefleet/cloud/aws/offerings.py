"""Are the pools' instance types offered where their nodes launch? Asked of EC2 before terraform
runs (`invoke plan` / `deploy`): no offline list of offerings stays right, and a type the region
does not offer passes validate, synth and plan, then fails every launch of the group it is in
(a mixed-instances group just never uses it).

Where the stack creates the network, the nodes launch in its private subnets, one per zone over
the first `network.az_count` zones of `<region>a` … `<region>f` in name order (stacks/aws/network.py,
whose `aws_availability_zones` lists them sorted, and whose `element()` wraps past the last), a
cluster-placement pool in the first of them only (stacks/aws/pool.py). With `network.subnet_ids`
the zones are the user's: only the region is checked.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import cache

import boto3
import botocore
import botocore.session

from tidefleet import naming
from tidefleet.cloud.aws import _fail_fast
from tidefleet.config import Environment, Pool

# At most this many types of the same family are named as a fix.
ALTERNATIVES = 3


@dataclass(frozen=True)
class Offerings:
    region: str
    types: frozenset[str]  # every type the region offers
    zones: tuple[str, ...]  # the stack's zones, in name order; () with the environment's own subnets
    in_zone: dict[str, frozenset[str]]  # pool type -> those of `zones` that offer it


@cache
def known_types() -> tuple[str, frozenset[str]]:
    """('botocore X.Y.Z', every EC2 instance type its EC2 model lists): offline, so a type newer than
    the installed botocore is missing. The model loads once, in about 0.2 s."""
    model = botocore.session.get_session().get_service_model("ec2")
    return f"botocore {botocore.__version__}", frozenset(model.shape_for("InstanceType").enum)


def read_offerings(env: Environment) -> Offerings:
    """What EC2 offers in the environment's region (and zones): 1 to 2 pages for the region, and
    with a stack-made network one call for its zones and one page or so for the pools' types
    there. Raises the cloud's errors (tidefleet.cloud.aws.ERRORS)."""
    _fail_fast()
    ec2 = boto3.client("ec2", region_name=env.region)
    pages = ec2.get_paginator("describe_instance_type_offerings")

    def offered(location_type: str, filters: list[dict]) -> list[dict]:
        return [o for page in pages.paginate(LocationType=location_type, Filters=filters)
                for o in page["InstanceTypeOfferings"]]  # fmt: skip

    # Every type, not just the pools': the same family's offered sizes make the fix.
    types = frozenset(o["InstanceType"] for o in offered("region", []))
    wanted = sorted({t.type for pool in env.pools.values() for t in pool.instance_types} & types)
    if env.network.subnet_ids or not wanted:
        return Offerings(env.region, types, (), {})
    found = ec2.describe_availability_zones(Filters=[{"Name": "zone-name", "Values": naming.stack_zones(env.region)}])
    zones = tuple(sorted(z["ZoneName"] for z in found["AvailabilityZones"]))
    in_zone: dict[str, set[str]] = {}
    filters = [{"Name": "instance-type", "Values": wanted}, {"Name": "location", "Values": list(zones)}]
    for o in offered("availability-zone", filters) if zones else []:
        in_zone.setdefault(o["InstanceType"], set()).add(o["Location"])
    return Offerings(env.region, types, zones, {t: frozenset(z) for t, z in in_zone.items()})


def pool_zones(env: Environment, pool: Pool, zones: tuple[str, ...]) -> tuple[str, ...]:
    """The zones of the stack's subnets a pool's group launches in."""
    if not zones:
        return ()
    count = 1 if pool.placement == "cluster" else env.network.az_count
    return tuple(dict.fromkeys(zones[i % len(zones)] for i in range(count)))


def problems(env: Environment, offerings: Offerings) -> tuple[list[str], list[str]]:
    """(refusals, warnings), one line each. A type no node can launch as, where the pool's
    subnets are, is refused: offered nowhere in the region, or in none of the pool's zones. One
    offered in some of them is a warning: the group still launches it, in fewer zones (an Auto
    Scaling group launches in another zone when one cannot), so its spot capacity is shallower."""
    refused, warned = [], []
    region = offerings.region
    if not offerings.types:  # no region offers nothing: an endpoint (an emulator) without the data
        return [], [f"EC2 lists no instance type offerings in {region}: the pools' types were not checked"]
    for name, pool in env.pools.items():
        zones = pool_zones(env, pool, offerings.zones)
        for i, instance in enumerate(pool.instance_types):
            where, kind = f"pools.{name}.instance_types[{i}].type", instance.type
            if kind not in offerings.types:
                family = kind.partition(".")[0]
                same = _nearest(kind, [t for t in offerings.types if t.partition(".")[0] == family])
                fix = (f"choose one it offers ({', '.join(same)}) or another region" if same
                       else f"it offers no {family} type: choose another type or another region")  # fmt: skip
                refused.append(f"{where}: {kind} is not offered in {region}; {fix}")
                continue
            has = offerings.in_zone.get(kind, frozenset())
            if all(z in has for z in zones):
                continue
            span, offering = _span(env, pool, zones), [z for z in offerings.zones if z in has]
            if not any(z in has for z in zones):
                refused.append(f"{where}: {kind} is offered in {region} but not in {span}, so the group never "
                               f"launches it; {_zone_fix(pool, offerings.zones, offering)}")  # fmt: skip
            else:
                lacking = ", ".join(z for z in zones if z not in has)
                warned.append(f"{where}: {kind} is not offered in {lacking}, of {span}: the group launches it only "
                              f"in {', '.join(z for z in zones if z in has)}; to use every zone, choose a type "
                              "offered in all of them, or give network.subnet_ids in zones that offer it")  # fmt: skip
    return refused, warned


def check(env: Environment) -> tuple[list[str], list[str]]:
    """`problems` of what EC2 offers now; raises the cloud's errors when it cannot be asked."""
    return problems(env, read_offerings(env))


def _span(env: Environment, pool: Pool, zones: tuple[str, ...]) -> str:
    if pool.placement == "cluster":
        return f"{zones[0]}, the one zone a cluster-placement pool launches in (the stack's first subnet)"
    return (
        f"the zones the stack spreads the pool's nodes over ({', '.join(zones)}: network.az_count = "
        f"{env.network.az_count})"
    )


def _zone_fix(pool: Pool, zones: tuple[str, ...], offering: list[str]) -> str:
    """What lets the group launch a type offered in `offering` of the stack's `zones` (maybe none)."""
    own = "choose another type, or give network.subnet_ids"
    if not offering:
        return f"{own} in a zone that offers it"
    if pool.placement == "cluster":
        return f"{own} whose first subnet is in {' or '.join(offering)}"
    return (
        f"it is offered in {', '.join(offering)}: raise network.az_count to {zones.index(offering[0]) + 1}, "
        f"{own} there"
    )


# Sizes below xlarge, in order; "Nxlarge" is N xlarges; any other (metal) counts as the largest.
SMALL_SIZES = {"nano": 1 / 32, "micro": 1 / 16, "small": 1 / 8, "medium": 1 / 4, "large": 1 / 2}


def _size(kind: str) -> float:
    size = kind.partition(".")[2]
    if size in SMALL_SIZES:
        return SMALL_SIZES[size]
    found = re.fullmatch(r"(\d*)xlarge", size)
    return int(found[1] or 1) if found else 1024


def _nearest(kind: str, offered: list[str]) -> list[str]:
    """Up to ALTERNATIVES of `offered`, nearest in size to `kind` first (then by name)."""
    wanted = math.log2(_size(kind))
    return sorted(offered, key=lambda t: (abs(math.log2(_size(t)) - wanted), t))[:ALTERNATIVES]
