"""Submit throughput on a moto server: a bare batched boto3 loop, then `sdk.submit` of a fresh
job, then the same job again (idempotent), all against the same server in one run.

    python benchmarks/bench_submit.py [--items 2000] [--threads 8]

The bare loop is the floor of what any submit costs: each chunk of items written with
BatchWriteItem (25 a call) and sent with SendMessageBatch (10 a call), chunks on the same number
of threads as `submit`, no checks, no marks, no conditions. The last line is the ratio of the two
rates (the issue's goal: >= 0.80). Each run sends to an empty queue: on moto a send costs time in
proportion to the messages already waiting, so absolute rates fall as the size grows (real SQS
does not); the ratio is the number to compare.
"""

from __future__ import annotations

import argparse
import os
import time
from concurrent.futures import ThreadPoolExecutor

from tidefleet.emulator import start_moto


def bare(env, n: int, threads: int) -> float:
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
            puts = [{"PutRequest": {"Item": {"pk": {"S": "JOB#bare"}, "sk": {"S": f"ITEM#{i}"}, "status": {"S": "queued"},
                                             "args": {"L": [{"S": f"s3://bucket/{i}"}]}}}} for i in ids[at : at + 25]]  # fmt: skip
            pending = {table: puts}
            while pending:
                pending = dynamodb.batch_write_item(RequestItems=pending).get("UnprocessedItems")
        for at in range(0, len(ids), 10):
            entries = [{"Id": i, "MessageBody": f'{{"job":"bare","item":"{i}","args":["s3://bucket/{i}"]}}'}
                       for i in ids[at : at + 10]]  # fmt: skip
            sqs.send_message_batch(QueueUrl=url, Entries=entries)

    start = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(chunk, range(0, n, CHUNK)))
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=None, help="default: the SDK's THREADS")
    args = parser.parse_args()
    server = start_moto()
    os.environ.update(server.env())
    try:
        from tidefleet.cloud.aws.provision import provision
        from tidefleet.config import load_environment
        from tidefleet.jobs import sdk

        threads = args.threads or sdk.THREADS
        env = load_environment("dev")
        provision(env, user_data={"cpu": ""})
        bare_s = bare(env, args.items, threads)
        print(f"bare     {args.items} items: {bare_s:6.1f} s  {args.items / bare_s:6.0f} items/s  ({threads} threads)")
        items = sdk.read_items([f"s3://bucket/{i}" for i in range(args.items)])
        start = time.perf_counter()
        first = sdk.submit(env, "bench", "default", items, kick=False, threads=threads)
        took = time.perf_counter() - start
        print(f"submit   {args.items} items: {took:6.1f} s  {args.items / took:6.0f} items/s  sent {first.sent}")
        start = time.perf_counter()
        again = sdk.submit(env, "bench", "default", items, kick=False, threads=threads)
        resubmit_s = time.perf_counter() - start
        print(f"resubmit {args.items} items: {resubmit_s:6.1f} s  new {again.new_items}, sent {again.sent} (must be 0, 0)")
        print(f"ratio submit/bare: {bare_s / took:.2f}")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
