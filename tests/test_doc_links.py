"""Every link in the README and docs lands: `(#anchor)` on a heading of the same file (as GitHub
slugs it), `(path)` and `(path#anchor)` on a file of the repository and a heading there. Sections
move between the README and docs/; a link left pointing at the old place reads as working."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (not - or _), spaces to -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def prose(text: str) -> str:
    """The text outside code fences (a `# comment` in a shell block is no heading)."""
    return "\n".join(line for line, fenced in _fenced(text) if not fenced)


def _fenced(text: str):
    inside = False
    for line in text.splitlines():
        if line.startswith("```"):
            inside = not inside
            yield line, True
        else:
            yield line, inside


def anchors(path: Path) -> set[str]:
    """Every heading's anchor; a repeated heading's later ones get -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    out = set()
    for match in re.finditer(r"^#{1,6} (.+)$", prose(path.read_text()), re.MULTILINE):
        base = slug(match.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def test_slugs_are_githubs():
    assert slug("Teams, quotas and fair share") == "teams-quotas-and-fair-share"
    assert slug("`[queues.<name>]`") == "queuesname"
    assert slug("`[teams.<name>]` — quotas and fair share") == "teamsname--quotas-and-fair-share"
    assert slug("What did it cost?") == "what-did-it-cost"


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_every_link_lands_on_a_file_and_heading_that_exist(path):
    problems = []
    for target in LINK.findall(prose(path.read_text())):
        if re.match(r"[a-z]+:", target):  # https:, mailto: ... : not this repository's
            continue
        file, _, anchor = target.partition("#")
        where = (path.parent / file).resolve() if file else path
        if not where.exists():
            problems.append(f"{path.name}: ({target}): no file {file}")
        elif anchor and where.suffix == ".md" and anchor not in anchors(where):
            problems.append(f"{path.name}: ({target}): no heading #{anchor} in {where.name}")
    assert not problems, "\n".join(problems)
