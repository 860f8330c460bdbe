"""Every Markdown table in the README and docs renders: a header, its separator row, and rows of
the header's width. Tables are pasted from benchmark output by hand; a header pasted without its
separator row renders as a paragraph of pipes (twice in the README, in session 37's edits)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SEPARATOR = re.compile(r"^\|(\s*:?-+:?\s*\|)+$")


def cells(row: str) -> int:
    """Cells of a table row: pipes outside code spans and not escaped, less the outer two."""
    outside = re.sub(r"`[^`]*`", "", row).replace("\\|", "")
    return outside.count("|") - 1


def tables(text: str) -> list[tuple[int, list[str]]]:
    """(first line number, rows) of each run of lines starting with a pipe, outside code fences."""
    out, rows, fenced = [], [], False
    for number, line in enumerate(text.splitlines(), start=1):
        fenced ^= line.startswith("```")
        if line.startswith("|") and not fenced:
            if not rows:
                out.append((number, rows))
            rows.append(line.rstrip())
        else:
            rows = []
    return out


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_every_table_has_its_separator_row_and_rows_of_its_width(path):
    problems = []
    for line, rows in tables(path.read_text()):
        if len(rows) < 2 or not SEPARATOR.match(rows[1]):
            problems.append(f"{path.name}:{line}: no separator row under the header {rows[0][:60]!r}")
            continue
        width = cells(rows[0])
        problems += [f"{path.name}:{line + i}: {cells(row)} cells, the header has {width}: {row[:60]!r}"
                     for i, row in enumerate(rows) if cells(row) != width]  # fmt: skip
    assert not problems, "\n".join(problems)
