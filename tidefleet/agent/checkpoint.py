"""What a workload imports to cooperate with the agent (the seeds' `check_alive()`).

    from tidefleet.agent import checkpoint
    state = load(checkpoint.checkpoint_uri())          # resume if a previous attempt saved
    for step in steps:
        if checkpoint.should_stop():                    # spot notice, drain or cancel
            save(checkpoint.checkpoint_uri(), state)
            checkpoint.exit_interrupted()               # the item is handed back, not failed
        ...
    checkpoint.complete()                               # done, even if a stop comes now

The contract, for any language: the agent creates the file named by TIDEFLEET_STOP_FILE and
sends SIGTERM to the workload's process group, then waits a bounded grace before SIGKILL.
Stopping is not success: once asked to stop, an attempt succeeds only if it exits 0 AND has
created the file named by TIDEFLEET_DONE_FILE (what `complete()` does); any other end is
"interrupted" (the item goes back to the queue without using a retry). Without a stop request,
exit 0 is success. The checkpoint location (TIDEFLEET_CHECKPOINT_URI) is per item and the same
on every attempt.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

EXIT_INTERRUPTED = 75  # EX_TEMPFAIL: "try again later"

_sigterm = threading.Event()
_watching = False


def _watch_sigterm() -> None:
    # A workload that polls should_stop() wants time to checkpoint: SIGTERM must set the
    # flag instead of killing it. Only possible from the main thread, and only if the
    # workload has not installed its own handler.
    global _watching
    _watching = True
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, lambda *_: _sigterm.set())


def should_stop() -> bool:
    """True once the agent asked this workload to checkpoint and stop."""
    if not _watching:
        _watch_sigterm()
    stop_file = os.environ.get("TIDEFLEET_STOP_FILE")
    return _sigterm.is_set() or bool(stop_file and os.path.exists(stop_file))


def checkpoint_uri() -> str:
    """This item's checkpoint location (s3://... or file://...), the same on every attempt."""
    uri = os.environ.get("TIDEFLEET_CHECKPOINT_URI")
    if not uri:
        raise RuntimeError("TIDEFLEET_CHECKPOINT_URI is not set: run this under `tidefleet agent`")
    return uri


def attempt() -> int:
    """1 on the first attempt of this item; interrupted attempts count too."""
    return int(os.environ.get("TIDEFLEET_ATTEMPT", "1"))


def complete() -> None:
    """Declare this item done: exit 0 after this counts as success even if a stop request came
    in the meantime (without it, an attempt asked to stop is handed back and runs again)."""
    done_file = os.environ.get("TIDEFLEET_DONE_FILE")
    if done_file:
        with open(done_file, "w"):
            pass


def exit_interrupted() -> None:
    """Leave after checkpointing: the agent hands the item back without using a retry."""
    sys.exit(EXIT_INTERRUPTED)
