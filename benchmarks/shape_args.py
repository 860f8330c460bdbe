"""The command line the random-shape benchmarks share (bench_moves, bench_unseen)."""

from __future__ import annotations

import argparse


def parse(description: str, *, shapes: int, max_items: int, keda_wait: bool = False) -> argparse.Namespace:
    """--shapes, --first, --max-items and --workers, each count at least 1 (a usage error if not);
    `keda_wait`: --keda-wait too (bench_unseen)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--shapes", type=int, default=shapes, help=f"how many shapes (default {shapes})")
    parser.add_argument("--first", type=int, default=0, help="the first shape's seed (default 0)")
    parser.add_argument("--max-items", type=int, default=max_items, help=f"items per shape at most (default {max_items})")
    parser.add_argument("--workers", type=int, default=2, help="processes (default 2)")
    if keda_wait:
        parser.add_argument("--keda-wait", action="store_true",
                            help="also replay tidefleet with keda's p95 as target_wait_s where keda is cheaper")
    args = parser.parse_args()
    for flag, value in (("--shapes", args.shapes), ("--max-items", args.max_items), ("--workers", args.workers)):
        if value < 1:
            parser.error(f"{flag}: must be at least 1 (got {value})")
    return args
