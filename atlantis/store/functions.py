"""The functions file (``functions.sql``): the live definition of every SQL function.

:func:`atlantis.store.migrate.migrate` applies it after the versioned migrations, every
time, inside its transaction and under its lock (:func:`apply`). The file may change a
function's body and attributes, never its signature: a definition that would create a
function no migration made (a new one, or a new overload of an existing one: a changed
argument type) or that PostgreSQL refuses as a replacement (a changed return type, a
renamed argument, a removed default) stops the migration with :class:`SignatureError`
naming the function, before anything is committed.
"""

from __future__ import annotations

import re
from importlib import resources
from typing import Any, LiteralString

import psycopg

from atlantis.errors import AtlantisError

FILE = "functions.sql"

#: Where each definition starts: the file holds one statement of this form per function,
#: each followed by nothing but its comments and REVOKE lines.
_HEADER = re.compile(r"^CREATE OR REPLACE FUNCTION (atlantis\.\w+)\(", re.MULTILINE | re.IGNORECASE)

_SIGNATURES: LiteralString = (
    "SELECT p.oid, p.oid::regprocedure::text, pg_catalog.pg_get_function_result(p.oid)"
    "  FROM pg_catalog.pg_proc p"
    " WHERE p.pronamespace = 'atlantis'::regnamespace"
)

_NEEDS_MIGRATION = ("a new function or a new signature (arguments, their names, the return "
                    "type) needs a migration; functions.sql may change bodies only")


class SignatureError(AtlantisError):
    """The functions file would create a function or change a signature: that takes a
    migration."""


def functions_sql() -> LiteralString:
    """The functions file shipped with the package."""
    sql: LiteralString = resources.files("atlantis.store").joinpath(FILE).read_text("utf-8")
    return sql


def definitions(sql: LiteralString) -> list[tuple[str, LiteralString]]:
    """(``atlantis.name``, its statements) for every definition of ``sql``, in order. What
    precedes the first one (the file's own comments) is left out."""
    starts = [(m.start(), m.group(1)) for m in _HEADER.finditer(sql)]
    ends = [start for start, _ in starts[1:]] + [len(sql)]
    return [(name, sql[start:end]) for (start, name), end in zip(starts, ends, strict=True)]


def apply(conn: psycopg.Connection[Any], sql: LiteralString | None = None) -> None:
    """Apply the functions file (or ``sql``, in its form) in the caller's transaction.

    Every function it defines must exist already, with the same signature: otherwise
    :class:`SignatureError`, naming the function, and the caller's transaction is left
    to roll back (migrate's: its migrations are rolled back too)."""
    before = _signatures(conn)
    for name, statements in definitions(functions_sql() if sql is None else sql):
        try:
            conn.execute(statements)
        except psycopg.errors.InvalidFunctionDefinition as exc:
            raise SignatureError(f"{FILE}: {name}: {_first_line(exc)}: {_NEEDS_MIGRATION}") from exc
        except psycopg.Error as exc:  # its own type kept: a lost connection is retried
            exc.add_note(f"while applying {FILE}: {name}")
            raise
    after = _signatures(conn)
    made = sorted(sig for oid, (sig, _) in after.items() if oid not in before)
    if made:
        raise SignatureError(f"{FILE}: {', '.join(made)} made by no migration: {_NEEDS_MIGRATION}")
    changed = sorted(sig for oid, (sig, result) in after.items()
                     if oid in before and before[oid] != (sig, result))
    if changed:  # PostgreSQL refuses a new result type above; the rule does not rest on it
        raise SignatureError(f"{FILE}: {', '.join(changed)} changed: {_NEEDS_MIGRATION}")


def _signatures(conn: psycopg.Connection[Any]) -> dict[int, tuple[str, str]]:
    """{oid: (``atlantis.name(types)``, its result)} for every function of the schema."""
    return {oid: (sig, result) for oid, sig, result in conn.execute(_SIGNATURES)}


def _first_line(exc: psycopg.Error) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
