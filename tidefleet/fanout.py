"""One call per key, several in flight: for cloud reads that have no batch form (SQS queue
attributes, a pool's heartbeats, a group's scaling activities). No SDK import here."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

K = TypeVar("K")
V = TypeVar("V")


def each(fetch: Callable[[K], V], keys: Sequence[K], at_once: int) -> list[V]:
    """fetch(key) for every key, results in the keys' order, at most `at_once` calls in flight.
    With at_once 1 (or one key) no thread is started: the simulator ticks ~10^5 times."""
    if at_once <= 1 or len(keys) <= 1:
        return [fetch(key) for key in keys]
    with ThreadPoolExecutor(min(at_once, len(keys)), thread_name_prefix="fanout") as pool:
        return list(pool.map(fetch, keys))
