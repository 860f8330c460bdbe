"""The calibration workload: hold its slots for the item's run time, recording when it ran.

    python -m tidefleet.sandbox.sleep_work SECONDS EVENTS_FILE

Appends {"item", "node", "start", "end"} to EVENTS_FILE (one JSON line, written at the end):
the sandbox's own record of when each item started, to compare with the simulator's
(`tidefleet.sim.calibration`). Standard library only: it starts once per item.
"""

from __future__ import annotations

import json
import os
import sys
import time


def main(argv: list[str]) -> int:
    start = time.time()
    seconds, events = float(argv[0]), argv[1]
    time.sleep(seconds)
    line = {"item": os.environ.get("TIDEFLEET_ITEM_ID", ""), "node": os.environ.get("TIDEFLEET_NODE_ID", ""),
            "start": start, "end": time.time()}  # fmt: skip
    with open(events, "a") as fh:  # one short append per line: whole lines even from parallel items
        fh.write(json.dumps(line) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
