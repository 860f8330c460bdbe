"""The job SDK: submit a job's items, follow its progress, cancel it, read its logs, send
its dead-lettered items back, and list the nodes working on it.

A job is a name, a queue and a list of items; each item is a list of string arguments
appended to the pool's command. Submitting is idempotent: the job id derives from the name
(unless given) and item ids from positions (unless given), so running the same submit twice
creates and sends nothing twice, and a submit that stopped midway (Ctrl-C, a crash, throttling)
is continued by running it again.

How a submit writes (`submit`), designed for 250,000 items in minutes: items are checked first
(`read_items` spools a file to disk, so memory stays flat), the job record is written, then the
items go in CHUNKs, THREADS chunks at once. Per chunk: record its items as `queued` in batch
writes, send its messages in batches, then write one mark "chunk k sent". Why in that order:
an agent drops a message whose item has no record, so the record comes first; and the mark,
one write per chunk instead of one update per item, is what a re-run trusts.
  - A job this call created has no items yet, so its chunks are written without conditions
    (DynamoDB's BatchWriteItem has none) and nothing is read.
  - A re-run skips the marked chunks without reading them. Chunks are started in order and at
    most `window` (the threads of the first run) are unmarked at once, so only the first
    `window` unmarked chunks can hold records: those are read, missing items created with a
    condition, and items still `queued` sent again; every later chunk is written as new.
  - Crash windows: before a chunk's records, nothing of it exists; between records and send,
    its items are recorded, not sent, and a re-run sends them; between send and mark, a re-run
    sends that chunk again: the one duplicate, at most a chunk per thread, and harmless (the
    agent drops a message whose item is final and fences a running one). Nothing is ever
    recorded and never sent once a re-run has finished; `status` shows a job whose submit has
    not finished as submitting.
Jobs submitted item by item by earlier versions (`Job.chunk` 0) are continued item by item.

The message of an item carries its failure and interruption counts (`ItemMessage`): the
agent re-sends a message to retry or hand back an item, so the queue's delivery count (and
its redrive / dead-letter policy) only ever sees lost nodes, never polite interruptions.
The cloud is the environment's adapters (`tidefleet.cloud.for_env`): queues, job store, item
logs, and the scaler's kick (an asynchronous invoke on AWS, a message on the scaler's trigger
topic on GCP).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import io
import json
import logging
import os
import re
import sqlite3
import sys
import tempfile
import threading
import time
import urllib.request
import weakref
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import asdict, dataclass, replace
from itertools import islice
from pathlib import Path

from tidefleet import naming
from tidefleet.cloud import for_env
from tidefleet.config import NODE_LOSSES_TOLERATED, Environment, Queue, env_argument
from tidefleet.jobs.identity import identify
from tidefleet.jobs.spec import JobSpec, not_text
from tidefleet.jobs.spec import problems as spec_problems
from tidefleet.ports import Backlog, Cloud, Delivery
from tidefleet.records import FINAL, Fence, Heartbeat, Item, ItemWrite, Job
from tidefleet.resources import PUBSUB_RETENTION_S, SQS_RETENTION_S, redrive_receives

SEND_BATCH = 10  # messages per receive of the dead-letter queue (SQS's most)
CHUNK = 500  # items per submit chunk: one progress mark each (`submit`)
THREADS = 8  # chunks written at once; a crash leaves at most this many chunks uncertain
STOP_WAIT_S = 20  # on Ctrl-C: how long the chunks in flight may take to finish (and be counted)
log = logging.getLogger("tidefleet.jobs")


class JobError(Exception):
    """A user mistake or a missing resource; the message says what to do."""


def _advised(fn):
    """A cloud error that leaves the SDK carries the line the CLI prints for it (`Cloud.explain`)
    as a note (PEP 678): still the cloud library's own exception, so callers that catch
    botocore's or Google's types still do, and an uncaught one's traceback ends in what to do."""

    def advise(cloud: Cloud, err: BaseException) -> None:
        line = cloud.explain(err)
        if line not in getattr(err, "__notes__", ()):  # one SDK function calling another
            err.add_note(line)

    if inspect.isgeneratorfunction(fn):

        @functools.wraps(fn)
        def generator(env: Environment, *args, **kwargs):
            _an_environment(env)
            cloud = kwargs.get("cloud") or for_env(env)  # the caller's, else one for its errors and words
            try:
                return (yield from fn(env, *args, **kwargs))
            except cloud.errors as err:
                advise(cloud, err)
                raise

        return generator

    @functools.wraps(fn)
    def call(env: Environment, *args, **kwargs):
        _an_environment(env)
        cloud = kwargs.get("cloud") or for_env(env)  # the caller's, else one for its errors and words
        try:
            return fn(env, *args, **kwargs)
        except cloud.errors as err:
            advise(cloud, err)
            raise

    return call


def _an_environment(env) -> None:
    """TypeError for an environment given by name or path (the CLI's --env), not loaded: every
    public function that takes one checks it here (`_advised`), before it is used."""
    if not isinstance(env, Environment):
        name = str(env) if isinstance(env, (str, os.PathLike)) else "NAME"
        raise TypeError(f"env: must be an Environment (got {_short(env)}); load it first: "
                        f"env = tidefleet.config.load_environment({name!r})")  # fmt: skip


class SubmitInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped a submit while `unconfirmed` chunks were still in flight: each may have sent
    some, all or none of its items; the same submit again continues the job."""

    def __init__(self, unconfirmed: int):
        super().__init__(unconfirmed)
        self.unconfirmed = unconfirmed


MAX_COUNTER = 2**53 - 1  # an item message's counters (seq, failures, ...); exact in any JSON reader too
COPY_NAME = re.compile(r"[0-9]{1,16}\.[0-9]{1,16}")  # `ItemMessage.copy`


@dataclass(frozen=True)
class ItemMessage:
    job: str
    item: str
    args: list[str]
    failures: int = 0
    interruptions: int = 0
    lost: int = 0  # attempts whose node died holding the item (see NODE_LOSSES_TOLERATED)
    seq: int = 0  # each re-send (retry, hand-back) carries seq + 1: a stale duplicate is known by it
    # A fresh copy of a running attempt's message (`Agent._refresh`): "<attempt>.<n>", the n-th
    # copy that attempt sent, recorded on the item before it is sent so any node knows it for the
    # holder's; "" (left out of the body) for every other message.
    copy: str = ""

    def body(self) -> str:
        fields = asdict(self)
        if not self.copy:
            del fields["copy"]  # bodies as they were before copies existed
        return json.dumps(fields, separators=(",", ":"))

    @classmethod
    def parse(cls, body: str) -> ItemMessage:
        """The message, or ValueError saying what is wrong with it (a poison message)."""
        try:
            return cls._parse(body)
        except RecursionError:  # json.loads (or printing what it read): a few KB of '[' is enough
            raise ValueError(f"not JSON (nested too deeply to read): {body[:200]!r}") from None

    @classmethod
    def _parse(cls, body: str) -> ItemMessage:
        try:
            data = json.loads(body)
        except ValueError:
            raise ValueError(f"not JSON: {body[:200]!r}") from None
        if not isinstance(data, dict) or not {"job", "item", "args"} <= data.keys():
            raise ValueError(f"not a tidefleet item message: {body[:200]!r}")
        for key in ("job", "item"):  # ids become log stream names and paths on the node
            if not isinstance(data[key], str) or id_problem(data[key]):
                raise ValueError(f"{key}: not a valid id ({data[key]!r})")
        args = data["args"]
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise ValueError(f"args: must be a list of strings (got {str(args)[:200]})")
        if problems := arg_problems(args):  # submit's check: a NUL byte, a lone surrogate
            raise ValueError(problems[0])
        counters = {k: data[k] for k in ("failures", "interruptions", "lost", "seq") if k in data}
        for key, value in counters.items():
            # Bounded: the store keeps them as numbers (DynamoDB: 38 digits; Firestore: 64 bits),
            # so a huge one would fail every write of the item instead of being one poison line.
            if type(value) is not int or not 0 <= value <= MAX_COUNTER:
                raise ValueError(f"{key}: must be a whole number from 0 to {MAX_COUNTER} (got {str(value)[:40]})")
        copy = data.get("copy", "")
        if not isinstance(copy, str) or not (copy == "" or COPY_NAME.fullmatch(copy)):
            raise ValueError(f"copy: must be '<attempt>.<n>' (got {str(copy)[:40]!r})")
        return cls(data["job"], data["item"], list(args), **counters, copy=copy)


@dataclass(frozen=True)
class ItemSpec:
    item_id: str
    args: list[str]


# -- reading items ------------------------------------------------------------------------
# Ids name log streams (job/item/attempt), Firestore documents and checkpoint paths, so one
# rule for item and job ids: no '/', ':', whitespace, control characters or '..'.
MAX_ID = 128
ID_RULE = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._-]{{0,{MAX_ID - 1}}}")
ID_HELP = f"use 1-{MAX_ID} letters, digits, '.', '_' or '-', starting with a letter or digit, without '..'"
MAX_LINE_BYTES = 1 << 20  # 1 MiB: a line is read whole only up to this (memory); the item bound below is tighter
# An item is a few arguments, not its data. Its record holds the args and, over its life, the
# claim (node, lease, message id), one history entry per attempt (a few hundred bytes each, the
# reason capped at ~300 characters of output), the gang's members and the last reason; its message
# carries the args too. The tightest limits: a DynamoDB item is at most 400 KB (attribute names
# included) and an SQS message 256 KiB; a Firestore document 1 MiB and a Pub/Sub message 10 MB.
# 64 KiB of id and args (JSON, non-ASCII escaped: never smaller than what is stored or sent)
# leaves over 300 KB for the rest on DynamoDB and fits a message with room to spare: one bound
# for both clouds.
MAX_ITEM_BYTES = 64 << 10
MAX_PROBLEMS = 10  # problems listed before the rest are only counted


def id_problem(value: str) -> str | None:
    """Why `value` is not a valid item or job id, or None if it is."""
    if ID_RULE.fullmatch(value) and ".." not in value:
        return None
    if not value:
        return "is empty"
    if len(value) > MAX_ID:
        return f"is {len(value)} characters long"
    if ".." in value:
        return "contains '..'"
    bad = next((c for c in value if not re.fullmatch(r"[A-Za-z0-9._-]", c)), None)
    return f"contains {bad!r}" if bad else f"starts with {value[0]!r}"


def _problems(spec: ItemSpec) -> list[str]:
    out = []
    if (why := id_problem(spec.item_id)) is not None:
        out.append(f"item id {spec.item_id[:80]!r} {why}; {ID_HELP}")
    return out + arg_problems(spec.args)


def arg_problems(args: list[str]) -> list[str]:
    """What no item's arguments may hold: submit refuses them, and the agent takes a message
    whose args hold them for poison (`ItemMessage.parse`)."""
    out = []
    for n, arg in enumerate(args):
        if "\0" in arg:
            out.append(f"args[{n}] contains a NUL byte; remove it (arguments are passed to a command line)")
        # JSON's "\udcff" (a lone surrogate) reads as a str, but no queue or store can carry it.
        if (at := not_text(arg)) is not None:
            out.append(f"args[{n}] is not valid text (a lone surrogate {arg[at]!r} at character {at + 1}); "
                       "give the argument as UTF-8 text")  # fmt: skip
    return out


def _spec(position: int, value) -> ItemSpec | str:
    """One item from a URI string, a list of args, or {"id": ..., "args": [...] | "..."};
    or what is wrong with the value."""
    default_id = f"{position:06d}"
    if isinstance(value, dict):
        if "args" not in value or not set(value) <= {"id", "args"}:
            keys = ", ".join(map(repr, sorted(value)))
            return f'an item object has the keys "id" (optional) and "args" (got {keys or "none"})'
        item_id = value.get("id", default_id)
        if isinstance(item_id, int) and not isinstance(item_id, bool):
            item_id = str(item_id)
        if not isinstance(item_id, str):
            return f"item id must be a string (got {item_id!r})"
        args = value["args"]
        if isinstance(args, str):
            args = [args]
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            return f'"args" must be a string or a list of strings (got {_short(args)})'
        return ItemSpec(item_id, list(args))
    if isinstance(value, str):
        return ItemSpec(default_id, [value])
    if isinstance(value, list) and all(isinstance(a, str) for a in value):
        return ItemSpec(default_id, list(value))
    return f'not an item (got {_short(value)}); use a URI string, a list of string args, or {{"id": "...", "args": [...]}}'


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


class ItemList:
    """Checked items, in their order, to iterate as often as needed: `len`, `digest`. Items
    read from a file or stdin live in a temporary spool file of canonical lines, written while
    they were checked, so a million items never sit in memory at once (and a file changed
    after the check cannot change what is sent); items given as a Python list stay in it."""

    def __init__(self, count: int, digest: str, *, specs: list[ItemSpec] | None = None, spool: str | None = None):
        self.count, self.digest, self._specs, self._spool = count, digest, specs, spool
        if spool is not None:
            weakref.finalize(self, os.unlink, spool)

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[ItemSpec]:
        if self._specs is not None:
            yield from self._specs
            return
        with open(self._spool, encoding="utf-8") as lines:
            for line in lines:
                item_id, args = json.loads(line)
                yield ItemSpec(item_id, args)


def _canonical(spec: ItemSpec) -> str:
    return json.dumps([spec.item_id, spec.args], separators=(",", ":")) + "\n"


DIGEST = "seq-sha256:"  # of the items in order: a re-run continues by position, so order matters


class _Reader:
    """Collects items and every problem, by where it is (`name:line` or `name[index]`), before
    anything is submitted. Strings are only built for problems: 250,000 items stay cheap. Ids
    seen are kept in a temporary SQLite table on disk, not a dict (a million ids: ~100 MB)."""

    def __init__(self, name: str, *, lines: bool, spool: bool):
        self.name, self.lines = name, lines
        self.count = 0
        self.hash = hashlib.sha256()
        self.problems: list[str] = []
        self.seen = sqlite3.connect("")  # "": a private temporary database, deleted on close
        self.seen.execute("CREATE TABLE seen (id TEXT PRIMARY KEY, at INTEGER)")
        self.specs: list[ItemSpec] | None = None if spool else []
        self.spool = None
        if spool:  # closed in result(); deleted with the ItemList, or at once if refused
            self.spool = tempfile.NamedTemporaryFile("w", encoding="utf-8", prefix="tidefleet-items-", delete=False)  # noqa: SIM115

    def where(self, at: int) -> str:
        return f"{self.name}:{at}" if self.lines else f"{self.name}[{at}]"

    def problem(self, at: int, text: str) -> None:
        self.problems.append(f"{self.where(at)}: {text}")

    def add(self, value, at: int) -> None:
        spec = value if isinstance(value, ItemSpec) else _spec(self.count, value)
        if isinstance(spec, str):
            self.problem(at, spec)
            return
        for text in _problems(spec):
            self.problem(at, text)
        if not self.seen.execute("INSERT OR IGNORE INTO seen VALUES (?, ?)", (spec.item_id, at)).rowcount:
            (first,) = self.seen.execute("SELECT at FROM seen WHERE id = ?", (spec.item_id,)).fetchone()
            used = f"on line {first}" if self.lines else f"by {self.where(first)}"
            self.problem(at, f"item id {spec.item_id[:80]!r} already used {used}; give each item its own id")
        self.count += 1
        line = _canonical(spec)
        if len(line) - 1 > MAX_ITEM_BYTES:  # ASCII (json.dumps escapes the rest): characters are bytes
            self.problem(at, f"item {spec.item_id[:80]!r} is {len(line) - 1} bytes as stored (its id and args as JSON), "
                             f"over the {MAX_ITEM_BYTES // 1024} KiB an item may hold; pass large data by URI, not inline")
        if self.problems:  # refused anyway: keep counting problems, stop keeping items
            return
        self.hash.update(line.encode())
        if self.spool is not None:
            self.spool.write(line)
        else:
            self.specs.append(spec)

    def result(self) -> ItemList:
        self.seen.close()
        if self.spool is not None:
            self.spool.close()
        try:
            self._refuse()
        except JobError:
            if self.spool is not None:
                os.unlink(self.spool.name)
            raise
        digest = DIGEST + self.hash.hexdigest()
        return ItemList(self.count, digest, specs=self.specs, spool=self.spool and self.spool.name)

    def _refuse(self) -> None:
        if len(self.problems) == 1:
            raise JobError(f"{self.problems[0]}; nothing submitted")
        if self.problems:
            more = len(self.problems) - MAX_PROBLEMS
            shown = self.problems[:MAX_PROBLEMS] + ([f"... and {more} more problem(s)"] if more > 0 else [])
            raise JobError(f"{self.name}: {len(self.problems)} problem(s), nothing submitted:\n" + "\n".join(shown))
        if not self.count:
            raise JobError(f"{self.name}: no items given; a job needs at least one item")


def read_items(source: Iterable | str | Path | io.IOBase) -> ItemList:
    """Items from a Python list, a file path ('-' = stdin) or an open stream (text or bytes).

    Files: one item per line, UTF-8; a line starting with '{', '[' or '"' is JSON, any other
    line is a URI (one argument, surrounding whitespace removed). Blank lines and lines starting
    with '#' are skipped. The whole input is checked first: any problem (each listed with its
    line) refuses it all, so a bad line never leaves half a job behind. A file or stream is read
    once, into a spool file on disk (`ItemList`): memory stays flat however many items. A dict,
    a set or bytes is refused: none is a list of items."""
    if isinstance(source, (str, Path)):
        if str(source) == "-":  # bytes, so a line that is not UTF-8 is reported, not a crash
            return _lines(getattr(sys.stdin, "buffer", sys.stdin), "stdin")
        # Every way the OS refuses the file is one line naming it (a pipe, <(cmd) or /dev/stdin, or
        # a device is read like a file): asking first (is_dir, exists) raises some of them itself.
        name, give = str(source), "give a file of URIs or JSON lines, or '-' for stdin"
        try:
            with Path(source).open("rb") as stream:
                return _lines(stream, name)
        except IsADirectoryError:
            raise JobError(f"items: {name!r} is a directory; {give}") from None
        except FileNotFoundError:
            if isinstance(source, str) and re.match(r"[a-z][a-z0-9+.-]*://", source):  # one item, not a file of them
                give = f"a string is a file's path: give one item as a list, read_items([{source!r}])"
            raise JobError(f"items: no such file {name!r}; {give}") from None
        except PermissionError as err:
            raise JobError(f"items: cannot read {name!r} ({err.strerror}); check the file's permissions") from None
        except OSError as err:  # a name too long, a loop of links, an I/O error
            raise JobError(f"items: cannot read {name!r} ({err.strerror}); give the path of a readable file of URIs "
                           "or JSON lines, or '-' for stdin") from None
    if isinstance(source, io.IOBase) or hasattr(source, "readline"):
        return _lines(source, "stdin")
    _a_list(source)
    reader = _Reader("items", lines=False, spool=False)
    for i, value in enumerate(source):
        reader.add(value, i)
    return reader.result()


def _a_list(source) -> None:
    """JobError for what iterates but is no list of items: a dict (its keys), a set (its order
    changes from run to run, and items are numbered by position), bytes (their ints), a str in
    code that takes items, not a path (its characters)."""
    kind = type(source).__name__
    if isinstance(source, dict):
        raise JobError(f"items: a {kind} is not a list of items (got {_short(source)}); give a list of them, "
                       f"e.g. read_items([{_short(source)}])")  # fmt: skip
    if isinstance(source, (set, frozenset)):
        raise JobError(f"items: a {kind} has no order, and items are numbered by their position (a re-submit must "
                       "give them in the same order); give a list, e.g. read_items(sorted(items))")  # fmt: skip
    if isinstance(source, (bytes, bytearray, memoryview)):
        raise JobError(f"items: {kind} {'are' if kind == 'bytes' else 'is'} not a list of items (got {_short(source)}); "
                       "give a list, a file path, or the bytes as a stream: read_items(io.BytesIO(data))")  # fmt: skip
    if isinstance(source, str):
        raise JobError(f"items: a str is not a list of items (got {_short(source)}); give read_items({source[:40]!r}) "
                       "to read a file of that path, or a list")  # fmt: skip


def _raw_lines(stream, name: str) -> Iterator[tuple[int, bytes | None]]:
    """(line number, bytes without the line end), or None for a line over MAX_LINE_BYTES,
    which is skipped without being held in memory. Text streams are turned back into bytes
    (surrogateescape keeps undecodable input undecodable)."""
    number = 0

    def read() -> bytes:
        try:
            chunk = stream.readline(MAX_LINE_BYTES + 2)
        except UnicodeDecodeError as err:  # a text stream that decodes strictly
            raise JobError(f"{name}:{number + 1}: not UTF-8 ({err.reason}); save the input as UTF-8") from None
        return chunk.encode("utf-8", "surrogateescape") if isinstance(chunk, str) else chunk

    while chunk := read():
        number += 1
        line = chunk.rstrip(b"\r\n")
        if len(line) <= MAX_LINE_BYTES and (chunk.endswith(b"\n") or len(chunk) <= MAX_LINE_BYTES):
            yield number, line
            continue
        while chunk and not chunk.endswith(b"\n"):
            chunk = read()
        yield number, None


def _lines(stream, name: str) -> ItemList:
    reader = _Reader(name, lines=True, spool=True)
    for number, raw in _raw_lines(stream, name):
        if raw is None:
            reader.problem(number, f"line longer than {MAX_LINE_BYTES} bytes; pass large data by URI, not inline")
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            reader.problem(number, f"not UTF-8 (byte 0x{raw[err.start]:02x} at column {err.start + 1}); "
                                   "save the file as UTF-8")
            continue
        text = text.removeprefix("\ufeff").strip() if number == 1 else text.strip()  # a BOM is not part of the item
        if not text or text.startswith("#"):
            continue
        value = text
        if text[0] in '{["':
            try:
                value = json.loads(text)
            except json.JSONDecodeError as err:
                reader.problem(number, f"not valid JSON ({err.msg} at column {err.colno}); "
                                       "fix the line or give a plain URI")
                continue
            except RecursionError:  # '[' x 1500: deeper than the parser goes
                reader.problem(number, "not valid JSON (nested too deeply to read); an item is a URI, a string, "
                                       "a list of string arguments or an object")
                continue
        reader.add(value, number)
    return reader.result()


def check_items(items: Iterable[ItemSpec]) -> ItemList:
    """The rules `read_items` applies, for items built in code: raises JobError listing every problem."""
    if isinstance(items, ItemList):
        return items
    _a_list(items)
    reader = _Reader("items", lines=False, spool=False)
    for i, spec in enumerate(items):
        if not isinstance(spec, ItemSpec) or not isinstance(spec.item_id, str) or not isinstance(spec.args, list) \
                or not all(isinstance(a, str) for a in spec.args):
            reader.problem(i, f"not an ItemSpec(item_id: str, args: list[str]) (got {_short(spec)}); give "
                              "sdk.read_items(...) of URIs, lists of args or {'id': ..., 'args': [...]} objects, "
                              "or ItemSpec objects")  # fmt: skip
            continue
        reader.add(spec, i)
    return reader.result()


def items_digest(items: Iterable[ItemSpec]) -> str:
    """The item list's identity, in order, stored on the job: a re-submit with other items (or
    the same in another order) is refused."""
    return check_items(items).digest


def _legacy_digest(items: Iterable[ItemSpec]) -> str:
    """The digest earlier versions stored ("sha256:"; order-free, so it needs every item in memory)."""
    canonical = json.dumps(sorted([s.item_id, s.args] for s in items), separators=(",", ":"))
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def job_id_for(name: str) -> str:
    """Deterministic and readable: the slug of the name plus a short hash of the exact name."""
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:40] or "job"
    return f"{slug}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"


# C0 controls, DEL and C1 controls: what breaks a line, moves a terminal's cursor or starts an
# escape sequence (ESC, and CSI U+009B on terminals that take 8-bit controls).
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def control_at(text: str) -> int | None:
    """Where `text` has its first control character (`CONTROL`), or None."""
    found = CONTROL.search(text)
    return found.start() if found else None


def _one_line_of_text(field: str, text: str, what: str) -> None:
    """JobError for free text a user gives that is printed back (a job name, a cancel reason) with
    a control character or a lone surrogate: one line of text, shown on one line."""
    if (bad := not_text(text)) is not None:
        raise JobError(f"{field}: not valid text (a lone surrogate {text[bad]!r} at character {bad + 1}); "
                       f"give the {field} as UTF-8 text")  # fmt: skip
    if (bad := control_at(text)) is not None:
        raise JobError(f"{field}: a control character {text[bad]!r} at character {bad + 1} (got {text[:80]!r}); "
                       f"a {what} is one line of text: give it without line breaks, tabs or escape sequences")  # fmt: skip


# -- cloud access -------------------------------------------------------------------------
def send_messages(cloud: Cloud, queue: str, messages: list[ItemMessage], *, dead_letter: bool = False) -> None:
    cloud.queues.send(queue, [m.body() for m in messages], dead_letter=dead_letter)


# -- submit -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Submitted:
    job_id: str
    new_items: int  # recorded by this call
    sent: int  # sent by this call (new ones plus any a stopped earlier submit left unsent)
    total: int
    kick: str  # how the scaler was told, or why it was not
    already: bool = False  # its submit had finished before: this call did nothing
    held: bool = False  # its items wait for another job (`after`): recorded, not sent


@dataclass(frozen=True)
class _Plan:
    """What a submit of a job has to do, from what the store says (see the module docstring)."""

    chunk: int  # items per chunk
    threads: int
    done: dict[int, int]  # chunks marked sent: skipped unread, with their item counts
    uncertain: set[int]  # chunks that may hold records: read, then created with conditions
    resend: tuple[str, ...]  # statuses of an existing item of an uncertain chunk that mean "maybe not sent"
    mark: bool  # write progress marks (not on jobs submitted item by item)


@_advised
def submit(
    env: Environment, name: str, queue: str, items: Iterable[ItemSpec], *, job_id: str | None = None,
    kick: bool = True, progress: Callable[[int], None] | None = None, on_job: Callable[[Job], None] | None = None,
    threads: int = THREADS, spec: JobSpec | None = None, after: str | None = None,
    after_finished: bool = False, schedule: str = "", deadline: float = 0.0, flags: bool = False,
    on_stop: Callable[[int, float], None] | None = None,
) -> Submitted:
    """Record the job and its items, send them, kick the scaler once the first chunk is out.
    Idempotent, and a submit that stopped midway is continued: submitting the same job and items
    again creates and sends nothing twice. `on_job(job)` is told once the job is recorded;
    `progress(n)` as items go out (first with those an earlier submit already sent).
    `after`: record the items `pending` and send nothing; the minute watch sends them once that
    job has succeeded (or finished, `after_finished`); see tidefleet.jobs.scheduled. A new job
    `after` one that can no longer succeed (cancelled, or finished with failures) is refused
    unless `after_finished`. `schedule`
    and `deadline` mark a scheduled run, which the watch cancels as timed out past its deadline.
    `flags`: name the spec's problems by the CLI's options (--slots) rather than its fields (spec.slots).
    On Ctrl-C, `on_stop(chunks, seconds)` is told how many chunks are in flight and how long they
    may finish (and be told to `progress`) before SubmitInterrupted (a KeyboardInterrupt) goes on,
    counting those still unconfirmed; a second Ctrl-C goes on at once. Nothing is lost either way:
    a re-run of the same submit continues it."""
    if queue not in env.queues:
        known = ", ".join(sorted(env.queues))
        raise JobError(f"queue: unknown queue {queue!r} in environment {env.name!r}; known queues: {known}")
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:  # 0: no chunk could ever start
        raise JobError(f"threads: must be a whole number of 1 or more (got {threads!r}); "
                       f"leave it out for {THREADS}, or give 1 to write one chunk at a time")  # fmt: skip
    if not isinstance(name, str):
        raise JobError(f"name: must be a string (got {_short(name)}); give a few words, e.g. name='nightly-eval'")
    if not name.strip():
        raise JobError(f"name: a job needs a name (got {name!r}); give --name a few words, e.g. --name nightly-eval")
    _one_line_of_text("name", name, "job name")
    job_id = job_id_for(name) if job_id is None else job_id
    if (why := id_problem(job_id)) is not None:
        raise JobError(f"job id: {job_id[:80]!r} {why}; {ID_HELP}")
    if spec is not None and not isinstance(spec, JobSpec):
        raise JobError(f"spec: must be a JobSpec (got {_short(spec)}); e.g. spec=JobSpec(**{_short(spec)})"
                       if isinstance(spec, dict) else f"spec: must be a JobSpec (got {_short(spec)}); "
                       "e.g. spec=JobSpec(command='python train.py')")  # fmt: skip
    spec = spec or JobSpec()
    q = env.queues[queue]
    if wrong := spec_problems(spec, queue, q, env.pools[q.pool], flags=flags):
        raise JobError("; ".join(wrong))
    items = check_items(items)  # everything is checked before the first write
    cloud = for_env(env)
    parent = cloud.store.job(after) if after is not None else None
    if after is not None and parent is None:
        raise not_found(cloud.store, env, after, "give the id its submit printed", what="after: job")
    # The store answers first (an error there means the environment is not deployed); a job that
    # exists is checked, and reused, without a write; a new one is recorded only once its queue is
    # known to exist, so a missing queue never leaves a job stuck submitting.
    stored = existing = cloud.store.job(job_id)
    if existing is not None:
        _same_job(cloud, existing, name, queue, spec, items, after, after_finished)
        if existing.submitting or not existing.chunk:  # it has items to send: its queue must be there
            _resolve_queue(cloud, env, queue)
    else:
        if parent is not None and not after_finished:
            _can_succeed(cloud, env, parent)
        _resolve_queue(cloud, env, queue)
        who, unknown_why = identify(cloud)  # said only once the store answered: else its error is the one line
        ours = Job(job_id, name, queue, time.time(), len(items), items_digest=items.digest, chunk=CHUNK, window=threads,
                   submitting=True, spec=spec.record(), submitter=who, after=after or "",
                   after_finished=after_finished, waiting=after is not None, schedule=schedule, deadline=deadline,
                   counted=True)  # fmt: skip
        stored = cloud.store.put_job(ours)
        if unknown_why:
            log.warning("%s", unknown_why)
        if stored != ours:  # another submit created it since it was read
            _same_job(cloud, stored, name, queue, spec, items, after, after_finished)
    if stored.waiting or stored.schedule:  # again on a re-run: a submit stopped before this line
        cloud.store.watch(job_id)
    if on_job:
        on_job(stored)
    if stored.chunk and not stored.submitting:  # finished before: nothing to read, nothing to do
        return Submitted(job_id, 0, 0, stored.total, "not needed", already=True, held=stored.waiting)
    plan = _plan(cloud, stored, fresh=existing is None and stored == ours, threads=threads)
    if progress and plan.done:
        progress(sum(plan.done.values()))
    new, sent, how = 0, 0, "not needed"
    running: set[Future] = set()

    def collect(finished: set[Future], *, stopping: bool = False) -> None:
        nonlocal new, sent, how
        running.difference_update(finished)
        for future in finished:
            if stopping and future.exception() is not None:  # stopping anyway; a re-run continues it
                continue
            created, out, size = future.result()  # a chunk's error ends the submit; a re-run continues it
            new, sent = new + created, sent + out
            if kick and out and how == "not needed" and not stopping:  # nodes boot while the rest is sent
                how = kick_scaler(env, f"submit {job_id}")
            if progress:
                progress(size)

    try:
        specs = iter(items)
        for k, chunk in enumerate(iter(lambda: list(islice(specs, plan.chunk)), [])):
            if k in plan.done:
                continue
            while len(running) >= plan.threads:
                collect(wait(running, return_when=FIRST_COMPLETED).done)
            _in_thread(running, _write_chunk, cloud, stored, k, chunk, plan)
        while running:
            collect(wait(running, return_when=FIRST_COMPLETED).done)
    except KeyboardInterrupt:  # chunks not started are dropped; started ones may finish (and mark) a while
        with contextlib.suppress(KeyboardInterrupt):  # a second Ctrl-C (even as on_stop speaks) leaves now
            if running and on_stop:
                on_stop(len(running), STOP_WAIT_S)
            deadline = time.monotonic() + STOP_WAIT_S
            while running and (left := deadline - time.monotonic()) > 0:
                collect(wait(running, timeout=left, return_when=FIRST_COMPLETED).done, stopping=True)
        raise SubmitInterrupted(len(running)) from None
    except Exception:  # an error: started chunks finish (and mark), so a re-run has less to read
        while running:
            collect(wait(running).done, stopping=True)
        raise
    if stored.submitting or stored.total != len(items):
        cloud.store.end_submit(job_id, len(items))
    return Submitted(job_id, new, sent, len(items), how, held=stored.waiting)


def _in_thread(running: set[Future], fn: Callable, *args) -> None:
    """`fn(*args)` in a daemon thread, its future in `running` before the thread starts: a Ctrl-C
    as it starts (the call may be out already) finds it in flight. A daemon thread: a Ctrl-C can
    leave a call stalled on the network behind, where ThreadPoolExecutor's workers are joined at exit."""
    future: Future = Future()
    running.add(future)

    def run() -> None:
        try:
            future.set_result(fn(*args))
        except BaseException as err:  # noqa: BLE001 - the caller gets it from the future
            future.set_exception(err)

    try:
        threading.Thread(target=run, name="submit", daemon=True).start()
    except RuntimeError as err:  # "can't start new thread": never started, so never waited for
        future.set_exception(err)


def _same_job(cloud: Cloud, stored: Job, name: str, queue: str, spec: JobSpec, items: ItemList, after: str | None,
              after_finished: bool) -> None:  # fmt: skip
    """A submit of an existing job continues it only with the same name, queue, spec, dependency and items."""
    job_id = stored.job_id
    if stored.name != name:
        raise JobError(f"job {job_id!r} already exists under the name {stored.name!r} (got {name!r}); "
                       f"re-submit it with --name {stored.name!r}, or use another --job-id")  # fmt: skip
    if stored.queue != queue:
        raise JobError(f"job {job_id!r} already exists on queue {stored.queue!r}; use another name or --job-id")
    if stored.spec != spec.record():
        raise JobError(f"job {job_id!r} already exists with another spec ({stored.spec or 'the queue defaults'}); "
                       "re-submit with the same options, or use another --name or --job-id")  # fmt: skip
    if (stored.after, stored.after_finished and bool(stored.after)) != (after or "", after_finished and bool(after)):
        raise JobError(f"job {job_id!r} already exists {_held(stored.after, stored.after_finished)} (got "
                       f"{_held(after, after_finished)}); re-submit with the same --after and --after-finished, "
                       "or use another --name or --job-id")  # fmt: skip
    if stored.cancelled:
        raise JobError(f"job {job_id!r} was cancelled; submit under another name or --job-id")
    if not _same_items(cloud, stored, items):
        raise JobError(
            f"job {job_id!r} already exists with different items ({stored.total} item(s) recorded, "
            f"{len(items)} given); re-submit the same items in the same order, or use another --name or --job-id"
        )


def _can_succeed(cloud: Cloud, env: Environment, parent: Job) -> None:
    """JobError if `parent` can never succeed, so a job held until it has would only be cancelled
    by the watch (`schedules.watch`): it was cancelled, or it finished with failed items."""
    why = fix = ""
    if parent.cancelled:
        why = "was cancelled"
    elif not parent.waiting and not parent.submitting:
        now = _settled(cloud, env, parent)
        if now.state == "failed":
            why = f"finished with {now.counts['failed']} failed item(s)"
            fix = f", or send its failed items back first (tidefleet retry-failed --env {env_argument(env)} {parent.job_id})"
    if why:
        raise JobError(f"after: job {parent.job_id} {why}, so it can never succeed and this job would only be cancelled; "
                       f"submit without --after, or with --after-finished to run after {parent.job_id} whatever its "
                       f"outcome{fix}")  # fmt: skip


def _held(after: str | None, after_finished: bool) -> str:
    if not after:
        return "without --after"
    return f"with --after {after}" + (" --after-finished" if after_finished else "")


QUEUE_KINDS = {"aws": ("SQS queue", "region"), "gcp": ("Pub/Sub subscription", "project")}


def _resolve_queue(cloud: Cloud, env: Environment, queue: str) -> None:
    """The queue exists (its URL / subscription is looked up), or JobError naming it: a queue added
    to the environment file after its last deploy. Other errors are the cloud's to explain."""
    try:
        cloud.queues.lease_s(queue)
    except cloud.errors as err:
        if not _not_found(err):
            raise
        kind, where = QUEUE_KINDS.get(cloud.name, ("queue", "region"))
        place = env.project if where == "project" else env.region
        raise JobError(f"queues.{queue}: {kind} {naming.queue(env.name, queue)!r} does not exist in {where} {place}; "
                       f"it was added after the last deploy: deploy it (invoke deploy --env {env_argument(env)})") from None


def _not_found(err: BaseException) -> bool:
    """A cloud's "no such resource": an adapter's own (a LookupError: AWS's QueueMissing), an AWS
    error code naming a missing thing, or HTTP 404 (Google)."""
    if isinstance(err, LookupError):
        return True
    response = getattr(err, "response", None)
    code = response.get("Error", {}).get("Code", "") if isinstance(response, dict) else ""
    return any(word in code for word in ("NonExistent", "NotFound", "DoesNotExist")) or getattr(err, "code", None) == 404


def _plan(cloud: Cloud, job: Job, *, fresh: bool, threads: int) -> _Plan:
    if fresh:
        return _Plan(CHUNK, threads, {}, set(), (), mark=True)
    if not job.chunk:  # submitted item by item: any item may exist; "pending" ones were maybe not sent
        chunks = range(-(-job.total // CHUNK))
        return _Plan(CHUNK, threads, {}, set(chunks), ("pending",), mark=False)
    done = cloud.store.sent_chunks(job.job_id)
    chunks = -(-job.total // job.chunk)
    unmarked = [k for k in range(chunks) if k not in done]
    # At most `window` chunks were in flight: no later chunk can hold a record. Not more threads
    # than that now either, or a crash of this run could leave more. A window of 0 (stored by
    # versions that took threads=0, whose submit then never started a chunk) is taken for 1.
    window = max(job.window, 1)
    return _Plan(job.chunk, min(threads, window), done, set(unmarked[:window]), ("pending", "queued"),
                 mark=True)  # fmt: skip


def _write_chunk(cloud: Cloud, job: Job, k: int, specs: list[ItemSpec], plan: _Plan) -> tuple[int, int, int]:
    """Record, send, mark one chunk; returns (items created, messages sent, items in it)."""
    # A waiting job's items are recorded `pending` and not sent (its marks then mean "recorded").
    records = [Item(job.job_id, s.item_id, s.args, status="pending" if job.waiting else "queued") for s in specs]
    if k in plan.uncertain:
        existing = cloud.store.items_by_id(job.job_id, [s.item_id for s in specs])
        created = set(cloud.store.create_items([r for r in records if r.item_id not in existing]))
        send = [s for s in specs if s.item_id in created or (s.item_id in existing and existing[s.item_id].status in plan.resend)]
    else:
        created = cloud.store.create_items(records, unseen=True)
        send = specs
    # A cancel flags the job, then cancels the items it lists: records written after that list
    # are this submit's to cancel; it sends nothing more (a held job's watch never sends them).
    if (now := cloud.store.job(job.job_id)) is not None and now.cancelled:
        _cancel_waiting(cloud, job.job_id, [r.item_id for r in records], now.cancel_reason or "cancelled")
        raise JobError(f"job {job.job_id} was cancelled while this submit ran; it stopped and cancelled the items "
                       "it had recorded; to run them, submit under another name or --job-id")  # fmt: skip
    if job.waiting:
        send = []
    send_messages(cloud, job.queue, [ItemMessage(job.job_id, s.item_id, s.args) for s in send])
    if plan.mark:
        cloud.store.mark_sent(job.job_id, k, len(specs))
    else:  # item by item, as those jobs were: only pending becomes queued (an agent may have started it)
        for s in send:
            cloud.store.update_item(job.job_id, s.item_id, only_from=("pending",), status="queued")
    return len(created), len(send), len(specs)


def _same_items(cloud: Cloud, stored: Job, items: ItemList) -> bool:
    if stored.items_digest.startswith(DIGEST):
        return stored.items_digest == items.digest
    if stored.items_digest:  # an earlier version's digest: order-free, over every item in memory
        return stored.items_digest == _legacy_digest(items)
    # A job recorded before digests: its total and every item recorded so far (a stopped
    # submit may have recorded only some) must match.
    given = {s.item_id: s.args for s in items}
    return stored.total == len(items) and all(given.get(i.item_id) == i.args for i in cloud.store.items(stored.job_id))


def kick_scaler(env: Environment, reason: str) -> str:
    """Tell the scaler there is work now. Never raises: its next scheduled tick comes anyway."""
    payload = json.dumps({"tidefleet": "kick", "env": env.name, "reason": reason}).encode()
    url = os.environ.get("TIDEFLEET_KICK_URL")
    try:
        if url:
            request = urllib.request.Request(url, data=payload, headers={"Content-Type": "application/json"})
            urllib.request.urlopen(request, timeout=5).close()
            return f"kicked {url}"
        return f"kicked {for_env(env).kick(payload)}"
    except Exception as err:  # noqa: BLE001 - any failure here only delays scaling by a tick
        # The variable is the sandbox's (`--keep` prints it): a stale one outlives its sandbox.
        where = f" at TIDEFLEET_KICK_URL={url} (a sandbox's; unset it to kick the deployed scaler)" if url else ""
        return (f"warning: could not kick the scaler{where} ({err}); its next scheduled tick comes within "
                f"{env.scaler.tick_s}s")  # fmt: skip


# -- progress -----------------------------------------------------------------------------
STATES = ("succeeded", "running", "queued", "failed", "cancelled")
WAITING = ("pending", "queued", "running")  # every status that is not final (store.FINAL)


@dataclass(frozen=True)
class JobStatus:
    job: Job
    counts: dict[str, int]  # every state in STATES, pending counted as queued
    # Every item when they were read (see `status`); the failed ones alone when only they were (a
    # job whose counters hold its counts: `JobStore.failed_items`); else empty.
    items: list[Item]
    warnings: tuple[str, ...] = ()  # what could not be checked (the dead-letter queue), to print
    sent: int | None = None  # items recorded and sent; below total while the job is submitting
    # Items recorded (in a cancelled job: its total, those never recorded counted as cancelled);
    # None: `items` has them all.
    recorded: int | None = None

    @property
    def submitting(self) -> bool:
        """Its submit has not finished: still running, or stopped (then run it again). A cancel
        ends it: a cancelled job is never submitted again, so nothing is left to send."""
        return self.job.submitting and not self.job.cancelled

    @property
    def unrecorded(self) -> int:
        """Items the job was submitted with that have no record: a submit stopped midway (and
        not cancelled since)."""
        return max(self.job.total - (len(self.items) if self.recorded is None else self.recorded), 0)

    @property
    def done(self) -> bool:
        """Every item has a final status (an unrecorded item is not final either)."""
        if self.submitting or self.unrecorded:
            return False
        if self.recorded is None:
            return all(i.status in FINAL for i in self.items)
        return sum(self.counts[s] for s in FINAL) >= self.recorded

    @property
    def state(self) -> str:
        """running (not done), failed (done with failed items) or done."""
        return "running" if not self.done else ("failed" if self.counts["failed"] else "done")


def _a_job_id(job_id) -> None:
    """JobError for a job id that is not a string: most often the Submitted that submit returned."""
    if isinstance(job_id, Submitted):
        raise JobError(f"job id: must be a string (got a Submitted); give its .job_id ({job_id.job_id!r})")
    if not isinstance(job_id, str):
        raise JobError(f"job id: must be a string (got {_short(job_id)}); give the id submit printed")


def _job(cloud: Cloud, env: Environment, job_id: str) -> Job:
    _a_job_id(job_id)
    job = cloud.store.job(job_id)
    if job is None:
        raise not_found(cloud.store, env, job_id, "check the id printed by submit")
    return job


def not_found(store, env: Environment, job_id: str, fix: str, what: str = "job") -> JobError:
    """No job of that id: a job's name given for its id (the id adds a hash of the name) is named,
    at the cost of one read more."""
    named = job_id_for(job_id) if isinstance(job_id, str) and job_id else None
    if named and named != job_id and store.job(named) is not None:
        fix = f"{job_id!r} is the name of job {named!r}: give that id"
    return JobError(f"{what} {job_id!r} not found in environment {env.name!r}; {fix}")


@_advised
def status(env: Environment, job_id: str, *, reconcile: bool = True, items: bool = False) -> JobStatus:
    """The job's counts, and its items when `items` is asked or when some failed (to show why);
    first marks failed what redrive moved to its dead-letter queue (`reconcile_dead_letters`),
    which costs one empty receive when there is none (and on SQS one count of the queue, which
    confirms it: `_receive_dead_letters`). Counts come from the job's counters of
    settled items and its nodes' heartbeats (running), in a few reads however big the job;
    from every item when those are read anyway, or the job predates the counters."""
    cloud = for_env(env)
    job = _job(cloud, env, job_id)
    warnings: list[str] = []
    if reconcile:
        try:
            reconciled = _reconcile(cloud, env, [job.queue], job_id)
            warnings += reconciled.warnings
            if reconciled.failed:  # the job's counters moved
                job = _job(cloud, env, job_id)
        except cloud.errors as err:
            warnings.append(f"could not read the dead-letter queue of {job.queue!r} ({err}); "
                            "items redrive moved there are not counted as failed yet")
    return _status(cloud, env, job, warnings, items=items)


RUNNING_FRESH_S = 60.0  # a node silent this long is gone: what it ran is not running (its lease lapsed)


def _settled(cloud: Cloud, env: Environment, job: Job) -> JobStatus:
    """`_status` for whether the job is done and how (`done`, `state`): its settled-item counters
    alone, with no failure reason read and no heartbeat (what runs now is not needed). Items are
    read only for a job recorded before the counters."""
    return _status(cloud, env, job, failed_items=False, heartbeats=lambda pool: {})


def _status(cloud: Cloud, env: Environment, job: Job, warnings: list[str] = (), *, items: bool = False,
            failed_items: bool = True, heartbeats: Callable[[str], dict[str, Heartbeat]] | None = None) -> JobStatus:  # fmt: skip
    """`items`: read every item; `failed_items`: read the failed items of a job with some, whose
    reasons `status` shows (False where the counts are all that is needed): those alone where the
    store tells them apart and finds as many as the job counts, else every item; `heartbeats`: a
    pool's node heartbeats (default: the store's, read for each job that has unsettled items)."""
    sent = sum(cloud.store.sent_chunks(job.job_id).values()) if job.submitting else None
    every: list[Item] = []
    failed: list[Item] | None = []
    if job.counted and not items and failed_items and job.n_failed:
        failed = cloud.store.failed_items(job.job_id)
        if failed is not None and len(failed) != job.n_failed:  # the index lags, or they failed before it
            failed = None
    if job.counted and not items and failed is not None:
        every = failed
        recorded = job.total if sent is None else sent
        settled = {"succeeded": job.n_succeeded, "failed": job.n_failed, "cancelled": job.n_cancelled}
        # An item that settled is not running: a heartbeat may still name one that finished since
        # (and a job whose items all settled reads none).
        unsettled = max(job.total - sum(settled.values()), 0)
        running = min(_running(env, job, heartbeats or cloud.store.heartbeats), unsettled) if unsettled else 0
        counts = {**settled, "running": running, "queued": max(recorded - sum(settled.values()) - running, 0)}
    else:
        every = cloud.store.items(job.job_id)
        found = Counter("queued" if i.status == "pending" else i.status for i in every)
        counts, recorded = {s: found.get(s, 0) for s in STATES}, len(every)
        sent = recorded if sent is None else sent
    if job.cancelled:  # a cancel ends its submit: the items it never recorded are cancelled too
        counts["cancelled"] += max(job.total - sum(counts.values()), 0)
        recorded = job.total
    if job.waiting:  # held for `after`: recorded, none sent (a held job cancelled never sends any)
        sent = 0
    return JobStatus(job, {s: counts[s] for s in STATES}, every, tuple(warnings), recorded if sent is None else sent,
                     recorded=recorded)  # fmt: skip


def _running(env: Environment, job: Job, heartbeats: Callable[[str], dict[str, Heartbeat]]) -> int:
    """Attempts of the job running now, as its pool's nodes said in their last heartbeats."""
    queue = env.queues.get(job.queue)
    if queue is None:
        return 0
    fresh = time.time() - RUNNING_FRESH_S
    return sum(hb.running.get(job.job_id, 0) for hb in heartbeats(queue.pool).values() if hb.at >= fresh)


# What `tidefleet jobs` shows of a job, and `jobs(state=...)` filters on: JobStatus.state, or for
# a cancelled job, cancelling until its running items have stopped, then cancelled.
JOB_STATES = ("running", "done", "failed", "cancelling", "cancelled")


def listed_state(status: JobStatus) -> str:
    if status.job.cancelled:
        return "cancelled" if status.done else "cancelling"
    return status.state


@_advised
def jobs(env: Environment, *, queue: str | None = None, state: str | None = None,
         since: float = 0.0) -> list[JobStatus]:  # fmt: skip
    """Every job of the environment (or of one queue, in one of JOB_STATES, created at `since` or later),
    oldest first. The job records come from the store's jobs index on AWS (a table deployed before
    it is scanned whole) and the jobs collection on GCP, and their counts from their counters:
    items are read only for a job submitted before the counters, so `JobStatus.items` is empty
    (`status` reads a job's failed items, to show why); dead letters are not reconciled here
    (`status` does that)."""
    if queue is not None and queue not in env.queues:
        raise JobError(f"queue: unknown queue {queue!r} in environment {env.name!r}; "
                       f"known queues: {', '.join(sorted(env.queues))}")
    if state is not None and state not in JOB_STATES:
        raise JobError(f"state: unknown state {state!r}; use one of {', '.join(JOB_STATES)}")
    cloud = for_env(env)
    heartbeats = functools.cache(cloud.store.heartbeats)  # each pool's read once, not once per running job
    found = (_status(cloud, env, job, failed_items=False, heartbeats=heartbeats) for job in cloud.store.jobs(queue, since))
    return [s for s in found if state is None or listed_state(s) == state]


# -- dead letters -------------------------------------------------------------------------
REDRIVE_SCAN_MAX = 1000  # dead-letter messages looked at per queue and call: normally there are none
REDRIVE_HOLD_S = 30  # hidden from others while one call looks; released at its end
CONFIRM_WAIT_S = 2  # the long poll that confirms an empty receive of a dead-letter queue (`_receive_dead_letters`)
RETRY_HOLD_S = 120  # retry-failed hides the dead letters it looks at this long (released at its end)


@dataclass(frozen=True)
class Reconciled:
    failed: list[tuple[str, str]]  # (job, item) marked failed by this call
    warnings: list[str]


@_advised
def reconcile_dead_letters(env: Environment, job_id: str | None = None, *, cloud: Cloud | None = None) -> Reconciled:
    """Mark failed every item (of one job, or all) that the queue's redrive moved to its
    dead-letter queue: the backstop when agents keep dying while holding its message, so no
    agent recorded an outcome. Messages the agent dead-lettered itself (their failures or node
    losses over budget) are left to the agent's own record. Only peeks: messages are held a
    moment and released, never deleted, so `retry_failed` still finds them."""
    cloud = cloud or for_env(env)
    queues = list(env.queues) if job_id is None else [_job(cloud, env, job_id).queue]
    return _reconcile(cloud, env, queues, job_id)


def _reconcile(cloud: Cloud, env: Environment, queues: list[str], job_id: str | None) -> Reconciled:
    queues = [q for q in queues if q in env.queues]  # a job's queue may since have left the config
    failed: list[tuple[str, str]] = []
    warnings: list[str] = []
    for name in queues:
        queue = env.queues[name]
        reason = f"moved to the dead-letter queue by the queue's redrive after {redrive_receives(env.cloud, queue)} receives"
        budgets: dict[str, int] = {}  # per job: its max_retries (a job's spec may set its own)
        held: list[str] = []
        unreadable = 0
        try:
            while len(held) < REDRIVE_SCAN_MAX:
                got = _receive_dead_letters(cloud, name, REDRIVE_HOLD_S, confirm=False)
                if not got:
                    break
                held += [d.handle for d in got]
                messages = [_dead_letter(d.body) for d in got]
                unreadable += messages.count(None)
                for msg in messages:
                    if msg is None or (job_id is not None and msg.job != job_id) or _agent_gave_up(msg, _max_retries(cloud, queue, msg.job, budgets)):
                        continue
                    # Only a waiting record changes: a missing item is never created, a final one stays,
                    # and one running under a live lease is its holder's (on Pub/Sub a message whose
                    # ack deadline extensions failed is redelivered, and dead-lettered, while it runs).
                    if cloud.store.update_item(msg.job, msg.item, only_from=WAITING, status="failed", reason=reason,
                                               fence=Fence(claim_at=time.time())):  # fmt: skip
                        failed.append((msg.job, msg.item))
        finally:
            if held:
                cloud.queues.release(name, held, dead_letter=True)
        if unreadable:
            warnings.append(f"{unreadable} message(s) in the dead-letter queue of {name!r} are not tidefleet items "
                            "(a poison message the agents set aside says why under 'tidefleet_poison'); skipped")
    for warning in warnings:
        log.warning("%s", warning)
    return Reconciled(failed, warnings)


def _dead_letter(body: str) -> ItemMessage | None:
    try:
        return ItemMessage.parse(body)
    except ValueError:
        return None


def _max_retries(cloud: Cloud, queue: Queue, job_id: str, budgets: dict[str, int]) -> int:
    """The job's `max_retries` (its spec's, else its queue's), read once per job into `budgets`."""
    if job_id not in budgets:
        record = cloud.store.job(job_id)
        budgets[job_id] = JobSpec.from_record(record.spec if record else None).retries_on(queue)
    return budgets[job_id]


def _agent_gave_up(msg: ItemMessage, max_retries: int) -> bool:
    """The agent sends an item's last message to the dead-letter queue itself, with the counts
    that exhausted its budget (agent.worker `_failed`: the job's `max_retries`, else its queue's),
    and then records the failure with its reason."""
    return msg.failures > max_retries or msg.lost > NODE_LOSSES_TOLERATED


@dataclass(frozen=True)
class Cancelled:
    cancelled: int  # waiting items this call cancelled
    already: str = ""  # why the job needed no cancelling (finished, or cancelled before), to print


def cancel(env: Environment, job_id: str, *, reason: str = "cancelled", cloud: Cloud | None = None) -> int:
    """Flag the job (agents stop its running items) and cancel its waiting items; returns how many.
    A finished job is left as it is (0); see `cancel_job`."""
    return cancel_job(env, job_id, reason=reason, cloud=cloud).cancelled


@_advised
def cancel_job(env: Environment, job_id: str, *, reason: str = "cancelled", cloud: Cloud | None = None) -> Cancelled:
    """`cancel`, saying when there was nothing to do: a job whose every item is final keeps its
    record (a finished job is not marked cancelled, so its idempotent re-submit still works); a
    job cancelled before has its waiting items cancelled again (a cancel that stopped midway)."""
    _a_job_id(job_id)
    if not isinstance(reason, str):
        raise JobError(f"reason: must be a string (got {_short(reason)}); e.g. reason='superseded by v2'")
    _one_line_of_text("reason", reason, "cancel reason")
    cloud = cloud or for_env(env)
    store = cloud.store
    job = store.job(job_id)
    if job is None:
        raise not_found(store, env, job_id, "nothing to cancel")
    # Whether it is done, from the job's counters: no heartbeat nor failure reason is read (neither
    # would change it), which the schedule function, whose watch cancels overdue runs, may not read.
    current = _settled(cloud, env, job)
    if current.done:
        c = current.counts
        if job.cancelled:
            return Cancelled(0, f"job {job_id} already cancelled; nothing to cancel")
        counts = f"succeeded {c['succeeded']}, failed {c['failed']}" + (f", cancelled {c['cancelled']}" if c["cancelled"] else "")
        return Cancelled(0, f"job {job_id} already finished ({counts}); nothing to cancel")
    already = job.cancelled
    if not already:
        store.cancel_job(job_id, reason)
    try:
        n = _cancel_waiting(cloud, job_id, [i.item_id for i in store.items(job_id) if i.status in ("pending", "queued")],
                            reason)  # fmt: skip
    except cloud.errors as err:  # a big job's cancel throttled midway: what stands, and how to finish
        err.add_note(f"job {job_id} is cancelled (its running items stop within a heartbeat; its agents skip its "
                     "queued items), but not every waiting item is marked yet: run the same cancel again to finish")
        raise
    return Cancelled(n, f"job {job_id} already cancelled; its running items stop within a heartbeat" if already else "")


def _cancel_waiting(cloud: Cloud, job_id: str, item_ids: list[str], reason: str) -> int:
    """Cancel those of the items still waiting (one that started meanwhile is its agent's to stop),
    many to a store call: a call per item took a round trip each, minutes for a big job."""
    waiting = ("pending", "queued")
    writes = [ItemWrite(job_id, i, {"status": "cancelled", "reason": reason}, only_from=waiting) for i in item_ids]
    return sum(cloud.store.update_items(writes))


def _dead_letter_counts(cloud: Cloud, queue: str) -> Backlog | None:
    """The dead-letter queue's visible and hidden (held) messages where the cloud's queues count
    them (`WorkQueues.counts`: SQS, not Pub/Sub), else None. None too when the count cannot be
    read (a caller without sqs:GetQueueAttributes): nothing is concluded from it."""
    try:
        return cloud.queues.counts(queue, dead_letter=True)
    except cloud.errors as err:
        log.debug("could not count the dead-letter queue of %r: %s", queue, err)
        return None


def _receive_dead_letters(cloud: Cloud, queue: str, hold_s: int, *, confirm: bool) -> list[Delivery]:
    """A batch of the queue's dead letters, hidden `hold_s`; [] once none is left to see. A receive
    without a wait may answer nothing while some wait: an SQS short poll asks a sample of its
    servers ("repeat the request"), a Pub/Sub pull answers nothing when none came back before its
    timeout (SHORT_PULL_S). So an empty answer is confirmed: where the queue counts its messages
    (SQS), by the count first (none visible: [] at the cost of one read, so `status` stays quick
    on the usual empty queue), then by a long poll of CONFIRM_WAIT_S (SQS asks every server);
    where it cannot (Pub/Sub), by that longer pull only when `confirm`: retry-failed, whose
    "nothing to do" must be true, not status, which counts what it missed at its next call."""
    got = cloud.queues.receive(queue, SEND_BATCH, 0, dead_letter=True, hold_s=hold_s)
    if got:
        return got
    counts = _dead_letter_counts(cloud, queue)
    if (counts is not None and counts.visible == 0) or (counts is None and not confirm):
        return []
    return cloud.queues.receive(queue, SEND_BATCH, CONFIRM_WAIT_S, dead_letter=True, hold_s=hold_s)


@_advised
def retry_failed(env: Environment, job_id: str) -> int:
    """Move this job's messages from the dead-letter queue back to its queue with a fresh retry
    budget; returns how many distinct items went back. Each item goes back at most once per call:
    one that fails again while the call still scans (the agent dead-letters it anew) is left in
    the dead-letter queue for the next call, as is a second message of the same item, instead of
    being sent back again with yet another fresh budget. A cancelled job is refused (JobError):
    its failed items stay failed. So is a call that found none while the dead-letter queue holds
    messages hidden by an earlier call (or a status) and the job is not finished: JobError says
    how many and when to run it again, instead of "nothing to do".

    Each batch: its items are marked queued, sent, then their dead letters deleted. At each stop:
      - Not the other order: an agent drops a message whose item is still final (failed) by its
        claim, so a send before the mark could be dropped, leaving the item queued, no message.
      - An error (a send throttled past its retries) or Ctrl-C after the mark: the batch's dead
        letters are released in `finally`, visible at once, and a rerun sends them (an item
        already marked queued is queued again: the second update).
      - The process dies there (no `finally`): they come back when RETRY_HOLD_S ends; a rerun
        before then is told so, as above. Records say queued until then, the job stays running.
      - Sent, not deleted (died, or the delete failed): they come back after the hold and a
        rerun sends them again: a duplicate of the same seq, which costs one receive: the
        agent's claim drops it when the item is final or runs under the other message, and a
        queued item is claimed once."""
    cloud = for_env(env)
    job = _job(cloud, env, job_id)
    if job.cancelled:  # the agent would cancel what goes back, erasing why it failed
        raise JobError(f"job {job_id} was cancelled: its failed items stay failed and are not sent back; to rerun them, "
                       f"submit them again as a new job (another --name or --job-id); `tidefleet status --env "
                       f"{env_argument(env)} {job_id} --failed` lists them")  # fmt: skip
    others: list[str] = []  # other jobs' messages, and items moved already: hidden while we scan, released at the end
    unsent: list[str] = []  # the batch in hand until its send returns: released if it never does
    moved: set[str] = set()
    try:
        while True:
            got = _receive_dead_letters(cloud, job.queue, RETRY_HOLD_S, confirm=True)
            if not got:
                break
            mine = []
            for m in got:
                try:
                    msg = ItemMessage.parse(m.body)
                except ValueError:
                    others.append(m.handle)
                    continue
                if msg.job == job_id and msg.item not in moved:
                    moved.add(msg.item)
                    mine.append((msg, m.handle))
                else:
                    others.append(m.handle)
            if mine:
                unsent = [r for _, r in mine]
                # Store first: an agent drops a message whose item is still final, so the item
                # must be queued again before its message can be received (an item with no
                # record gets none: the store never creates one in an update).
                back, dropped = [], []
                for msg, handle in mine:  # from failed (uncounted on the job), else from waiting
                    # A fresh budget: its failures and its node losses (either dead-letters it).
                    if cloud.store.update_item(job_id, msg.item, only_from=("failed",), never_from=(), status="queued",
                                               failures=0, lost=0, reason="") is None and cloud.store.update_item(
                            job_id, msg.item, status="queued", failures=0, lost=0, reason="",
                            fence=Fence(claim_at=time.time())) is None:  # fmt: skip
                        # Final: its dead letter is spent (an agent's claim would drop it): deleted.
                        # Running under a live lease (its holder's, whose message Pub/Sub dead-lettered
                        # while it ran), or no record (the agent would drop it): left where it is.
                        record = cloud.store.item(job_id, msg.item)
                        (dropped if record is not None and record.status in FINAL else others).append(handle)
                        moved.discard(msg.item)
                        continue
                    back.append((msg, handle))
                if back:
                    send_messages(cloud, job.queue, [replace(msg, failures=0, lost=0) for msg, _ in back])
                unsent = []
                cloud.queues.delete(job.queue, [r for _, r in back] + dropped, dead_letter=True)
        if not moved:
            _held_by_another_run(cloud, env, job_id, job.queue, ours=len(others))
            _failed_without_dead_letters(env, job)
        return len(moved)
    finally:
        if others or unsent:
            cloud.queues.release(job.queue, others + unsent, dead_letter=True)


def _failed_without_dead_letters(env: Environment, job: Job) -> None:
    """JobError where the job has failed items and none of their dead letters is left to send back:
    the queue keeps a dead letter for its retention (`resources.*_RETENTION_S`), and "nothing to do"
    said nothing of the failed items `status` still lists. `job` as read at the start: a call that
    moved nothing changed none of its counters."""
    if not job.counted or not job.n_failed:
        return
    job_id = job.job_id
    days = (PUBSUB_RETENTION_S if env.cloud == "gcp" else SQS_RETENTION_S) // 86400
    raise JobError(f"job {job_id}: its {job.n_failed} failed item(s) have no dead letter left to send back (a dead "
                   f"letter is kept {days} days on {env.cloud.upper()}); submit them again as a new job (another "
                   f"--name or --job-id); `tidefleet status --env {env_argument(env)} {job_id} --failed` lists them")  # fmt: skip


def _held_by_another_run(cloud: Cloud, env: Environment, job_id: str, queue: str, *, ours: int) -> None:
    """JobError where retry-failed found none of the job's dead letters, yet the queue has messages
    hidden by another call (`ours` are this call's): an earlier retry-failed that stopped (it died,
    it is still running) or a status holds them, maybe this job's. Not for a job that is finished
    without failures (nothing of it can be there), nor where the queue cannot count (Pub/Sub)."""
    counts = _dead_letter_counts(cloud, queue)
    hidden = (counts.in_flight - ours) if counts is not None else 0
    if hidden <= 0:
        return
    job = cloud.store.job(job_id)
    if job is not None and job.counted and not job.submitting and not job.n_failed \
            and job.n_succeeded + job.n_cancelled >= job.total:  # fmt: skip
        return
    again = time.strftime("%H:%M:%S UTC", time.gmtime(time.time() + RETRY_HOLD_S))
    raise JobError(f"job {job_id}: no item sent back, but {hidden} message(s) in the dead-letter queue of {queue!r} are "
                   f"hidden by an earlier retry-failed or status (this job's or another's) for up to {RETRY_HOLD_S}s; "
                   f"run it again after {again} (tidefleet retry-failed --env {env_argument(env)} {job_id})")  # fmt: skip


@_advised
def log_lines(env: Environment, job_id: str, item_id: str | None = None) -> Iterator[tuple[str, str]]:
    """(stream, line) for every attempt of the job's items (or one item), oldest first per stream."""
    cloud = for_env(env)
    job = _job(cloud, env, job_id)
    if item_id is not None:
        if not isinstance(item_id, str):
            raise JobError(f"item id: must be a string (got {_short(item_id)}); give an item id of job {job_id}, "
                           "e.g. '000000' for its first item when submit numbered them")  # fmt: skip
        failed = f"tidefleet status --env {env_argument(env)} {job_id} --failed"
        if (why := id_problem(item_id)) is not None:
            raise JobError(f"item id {item_id[:80]!r} {why}; give an item id of job {job_id} (`{failed}` lists failed ones)")
        if cloud.store.item(job_id, item_id) is None:
            raise JobError(f"item {item_id!r} not found in job {job_id!r}; check the id (`{failed}` lists the failed items)")
    return cloud.logs.lines(job.queue, job_id, item_id)


# -- nodes --------------------------------------------------------------------------------
@dataclass(frozen=True)
class NodeRow:
    pool: str
    node_id: str
    instance_type: str
    spot: bool
    busy_slots: int
    slots: int
    gpus: int
    draining: bool
    heartbeat_age_s: float
    # The group no longer lists it (terminated, reclaimed): its heartbeat record stays until the
    # control tick forgets it, once silent longer than the pool's boot timeout. Every node of a pool
    # whose group is not found (deleted, and its nodes with it) too: the tick skips that pool, so
    # their records stay until the group exists again.
    gone: bool = False
    # Why its agent took no items (GPUs, docker, the item user), found at start; "" if none. Such a
    # node's record stays an hour after it is gone: the scaler holds launches after several.
    fault: str = ""


@dataclass(frozen=True)
class PoolRow:
    pool: str
    desired: int | None  # None: the group was not found
    instances: int | None
    nodes: list[NodeRow]  # the group's nodes, then the gone ones, each by node id


@_advised
def nodes(env: Environment, now: float | None = None) -> list[PoolRow]:
    """Per pool: the group's desired size and instances, and each node's last heartbeat, marked
    `gone` where the group no longer lists the node (every node where the pool has no group)."""
    now = time.time() if now is None else now
    cloud = for_env(env)
    pools = list(env.pools)
    # Heartbeats before the groups: a node launched between the two reads has no heartbeat yet
    # rather than one that looks gone.
    beats = {pool: cloud.store.heartbeats(pool) for pool in pools}
    groups = cloud.group_members()
    out = []
    for pool in pools:
        group = groups.get(pool)
        members = set(group[1]) if group else set()
        rows = sorted((NodeRow(pool, hb.node_id, hb.instance_type, hb.spot, hb.busy_slots, hb.slots, hb.gpus, hb.draining,
                               now - hb.at, gone=hb.node_id not in members, fault=hb.fault) for hb in beats[pool].values()),
                      key=lambda n: (n.gone, n.node_id))  # fmt: skip
        desired, instances = (group[0], len(group[1])) if group else (None, None)
        out.append(PoolRow(pool, desired, instances, rows))
    return out
