"""What a workload imports to cooperate with the agent (the seeds' `check_alive()`).

    from tidefleet.agent import checkpoint
    state = checkpoint.load("state.json")               # what a previous attempt saved, or None
    for step in steps:
        if checkpoint.should_stop():                    # spot notice, drain or cancel
            checkpoint.save("state.json", state)
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
import urllib.parse
import urllib.request
from pathlib import Path

from tidefleet.cloud import object_store

EXIT_INTERRUPTED = 75  # EX_TEMPFAIL: "try again later"
# Beside the item's checkpoints: `complete()` leaves it, and an agent that is about to start an
# item again (its last node died before recording the end) finds it and records the success.
COMPLETE_MARKER = ".tidefleet-complete"

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


def _location(name: str, base: str | None) -> tuple[str, str, str]:
    """(scheme, bucket or directory, key) of `name` under this item's checkpoint location."""
    if not name or name.startswith("/") or ".." in name.split("/"):
        raise ValueError(f"checkpoint name {name!r}: give a relative name such as 'state.json'")
    uri = urllib.parse.urlparse(base or checkpoint_uri())
    if uri.scheme == "file":
        return "file", urllib.request.url2pathname(uri.path), name
    if uri.scheme in ("s3", "gs"):
        return uri.scheme, uri.netloc, uri.path.lstrip("/") + name
    raise RuntimeError(f"TIDEFLEET_CHECKPOINT_URI {checkpoint_uri()!r}: only file://, s3:// and gs:// are supported")


def save(name: str, data: bytes | str, *, base: str | None = None) -> None:
    """Store `data` as `name` in this item's checkpoint location (a local file in the sandbox,
    S3 on AWS, GCS on GCP), replacing what was there. `base`: another item's location."""
    scheme, where, key = _location(name, base)
    body = data.encode() if isinstance(data, str) else data
    if scheme == "file":
        path = Path(where) / key
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".partial")  # a kill mid-write leaves the old one whole
        partial.write_bytes(body)
        partial.replace(path)
    else:
        object_store(scheme).put(where, key, body)


def load(name: str, *, base: str | None = None) -> bytes | None:
    """What `save(name, ...)` stored on an earlier attempt of this item, or None."""
    scheme, where, key = _location(name, base)
    if scheme == "file":
        path = Path(where) / key
        return path.read_bytes() if path.exists() else None
    return object_store(scheme).get(where, key)


def attempt() -> int:
    """1 on the first attempt of this item; interrupted attempts count too."""
    return int(os.environ.get("TIDEFLEET_ATTEMPT", "1"))


def complete() -> None:
    """Declare this item done: exit 0 after this counts as success even if a stop request came
    in the meantime (without it, an attempt asked to stop is handed back and runs again), and
    if the node dies before the agent records the end, the next node records the success
    instead of running the item again."""
    done_file = os.environ.get("TIDEFLEET_DONE_FILE")
    if done_file:
        with open(done_file, "w"):
            pass
    if os.environ.get("TIDEFLEET_CHECKPOINT_URI"):
        try:
            save(COMPLETE_MARKER, b"")
        except Exception as err:  # noqa: BLE001 - the work is done; only the crash shortcut is lost
            print(f"tidefleet: could not leave the completion marker ({err})", file=sys.stderr)


def exit_interrupted() -> None:
    """Leave after checkpointing: the agent hands the item back without using a retry."""
    sys.exit(EXIT_INTERRUPTED)
