"""The sandbox demo's workload: one item = one generated text file.

It reads the file in pages, as if each came from object storage (a short wait per page),
counting words as it goes; then finds the most common word, hashes the bytes and counts the
primes below a bound proportional to the text's length (a sieve: real CPU work). Between
pages it asks the agent whether to stop (spot notice, drain); if so it saves its progress to
the item's checkpoint and exits "interrupted", and the next attempt, on any node, resumes
there. An input that is not UTF-8 fails on purpose with a clear reason.

Each start, resume and success is appended to `<workdir>/events.jsonl` (the input's
grandparent): the sandbox's own evidence of what ran where, independent of the job store.
Standard library and the agent's checkpoint API only: it starts once per item.

    python -m tidefleet.sandbox.demo_work /abs/WORKDIR/inputs/item-0007.txt    (--help explains it)

The input is named by its absolute path: each item runs in its own folder on a node, which
cannot know the folder the job was submitted from. A relative or unreadable one fails the item
with one line saying so.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

from tidefleet.agent import checkpoint

EVENTS = "events.jsonl"
PAGES = 8
PAGE_FETCH_S = 0.12  # the pretend object-storage latency of one page
PRIMES_PER_WORD = 1000  # sieve bound per word of input: bigger files, more work
USAGE = "usage: python -m tidefleet.sandbox.demo_work INPUT_FILE"
HELP = f"""{USAGE}

The sandbox demo's workload (environments/sandbox.toml), run by the agent with an item's args:
reads INPUT_FILE in {PAGES} pages (a short wait each, as from object storage) counting its words,
then prints one JSON line: its words, most common word, sha256 and the primes below {PRIMES_PER_WORD} x
its words. Asked to stop between pages (a spot notice, a drain), it saves its progress in the
item's checkpoint and exits interrupted; the next attempt, on any node, resumes there.

  INPUT_FILE  the item's UTF-8 text file, by its absolute path (an item runs in its own folder
              on a node, which cannot know the folder the job was submitted from)

Each start, resume and success is appended to {EVENTS} in the input's grandparent folder.
Exit 0: done; 2: bad arguments, or an input it cannot read; 3: not UTF-8 (made to fail);
75: interrupted (checkpointed)."""


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


def checkpoint_file() -> Path | None:
    """The item's checkpoint as a local file (the sandbox's file:// checkpoints); None elsewhere."""
    uri = os.environ.get("TIDEFLEET_CHECKPOINT_URI", "")
    if not uri.startswith("file://"):
        return None
    return Path(urllib.request.url2pathname(urllib.parse.urlparse(uri).path)) / "progress.json"


def count_words(text: str, workdir: Path, saved: Path | None) -> collections.Counter:
    """Word counts page by page, resuming from and saving to the checkpoint."""
    words = text.split()
    page_size = -(-len(words) // PAGES)
    counts, page = collections.Counter(), 0
    if saved is not None and saved.exists():
        state = json.loads(saved.read_text())
        counts, page = collections.Counter(state["counts"]), state["page"]
        record(workdir, "resume", page=page)
    while page < PAGES:
        if checkpoint.should_stop():
            if saved is not None:
                saved.write_text(json.dumps({"page": page, "counts": counts}))
            checkpoint.exit_interrupted()
        time.sleep(PAGE_FETCH_S)
        counts.update(words[page * page_size : (page + 1) * page_size])
        page += 1
    return counts


def analyse(data: bytes, workdir: Path) -> dict:
    text = data.decode("utf-8")  # raises on the inputs made to fail
    counts = count_words(text, workdir, checkpoint_file())
    (top, top_count), words = counts.most_common(1)[0], sum(counts.values())
    bound = PRIMES_PER_WORD * words
    return {
        "words": words,
        "top_word": top,
        "top_count": top_count,
        "sha256": hashlib.sha256(data).hexdigest(),
        "primes_below": [bound, count_primes_below(bound)],
    }


def main(argv: list[str]) -> int:
    if "-h" in argv or "--help" in argv:
        print(HELP)
        return 0
    if len(argv) != 1:
        print(f"demo_work: takes 1 argument, INPUT_FILE (got {len(argv)}); {USAGE}", file=sys.stderr)
        return 2
    path = Path(argv[0])
    if not path.is_absolute():  # it would be read from this attempt's own folder on the node
        print(f"{path}: a relative path; an item runs in its own folder on a node, which cannot know the "
              "folder it was submitted from: name the input by its absolute path", file=sys.stderr)  # fmt: skip
        return 2
    try:
        data = path.read_bytes()
    except OSError as err:
        print(f"{path}: cannot read it ({err.strerror})", file=sys.stderr)
        return 2
    workdir = path.parent.parent
    record(workdir, "start", input=path.name)
    try:
        result = analyse(data, workdir)
    except UnicodeDecodeError as err:
        print(
            f"{path.name}: not UTF-8 text (byte {err.object[err.start]:#04x} at offset {err.start}); "
            "this input is made to fail",
            file=sys.stderr,
        )
        return 3
    print(json.dumps(result))
    record(workdir, "success", input=path.name)
    checkpoint.complete()  # at once: from here a stop request or a lost node cannot make it run again
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
