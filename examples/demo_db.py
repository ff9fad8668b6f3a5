"""The database both demos use: one of their own, so that the user's stays theirs.

With ``ATLANTIS_DATABASE_URL`` unset, the demos work in the database ``atlantis_demo`` of the
embedded PostgreSQL (created on first use), never in its default database, which every
other command (``tide``, ``atlantis-supervise``, the user's code through
``atlantis.database_url()``) uses: the demos' tables (``contacts``, ...) and declarations
(``directory.*``, ``onboarding.*``) stay out of the user's way. The default database gets
the atlantis schema only (``tide db migrate`` with no app: no table or declaration of the
demos), as the first command of any app would make it, so that ``tide db doctor`` finds
nothing to report after a demo on a new home.

With ``ATLANTIS_DATABASE_URL`` set, the demos use that database as given: the user chose it.
"""

from __future__ import annotations

import os

import psycopg
from psycopg import errors, sql

from atlantis.store import migrate
from atlantis.store.database import ENV_URL, resolve_url

#: The embedded server's database the demos run in.
DEMO_DATABASE = "atlantis_demo"


def demo_database() -> tuple[str, bool]:
    """The demos' database URL, and whether the user named it (``ATLANTIS_DATABASE_URL``).

    Starts the embedded server if needed, creates :data:`DEMO_DATABASE` in it when missing,
    and migrates the default database's schema (nothing else). Raises what starting the
    server raises.
    """
    explicit = os.environ.get(ENV_URL)
    if explicit:
        return explicit, True
    default = resolve_url(None)
    with psycopg.connect(default, autocommit=True) as conn:
        found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s",
                             (DEMO_DATABASE,)).fetchone()
        if found is None:
            try:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DEMO_DATABASE)))
            except errors.DuplicateDatabase:  # another demo made it meanwhile
                pass
    with psycopg.connect(default) as conn:
        migrate(conn)
    return psycopg.conninfo.make_conninfo(default, dbname=DEMO_DATABASE), False


def where(explicit: bool) -> str:
    """The demo's first line: the database it works in."""
    if explicit:
        return "demo: in the database ATLANTIS_DATABASE_URL names"
    return (f"demo: in the database {DEMO_DATABASE} of the embedded PostgreSQL "
            f"(your default database gets no demo table nor declaration)")
