"""A scratch database on the embedded PostgreSQL server, dropped afterwards."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg

from atlantis.store.database import resolve_url
from benchmarks.compare import url_for


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
