"""The sandbox demo's workload: one item = one generated text file.

It counts words, finds the most common one, hashes the bytes and counts the primes below a
bound proportional to the text's length (a sieve: real CPU work, a fraction of a second). An input that
is not UTF-8 fails on purpose with a clear reason. Each start and success is appended to
`<workdir>/events.jsonl` (the file's grandparent), the sandbox's own evidence of what ran
where, independent of the job store. Standard library only: it starts once per item.

    python -m tidefleet.sandbox.demo_work WORKDIR/inputs/item-0007.txt
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import sys
import time
from pathlib import Path

EVENTS = "events.jsonl"
PRIMES_PER_WORD = 1000  # sieve bound per word of input: bigger files, more work


def record(workdir: Path, event: str, **fields) -> None:
    line = json.dumps(
        {
            "event": event,
            "item": os.environ.get("TIDEFLEET_ITEM_ID", ""),
            "attempt": os.environ.get("TIDEFLEET_ATTEMPT", ""),
            "node": os.environ.get("TIDEFLEET_NODE_ID", ""),
            "at": time.time(),
            **fields,
        }
    )
    # One write per line with O_APPEND: concurrent items on many nodes never interleave.
    fd = os.open(workdir / EVENTS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def count_primes_below(n: int) -> int:
    sieve = bytearray([1]) * n
    sieve[:2] = b"\x00\x00"
    for p in range(2, int(n**0.5) + 1):
        if sieve[p]:
            sieve[p * p :: p] = bytes(len(range(p * p, n, p)))
    return sum(sieve)


def analyse(data: bytes) -> dict:
    text = data.decode("utf-8")  # raises on the inputs made to fail
    words = text.split()
    top, top_count = collections.Counter(words).most_common(1)[0]
    bound = PRIMES_PER_WORD * len(words)
    return {
        "words": len(words),
        "top_word": top,
        "top_count": top_count,
        "sha256": hashlib.sha256(data).hexdigest(),
        "primes_below": [bound, count_primes_below(bound)],
    }


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tidefleet.sandbox.demo_work INPUT_FILE", file=sys.stderr)
        return 2
    path = Path(argv[0])
    workdir = path.parent.parent
    record(workdir, "start", input=path.name)
    try:
        result = analyse(path.read_bytes())
    except UnicodeDecodeError as err:
        print(
            f"{path.name}: not UTF-8 text (byte {err.object[err.start]:#04x} at offset {err.start}); "
            "this input is made to fail",
            file=sys.stderr,
        )
        return 3
    print(json.dumps(result))
    record(workdir, "success", input=path.name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
