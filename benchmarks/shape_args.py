"""The command line the benchmarks share: counts that must be whole numbers of at least 1 (or 0),
refused as a usage error before anything starts; and the random-shape benchmarks' options
(bench_moves, bench_unseen)."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def at_least(minimum: int) -> Callable[[str], int]:
    """An argparse `type`: a whole number of at least `minimum`, else a usage error naming the
    value (`argument --rounds: must be at least 1 (got 0)`) and exit 2, before the benchmark starts
    anything (a moto server) or divides by the count."""

    def count(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, at least {minimum} (got {text!r})") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum} (got {value})")
        return value

    return count


positive = at_least(1)


def parse(description: str, *, shapes: int, max_items: int, keda_wait: bool = False,
          clearml_idle: bool = False) -> argparse.Namespace:  # fmt: skip
    """--shapes, --first, --max-items and --workers, each count at least 1 (a usage error if not);
    `keda_wait`, `clearml_idle`: --keda-wait, --clearml-idle too (bench_unseen)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--shapes", type=positive, default=shapes, help=f"how many shapes (default {shapes})")
    parser.add_argument("--first", type=int, default=0, help="the first shape's seed (default 0)")
    parser.add_argument("--max-items", type=positive, default=max_items, help=f"items per shape at most (default {max_items})")
    parser.add_argument("--workers", type=positive, default=2, help="processes (default 2)")
    if keda_wait:
        parser.add_argument("--keda-wait", action="store_true",
                            help="also replay tidefleet with keda's p95 as target_wait_s where keda is cheaper")
    if clearml_idle:
        parser.add_argument("--clearml-idle", action="store_true",
                            help="also replay tidefleet with clearml's idle timeout as scale_in_delay_s where only "
                                 "a costlier baseline waits less")  # fmt: skip
    return parser.parse_args()
