"""The calibration workload: hold its slots for the item's run time, recording when it ran.

    python -m tidefleet.sandbox.sleep_work SECONDS EVENTS_FILE    (--help explains them)

Appends {"item", "node", "start", "began", "end"} to EVENTS_FILE (one JSON line, written when the
item is done): the sandbox's own record of when each item first started (`start`), when its last
attempt started (`began`) and when it ended, to compare with the simulator's
(`tidefleet.sim.calibration`). Asked to stop (the agent's stop file or SIGTERM: a spot notice, a
preemption, a move), it saves how long it has slept in its checkpoint location and exits
interrupted; the next attempt sleeps only the rest. The agent's checkpoint contract
(`tidefleet.agent.checkpoint`) in the standard library only: it starts once per item.
"""

from __future__ import annotations

import json
import math
import os
import signal
import sys
import threading
import time
import urllib.parse
from pathlib import Path

EXIT_INTERRUPTED = 75  # tidefleet.agent.checkpoint.EXIT_INTERRUPTED
STEP_S = 0.1  # how often it looks for a stop request
USAGE = "usage: python -m tidefleet.sandbox.sleep_work SECONDS EVENTS_FILE"
HELP = f"""{USAGE}

The calibration workload (environments/calibration.toml), run by the agent with an item's args:
holds the item's slots SECONDS, then appends one JSON line {{"item", "node", "start", "began",
"end"}} to EVENTS_FILE, the sandbox's own record of when the item ran.

  SECONDS      the item's run time: a number of seconds, 0 or more (e.g. 12.5)
  EVENTS_FILE  the file the line is appended to (created if missing)

Asked to stop (the agent's stop file, or SIGTERM), it keeps how long it slept in the item's
file:// checkpoint (TIDEFLEET_CHECKPOINT_URI) and exits {EXIT_INTERRUPTED} (interrupted); the next attempt
sleeps only the rest. Exit 0: done; 2: bad arguments."""


def _arguments(argv: list[str]) -> tuple[float, str] | str:
    """(SECONDS, EVENTS_FILE), or the one line that says what is wrong with them."""
    if len(argv) != 2:
        return f"sleep_work: takes 2 arguments, SECONDS and EVENTS_FILE (got {len(argv)}); {USAGE}"
    try:
        seconds = float(argv[0])
    except ValueError:
        seconds = math.nan
    if not 0 <= seconds < math.inf:
        return f"sleep_work: SECONDS must be a number of seconds, 0 or more (got {argv[0]!r}); {USAGE}"
    return seconds, argv[1]


def _progress_file() -> Path | None:
    """Where this item's progress is kept: its file:// checkpoint location (the sandbox's)."""
    uri = urllib.parse.urlparse(os.environ.get("TIDEFLEET_CHECKPOINT_URI", ""))
    return Path(urllib.parse.unquote(uri.path)) / "sleep_work.json" if uri.scheme == "file" else None


def main(argv: list[str]) -> int:
    began = time.time()
    if "-h" in argv or "--help" in argv:
        print(HELP)
        return 0
    if isinstance(parsed := _arguments(argv), str):
        print(parsed, file=sys.stderr)
        return 2
    seconds, events = parsed
    progress = _progress_file()
    state = json.loads(progress.read_text()) if progress and progress.exists() else {"start": began, "slept_s": 0.0}
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stop_file = os.environ.get("TIDEFLEET_STOP_FILE")
    until = began + max(0.0, seconds - state["slept_s"])
    while (now := time.time()) < until:
        if stop.wait(min(STEP_S, until - now)) or (stop_file and os.path.exists(stop_file)):
            if progress is None:
                return EXIT_INTERRUPTED  # nowhere to keep it: the next attempt sleeps it all again
            state["slept_s"] += time.time() - began
            progress.parent.mkdir(parents=True, exist_ok=True)
            partial = progress.with_name(progress.name + ".partial")  # a kill mid-write leaves the old one whole
            partial.write_text(json.dumps(state))
            partial.replace(progress)
            return EXIT_INTERRUPTED
    if done_file := os.environ.get("TIDEFLEET_DONE_FILE"):  # done, even if a stop comes now
        Path(done_file).touch()
    line = {"item": os.environ.get("TIDEFLEET_ITEM_ID", ""), "node": os.environ.get("TIDEFLEET_NODE_ID", ""),
            "start": state["start"], "began": began, "end": time.time()}  # fmt: skip
    with open(events, "a") as fh:  # one short append per line: whole lines even from parallel items
        fh.write(json.dumps(line) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
