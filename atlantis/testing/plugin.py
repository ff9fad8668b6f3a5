"""The pytest plugin of :mod:`atlantis.testing` (entry point ``pytest11``: ``atlantis``).

Its fixtures are opt-in, by name: a test that asks for none of them costs nothing, and
loading the plugin imports nothing of atlantis but this module.

* ``atlantis_app``: the app, ``package.module:registry``: ``--atlantis-app``, else the ini
  option ``atlantis_app``, else ``ATLANTIS_APP``; override the fixture to choose per
  directory or module (a conftest.py ``def atlantis_app(): return "..."``).
* ``atlantis_db``: a fresh database per test, migrated, with the app's declarations
  (:class:`atlantis.testing.TestDatabase`, a ``str`` of its URL).
* ``atlantis_conn``: an autocommit ``psycopg.Connection`` to ``atlantis_db``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

_TEMPLATES: dict[tuple[str, str], str] = {}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("atlantis", "atlantis.testing")
    group.addoption("--atlantis-app", default=None, metavar="MODULE:REGISTRY",
                    help="the app atlantis_db holds the declarations of")
    parser.addini("atlantis_app", "the app of atlantis_db (package.module:registry)",
                  default="")


@pytest.fixture(scope="session")
def atlantis_app(pytestconfig: pytest.Config) -> str:
    """The app under test, ``package.module:registry``."""
    from atlantis import environ

    app = (pytestconfig.getoption("atlantis_app") or pytestconfig.getini("atlantis_app")
           or os.environ.get(environ.APP))
    if not app:
        raise pytest.UsageError(
            "atlantis_db needs the app: pass --atlantis-app package.module:registry, set "
            "atlantis_app in the pytest ini options, or override the atlantis_app fixture")
    return str(app)


@pytest.fixture(scope="session")
def _atlantis_server() -> Iterator[str]:
    from atlantis.testing.database import drop, server_url

    url = server_url()
    yield url
    for (server, _), template in list(_TEMPLATES.items()):
        if server == url:
            drop(url, template)
            _TEMPLATES.pop((server, _), None)


@pytest.fixture
def atlantis_db(_atlantis_server: str, atlantis_app: str) -> Iterator[Any]:
    """A fresh database of the app: migrated, its declarations synced, dropped after."""
    from atlantis.testing.database import fresh_database, make_template

    key = (_atlantis_server, atlantis_app)
    if key not in _TEMPLATES:
        _TEMPLATES[key] = make_template(_atlantis_server, atlantis_app)
    with fresh_database(_atlantis_server, _TEMPLATES[key], atlantis_app) as db:
        yield db


@pytest.fixture
def atlantis_conn(atlantis_db: Any) -> Iterator[Any]:
    """An autocommit connection to ``atlantis_db``."""
    with atlantis_db.connect() as conn:
        yield conn
