"""Submit throughput on a moto server: a fresh job, then the same job again (idempotent).

    python benchmarks/bench_submit.py [--items 2000]

Prints items/s of the first submit and the time of the re-submit, which must create and send nothing.
"""

from __future__ import annotations

import argparse
import os
import time

from tidefleet.emulator import start_moto


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=2000)
    args = parser.parse_args()
    server = start_moto()
    os.environ.update(server.env())
    try:
        from tidefleet.cloud.aws.provision import provision
        from tidefleet.config import load_environment
        from tidefleet.jobs import sdk

        env = load_environment("dev")
        provision(env, user_data={"cpu": ""})
        items = sdk.read_items([f"s3://bucket/{i}" for i in range(args.items)])
        start = time.perf_counter()
        first = sdk.submit(env, "bench", "default", items, kick=False)
        took = time.perf_counter() - start
        print(f"submit   {args.items} items: {took:6.1f} s  {args.items / took:6.0f} items/s  sent {first.sent}")
        start = time.perf_counter()
        again = sdk.submit(env, "bench", "default", items, kick=False)
        took = time.perf_counter() - start
        print(f"resubmit {args.items} items: {took:6.1f} s  new {again.new_items}, sent {again.sent} (must be 0, 0)")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
