"""``atlantis.database_url()`` and ``tide db url``: the URL tide and the supervisor use.

The embedded case (no URL set: the server under ``ATLANTIS_HOME``) is checked by
``tests/test_demo_database.py``, which runs on a home of its own.
"""
from __future__ import annotations

import pytest

import atlantis
from tests.conftest import run_tide


def test_the_environment_url_is_the_url(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATLANTIS_DATABASE_URL", db_url)
    assert atlantis.database_url() == db_url
    assert run_tide(["db", "url"]).stdout.strip() == db_url


def test_tide_prints_its_explicit_url_first(db_url: str, monkeypatch: pytest.MonkeyPatch
                                            ) -> None:
    monkeypatch.setenv("ATLANTIS_DATABASE_URL", "postgresql:///elsewhere")
    assert run_tide(["--database-url", db_url, "db", "url"]).stdout.strip() == db_url
