"""What a child process writes to a pseudo-terminal: rich draws its live views and bars only on one."""

from __future__ import annotations

import os
import select


def read_until_closed(fd: int, timeout_s: float) -> bytes:
    """Everything written to the pty whose main side is `fd`, until its child side closes (then
    `fd` is closed too). Read as it comes, since a full pty would stall the writer; an
    AssertionError with the tail read so far if nothing comes for `timeout_s`."""
    out = b""
    while True:
        ready, _, _ = select.select([fd], [], [], timeout_s)
        assert ready, out[-3000:].decode(errors="replace")
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # the child side closed: the run is over
            break
        if not chunk:
            break
        out += chunk
    os.close(fd)
    return out
