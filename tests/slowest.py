"""The slowest tests of one run of ``scripts/test``, from the JUnit XML of its passes.

    python -m tests.slowest N FILE.xml...

Prints the N slowest test cases across the files (setup, call and teardown together, as
pytest's JUnit XML times them), each with its pass (the file's name), slowest first.
``scripts/test`` runs it at the end of every run.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def slowest(files: list[Path], n: int) -> list[tuple[float, str, str]]:
    """(seconds, pass, test) of the ``n`` slowest test cases of ``files``."""
    found = []
    for path in files:
        if not path.is_file():
            continue
        for case in ET.parse(path).iter("testcase"):
            name = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name', '')}"
            found.append((float(case.get("time") or 0), path.stem, name))
    return sorted(found, reverse=True)[:n]


def main(argv: list[str]) -> int:
    n, files = int(argv[0]), [Path(a) for a in argv[1:]]
    rows = slowest(files, n)
    print(f"== the {len(rows)} slowest tests (setup, call and teardown)")
    for seconds, where, name in rows:
        print(f"{seconds:8.2f}s  {where:<6} {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
