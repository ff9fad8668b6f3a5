"""Whole databases, made and dropped by name (identifiers composed by psycopg.sql, never by
string formatting): the schema file's scratch database, and atlantis.testing's templates
and per-test copies. The caller's connection is in autocommit (a database cannot be made in
a transaction)."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql


def create(conn: psycopg.Connection[Any], name: str, template: str | None = None) -> None:
    """``CREATE DATABASE name`` (``TEMPLATE template`` when given)."""
    if template is None:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    else:
        conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
            sql.Identifier(name), sql.Identifier(template)))


def drop(conn: psycopg.Connection[Any], name: str) -> None:
    """``DROP DATABASE IF EXISTS name WITH (FORCE)``: its sessions are ended first."""
    conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
        sql.Identifier(name)))
