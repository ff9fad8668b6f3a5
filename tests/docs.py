"""The documentation pages the tests read: the bad-input reference, docs/reference/bad-input/,
one page per surface (enqueue-python.md, configuration.md, ...) and index.md, whose toctree
lists them. The tests that quote their messages there read ``bad_input_text()``;
tests/test_bad_input.py also reads the pages one by one.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BAD_INPUT = ROOT / "docs" / "reference" / "bad-input"

_TOCTREE = re.compile(r"^```\{toctree\}\n(.*?)^```", re.M | re.S)
_CELL = re.compile(r"(?<!\\)\|")  # a | written \| stands inside its cell


def bad_input_pages() -> dict[str, str]:
    """The text of each page of the bad-input reference, by file name (index.md included)."""
    return {path.name: path.read_text("utf-8") for path in sorted(BAD_INPUT.glob("*.md"))}


def bad_input_text() -> str:
    """The pages of the bad-input reference, one after the other, as one text."""
    return "\n".join(bad_input_pages().values())


def toctree(text: str) -> list[str]:
    """The entries of the first toctree of a page (its options and blank lines left out)."""
    found = _TOCTREE.search(text)
    if found is None:
        return []
    return [line.strip() for line in found.group(1).splitlines()
            if line.strip() and not line.lstrip().startswith(":")]


def table_rows(text: str) -> list[list[str]]:
    """The rows of every table of a page, as lists of cells (header rows left out)."""
    rows = []
    for line in text.splitlines():
        if not line.startswith("|") or set(line) <= set("|- "):
            continue
        cells = [c.strip() for c in _CELL.split(line.strip())[1:-1]]
        if cells and cells[0] != "bad input":
            rows.append(cells)
    return rows


def table_headers(text: str) -> list[list[str]]:
    """The header row of every table of a page, as lists of cells."""
    return [[c.strip() for c in _CELL.split(line.strip())[1:-1]]
            for line in text.splitlines() if line.startswith("| bad input |")]
