"""The shop's tests: atlantis.testing's fixtures and helpers, nothing else."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg import sql
from shop.handlers import PAGES, PER_PAGE, registry, setup

import atlantis
from atlantis.testing import TestDatabase, assert_idempotent, drain, run_inline


def test_run_inline_returns_the_result(atlantis_db: str) -> None:
    run = run_inline(registry, "shop.Add", {"a": 2, "b": 3}, db=atlantis_db)
    assert run.result == {"sum": 5}
    assert run.checkpoints == [(50.0, "adding")]
    assert run.state == "complete"


def test_run_inline_refuses_bad_args(atlantis_db: str) -> None:
    with pytest.raises(atlantis.ValidationError):
        run_inline(registry, "shop.Add", {"a": "two", "b": 3}, db=atlantis_db)


def test_run_inline_raises_as_the_attempt_ends(atlantis_db: str) -> None:
    with pytest.raises(RuntimeError, match="out of stock"):
        run_inline(registry, "shop.Fail", {"why": "out of stock"}, db=atlantis_db)


def test_drain_runs_jobs_to_their_end(atlantis_db: str,
                                      atlantis_conn: psycopg.Connection[Any]) -> None:
    ok = atlantis.enqueue(atlantis_conn, "shop.Add", {"a": 1, "b": 1})
    bad = atlantis.enqueue(atlantis_conn, "shop.Fail", {"why": "no"})
    ends = {end.id: end for end in drain(atlantis_db, registry)}
    assert (ends[ok].state, ends[ok].result, ends[ok].attempts) == ("complete", {"sum": 2}, 1)
    assert ends[bad].state == "dead"
    assert "no" in (ends[bad].error or "")


def _contacts(table: str) -> Any:
    def check(conn: psycopg.Connection[Any]) -> None:
        query = sql.SQL("SELECT count(*), count(DISTINCT contact) FROM {}").format(
            sql.Identifier(table))
        rows = conn.execute(query).fetchone()
        assert rows == (PAGES * PER_PAGE, PAGES * PER_PAGE), f"{table}: {rows}"
    return check


def test_the_guides_handler_is_idempotent(atlantis_db: TestDatabase) -> None:
    points = assert_idempotent(registry, "shop.Import", {"account": "acme"},
                               _contacts("contacts"), db=atlantis_db, setup=setup)
    assert any("commit" in p for p in points)


def test_the_transaction_step_version_is_idempotent(atlantis_db: TestDatabase) -> None:
    assert_idempotent(registry, "shop.ImportDurable", {"account": "acme"},
                      _contacts("contacts"), db=atlantis_db, setup=setup)


def test_broken_a_row_per_page_without_a_key(atlantis_db: TestDatabase) -> None:
    assert_idempotent(registry, "shop.ImportNoKey", {"account": "acme"},
                      _contacts("contacts_nokey"), db=atlantis_db, setup=setup)
