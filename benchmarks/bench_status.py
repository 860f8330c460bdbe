"""`tidefleet status` and `jobs` beside a big job: counters and the jobs index vs reading every record.

    python benchmarks/bench_status.py [--total 250000] [--items 5000]

A job whose counters say `--total` items (all but ten settled), and `--items` item records
actually written (writing 250k records into moto takes longer than the point needs). Status
from the counters reads the job, its pool's heartbeats and the sent chunks: its time does not
depend on the size. The full read (`items=True`, what status did before) is timed on the
records written and scaled to the total. Beside it, a job as big with 3 failed items: status
reads those through the failed-items index (it read every item before, to show why). `tidefleet jobs` reads the job records through the
table's jobs index; the scan it made before (and still makes on a table deployed without the
index) reads every record, and is scaled likewise. `tidefleet cost --since 30d` beside a job of as
many records whose attempts all ended 40 days ago: skipped on its `last_attempt_at`, or read
whole as a job recorded before the stamp was kept (scaled likewise).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import shape_args

from tidefleet.cloud.aws.dynamodb import DynamoStore
from tidefleet.cloud.aws.provision import provision
from tidefleet.config import load_environment
from tidefleet.emulator import start_moto
from tidefleet.jobs import sdk
from tidefleet.jobs.cost_cli import collect
from tidefleet.records import Item, Job

ENV = """
region = "us-east-1"
[pools.cpu]
max = 1
command = "true"
instance_types = [{ type = "c6i.large", weight = 1 }]
[queues.work]
pool = "cpu"
"""


def timed(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--total", type=shape_args.positive, default=250_000, help="items the job's counters say")
    parser.add_argument("--items", type=shape_args.positive, default=5_000, help="item records actually written")
    parser.add_argument("--repeat", type=shape_args.positive, default=5)
    args = parser.parse_args()
    server = start_moto()
    try:
        os.environ.update(server.env())
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "bstatus.toml"
            path.write_text(ENV)
            env = load_environment(str(path))
            provision(env, user_data={"cpu": ""})
            store = DynamoStore(env.name, env.region)
            store.put_job(Job("big", "big", "work", time.time(), args.total, counted=True, n_succeeded=args.total - 10))
            store.create_items([Item("big", f"{n:06d}", ["x"], status="succeeded") for n in range(args.items)], unseen=True)
            counted = timed(lambda: sdk.status(env, "big"), args.repeat)
            read_all = timed(lambda: sdk.status(env, "big", items=True), max(1, args.repeat // 2))
            listed = timed(lambda: sdk.jobs(env), args.repeat)
            scanned = timed(store._scanned_jobs, max(1, args.repeat // 2))
            # After the scan, which is scaled from the records of one job.
            store.put_job(Job("broken", "broken", "work", time.time(), args.total, counted=True,
                              n_succeeded=args.total - 3, n_failed=3))  # fmt: skip
            store.create_items([Item("broken", f"{n:06d}", ["x"], status="failed" if n < 3 else "succeeded",
                                     reason="exit 1" if n < 3 else "") for n in range(args.items)], unseen=True)  # fmt: skip
            failed = timed(lambda: sdk.status(env, "broken"), args.repeat)
            assert len(sdk.status(env, "broken").items) == 3, "the failed items alone"
            ended = time.time() - 40 * 86400
            entry = {"attempt": 1, "node": "i-1", "outcome": "succeeded", "seconds": 60.0, "instance_type": "c6i.large",
                     "spot": True, "slots": 1, "node_slots": 2, "ended_at": ended}  # fmt: skip
            store.put_job(Job("done", "done", "work", ended - 3600, args.items, counted=True, n_succeeded=args.items,
                              last_attempt_at=ended))  # fmt: skip
            store.create_items([Item("done", f"{n:06d}", ["x"], status="succeeded", history=[entry])
                                for n in range(args.items)], unseen=True)  # fmt: skip
            window = time.time() - 30 * 86400
            skipped = timed(lambda: collect(env, since=window, job_id="done"), args.repeat)
            store.table.update_item(Key={"pk": "JOB#done", "sk": "JOB"}, UpdateExpression="REMOVE last_attempt_at")
            cost_read = timed(lambda: collect(env, since=window, job_id="done"), max(1, args.repeat // 2))
    finally:
        server.stop()
    scaled = read_all * args.total / args.items
    print(f"status of a job of {args.total} items, moto server on loopback")
    print(f"from the counters:        {counted * 1000:8.0f} ms")
    print(f"reading every item:       {read_all * 1000:8.0f} ms for {args.items} records, "
          f"~{scaled:.0f} s scaled to {args.total}")
    print(f"ratio read-all/counters:  {scaled / counted:8.0f}")
    print(f"with 3 failed items:      {failed * 1000:8.0f} ms (the failed ones through the index)")
    print(f"ratio read-all/failed:    {scaled / failed:8.0f}")
    scan_scaled = scanned * args.total / args.items
    print(f"jobs through the index:   {listed * 1000:8.0f} ms")
    print(f"jobs by a scan:           {scanned * 1000:8.0f} ms for {args.items} records, ~{scan_scaled:.0f} s scaled to "
          f"{args.total}")
    print(f"ratio scan/index:         {scan_scaled / listed:8.0f}")
    read_scaled = cost_read * args.total / args.items
    print("cost --since 30d beside a job whose attempts ended 40 days ago:")
    print(f"  skipped on its stamp:   {skipped * 1000:8.0f} ms")
    print(f"  read whole (no stamp):  {cost_read * 1000:8.0f} ms for {args.items} records, ~{read_scaled:.0f} s scaled "
          f"to {args.total}")
    print(f"ratio read/stamp:         {read_scaled / skipped:8.0f}")


if __name__ == "__main__":
    main()
