"""A child process's tie to its parent's life: the sandbox's emulated nodes and the moto server,
which otherwise ran on for good after a SIGKILL of the sandbox (or of a test run), polling an
emulator that was gone (five agents of one killed sandbox were still polling 75 minutes later).

The parent holds the write end of one pipe for as long as it lives and hands the read end to each
child it starts (`for_child`). The child's `watch` thread reads it: end of file means the parent is
gone, whatever killed it, and the child ends itself and everything it started (`end_tree`).
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Callable

ENV = "TIDEFLEET_LIFELINE_FD"
_pipe: tuple[int, int] | None = None  # (read, write): never closed; the write end goes only when this process does
_lock = threading.Lock()


def for_child() -> tuple[dict[str, str], tuple[int, ...]]:
    """(environment variables, pass_fds) for a `subprocess.Popen` whose child is to end with this
    process. os.pipe's ends are not inherited; pass_fds hands the child the read end alone."""
    global _pipe
    with _lock:
        if _pipe is None:
            _pipe = os.pipe()
        read = _pipe[0]
    return {ENV: str(read)}, (read,)


def watch(on_parent_gone: Callable[[], None]) -> bool:
    """If this process was given a lifeline: a daemon thread calls `on_parent_gone` once its parent
    is gone. False where there is none (the variable unset, or naming no open pipe here)."""
    raw = os.environ.get(ENV, "")
    try:
        fd = int(raw)
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return False
    except (ValueError, OSError):
        return False

    def wait() -> None:
        try:
            while os.read(fd, 1):
                pass
        except OSError:
            pass
        on_parent_gone()

    threading.Thread(target=wait, name="lifeline", daemon=True).start()
    return True


def end_tree() -> None:
    """Kill every process this one started, then end this one at once: whoever would have been
    told or cleaned up after is gone already."""
    import psutil

    try:
        children = psutil.Process().children(recursive=True)
    except psutil.Error:
        children = []
    for child in children:
        try:
            child.kill()
        except psutil.Error:
            pass
    os._exit(1)
