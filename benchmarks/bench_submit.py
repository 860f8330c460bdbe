"""Submit throughput on a moto server: a bare batched boto3 loop and `sdk.submit` of a fresh
job, alternated over rounds, then the last job again (idempotent), all against one server in one run.

    python benchmarks/bench_submit.py [--items 2000] [--threads 8] [--rounds 3]

The bare loop is the floor of what any submit costs: each chunk of items written with
BatchWriteItem (25 a call) and sent with SendMessageBatch (10 a call), chunks on the same number
of threads as `submit`, no checks, no marks, no conditions. The last line is the ratio of the two
rates over all rounds (the issue's goal: >= 0.80). Each run sends to an empty queue (both
queues are recreated before every run) and the two go first in turn: on moto a send costs time in
proportion to the messages already waiting, and a shared machine drifts, so absolute rates fall
as the size grows (real SQS does not); the ratio is the number to compare.
"""

from __future__ import annotations

import argparse
import os
import time
from concurrent.futures import ThreadPoolExecutor

import shape_args

from tidefleet.emulator import start_moto


def bare(env, n: int, threads: int, job: str = "bare") -> float:
    """Seconds to record and send n items with plain batch calls; the records as few attributes as a bare loop writes."""
    import boto3

    from tidefleet import naming
    from tidefleet.jobs.sdk import CHUNK

    dynamodb, sqs = boto3.client("dynamodb", region_name=env.region), boto3.client("sqs", region_name=env.region)
    # A queue of its own: moto's SendMessage costs grow with the messages a queue holds (its
    # attribute counts scan them all), so both runs start from an empty queue.
    table, url = naming.table(env.name), sqs.create_queue(QueueName="bench-bare")["QueueUrl"]

    def chunk(start: int) -> None:
        ids = [f"{i:06d}" for i in range(start, min(start + CHUNK, n))]
        for at in range(0, len(ids), 25):
            puts = [{"PutRequest": {"Item": {"pk": {"S": f"JOB#{job}"}, "sk": {"S": f"ITEM#{i}"}, "status": {"S": "queued"},
                                             "args": {"L": [{"S": f"s3://bucket/{i}"}]}}}} for i in ids[at : at + 25]]  # fmt: skip
            pending = {table: puts}
            while pending:
                pending = dynamodb.batch_write_item(RequestItems=pending).get("UnprocessedItems")
        for at in range(0, len(ids), 10):
            entries = [{"Id": i, "MessageBody": f'{{"job":"{job}","item":"{i}","args":["s3://bucket/{i}"]}}'}
                       for i in ids[at : at + 10]]  # fmt: skip
            sqs.send_message_batch(QueueUrl=url, Entries=entries)

    start = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(chunk, range(0, n, CHUNK)))
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=shape_args.positive, default=2000)
    parser.add_argument("--threads", type=shape_args.positive, default=None, help="default: the SDK's THREADS")
    parser.add_argument("--rounds", type=shape_args.positive, default=3, help="bare loop and submit, alternated, each on empty queues")
    args = parser.parse_args()
    server = start_moto()
    os.environ.update(server.env())
    try:
        import boto3

        from tidefleet import naming
        from tidefleet.cloud.aws.provision import provision
        from tidefleet.config import load_environment
        from tidefleet.jobs import sdk

        threads = args.threads or sdk.THREADS
        env = load_environment("dev")
        provision(env, user_data={"cpu": ""})
        sqs = boto3.client("sqs", region_name=env.region)
        names = ("bench-bare", naming.queue(env.name, "default"))
        items = sdk.read_items([f"s3://bucket/{i}" for i in range(args.items)])
        bare_s = submit_s = 0.0
        for r in range(args.rounds):
            for name in names:  # recreated, not purged: moto allows one PurgeQueue a minute, as AWS does
                sqs.delete_queue(QueueUrl=sqs.create_queue(QueueName=name)["QueueUrl"])
                sqs.create_queue(QueueName=name)
            for side in ("bare", "submit") if r % 2 == 0 else ("submit", "bare"):
                start = time.perf_counter()
                if side == "bare":
                    bare(env, args.items, threads, job=f"bare-{r}")
                else:
                    first = sdk.submit(env, f"bench-{r}", "default", items, kick=False, threads=threads)
                took = time.perf_counter() - start
                bare_s, submit_s = (bare_s + took, submit_s) if side == "bare" else (bare_s, submit_s + took)
                sent = f"sent {first.sent}" if side == "submit" else f"({threads} threads)"
                print(f"{side:8s} {args.items} items: {took:6.1f} s  {args.items / took:6.0f} items/s  {sent}  round {r + 1}")
        start = time.perf_counter()
        again = sdk.submit(env, f"bench-{args.rounds - 1}", "default", items, kick=False, threads=threads)
        resubmit_s = time.perf_counter() - start
        print(f"resubmit {args.items} items: {resubmit_s:6.1f} s  new {again.new_items}, sent {again.sent} (must be 0, 0)")
        print(f"ratio submit/bare: {bare_s / submit_s:.2f}")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
