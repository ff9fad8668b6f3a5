"""Where the database is: ``ATLANTIS_DATABASE_URL``, ``--database-url``, or the embedded one.

With no URL configured, every command uses an embedded PostgreSQL (the ``pgserver``
package, PostgreSQL 16 from PyPI), started on first use with its data under
``ATLANTIS_HOME`` and left running for the user's other commands.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

ENV_URL = "ATLANTIS_DATABASE_URL"
ENV_HOME = "ATLANTIS_HOME"


def atlantis_home() -> Path:
    raw = os.environ.get(ENV_HOME) or os.path.join(
        os.path.expanduser("~"), ".local", "share", "atlantis"
    )
    return Path(raw)


def embedded_url(home: Path | None = None) -> str:
    """Start (or join) the embedded PostgreSQL under ``home`` and return its URL."""
    data = (home or atlantis_home()) / "pgdata"
    data.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.getLogger("pgserver").setLevel(logging.WARNING)
        from pgserver.postgres_server import get_server

        server = get_server(data, cleanup_mode=None)
        return str(server.get_uri())


def resolve_url(explicit: str | None = None) -> str:
    """The URL to use: explicit, else ``ATLANTIS_DATABASE_URL``, else the embedded server."""
    return explicit or os.environ.get(ENV_URL) or embedded_url()


def redact(url: str) -> str:
    """The URL with its password hidden, for logs and stderr."""
    try:
        params = conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "<unparseable database url>"
    if params.get("password"):
        params["password"] = "***"
    return make_conninfo("", **params)


def announce(url: str, *, embedded: bool) -> None:
    kind = "embedded PostgreSQL" if embedded else "database"
    print(f"atlantis: using {kind} {redact(url)}", file=sys.stderr)


def connect(url: str, *, autocommit: bool = False, **kwargs: Any) -> psycopg.Connection[Any]:
    return psycopg.connect(url, autocommit=autocommit, application_name="atlantis", **kwargs)
