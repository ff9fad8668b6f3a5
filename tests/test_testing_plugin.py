"""atlantis.testing, the pytest plugin, as a user runs it: the project in
tests/plugin_project (its own .atl, handlers and tests, using only the documented plugin) is
copied out of the repo and its pytest run in a process of its own; and the contact-import
example's handler proven idempotent with assert_idempotent."""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from atlantis import environ
from atlantis.testing import assert_idempotent
from atlantis.testing.database import TestDatabase, drop, fresh_database, make_template
from examples.contacts.app import CRM_URL_ENV, ensure_schema
from examples.contacts.crm import FakeCRM

PROJECT = Path(__file__).resolve().parent / "plugin_project"


def _pytest(project: Path, admin_url: str, *selection: str) -> subprocess.Popen[str]:
    """The project's pytest, in the project, on the suite's server (ATLANTIS_DATABASE_URL);
    the plugin comes by the package's entry point, or by ``-p`` where the development
    install predates it."""
    registered = any(e.value == "atlantis.testing.plugin"
                     for e in importlib.metadata.entry_points(group="pytest11"))
    plugin = [] if registered else ["-p", "atlantis.testing.plugin"]
    env = {**os.environ, environ.DATABASE_URL: admin_url}
    env.pop("PYTEST_XDIST_WORKER", None)
    env.pop("PYTHONPATH", None)
    return subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *plugin,
         "-p", "no:xdist", *selection], cwd=project, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


@pytest.mark.timeout(600)  # many supervisors, one after the other: slow on a loaded machine
def test_a_user_project_tests_its_handlers_with_the_plugin(admin_url: str,
                                                          tmp_path: Path) -> None:
    project = tmp_path / "shop-project"
    shutil.copytree(PROJECT, project, ignore=shutil.ignore_patterns("__pycache__"))
    # One after the other: each runs supervisors of its own, as many as the machine has
    # cores (assert_idempotent's kill runs); together they starved the rest of the suite.
    passing = _pytest(project, admin_url, "-k", "not broken")
    out, _ = passing.communicate(timeout=500)
    assert passing.returncode == 0, out
    assert "6 passed" in out, out
    broken = _pytest(project, admin_url, "-k", "broken")
    out, _ = broken.communicate(timeout=300)
    assert broken.returncode == 1, out
    assert "1 failed" in out, out
    # the kill point is named: a page's rows committed, its cursor not yet
    assert ("shop.ImportNoKey is not idempotent: killed just after commit 2 "
            "(before the first checkpoint) and run again, check failed") in out, out


@pytest.fixture
def contacts_db(admin_url: str) -> Iterator[TestDatabase]:
    app = "examples.contacts.app:registry"
    template = make_template(admin_url, app)
    try:
        with fresh_database(admin_url, template, app) as db:
            yield db
    finally:
        drop(admin_url, template)


def test_the_contact_import_example_is_idempotent(contacts_db: TestDatabase,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from examples.contacts.app import registry

    with FakeCRM(page_delay=0, page_size=4, contacts_per_account=10) as crm:
        monkeypatch.setenv(CRM_URL_ENV, crm.url)  # the supervisors' environment

        def check(conn: psycopg.Connection[Any]) -> None:
            got = conn.execute("SELECT count(*), count(DISTINCT contact_id) FROM contacts "
                               "WHERE account_id = 'acme'").fetchone()
            assert got == (10, 10), got

        points = assert_idempotent(registry, "directory.ImportContacts", {"account_id": "acme"},
                                   check, db=contacts_db, setup=ensure_schema)
    assert "before checkpoint 1 ('resuming pages=0 contacts=0')" in points
