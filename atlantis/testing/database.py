"""The test kit's databases: one template per app and session (migrated, the app's
declarations synced), then a fresh copy of it per test (``CREATE DATABASE ... TEMPLATE``:
milliseconds), dropped after the test.

The server is the one every atlantis command would use (:func:`atlantis.database_url`):
``ATLANTIS_DATABASE_URL`` when set (its role needs CREATEDB), else the embedded PostgreSQL
under ``ATLANTIS_HOME``, started on first use.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg

from atlantis.store import databases

_counter = itertools.count()


def url_for(url: str, dbname: str) -> str:
    """``url`` naming database ``dbname`` instead."""
    return psycopg.conninfo.make_conninfo(url, dbname=dbname)


class TestDatabase(str):
    """A test's database: the ``str`` is its URL (``psycopg.connect(atlantis_db)``).

    ``app`` is the app it holds the declarations of (``package.module:registry``);
    :meth:`fresh` makes another database like it, as it was before the test: what
    :func:`atlantis.testing.assert_idempotent` runs each run in.
    """

    __test__ = False  # not a test class, whatever pytest collects
    admin_url: str
    template: str
    app: str
    name: str

    def __new__(cls, admin_url: str, template: str, app: str, name: str) -> TestDatabase:
        self = super().__new__(cls, url_for(admin_url, name))
        self.admin_url, self.template, self.app, self.name = admin_url, template, app, name
        return self

    @property
    def url(self) -> str:
        return str(self)

    def connect(self, **kwargs: Any) -> psycopg.Connection[Any]:
        """An autocommit connection to this database (``kwargs`` to ``psycopg.connect``)."""
        return psycopg.connect(str(self), **{"autocommit": True, **kwargs})

    @contextmanager
    def fresh(self, setup: Callable[[psycopg.Connection[Any]], object] | None = None
              ) -> Iterator[TestDatabase]:
        """Another fresh database from the same template, ``setup(conn)`` applied to it
        (your tables), dropped when the block ends."""
        with fresh_database(self.admin_url, self.template, self.app) as other:
            if setup is not None:
                with other.connect() as conn:
                    setup(conn)
            yield other


def _admin(url: str) -> psycopg.Connection[Any]:
    return psycopg.connect(url, autocommit=True)


def template_name(app: str) -> str:
    """The template of ``app`` for this process (a pytest-xdist worker makes its own)."""
    digest = hashlib.sha1(app.encode()).hexdigest()[:10]
    return f"atl_test_tpl_{digest}_{os.getpid()}"


def make_template(admin_url: str, app: str) -> str:
    """Create (again) this process's template of ``app``: migrated, declarations synced."""
    from atlantis.app import load_app
    from atlantis.store import migrate, sync

    registry = load_app(app)
    name = template_name(app)
    with _admin(admin_url) as conn:
        databases.drop(conn, name)
        databases.create(conn, name)
    with psycopg.connect(url_for(admin_url, name)) as conn:
        migrate(conn)
        sync(conn, list(registry.decls.values()), list(registry.workflows.values()))
        conn.commit()
    return name


def drop(admin_url: str, name: str) -> None:
    with _admin(admin_url) as conn:
        databases.drop(conn, name)


@contextmanager
def fresh_database(admin_url: str, template: str, app: str) -> Iterator[TestDatabase]:
    """A database copied from ``template``, dropped (with its sessions) afterwards."""
    name = f"atl_test_{os.getpid()}_{next(_counter)}"
    with _admin(admin_url) as conn:
        databases.create(conn, name, template)
    try:
        yield TestDatabase(admin_url, template, app, name)
    finally:
        drop(admin_url, name)


def server_url() -> str:
    """The server to make test databases on, as every atlantis command picks it."""
    from atlantis.store.database import database_url

    return database_url()


def python_path() -> str:
    """``PYTHONPATH`` for the processes the kit starts: this process's path first, so that a
    supervisor imports the app (and its handlers) as the tests do."""
    extra = os.environ.get("PYTHONPATH", "")
    return os.pathsep.join([p for p in sys.path if p] + ([extra] if extra else []))
