"""The observe path's fan-out: every key fetched once, results in the keys' order, never more
calls in flight than asked, and no thread at all when one at a time is asked."""

from __future__ import annotations

import threading
import time

import pytest

from tidefleet.fanout import each


@pytest.mark.parametrize(("keys", "at_once"), [([], 4), (["a"], 4), (list("abcdefghij"), 1), (list("abcdefghij"), 3),
                                               (list("abcdefghij"), 16)])  # fmt: skip
def test_each_key_is_fetched_once_in_order_with_at_most_at_once_in_flight(keys, at_once):
    lock, flying, most, threads = threading.Lock(), [0], [0], set()

    def fetch(key: str) -> str:
        with lock:
            flying[0] += 1
            most[0] = max(most[0], flying[0])
            threads.add(threading.get_ident())
        time.sleep(0.01)  # long enough that calls overlap when they may
        with lock:
            flying[0] -= 1
        return key.upper()

    assert each(fetch, keys, at_once) == [k.upper() for k in keys]
    assert most[0] <= max(at_once, 1)
    if at_once == 1 or len(keys) <= 1:
        assert threads <= {threading.get_ident()}  # the caller's own thread: the simulator starts none
