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
exit 0 is success and any other exit (75 too) is a failure that uses a retry. The checkpoint
location (TIDEFLEET_CHECKPOINT_URI) is per item and the same on every attempt; run outside the
agent, a workload checkpoints to a new local folder (`checkpoint_uri`).

PyTorch gives each DataLoader worker process its own SIGTERM handler, so the signal that reaches
the whole process group would end the workers and crash the loop before it saves:
`DataLoader(..., worker_init_fn=checkpoint.ignore_stop)` keeps them serving through the notice.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import itertools
import os
import re
import secrets
import signal
import sys
import tempfile
import threading
import urllib.parse
import urllib.request
from pathlib import Path

from tidefleet.cloud import object_store

# EX_TEMPFAIL, "try again later": a hand-back only once the agent asked to stop; otherwise a
# failure like any other exit code, which uses a retry.
EXIT_INTERRUPTED = 75
# Beside the item's checkpoints: `complete()` leaves it, and an agent that is about to start an
# item again (its last node died before recording the end) finds it and records the success.
COMPLETE_MARKER = ".tidefleet-complete"
# A save to a local folder writes a file of its own beside its target (so two saves at once never
# share one), holding a lock on it, then renames it over the target: last writer wins, whole. A
# killed save's file is unlocked: the next save in that folder removes it. Hidden, and never a
# name load() or save() accepts. An older version's '<name>.partial' is never swept: 'x.partial' is
# also a name a user may save, and it was unlocked, so one a running old save holds looks the same.
PARTIAL = ".tidefleet-{token}.{name}.partial"

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


def _asked_by_agent() -> bool:
    stop_file = os.environ.get("TIDEFLEET_STOP_FILE")
    return bool(stop_file and os.path.exists(stop_file))


def ignore_stop(*_) -> None:
    """Let this process live through the agent's stop request: for the worker processes of a
    process that polls `should_stop()` and ends them once it has saved, such as a PyTorch
    DataLoader's (`DataLoader(..., worker_init_fn=checkpoint.ignore_stop)`, or call it from your own
    worker_init_fn; not in the process that polls `should_stop()`). The agent's notice (the SIGTERM
    to the whole process group, once its stop file exists) is ignored; any other SIGTERM, a later
    one or the DataLoader ending its workers, ends the process as usual, as does SIGKILL."""

    def on_sigterm(signum, frame) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # one notice: the next SIGTERM ends it
        if not _asked_by_agent():
            os.kill(os.getpid(), signal.SIGTERM)

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, on_sigterm)


def checkpoint_uri() -> str:
    """This item's checkpoint location (s3://... or file://...), the same on every attempt. Run
    outside the agent (on a laptop), a new local folder for this run, named once on stderr."""
    if uri := os.environ.get("TIDEFLEET_CHECKPOINT_URI"):
        return uri
    if os.environ.get("TIDEFLEET_ITEM_ID"):  # the agent sets both: never lose its checkpoints locally
        raise RuntimeError("TIDEFLEET_CHECKPOINT_URI is not set though TIDEFLEET_ITEM_ID is; "
                           "keep the agent's environment when a wrapper starts the workload")  # fmt: skip
    return _local_uri()


def _local_uri() -> str:
    # A new folder: a local run starts from nothing, as an item's first attempt does, never from
    # what an older run left. Made at the first save (a run that only loads leaves none behind),
    # and put in the environment, so processes this one starts from then on (torchrun's ranks, a
    # spawned pool) share it, as an item's processes share its location, and say nothing more.
    folder = Path(tempfile.mkdtemp(prefix="tidefleet-checkpoints-"))
    print(f"tidefleet: not run by the agent (TIDEFLEET_CHECKPOINT_URI is not set): checkpoints go to {folder}; "
          "set TIDEFLEET_CHECKPOINT_URI=file:///path/to/folder/ to choose the folder (and resume from it)",
          file=sys.stderr, flush=True)  # fmt: skip
    os.environ["TIDEFLEET_CHECKPOINT_URI"] = folder.as_uri() + "/"
    return os.environ["TIDEFLEET_CHECKPOINT_URI"]


def _nothing_saved_locally(base: str | None) -> bool:
    """Run outside the agent, before its first save: there is nothing to load yet."""
    return base is None and not os.environ.get("TIDEFLEET_CHECKPOINT_URI") and not os.environ.get("TIDEFLEET_ITEM_ID")


# One rule on every backend, so a name means one file, the same on a laptop and in a bucket.
NAME_RULE = ("a checkpoint name is a relative path such as 'state.json' or 'ckpt/step-100.pt': parts between single "
             "slashes, none empty, '.' or '..', no control character (NUL, newline, tab...), at most 200 bytes a part and 512 in all, not starting with "
             "'.tidefleet-' (tidefleet's own files)")  # fmt: skip
RESERVED = ".tidefleet-"
CONTROL = re.compile(r"[\x00-\x1f\x7f]")  # GCS refuses a newline in a name; a file name would keep it
MAX_PART, MAX_NAME = 200, 512  # bytes (UTF-8): a file name's limit is 255, a key's 1024 with its prefix


def _check_name(name: str, *, marker: bool = False) -> None:
    """Refuse a name outside NAME_RULE (`marker`: the completion marker is allowed), before
    anything is written."""
    if not isinstance(name, str):
        raise TypeError(f"checkpoint name {name!r}: a name is a str such as 'state.json', not a {type(name).__name__}")
    parts = name.split("/")
    why = (
        "it is empty" if not name
        else f"it has the control character {CONTROL.search(name).group()!r}" if CONTROL.search(name)
        else "it starts with '/'" if name.startswith("/")
        else "it ends with '/'" if name.endswith("/")
        else "it has an empty part ('//')" if "" in parts
        else f"a part is {next(p for p in parts if p in ('.', '..'))!r}" if {".", ".."} & set(parts)
        else f"a part is over {MAX_PART} bytes" if any(len(p.encode()) > MAX_PART for p in parts)
        else f"it is over {MAX_NAME} bytes" if len(name.encode()) > MAX_NAME
        else f"a part starts with {RESERVED!r}" if any(p.startswith(RESERVED) for p in parts)
        and not (marker and name == COMPLETE_MARKER)
        else None
    )  # fmt: skip
    if why:
        shown = repr(name) if len(name) <= 60 else f"{name[:10] + '...'!r} ({len(name)} characters)"
        raise ValueError(f"checkpoint name {shown}: {why}: {NAME_RULE}")


def _location(name: str, base: str | None, *, marker: bool = False) -> tuple[str, str, str]:
    """(scheme, bucket or directory, key) of `name` under this item's checkpoint location."""
    _check_name(name, marker=marker)
    given = base or checkpoint_uri()
    what = f"checkpoint location {given!r}" if base else f"TIDEFLEET_CHECKPOINT_URI {given!r}"
    uri = urllib.parse.urlparse(given)
    if uri.query or uri.fragment or given.endswith(("?", "#")):  # cut off as a URL's: two runs would share a folder
        raise ValueError(f"{what} has a {'?' if '?' in given else '#'}, which a location's URL reads as its query or "
                         "fragment and drops: name the folder without '?' and '#'")  # fmt: skip
    if uri.scheme == "file":
        # file://runA/ is the host runA and the folder /: two runs would share (and load) one folder
        if uri.netloc not in ("", "localhost"):
            raise ValueError(f"{what} names the host {uri.netloc!r}: a file:// location is a folder on this machine, "
                             "written with three slashes: file:///absolute/path/")  # fmt: skip
        if not uri.path.startswith("/"):
            raise ValueError(f"{what} is a relative path: write the folder's absolute path, file:///absolute/path/")
        folder = urllib.request.url2pathname(uri.path)
        if os.path.exists(folder) and not os.path.isdir(folder):  # save would fail mid-mkdir, load find nothing
            raise ValueError(f"{what} is a file, not a folder: point it at a folder (file:///absolute/path/), "
                             "where the checkpoints go")  # fmt: skip
        _check_not_nested(Path(folder), name, what)
        return "file", folder, name
    if uri.scheme in ("s3", "gs"):
        if not uri.netloc:
            raise ValueError(f"{what} names no bucket: write {uri.scheme}://bucket/prefix/")
        # A folder, as a file:// location is: s3://b/runs/exp1 + state.json is runs/exp1/state.json
        prefix = uri.path.strip("/")
        return uri.scheme, uri.netloc, f"{prefix}/{name}" if prefix else name
    raise ValueError(f"{what} is not file://, s3:// or gs://: write file:///absolute/path/, s3://bucket/prefix/ "
                     "or gs://bucket/prefix/")  # fmt: skip


def _check_not_nested(folder: Path, name: str, what: str) -> None:
    """Refuse, before anything is written, a name that is a checkpoint on one side and a folder of
    checkpoints on the other ('a' and 'a/b'): S3 and GCS keys can be both, a file cannot."""
    rule = "on file:// a name cannot be both a checkpoint and a folder of checkpoints (S3 and GCS allow it)"
    parts = name.split("/")
    for depth in range(1, len(parts)):
        above = "/".join(parts[:depth])
        if (folder / above).exists() and not (folder / above).is_dir():
            raise ValueError(f"checkpoint name {name!r}: {above!r} is already a checkpoint in {what}, and {rule}: "
                             f"give {name!r} a name outside {above + '/'!r} (or remove the checkpoint {above!r} first)")  # fmt: skip
    if (folder / name).is_dir():
        held = _a_checkpoint_under(folder, name)
        holds = f" (it holds {held!r})" if held else ""
        raise ValueError(f"checkpoint name {name!r}: {name!r} is already a folder of checkpoints in {what}{holds}, "
                         f"and {rule}: give {name!r} another name (or remove the folder {name!r} first)")  # fmt: skip


def _a_checkpoint_under(folder: Path, name: str) -> str | None:
    """The name of one checkpoint saved under the folder `name` (not a partial), to show it."""
    for inside, _, files in os.walk(folder / name):
        for file in files:
            if not file.startswith(RESERVED):
                return Path(inside, file).relative_to(folder).as_posix()
    return None


def save(name: str, data: bytes | str, *, base: str | None = None) -> None:
    """Store `data` as `name` in this item's checkpoint location (a local file in the sandbox,
    S3 on AWS, GCS on GCP), replacing what was there. `base`: another item's location. `name`
    follows NAME_RULE; `data` is bytes (or a bytearray, a memoryview) or str (saved as UTF-8)."""
    _save(name, data, base)


def _save(name: str, data: bytes | str, base: str | None, *, marker: bool = False) -> None:
    _check_name(name, marker=marker)
    if isinstance(data, str):
        body = data.encode()
    elif isinstance(data, bytes | bytearray | memoryview):
        body = bytes(data)
    else:
        raise TypeError(f"checkpoint.save({name!r}, ...) got a {type(data).__name__}: save takes bytes or str "
                        "(json.dumps(...) a dict; torch.save(...) into an io.BytesIO and give its getvalue())")  # fmt: skip
    scheme, where, key = _location(name, base, marker=marker)
    if scheme == "file":
        _save_file(Path(where) / key, body)
    else:
        with _said("save", scheme, where, key):
            object_store(scheme).put(where, key, body)


@contextlib.contextmanager
def _said(verb: str, scheme: str, where: str, key: str):
    """A cloud's error leaves as its own (a workload catching botocore's or Google's types still
    does), with a note naming the checkpoint and what to check: its traceback said only the call."""
    try:
        yield
    except Exception as err:
        where_to = f"{scheme}://{where}/{key}"
        err.add_note(f"tidefleet: checkpoint {verb} of {where_to} failed ({type(err).__name__}); on a node, check that "
                     f"its role may use the item's checkpoint prefix and the bucket exists; elsewhere, your credentials "
                     f"and TIDEFLEET_CHECKPOINT_URI. A failed periodic save can be caught and the work go on.")  # fmt: skip
        raise


def _save_file(path: Path, body: bytes) -> None:
    new_folders = list(itertools.takewhile(lambda folder: not folder.exists(), [path.parent, *path.parent.parents]))
    path.parent.mkdir(parents=True, exist_ok=True)
    _sweep(path.parent)
    fd, partial = _own_partial(path)
    try:
        view = memoryview(body)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
        os.replace(partial, path)  # still locked: no sweep removes it before the rename
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise
    finally:
        os.close(fd)
    # The rename is an entry of its folder, and a new folder an entry of the one above: a power loss
    # can undo them until those folders are synced.
    for folder in [path.parent, *(new.parent for new in new_folders)]:
        _fsync_folder(folder)


# Some filesystems refuse to fsync a folder (EINVAL, ENOTSUP), and a folder may be writable but not
# readable (EACCES): there the rename is as durable as the filesystem makes it, and the save stands.
NO_FOLDER_FSYNC = {errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EACCES}


def _fsync_folder(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as err:
        if err.errno not in NO_FOLDER_FSYNC:
            raise


def _own_partial(path: Path) -> tuple[int, str]:
    """A new file beside `path`, open and locked (a sweep between its creation and its lock
    removes it: then another)."""
    while True:
        partial = str(path.with_name(PARTIAL.format(token=secrets.token_hex(6), name=path.name)))
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if os.stat(partial).st_ino == os.fstat(fd).st_ino:
                return fd, partial
        except (BlockingIOError, FileNotFoundError):
            pass
        os.close(fd)


def _sweep(folder: Path) -> None:
    """Remove what killed saves left in `folder`: their files, which no save holds locked."""
    for left in folder.glob(PARTIAL.format(token="*", name="*")):
        try:
            fd = os.open(left, os.O_RDONLY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            left.unlink(missing_ok=True)
        except OSError:  # held by a save under way, or not ours to remove
            pass
        finally:
            os.close(fd)


def load(name: str, *, base: str | None = None) -> bytes | None:
    """What `save(name, ...)` stored on an earlier attempt of this item, or None."""
    if _nothing_saved_locally(base):
        _check_name(name, marker=True)  # the name's rules all the same
        return None
    scheme, where, key = _location(name, base, marker=True)  # the agent reads the marker
    if scheme == "file":
        path = Path(where) / key
        return path.read_bytes() if path.exists() else None
    with _said("load", scheme, where, key):
        return object_store(scheme).get(where, key)


def attempt() -> int:
    """1 on the first attempt of this item; interrupted attempts count too."""
    return int(os.environ.get("TIDEFLEET_ATTEMPT", "1"))


def complete() -> None:
    """Declare this item done: exit 0 after this counts as success even if a stop request came
    in the meantime (without it, an attempt asked to stop is handed back and runs again), and
    if the node dies before the agent records the end, the next node records the success
    instead of running the item again. A nonzero exit after it is still a failure: the retry
    runs the item again."""
    done_file = os.environ.get("TIDEFLEET_DONE_FILE")
    if done_file:
        with open(done_file, "w"):
            pass
    if os.environ.get("TIDEFLEET_CHECKPOINT_URI"):
        try:
            _save(COMPLETE_MARKER, str(attempt()), None, marker=True)  # which attempt: only a lost one's counts
        except Exception as err:  # noqa: BLE001 - the work is done; only the crash shortcut is lost
            print(f"tidefleet: could not leave the completion marker ({err})", file=sys.stderr)


def exit_interrupted() -> None:
    """Leave after checkpointing (exit 75). Once the agent asked to stop (`should_stop()`), it
    hands the item back without using a retry; without a stop request this is a failure that uses
    a retry (75 is an exit code like any other), and the line it prints on stderr says why."""
    if not should_stop():
        print(f"tidefleet: exit_interrupted() but this process was not asked to stop: exit {EXIT_INTERRUPTED} counts "
              "as a failure that uses a retry unless the agent asks the workload to stop before it ends",
              file=sys.stderr, flush=True)  # fmt: skip
    sys.exit(EXIT_INTERRUPTED)
