"""The current schema in one file, ``schema.sql``: generated, never edited by hand.

    python -m atlantis.store.schema --write    # regenerate atlantis/store/schema.sql
    python -m atlantis.store.schema --check    # exit 1, with a diff, when it is stale

It migrates a scratch database (:func:`atlantis.store.migrate.migrate`: the migrations, then
``live/*.sql``) on the server of ``--database-url`` (else ``ATLANTIS_DATABASE_URL``, else
the embedded PostgreSQL), dumps its ``atlantis`` schema with the ``pg_dump`` of the embedded
wheel's default major (``--schema-only --no-owner --no-privileges``) and drops pg_dump's
settings and version lines. The dump is PostgreSQL's own and differs between majors, so the
file is written on the default major (18) only; ``tests/test_schema.py`` regenerates it
and fails when it and the migrations drift.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import subprocess
import sys
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import psycopg

from atlantis.errors import AtlantisError
from atlantis.store import databases
from atlantis.store.migrate import migrate, migrations

FILE = "schema.sql"
#: The command that regenerates the file.
COMMAND = "python -m atlantis.store.schema --write"

# pg_dump's lines that depend on the versions or set the restoring session up.
_NOISE = re.compile(r"^(?:SET |SELECT pg_catalog\.set_config\(|\\(?:un)?restrict |"
                    r"-- (?:Dumped from|Dumped by|PostgreSQL database dump)|--$)")

# A function's body, as pg_dump quotes it (with $$, or $_$ when the body holds $$).
_BODY = re.compile(r"^    AS (\$\w*\$).*?\1;$", re.DOTALL | re.MULTILINE)
_BODY_ELSEWHERE = "    AS $$ ... $$;  -- the body: atlantis/store/live"


class WrongMajorError(AtlantisError):
    """The server is not of the default PostgreSQL major; the schema file is written there."""


def pg_dump() -> Path:
    """The pg_dump of the embedded wheel's default major."""
    from atlantis.store.embedded import DEFAULT_MAJOR, bin_dir

    return bin_dir(DEFAULT_MAJOR) / "pg_dump"


@cache
def default_major() -> int:
    """The PostgreSQL major the schema file is written on: the embedded default's."""
    out = subprocess.run([str(pg_dump()), "--version"], capture_output=True, text=True,
                         check=True).stdout
    found = re.search(r"\) (\d+)", out)
    if found is None:
        raise AtlantisError(f"cannot read the version of {pg_dump()}: {out.strip()}")
    return int(found.group(1))


def server_major(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT current_setting('server_version_num')::int / 10000").fetchone()
    assert row is not None
    return int(row[0])


def current() -> str:
    """The schema file shipped with the package."""
    return resources.files("atlantis.store").joinpath(FILE).read_text("utf-8")


def generate(url: str) -> str:
    """The schema file as the migrations make it, built in a scratch database on the server
    of ``url`` (a role that may create databases), dropped afterwards."""
    scratch = f"atl_schema_{os.getpid()}"
    with psycopg.connect(url, autocommit=True) as conn:
        major = server_major(conn)
        if major != default_major():
            raise WrongMajorError(f"the server runs PostgreSQL {major}; {FILE} is written on "
                                  f"PostgreSQL {default_major()}, the embedded default")
        databases.drop(conn, scratch)
        databases.create(conn, scratch)
    try:
        scratch_url = psycopg.conninfo.make_conninfo(url, dbname=scratch)
        with psycopg.connect(scratch_url) as conn:
            migrate(conn)
        dump = subprocess.run(
            [str(pg_dump()), "--schema-only", "--no-owner", "--no-privileges",
             "--schema=atlantis", "--dbname", scratch_url],
            capture_output=True, text=True, check=True).stdout
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            databases.drop(conn, scratch)
    return normalize(dump)


def normalize(dump: str) -> str:
    """A dump without pg_dump's settings and version lines, under the file's own header:
    its statements in pg_dump's order (by kind, then name), one blank line between them.
    A function keeps its signature and attributes; its body is in atlantis/store/live."""
    blocks = []
    for block in re.split(r"\n\s*\n", dump.replace("\r\n", "\n")):
        if any(not _NOISE.match(line) for line in block.strip("\n").splitlines()):
            blocks.append(_BODY.sub(_BODY_ELSEWHERE, block.strip("\n")))
    return _header() + "\n\n" + "\n\n".join(blocks) + "\n"


def _header() -> str:
    return (f"-- The atlantis schema as the migrations (0001 to {migrations()[-1][0]:04d}) and live/*.sql\n"
            "-- leave it; a function's body is in live/*.sql. GENERATED, do not edit:\n"
            f"-- `{COMMAND}` writes it, and tests/test_schema.py\n"
            "-- fails when it and the migrations drift. pg_dump --schema-only --no-owner\n"
            f"-- --no-privileges on PostgreSQL {default_major()}, without its settings and version lines;\n"
            "-- the roles' rights are granted by atlantis.store.migrate.")


def drift(expected: str, found: str) -> str:
    """A unified diff from the file (``expected``) to what the migrations make."""
    return "".join(difflib.unified_diff(expected.splitlines(keepends=True),
                                        found.splitlines(keepends=True),
                                        f"atlantis/store/{FILE}", "the migrations"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m atlantis.store.schema",
                                     description=__doc__.splitlines()[0] if __doc__ else None)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help=f"regenerate atlantis/store/{FILE}")
    mode.add_argument("--check", action="store_true", help="exit 1 when the file is stale")
    parser.add_argument("--database-url", help="a server to build the scratch database on")
    args = parser.parse_args(argv)
    from atlantis.store.database import resolve_url

    text = generate(resolve_url(args.database_url))
    if args.write:
        Path(__file__).with_name(FILE).write_text(text, "utf-8")
        return 0
    diff = drift(current(), text)
    if diff:
        sys.stdout.write(diff)
        print(f"atlantis/store/{FILE} is stale: run `{COMMAND}`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
