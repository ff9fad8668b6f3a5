"""The live definitions (``atlantis/store/live/*.sql``): every SQL function and view of the
schema, one file per concept.

:func:`atlantis.store.migrate.migrate` applies them after the versioned migrations, inside
its transaction and under its lock, through :func:`refresh`: only when their text changed
since they were last applied, or when what the database holds is no longer what was applied
(a previous release's host re-applied its own bodies, or someone edited one by hand), and
never over the definitions a newer package applied. What was applied is recorded in
``atlantis.live_definitions`` (migration 0024).

The files may change a function's body and attributes, never its signature, and a view's
query, never its columns: a definition that would create a function or view no migration
made (a new one, or a new overload: a changed argument type), or that PostgreSQL refuses as
a replacement (a changed return type, a renamed argument, a removed default, a dropped view
column), stops the migration with :class:`SignatureError` naming the file and the object,
before anything is committed.

CREATE OR REPLACE keeps an object's owner and grants but resets what the statement does not
say: every SECURITY DEFINER function says so, with its fixed search_path. The roles' rights
are granted by migrate's role step. ``schema.sql`` is the whole schema as the migrations and
these files leave it, generated: ``python -m atlantis.store.schema --write``.
"""

from __future__ import annotations

import hashlib
import re
from importlib import metadata, resources
from typing import Any, LiteralString

import psycopg

from atlantis.errors import AtlantisError

#: The files, in the order they are applied (every function they define exists already,
#: made by a migration, so the order only matters for the views, which come last).
FILES = ("types", "enqueue", "claims", "operators", "schedules", "counts", "workflows",
         "workflow_operators", "limits", "limited_claims", "steps", "events", "children", "liveness",
         "workers", "signal", "views")

#: Where each definition starts: each file holds one statement of this form per function or
#: view, each followed by nothing but its comments and REVOKE lines.
_HEADER = re.compile(r"^CREATE OR REPLACE (FUNCTION|VIEW) (atlantis\.\w+)\b",
                     re.MULTILINE | re.IGNORECASE)

_SIGNATURES: LiteralString = (
    "SELECT 'f' || p.oid, p.oid::regprocedure::text, pg_catalog.pg_get_function_result(p.oid)"
    "  FROM pg_catalog.pg_proc p"
    " WHERE p.pronamespace = 'atlantis'::regnamespace"
    " UNION ALL "
    "SELECT 'v' || c.oid, 'atlantis.' || c.relname,"
    "       (SELECT string_agg(a.attname || ' ' || format_type(a.atttypid, a.atttypmod), ', '"
    "                          ORDER BY a.attnum)"
    "          FROM pg_catalog.pg_attribute a WHERE a.attrelid = c.oid AND a.attnum > 0)"
    "  FROM pg_catalog.pg_class c"
    " WHERE c.relnamespace = 'atlantis'::regnamespace AND c.relkind = 'v'"
)

_NEEDS_MIGRATION = ("a new function or view, a new signature (arguments, their names, the "
                    "return type) or new view columns: each needs a migration; atlantis/store/live "
                    "may change bodies only")


class SignatureError(AtlantisError):
    """A live definition would create a function or view, or change a signature or a view's
    columns: that takes a migration."""


def file_sql(name: str) -> LiteralString:
    """The text of ``live/<name>.sql`` shipped with the package."""
    sql: LiteralString = (resources.files("atlantis.store").joinpath("live", f"{name}.sql")
                          .read_text("utf-8"))
    return sql


def live_files() -> list[tuple[str, LiteralString]]:
    """(``live/<name>.sql``, its text) for every file, in the order they are applied."""
    return [(f"live/{name}.sql", file_sql(name)) for name in FILES]


def functions_sql() -> LiteralString:
    """Every live definition as one text, in the order they are applied."""
    sql: LiteralString = "\n".join(text for _, text in live_files())
    return sql


def definitions(sql: LiteralString) -> list[tuple[str, LiteralString]]:
    """(``atlantis.name``, its statements) for every definition of ``sql``, in order. What
    precedes the first one (the file's own comments) is left out."""
    starts = [(m.start(), m.group(2)) for m in _HEADER.finditer(sql)]
    ends = [start for start, _ in starts[1:]] + [len(sql)]
    return [(name, sql[start:end]) for (start, name), end in zip(starts, ends, strict=True)]


def apply(conn: psycopg.Connection[Any], sql: LiteralString | None = None) -> None:
    """Apply the live files (or ``sql``, in their form, labelled "the given SQL") in the
    caller's transaction.

    Every function and view they define must exist already, with the same signature or
    columns: otherwise :class:`SignatureError`, naming the file and the object, and the
    caller's transaction is left to roll back (migrate's: its migrations are rolled back
    too)."""
    files = live_files() if sql is None else [("the given SQL", sql)]
    before = _signatures(conn)
    for label, text in files:
        for name, statements in definitions(text):
            try:
                conn.execute(statements)
            except (psycopg.errors.InvalidFunctionDefinition,
                    psycopg.errors.InvalidTableDefinition) as exc:
                raise SignatureError(
                    f"{label}: {name}: {_first_line(exc)}: {_NEEDS_MIGRATION}") from exc
            except psycopg.Error as exc:  # its own type kept: a lost connection is retried
                exc.add_note(f"while applying {label}: {name}")
                raise
    after = _signatures(conn)
    where = "atlantis/store/live" if sql is None else "the given SQL"
    made = sorted(sig for oid, (sig, _) in after.items() if oid not in before)
    if made:
        raise SignatureError(f"{where}: {', '.join(made)} made by no migration: {_NEEDS_MIGRATION}")
    changed = sorted(sig for oid, (sig, result) in after.items()
                     if oid in before and before[oid] != (sig, result))
    if changed:  # PostgreSQL refuses a new result type above; the rule does not rest on it
        raise SignatureError(f"{where}: {', '.join(changed)} changed: {_NEEDS_MIGRATION}")


# ---- applied only when changed --------------------------------------------------------------

#: What the database holds of the live definitions, in one digest: each function's signature,
#: body and attributes, each view's query. Taken right after applying and compared at every
#: migrate, so that bodies replaced since (a host of the previous release re-applying its own
#: at its start, or a hand edit) are applied again.
_FINGERPRINT: LiteralString = (
    "SELECT md5(coalesce(string_agg(d, E'\\n' ORDER BY d), '')) FROM ("
    " SELECT p.oid::regprocedure::text || ' ' || p.prosrc || ' ' || p.prosecdef::text"
    "        || p.provolatile::text || coalesce(array_to_string(p.proconfig, ','), '') AS d"
    "   FROM pg_catalog.pg_proc p WHERE p.pronamespace = 'atlantis'::regnamespace"
    " UNION ALL"
    " SELECT c.relname || ' ' || pg_catalog.pg_get_viewdef(c.oid)"
    "   FROM pg_catalog.pg_class c"
    "  WHERE c.relnamespace = 'atlantis'::regnamespace AND c.relkind = 'v') AS s"
)


def package_version() -> str:
    """This package's version, as the record of the applied definitions keeps it."""
    try:
        return metadata.version("atlantis-jobs")
    except metadata.PackageNotFoundError:  # a source tree that was never installed
        return "0"


def _release(version: str) -> tuple[int, ...]:
    """The leading numbers of a version ("0.4.0rc1" -> (0, 4, 0)): enough to order releases."""
    return tuple(int(part) for part in re.findall(r"\d+", version.split("+")[0])[:3])


def refresh(conn: psycopg.Connection[Any], schema_version: int,
            version: str | None = None) -> bool:
    """Apply the live files in the caller's transaction (migrate's, under its lock) unless
    the database holds them already; returns whether they were applied.

    They are left alone when the record says they were applied from the same text, at the
    same schema version, and the database still holds what was applied then; and when a newer
    package (``version``, default :func:`package_version`) applied its own and they still
    stand. Otherwise they are applied and recorded."""
    version = package_version() if version is None else version
    text = functions_sql()
    checksum = hashlib.sha256(text.encode("utf-8")).hexdigest()
    row = conn.execute(
        "SELECT checksum, schema_version, package_version, fingerprint"
        "  FROM atlantis.live_definitions").fetchone()
    if row is not None and row[3] == _fingerprint(conn):
        same = row[0] == checksum and row[1] == schema_version
        if same or _release(row[2]) > _release(version):
            return False
    apply(conn)
    conn.execute(
        "INSERT INTO atlantis.live_definitions"
        " (checksum, schema_version, package_version, fingerprint) VALUES (%s, %s, %s, %s)"
        " ON CONFLICT (one) DO UPDATE SET checksum = EXCLUDED.checksum,"
        " schema_version = EXCLUDED.schema_version, package_version = EXCLUDED.package_version,"
        " fingerprint = EXCLUDED.fingerprint, applied_at = now()",
        (checksum, schema_version, version, _fingerprint(conn)))
    return True


def _fingerprint(conn: psycopg.Connection[Any]) -> str:
    row = conn.execute(_FINGERPRINT).fetchone()
    return str(row[0]) if row else ""


def _signatures(conn: psycopg.Connection[Any]) -> dict[str, tuple[str, str]]:
    """{oid: (``atlantis.name(types)``, its result)} for every function of the schema, and
    {oid: (``atlantis.name``, its columns)} for every view."""
    return {oid: (sig, result) for oid, sig, result in conn.execute(_SIGNATURES)}


def _first_line(exc: psycopg.Error) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
