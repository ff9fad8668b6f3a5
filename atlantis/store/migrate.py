"""Versioned schema migrations, safe when several processes migrate at once."""

from __future__ import annotations

import re
from importlib import resources
from typing import Any, LiteralString

import psycopg

from atlantis.declarations.model import JobDecl
from atlantis.store.queries import Q

_LOCK_KEY = 0x61746C616E746973  # "atlantis"
_FILE = re.compile(r"^(\d{4})_[\w-]+\.sql$")


def migrations() -> list[tuple[int, str, LiteralString]]:
    """(version, name, sql) for every migration shipped with the package, in order."""
    found = []
    for entry in resources.files("atlantis.store").joinpath("migrations").iterdir():
        m = _FILE.match(entry.name)
        if m:
            sql: LiteralString = entry.read_text("utf-8")
            found.append((int(m.group(1)), entry.name, sql))
    found.sort()
    return found


def migrate(conn: psycopg.Connection[Any]) -> list[int]:
    """Apply the migrations this database lacks; returns the versions applied."""
    applied: list[int] = []
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
        conn.execute("CREATE SCHEMA IF NOT EXISTS atlantis")
        conn.execute(
            "CREATE TABLE IF NOT EXISTS atlantis.schema_migrations ("
            " version int PRIMARY KEY, name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        done = {row[0] for row in conn.execute("SELECT version FROM atlantis.schema_migrations")}
        for version, name, sql in migrations():
            if version in done:
                continue
            conn.execute(sql)
            conn.execute(
                "INSERT INTO atlantis.schema_migrations (version, name) VALUES (%s, %s)",
                (version, name),
            )
            applied.append(version)
    return applied


def sync(conn: psycopg.Connection[Any], decls: list[JobDecl]) -> None:
    """Store the declarations in ``atlantis.job_types``; enqueues validate against them."""
    from psycopg.types.json import Jsonb

    with conn.transaction():
        for decl in decls:
            d = decl.to_json()
            conn.execute(
                Q.sync_job_type,
                {
                    "job": d["job"], "queue": d["queue"], "max_attempts": d["max_attempts"],
                    "priority": d["priority"], "timeout": d["timeout"],
                    "heartbeat": d["heartbeat"], "backoff": d["backoff"],
                    "unique_fields": d["unique_fields"], "fields": Jsonb(d["fields"]),
                    "source": d["source"], "stall": d["stall"], "schedule": d["schedule"],
                    "tz": d["tz"],
                },
            )
