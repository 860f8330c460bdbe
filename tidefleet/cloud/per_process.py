"""One client per process for the object store a workload calls again and again (its checkpoints):
a new boto3 client for each save and load cost its build (~8 ms warm) and a new connection (a TLS
handshake on S3), a new Cloud Storage session the credentials' lookup and a new access token, on
every save and load of a loop that checkpoints every few seconds.

Never across `os.fork()`: a child would share the parent's open connections (neither boto3 clients
nor requests sessions are fork-safe), so a client is kept for the process that built it, and a
forked child builds its own."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")


class PerProcess(Generic[T]):
    """The last client `get` built, while this process asks for it with the same key (what the
    client was built from: the variables and the session it reads). Another key builds another and
    drops this one, unclosed (a call of another thread may still be using it). A build that raises
    is made again at the next call."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: tuple[tuple[int, Hashable], T] | None = None
        os.register_at_fork(after_in_child=self.clear)

    def clear(self) -> None:
        # In a forked child: the parent's client is dropped, and the lock is a new one, as one that
        # another of the parent's threads held at the fork would stay held in the child for ever.
        self._lock = threading.Lock()
        self._held = None

    def get(self, key: Hashable, build: Callable[[], T]) -> T:
        mine = (os.getpid(), key)  # a child forked by other means than os.fork() still builds its own
        with self._lock:  # one build at a time: boto3's default session is not thread-safe
            if self._held is None or self._held[0] != mine:
                self._held = (mine, build())
            return self._held[1]
