"""Ctrl-C tests: children that take SIGINT as a foreground job at a terminal does, and what a child
that did not end on it was doing."""

from __future__ import annotations

import os
import sys
from pathlib import Path

# Sets SIGINT to its default, unblocked, then becomes the command: an ignored SIGINT survives an
# exec, a default one stays default (a `preexec_fn` would do it in the forked child, unsafe beside
# the threads a test runs).
_DEFAULT_SIGINT = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                   "signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT]); os.execv(sys.argv[1], sys.argv[1:])")  # fmt: skip


def as_at_a_terminal(argv: list[str]) -> list[str]:
    """`argv` run with SIGINT as a foreground job at a terminal has it: at its default, unblocked.
    A test run started as a background job of a shell without job control (a CI script's `&`) has
    it ignored, every child inherits that, and Python then leaves it ignored: a Ctrl-C test would
    wait on a child that never sees the signal."""
    return [sys.executable, "-c", _DEFAULT_SIGINT, *argv]


def group_state(pgid: int) -> str:
    """A line per process of group `pgid`: its command, state, kernel wait and signal masks (what
    a child that did not end on a signal was doing, for the failure message)."""
    lines = []
    for proc in Path("/proc").iterdir():
        try:
            if not proc.name.isdigit() or os.getpgid(int(proc.name)) != pgid:
                continue
            status = dict(line.split(":\t", 1) for line in (proc / "status").read_text().splitlines() if ":\t" in line)
            fields = " ".join(f"{k}={status.get(k, '?').strip()}" for k in ("State", "Threads", "SigBlk", "SigIgn", "SigCgt"))
            command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:200]
            lines.append(f"{proc.name} {fields} wchan={(proc / 'wchan').read_text()} {command}")
        except (OSError, ValueError):
            continue  # gone meanwhile
    return "\n".join(lines) or f"no process left in group {pgid}"
