"""A scratch database on the embedded PostgreSQL server, dropped afterwards; its URL."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import quote

import psycopg
from psycopg.conninfo import conninfo_to_dict

from atlantis.store.database import resolve_url


def url_for(admin: str, dbname: str) -> str:
    """A libpq URL (which asyncpg also reads) for ``dbname`` on the admin URL's server."""
    params = conninfo_to_dict(admin)
    user = quote(str(params.get("user") or "postgres"))
    password = params.get("password")
    auth = f"{user}:{quote(str(password))}" if password else user
    query = []
    if params.get("host"):
        query.append(f"host={quote(str(params['host']), safe='')}")
    if params.get("port"):
        query.append(f"port={params['port']}")
    return f"postgresql://{auth}@/{dbname}" + ("?" + "&".join(query) if query else "")


@contextmanager


def scratch_database(prefix: str) -> Iterator[str]:
    """Create a database named ``prefix`` plus a random part; yield its URL; drop it."""
    admin = resolve_url(None)
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')  # a name made here, not user input
    try:
        yield url_for(admin, name)
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
