"""Agent throughput on no-op items against a plain receive/delete loop, same moto server, one run.

    python benchmarks/bench_agent.py [--items 300] [--slots 8]

Both sides drain the same kind of queue filled by the same `submit`. The baseline only
receives and deletes (10 per call). The agent is a real `tidefleet agent` process doing
everything it does in production per item: store transitions, a log stream, a subprocess
(`true`), usage accounting, delete. Timed from the agent's first heartbeat to an empty queue.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import boto3

from tidefleet import naming
from tidefleet.cloud.aws.dynamodb import DynamoStore
from tidefleet.cloud.aws.provision import provision
from tidefleet.config import load_environment
from tidefleet.emulator import start_moto
from tidefleet.jobs import sdk

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


def plain_loop(env, items: int) -> float:
    sdk.submit(env, "plain", "plain", sdk.read_items(["noop"] * items), kick=False)
    sqs = boto3.client("sqs", region_name=env.region)
    url = sqs.get_queue_url(QueueName=naming.queue(env.name, "plain"))["QueueUrl"]
    done, start = 0, time.perf_counter()
    while done < items:
        messages = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1).get("Messages", [])
        if messages:
            sqs.delete_message_batch(
                QueueUrl=url, Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)]
            )
            done += len(messages)
    return items / (time.perf_counter() - start)


def agent(env, env_path: Path, items: int, server_env: dict, root: Path) -> float:
    job = sdk.submit(env, "agent", "noop", sdk.read_items(["noop"] * items), kick=False).job_id
    sqs = boto3.client("sqs", region_name=env.region)
    url = sqs.get_queue_url(QueueName=naming.queue(env.name, "noop"))["QueueUrl"]
    store = DynamoStore(env.name, env.region)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tidefleet.cli", "agent", "--env", str(env_path), "--pool", "cpu"],
        env={**os.environ, **server_env, "TIDEFLEET_NODE_ID": "bench", "TIDEFLEET_IMDS_URL": "http://127.0.0.1:9",
             "TIDEFLEET_CHECKPOINT_ROOT": str(root / "ck"), "TIDEFLEET_AGENT_WAIT_S": "1"},
        stdout=subprocess.DEVNULL, stderr=open(root / "agent.log", "w"),  # noqa: SIM115 - the child owns it
    )
    try:
        while store.heartbeat("cpu", "bench") is None:
            time.sleep(0.05)
        start = time.perf_counter()
        while _depth(sqs, url) > 0:
            time.sleep(0.1)
        elapsed = time.perf_counter() - start
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    counts = sdk.status(env, job).counts
    if counts["succeeded"] != items:
        raise SystemExit(f"agent run incomplete: {counts}; see {root / 'agent.log'}")
    return items / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=300)
    parser.add_argument("--slots", type=int, default=8, help="agent slots (items at once)")
    args = parser.parse_args()
    server = start_moto()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            os.environ.update(server.env())
            root = Path(tmp)
            _, plain_env = _env(root, "bplain", "plain", args.slots)
            env_path, agent_env = _env(root, "bagent", "noop", args.slots)
            baseline = plain_loop(plain_env, args.items)
            with_agent = agent(agent_env, env_path, args.items, server.env(), root)
    finally:
        server.stop()
    print(f"items: {args.items}, agent slots: {args.slots}, moto server on loopback")
    print(f"plain receive/delete loop: {baseline:8.1f} items/s")
    print(f"tidefleet agent (no-op):   {with_agent:8.1f} items/s")
    print(f"ratio agent/plain:         {with_agent / baseline:8.3f}")


if __name__ == "__main__":
    main()
