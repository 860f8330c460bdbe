"""A clock for code that sleeps: `monkeypatch.setattr(module, "time", Clock())` in a module that
calls `time.time()` and `time.sleep()`; sleeping moves it, nothing else does."""

from __future__ import annotations

import time


class Clock:
    def __init__(self):
        self.now, self.slept = time.time(), []

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds
