"""Workload and spot traces: read, validate, filter.

A workload trace is a CSV with at least `submit_s` and `duration_s` (see
`traces/README.md`); `gpus` (empty or 0 = CPU-only), `cpus` and `group` are optional.
Bad rows stop the load with the file, line, column and value, never a silent skip.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
import sys
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

REQUIRED_COLUMNS = ("submit_s", "duration_s")
STDIN = "-"  # the trace argument that reads it from standard input
# Longer than any workload replays in useful time (the scaler ticks every minute of it): a trace
# that spans more, or an item that runs longer, has its times in other units than seconds.
MAX_SPAN_S = 10 * 365 * 86400.0
# Submit times are below this (3,171 years): a float resolves 1e-5 s there, so a replay at any
# allowed time gives the waits and costs it gives at 0. A Unix time in seconds passes (1.7e9); one
# in milliseconds (1.7e12), micro- or nanoseconds does not (at 1e16 an event time rounds to 2 s).
MAX_SUBMIT_S = 1e11
# A duration is 0 or at least this: the replay resolves milliseconds, and a shorter item's end is
# no time after its start (at 1e-300 s the work bound is 1e-300 of a cent and costs divide by it).
MIN_DURATION_S = 0.001
MOST_NAMED = 10  # columns a message names before it counts the rest


class TraceError(ValueError):
    """A trace file that cannot be replayed; the message names the place and the fix."""


class WindowError(TraceError):
    """`--window` is what is wrong (a usage error): not START:END, or no item of the trace in it."""


def seconds(x: float) -> str:
    """A number of seconds (or years) as a message says it: with separators, or in exponent form
    where that would run to more digits than anyone reads (1e+308 s, not 309 of them)."""
    return f"{x:,.0f}" if x < 1e12 else f"{x:.3g}"


def plain(x: float) -> str:
    """A time as the user would type it on the command line: 2592000, 0.5, 1e+20."""
    return f"{x:.15g}"


def is_dir(path: Path) -> bool:
    """Path.is_dir, False where the OS refuses to look (a name too long, a folder not searchable):
    opening the path then says why, in one line."""
    try:
        return path.is_dir()
    except OSError:
        return False


def traces_dir() -> Path:
    """$TIDEFLEET_TRACES, else the project's traces/ beside the package (whatever the cwd)."""
    if os.environ.get("TIDEFLEET_TRACES"):
        return Path(os.environ["TIDEFLEET_TRACES"])
    return Path(__file__).resolve().parents[2] / "traces"


@dataclass(frozen=True, slots=True)
class TraceItem:
    submit_s: float
    duration_s: float
    slots: int  # GPUs it needs on one node, or 1 when CPU-only (see for_pool for CPU pools)
    group: str = ""
    cpus: float = 0.0  # the trace's `cpus` (0 where it records none)


def _number(text: str, *, where: str, column: str, allow_empty: bool = False) -> float:
    if text.strip() == "" and allow_empty:
        return 0.0
    try:
        value = float(text)
    except ValueError:
        raise TraceError(f"{where}: column {column!r} is not a number (got {text!r})") from None
    if not math.isfinite(value) or value < 0:
        raise TraceError(f"{where}: column {column!r} must be a finite number >= 0 (got {text!r})")
    return value


def trace_name(path: Path | str) -> str:
    """How reports and messages name a trace: a file's name, a pipe's whole path (/dev/fd/63 from
    `<(zcat t.csv.gz)`: its name alone says nothing), <stdin> for `-`."""
    if str(path) == STDIN:
        return "<stdin>"
    try:
        return Path(path).name if Path(path).is_file() else str(path)
    except OSError:  # a name the OS refuses to look up (too long)
        return str(path)


def load_trace(path: Path | str, window: tuple[float, float] | None = None) -> list[TraceItem]:
    """Items of `path` (any readable file, a pipe included; `-`: standard input) sorted by submit
    time; with `window`, only START <= submit_s < END."""
    path = Path(path)
    stdin = str(path) == STDIN
    fix = f"give the path of a CSV trace (the project's are in {traces_dir()}), or - to read it from stdin"
    if is_dir(path):
        raise TraceError(f"{path}: is a folder; {fix}")
    try:  # utf-8-sig: a spreadsheet's byte-order mark; newline="": csv reads line ends itself
        fh = (io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8-sig", newline="") if stdin
              else path.open(newline="", encoding="utf-8-sig"))  # fmt: skip
    except FileNotFoundError:
        raise TraceError(f"{path}: no such trace file; {fix}") from None
    except OSError as err:  # unreadable
        raise TraceError(f"{path}: cannot read it ({err.strerror or err}); {fix}") from None
    shown = Path(trace_name(path)) if stdin else path
    try:
        return _read_trace(fh, shown, window)
    except UnicodeDecodeError:
        raise TraceError(f"{shown}: not a UTF-8 CSV text file (compressed, or another encoding?); decompress it "
                         "(zcat FILE.gz | tidefleet simulate - ... reads it from stdin) or save it as UTF-8 CSV") from None
    finally:
        if stdin:
            fh.detach()  # the process's stdin stays open
        else:
            fh.close()


def _read_trace(fh, path: Path, window: tuple[float, float] | None) -> list[TraceItem]:
    """The items of the open trace `fh`; `path` names it in errors."""
    # strict: a quote left open is an error at the end of the file, not the rest of it in one field
    reader = csv.DictReader(fh, strict=True)
    columns = reader.fieldnames = [c.strip() for c in _malformed_as_trace_error(lambda: reader.fieldnames, path, 1) or []]
    if repeated := sorted(c for c, n in Counter(columns).items() if n > 1):  # linear: a header may be huge
        raise TraceError(f"{path}: column(s) {_some(repeated)} named twice in the header; keep one of each")
    missing = [c for c in REQUIRED_COLUMNS if c not in columns]
    if missing:
        raise TraceError(
            f"{path}: missing column(s) {', '.join(missing)} (got {_some(columns) or 'no header'}); "
            "a trace needs submit_s and duration_s, optionally gpus, cpus and group"
        )
    items = []
    rows, first, last = 0, math.inf, -math.inf  # every row's submit time, in the window or not
    for line, row in _rows(reader, path):
        where = f"{path.name} line {line}"
        if None in row:  # more fields than the header names
            raise TraceError(f"{where}: {len(columns) + len(row[None])} fields, the header names {len(columns)}; "
                             "quote fields that hold commas")
        submit = _number(row["submit_s"] or "", where=where, column="submit_s")
        if submit >= MAX_SUBMIT_S:
            raise TraceError(
                f"{where}: column 'submit_s' must be below {seconds(MAX_SUBMIT_S)} s "
                f"({seconds(MAX_SUBMIT_S / (365 * 86400))} years) (got {row['submit_s']!r}); times that large are "
                "milliseconds, microseconds or nanoseconds (a Unix time in ms is about 1.7e12): convert the column "
                "to seconds (divide by 1e3, 1e6 or 1e9)"
            )
        rows, first, last = rows + 1, min(first, submit), max(last, submit)
        if window and not window[0] <= submit < window[1]:
            continue
        duration = _number(row["duration_s"] or "", where=where, column="duration_s")
        if 0 < duration < MIN_DURATION_S:
            raise TraceError(
                f"{where}: column 'duration_s' must be 0 or at least {MIN_DURATION_S:g} s (got {row['duration_s']!r}); "
                "the replay resolves milliseconds: give 0 for an item shorter than that (it holds no slot in the "
                f"bounds) or round it up to {MIN_DURATION_S:g}"
            )
        gpus = _number(row.get("gpus") or "", where=where, column="gpus", allow_empty=True)
        if gpus != int(gpus):
            raise TraceError(f"{where}: column 'gpus' must be a whole number (got {row['gpus']!r})")
        cpus = _number(row.get("cpus") or "", where=where, column="cpus", allow_empty=True)
        items.append(TraceItem(submit, duration, max(1, int(gpus)), row.get("group") or "", cpus))
    if window and rows and not items:
        where = " ".join(filter(None, [f"{plain(window[0])} <=" if window[0] > -math.inf else "", "submit_s",
                                       f"< {plain(window[1])}" if window[1] < math.inf else ""]))  # fmt: skip
        span = plain(first) if first == last else f"{plain(first)} to {plain(last)}"
        raise WindowError(f"--window: no item of {path.name} has {where} (its {rows} item{'s' * (rows != 1)}: "
                          f"submit_s {span}); widen --window")  # fmt: skip
    items.sort(key=lambda i: i.submit_s)  # stable: equal submit times keep file order
    span = items[-1].submit_s - items[0].submit_s if items else 0.0
    longest = max((i.duration_s for i in items), default=0.0)
    for what, length, fix in (("submit_s spans", span, ", or replay a part with --window START:END"),
                              ("longest duration_s is", longest, "")):  # fmt: skip
        if length > MAX_SPAN_S:
            raise TraceError(
                f"{path}: {what} {seconds(length)} s ({seconds(length / (365 * 86400))} years, more than 10); "
                f"times must be in seconds (milliseconds? divide by 1000){fix}"
            )
    return items


def _some(names: list[str]) -> str:
    """The first MOST_NAMED names, and how many more: a header of 100,000 columns is not one message."""
    more = len(names) - MOST_NAMED
    return ", ".join(names[:MOST_NAMED]) + (f" and {more:,} more" if more > 0 else "")


def _malformed_as_trace_error(read, path: Path, line: int):
    """read(), with a record the csv module cannot split (`csv.Error`) as a TraceError naming `line`."""
    try:
        return read()
    except csv.Error as err:
        raise TraceError(f"{path.name} line {line}: not a CSV record ({err}); an unbalanced quote? "
                         'a field that starts with " runs to the next one: close it or remove it') from None


LINE_BREAK = re.compile(r"\r\n|\r|\n")  # what the file's line iteration splits on (opened with newline="")


def _rows(reader: csv.DictReader, path: Path):
    """(the line its record starts on, the row) for each of the reader's rows; a malformed one stops
    the load naming the line its record starts on (where an unbalanced quote is, not where the
    reader gave up). The reader skips blank lines and a quoted field may hold line breaks: the
    start is where the record ends less the breaks inside it, not a count of the rows."""
    rows = iter(reader)
    while True:
        try:
            row = _malformed_as_trace_error(lambda: next(rows), path, reader.line_num + 1)
        except StopIteration:
            return
        fields = [v for k, v in row.items() if k is not None] + (row.get(None) or [])
        yield reader.line_num - sum(len(LINE_BREAK.findall(v)) for v in fields if isinstance(v, str)), row


def for_pool(items: list[TraceItem], capacity_unit: str) -> list[TraceItem]:
    """Items as a pool of this capacity unit counts them: a vCPU pool's slots are vCPUs, so an
    item takes its `cpus` rounded up (1 where the trace records none); other pools count GPUs."""
    if capacity_unit != "vcpus":
        return items
    return [replace(i, slots=max(1, math.ceil(i.cpus))) for i in items]


def parse_window(text: str) -> tuple[float, float]:
    """`START:END` in seconds into the trace; either side may be empty (open)."""
    start, sep, end = text.partition(":")
    try:
        if not sep:
            raise ValueError
        lo = float(start) if start.strip() else 0.0
        hi = float(end) if end.strip() else math.inf
    except ValueError:
        raise WindowError(f"--window: expected START:END in seconds, e.g. 0:86400 (got {text!r})") from None
    if math.isnan(lo) or math.isnan(hi):
        raise WindowError(f"--window: START and END must be numbers of seconds, e.g. 0:86400 (got {text!r})")
    if lo == math.inf:  # 1e400 reads as inf: after every item, and no END is after it
        raise WindowError(f"--window: START must be a finite number of seconds, e.g. 0:86400 (got {text!r})")
    if hi <= lo:
        raise WindowError(f"--window: END must be after START{'' if start.strip() else ' (0 where it is left out)'} "
                          f"(got {text!r})")
    return lo, hi


@dataclass(frozen=True, slots=True)
class SpotTrace:
    """Spot capacity over time from a skypilot-org/spot-traces JSON file.

    `data[i]` is how many spot instances were available (availability traces) or still alive
    (preemption traces) during step i of `gap_s` seconds. We read both the same way: the
    level divided by its maximum is the share of spot capacity the market allows. The series
    repeats when the workload trace is longer.
    """

    gap_s: float
    levels: tuple[float, ...]  # each in [0, 1]

    def level_at(self, t: float) -> float:
        return self.levels[int(t // self.gap_s) % len(self.levels)]

    def drops(self, start: float, end: float):
        """(time, share of spot nodes lost) for every fall of the level in [start, end)."""
        if not any(self.levels[i] < self.levels[i - 1] for i in range(len(self.levels))):
            return  # the level never falls (the series repeats: it falls at the wrap if anywhere)
        step = int(start // self.gap_s) + 1
        while step * self.gap_s < end:
            before = self.levels[(step - 1) % len(self.levels)]
            after = self.levels[step % len(self.levels)]
            if after < before:
                yield step * self.gap_s, (before - after) / before
            step += 1


def _first_json(folder: Path, most_folders: int = 500) -> Path | None:
    """The first .json file under `folder` in name order, looking into at most `most_folders`
    folders (a folder such as / would otherwise be walked whole); None if none is found."""
    for seen, (root, folders, files) in enumerate(os.walk(folder)):
        if seen == most_folders:
            return None
        folders.sort()
        if found := sorted(f for f in files if f.endswith(".json")):
            return Path(root) / found[0]
    return None


def _spot_folder_error(path: Path) -> TraceError:
    """A folder given as a spot trace: one file in it is expected; name one, from it or the project's."""
    if (inside := _first_json(path)) is not None:
        return TraceError(f"{path}: is a folder; give one spot trace JSON file in it, e.g. {inside}")
    spot = traces_dir() / "spot"
    example = _first_json(spot) if spot.is_dir() else None
    return TraceError(
        f"{path}: is a folder, with no spot trace JSON file in it; give a skypilot spot-traces JSON "
        f"file (the project's are under {spot}{f', e.g. {example}' if example else ''})"
    )


def _json_kind(value) -> str:
    """How a message names a JSON value it did not expect: its kind, or a short string itself."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)  # null, true, false
    if isinstance(value, str):
        return repr(value) if len(value) <= 40 else f"a string of {len(value):,} characters"
    return {dict: "an object", list: "a list"}.get(type(value), "a number")


def _spot_number(value, field: str, not_spot) -> float:
    """A JSON number (or a string of one, as "60"); else `not_spot` naming `field` and what it got."""
    if isinstance(value, (int, float, str)) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:  # an integer of more digits than a float holds: the range check refuses it
            return math.inf
        except ValueError:
            pass
    raise not_spot(f"{field} must be a number, got {_json_kind(value)}")


def load_spot_trace(path: Path) -> SpotTrace:
    path = Path(path)
    fix = f"give a skypilot spot-traces JSON (the project's are under {traces_dir() / 'spot'})"
    if is_dir(path):
        raise _spot_folder_error(path)

    def not_spot(what: str) -> TraceError:
        return TraceError(f'{path}: not a spot trace: {what}; a spot trace is JSON {{"metadata": {{"gap_seconds": N}}, '
                          '"data": [N, ...]} (a skypilot spot-traces file)')  # fmt: skip

    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise TraceError(f"{path}: no such spot trace file; {fix}") from None
    except OSError as err:  # unreadable
        raise TraceError(f"{path}: cannot read it ({err.strerror or err}); {fix}") from None
    except UnicodeDecodeError:
        raise not_spot("not UTF-8 text (compressed?)") from None
    except json.JSONDecodeError as err:
        raise not_spot(f"not JSON ({err.msg}: line {err.lineno} column {err.colno})") from None
    except RecursionError:
        raise not_spot("not JSON this reader can take (nested too deep)") from None
    if not isinstance(raw, dict):
        raise not_spot(f"the JSON must be an object, got {_json_kind(raw)}")
    for field in ("metadata", "data"):
        if field not in raw:
            raise not_spot(f"no {field!r} field")
    if not isinstance(raw["metadata"], dict):
        raise not_spot(f"'metadata' must be an object, got {_json_kind(raw['metadata'])}")
    if "gap_seconds" not in raw["metadata"]:
        raise not_spot("no 'metadata.gap_seconds' field")
    gap = _spot_number(raw["metadata"]["gap_seconds"], "'metadata.gap_seconds'", not_spot)
    if not isinstance(raw["data"], list):
        raise not_spot(f"'data' must be a list, got {_json_kind(raw['data'])}")
    data = [_spot_number(x, f"data[{i}]", not_spot) for i, x in enumerate(raw["data"])]
    top = max(data, default=0.0)
    if not (math.isfinite(gap) and gap >= 1) or not all(math.isfinite(x) and x >= 0 for x in data) or top <= 0:
        raise TraceError(
            f"{path}: a spot trace needs gap_seconds >= 1 and data of finite numbers >= 0, some > 0 "
            f"(got gap_seconds {gap}, data from {min(data, default=0.0)} to {top})"
        )
    return SpotTrace(gap, tuple(x / top for x in data))
