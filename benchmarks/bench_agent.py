"""Agent throughput on no-op items against a bare receive/delete loop, same moto server, one run.

    python benchmarks/bench_agent.py [--items 300] [--rounds 1]

For 1 and for 8 slots per node, both sides drain the same kind of queue filled by the same
`submit`. The bare loop only receives and deletes (10 per call). The agent is a real
`tidefleet agent` process doing everything it does in production per item: the claim, a
subprocess (`true`), usage accounting, the final record, the delete. Timed from the agent's
first heartbeat to an empty queue. A third loop, bare + claim + record, adds to the bare loop
the two conditional writes per item that running each item once and recording it once need:
the agent's floor on this server, whatever it does besides. Every AWS call each side makes is
counted by operation (the agent's through `benchmarks/callcount/sitecustomize.py` on its
PYTHONPATH); the last line is the worse agent/bare ratio of the two slot settings.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import boto3
import shape_args

from tidefleet import naming
from tidefleet.cloud.aws.dynamodb import DynamoStore
from tidefleet.cloud.aws.provision import provision
from tidefleet.config import load_environment
from tidefleet.emulator import start_moto
from tidefleet.jobs import sdk
from tidefleet.records import Fence, ItemWrite

COUNTER = Path(__file__).resolve().parent / "callcount"
ENV = """
region = "us-east-1"
[pools.cpu]
max = 1
command = "true"
slots_per_unit = {slots}
instance_types = [{{ type = "c6i.large", weight = 1 }}]
[queues.{queue}]
pool = "cpu"
item_timeout_s = 60
"""


def _env(root: Path, name: str, queue: str, slots: int):
    path = root / f"{name}.toml"
    path.write_text(ENV.format(slots=slots, queue=queue))
    env = load_environment(str(path))
    provision(env, user_data={"cpu": ""})
    return path, env


def _depth(sqs, url: str) -> int:
    attrs = sqs.get_queue_attributes(
        QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    )["Attributes"]
    return int(attrs["ApproximateNumberOfMessages"]) + int(attrs["ApproximateNumberOfMessagesNotVisible"])


def bare_loop(env, items: int) -> tuple[float, collections.Counter]:
    sdk.submit(env, "bare", "bare", sdk.read_items(["noop"] * items), kick=False)
    sqs = boto3.client("sqs", region_name=env.region)
    calls: collections.Counter = collections.Counter()
    sqs.meta.events.register("before-call.sqs.*", lambda model, **_: calls.update([f"sqs.{model.name}"]))
    url = sqs.get_queue_url(QueueName=naming.queue(env.name, "bare"))["QueueUrl"]
    done, start = 0, time.perf_counter()
    while done < items:
        messages = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1).get("Messages", [])
        if messages:
            sqs.delete_message_batch(
                QueueUrl=url, Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)]
            )
            done += len(messages)
    return items / (time.perf_counter() - start), calls


def records_loop(env, items: int) -> tuple[float, collections.Counter]:
    """The bare loop plus the two writes that "run once, record once" needs per item and no
    more: the claim (a conditional UpdateItem) and the final record with its job counter, the
    records of one receive batched as the agent batches a flush's (`update_items`: one
    TransactWriteItems), through the same store the agent uses. The agent's floor on this server."""
    job = sdk.submit(env, "records", "records", sdk.read_items(["noop"] * items), kick=False).job_id
    sqs = boto3.client("sqs", region_name=env.region)
    store = DynamoStore(env.name, env.region)
    calls: collections.Counter = collections.Counter()
    for client in (sqs, store.table.meta.client):
        client.meta.events.register("before-call.*.*", lambda model, **_: calls.update([model.name]))
    url = sqs.get_queue_url(QueueName=naming.queue(env.name, "records"))["QueueUrl"]
    done, start = 0, time.perf_counter()
    while done < items:
        messages = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1).get("Messages", [])
        finished = []
        for m in messages:
            msg = sdk.ItemMessage.parse(m["Body"])
            now = time.time()
            store.update_item(job, msg.item, status="running", node="bench", seq=msg.seq, lease_until=now + 60,
                              add={"attempts": 1}, fence=Fence(claim_at=now, seq=msg.seq))  # fmt: skip
            finished.append(ItemWrite(job, msg.item, {"status": "succeeded", "exit_code": 0}, fence=Fence(attempt=1)))
        if messages:
            store.update_items(finished)
            sqs.delete_message_batch(
                QueueUrl=url, Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)]
            )
            done += len(messages)
    if sdk.status(env, job).counts["succeeded"] != items:
        raise SystemExit("the records loop did not record every item")
    return items / (time.perf_counter() - start), calls


def agent(env, env_path: Path, items: int, server_env: dict, root: Path) -> tuple[float, collections.Counter]:
    job = sdk.submit(env, "agent", "noop", sdk.read_items(["noop"] * items), kick=False).job_id
    sqs = boto3.client("sqs", region_name=env.region)
    url = sqs.get_queue_url(QueueName=naming.queue(env.name, "noop"))["QueueUrl"]
    store = DynamoStore(env.name, env.region)
    counted = root / f"{env.name}-calls.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tidefleet.cli", "agent", "--env", str(env_path), "--pool", "cpu"],
        env={**os.environ, **server_env, "TIDEFLEET_NODE_ID": f"bench-{env.name}", "TIDEFLEET_IMDS_URL": "http://127.0.0.1:9",
             "TIDEFLEET_CHECKPOINT_ROOT": str(root / "ck"), "TIDEFLEET_AGENT_WAIT_S": "1",
             "PYTHONPATH": os.pathsep.join(filter(None, [str(COUNTER), os.environ.get("PYTHONPATH")])),
             "TIDEFLEET_CALL_COUNT": str(counted)},
        stdout=subprocess.DEVNULL, stderr=open(root / f"{env.name}-agent.log", "w"),  # noqa: SIM115 - the child owns it
    )
    try:
        while store.heartbeat("cpu", f"bench-{env.name}") is None:
            if proc.poll() is not None:
                raise SystemExit(f"the agent exited ({proc.returncode}): {(root / f'{env.name}-agent.log').read_text()[-2000:]}")
            time.sleep(0.05)
        start = time.perf_counter()
        while _depth(sqs, url) > 0:
            time.sleep(0.1)
        elapsed = time.perf_counter() - start
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    counts = sdk.status(env, job).counts
    if counts["succeeded"] != items:
        raise SystemExit(f"agent run incomplete: {counts}; see {root / f'{env.name}-agent.log'}")
    return items / elapsed, collections.Counter(json.loads(counted.read_text()))


def per_item(calls: collections.Counter, items: int) -> str:
    return ", ".join(f"{op} {n / items:.2f}" for op, n in sorted(calls.items())) + f"; total {sum(calls.values()) / items:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=shape_args.positive, default=300, help="items per run")
    parser.add_argument("--rounds", type=shape_args.positive, default=1, help="bare/agent pairs per slot setting (best kept)")
    args = parser.parse_args()
    server = start_moto()
    ratios = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            os.environ.update(server.env())
            root = Path(tmp)
            print(f"items: {args.items} per run, moto server on loopback")
            for slots in (1, 8):
                bare_rate = agent_rate = floor_rate = 0.0
                for n in range(args.rounds):  # fresh queues each round; the best of each side
                    _, bare_env = _env(root, f"bb{slots}r{n}", "bare", slots)
                    _, floor_env = _env(root, f"bf{slots}r{n}", "records", slots)
                    env_path, agent_env = _env(root, f"ba{slots}r{n}", "noop", slots)
                    rate, bare_calls = bare_loop(bare_env, args.items)
                    bare_rate = max(bare_rate, rate)
                    rate, floor_calls = records_loop(floor_env, args.items)
                    floor_rate = max(floor_rate, rate)
                    rate, agent_calls = agent(agent_env, env_path, args.items, server.env(), root)
                    agent_rate = max(agent_rate, rate)
                ratios[slots] = agent_rate / bare_rate
                print(f"{slots} slot(s): bare receive/delete {bare_rate:7.1f} items/s, bare + claim + record "
                      f"{floor_rate:7.1f} items/s, agent {agent_rate:7.1f} items/s: ratio {ratios[slots]:.2f} "
                      f"(to bare + claim + record: {agent_rate / floor_rate:.2f})")
                print(f"  bare calls per item:  {per_item(bare_calls, args.items)}")
                print(f"  bare + claim + record calls per item: {per_item(floor_calls, args.items)}")
                print(f"  agent calls per item: {per_item(agent_calls, args.items)}")
    finally:
        server.stop()
    print(f"ratio agent/bare: {min(ratios.values()):.2f}")


if __name__ == "__main__":
    main()
