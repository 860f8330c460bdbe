"""One scaler tick at scale on a moto server: the real `control.tick` with the AWS adapters
against a bare loop of the same observe calls, alternated in one run.

    python benchmarks/bench_tick.py [--queues 1000] [--pools 100] [--nodes 10000] [--rounds 5]

Set up once per run (it is the slow part on moto, and the same for both sides): one Auto
Scaling group per pool holding nodes/pools instances (moto launches them on create), the
queues with a few messages in every tenth, a heartbeat per node, a mean item time per queue.
The tick runs with dry_run, so every round observes the same world; its act step would add
one call per pool whose desired changes. The bare loop makes the tick's observe calls with
plain boto3 and no parsing, the same number in flight (`CALLS_IN_FLIGHT`): groups 100 names a
call, instances 200 ids a call, each group's scaling activities, each pool's heartbeats (a
query), each queue's attributes, the queue statistics 100 keys a call. Each side's best round
is compared; the last line is `ratio tick/bare` of their times (1.00: the tick costs what its
calls cost; below 1: it is quicker, as a warm tick describes only instances it has not seen).
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import time

import shape_args

from tidefleet.emulator import start_moto


def environment(queues: int, pools: int):
    from tidefleet.config import parse_environment

    pool_names = [f"p{p:03d}" for p in range(pools)]
    pool = {"max": 10000, "command": "true", "instance_types": [{"type": "c6i.large", "weight": 1}]}
    data = {
        "cloud": "aws",
        "region": "us-east-1",
        # Pools of 10,000 nodes, more than a VPC the stack creates holds: subnets of its own, as such a fleet would have.
        "network": {"subnet_ids": ["subnet-0123456789abcdef0"]},
        "pools": dict.fromkeys(pool_names, pool),
        "queues": {f"q{q:04d}": {"pool": pool_names[q % pools]} for q in range(queues)},
    }
    return parse_environment(data, name="bench")


def populate(env, nodes: int) -> None:
    """Groups, instances, queues, heartbeats and statistics, written once."""
    import boto3

    from tidefleet import naming
    from tidefleet.cloud.aws.dynamodb import create_table
    from tidefleet.fanout import each

    region = env.region
    asg, ec2, sqs = (boto3.client(s, region_name=region) for s in ("autoscaling", "ec2", "sqs"))
    template = ec2.create_launch_template(
        LaunchTemplateName="bench", LaunchTemplateData={"ImageId": "ami-12c6146b", "InstanceType": "c6i.large"}
    )["LaunchTemplate"]["LaunchTemplateId"]
    pools = list(env.pools)
    per_pool = [nodes // len(pools) + (1 if i < nodes % len(pools) else 0) for i in range(len(pools))]

    def group(i: int) -> None:
        asg.create_auto_scaling_group(
            AutoScalingGroupName=naming.group(env.name, pools[i]), LaunchTemplate={"LaunchTemplateId": template},
            MinSize=0, MaxSize=10000, DesiredCapacity=per_pool[i], AvailabilityZones=[f"{region}a"],
        )  # fmt: skip

    each(group, range(len(pools)), 4)
    create_table(env.name, region)
    table = boto3.resource("dynamodb", region_name=region).Table(naming.table(env.name))
    now = time.time()
    groups = []
    for at in range(0, len(pools), 100):
        names = [naming.group(env.name, p) for p in pools[at : at + 100]]
        groups += asg.describe_auto_scaling_groups(AutoScalingGroupNames=names)["AutoScalingGroups"]
    with table.batch_writer() as batch:
        for g in groups:
            pool = g["AutoScalingGroupName"].removeprefix(naming.group(env.name, ""))
            for i in g["Instances"]:
                batch.put_item(Item={"pk": f"POOL#{pool}", "sk": f"NODE#{i['InstanceId']}", "at": int(now),
                                     "slots": 2, "busy_slots": 1})  # fmt: skip
        for q in env.queues:
            batch.put_item(Item={"pk": f"QUEUE#{q}", "sk": "STATS", "mean_item_s": 30, "items": 10})

    def queue(index_name: tuple[int, str]) -> None:
        index, name = index_name
        url = sqs.create_queue(QueueName=naming.queue(env.name, name))["QueueUrl"]
        if index % 10 == 0:
            sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": str(m), "MessageBody": "{}"} for m in range(10)])

    each(queue, list(enumerate(env.queues)), 4)


def bare(env, urls: list[str]) -> dict[str, float]:
    """Seconds for the tick's observe calls, plain, per kind of call."""
    import boto3

    from tidefleet import naming
    from tidefleet.cloud.aws.autoscaling import CALLS_IN_FLIGHT, FILTER_VALUES_MAX, GROUP_NAMES_MAX
    from tidefleet.fanout import each

    region = env.region
    asg, ec2, sqs = (boto3.client(s, region_name=region) for s in ("autoscaling", "ec2", "sqs"))
    dynamodb = boto3.client("dynamodb", region_name=region)
    table, names = naming.table(env.name), [naming.group(env.name, p) for p in env.pools]
    took, start = {}, time.perf_counter()

    def lap(kind: str) -> None:
        nonlocal start
        took[kind], start = time.perf_counter() - start, time.perf_counter()

    groups = []
    for at in range(0, len(names), GROUP_NAMES_MAX):
        groups += asg.describe_auto_scaling_groups(AutoScalingGroupNames=names[at : at + GROUP_NAMES_MAX])[
            "AutoScalingGroups"
        ]
    ids = [i["InstanceId"] for g in groups for i in g["Instances"]]
    chunks = [ids[at : at + FILTER_VALUES_MAX] for at in range(0, len(ids), FILTER_VALUES_MAX)]
    lap("groups")
    each(lambda c: ec2.describe_instances(Filters=[{"Name": "instance-id", "Values": c}]), chunks, CALLS_IN_FLIGHT)
    lap("instances")
    each(lambda g: asg.describe_scaling_activities(AutoScalingGroupName=g["AutoScalingGroupName"], MaxRecords=50),
         groups, CALLS_IN_FLIGHT)  # fmt: skip
    lap("activities")

    def heartbeats(pool: str) -> None:
        kwargs = {"TableName": table, "KeyConditionExpression": "pk = :pk AND begins_with(sk, :node)",
                  "ExpressionAttributeValues": {":pk": {"S": f"POOL#{pool}"}, ":node": {"S": "NODE#"}}}  # fmt: skip
        while "LastEvaluatedKey" in (page := dynamodb.query(**kwargs)):
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]

    each(heartbeats, list(env.pools), CALLS_IN_FLIGHT)
    lap("heartbeats")
    queues = list(env.queues)
    for at in range(0, len(queues), 100):
        keys = [{"pk": {"S": f"QUEUE#{q}"}, "sk": {"S": "STATS"}} for q in queues[at : at + 100]]
        dynamodb.batch_get_item(RequestItems={table: {"Keys": keys, "ConsistentRead": True}})
    lap("stats")
    attributes = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    each(lambda url: sqs.get_queue_attributes(QueueUrl=url, AttributeNames=attributes), urls, CALLS_IN_FLIGHT)
    lap("queues")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queues", type=shape_args.positive, default=1000)
    parser.add_argument("--pools", type=shape_args.positive, default=100)
    parser.add_argument("--nodes", type=shape_args.at_least(0), default=10000, help="instances in all, spread over the pools")
    parser.add_argument("--rounds", type=shape_args.positive, default=5, help="tick and bare loop, alternated")
    args = parser.parse_args()
    server = start_moto()
    os.environ.update(server.env())
    logging.getLogger("tidefleet").setLevel(logging.WARNING)  # one decision line per pool would be printed
    try:
        import boto3

        from tidefleet import naming
        from tidefleet.cloud.aws import aws_ports
        from tidefleet.control import tick

        env = environment(args.queues, args.pools)
        start = time.perf_counter()
        populate(env, args.nodes)
        print(f"setup    {args.pools} groups, {args.nodes} instances, {args.queues} queues: "
              f"{time.perf_counter() - start:6.1f} s (once)")  # fmt: skip
        sqs = boto3.client("sqs", region_name=env.region)
        urls = [sqs.get_queue_url(QueueName=naming.queue(env.name, q))["QueueUrl"] for q in env.queues]
        ports = aws_ports(env)
        start = time.perf_counter()
        decisions = tick(env, ports, time.time(), dry_run=True)
        print(f"tick     first (clients, queue URLs): {time.perf_counter() - start:6.2f} s  {len(decisions)} decisions")
        ticks, bares = [], []
        for _ in range(args.rounds):
            bares.append(bare(env, urls))
            start = time.perf_counter()
            tick(env, ports, time.time(), dry_run=True)
            ticks.append(time.perf_counter() - start)
        fastest = min(bares, key=lambda took: sum(took.values()))
        print("bare     best round by call: " + ", ".join(f"{kind} {s:.2f} s" for kind, s in fastest.items()))
        bares = [sum(took.values()) for took in bares]
        for name, times in (("bare", bares), ("tick", ticks)):
            print(f"{name}     warm: best {min(times):6.2f} s  median {statistics.median(times):6.2f} s  "
                  f"({args.rounds} rounds)")  # fmt: skip
        print(f"ratio tick/bare: {min(ticks) / min(bares):.2f}")  # of times: below 1, quicker than its bare calls
    finally:
        server.stop()


if __name__ == "__main__":
    main()
