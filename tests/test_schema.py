"""The current schema in one file (``atlantis/store/schema.sql``), and every SQL function's
one live definition (``atlantis/store/functions.sql``), which migrate applies after the
migrations and which may change a body, never a signature."""

from __future__ import annotations

from typing import Any, LiteralString

import psycopg
import pytest

from atlantis.store import functions, schema
from atlantis.store.migrate import migrate, migrations

#: Database-facing: also run on PostgreSQL 16 (ATLANTIS_TEST_PG=16).
pytestmark = pytest.mark.server_matrix

# ---- schema.sql -----------------------------------------------------------------------------


def test_the_schema_file_is_what_the_migrations_make(admin_url: str) -> None:
    """Regenerated into a scratch database; fails when the file and the migrations (or
    functions.sql) drift."""
    try:
        made = schema.generate(admin_url)
    except schema.WrongMajorError as exc:
        pytest.skip(f"the schema file is checked on the default PostgreSQL major only: {exc}")
    found = schema.current()
    assert made == found, (f"atlantis/store/schema.sql and the migrations drift: run "
                           f"`{schema.COMMAND}` and commit the file\n"
                           + schema.drift(found, made)[:8000])


def test_the_schema_file_says_nothing_of_the_versions_that_wrote_it() -> None:
    found = schema.current()
    assert "Dumped" not in found and "\nSET " not in found and "set_config" not in found
    assert f"0001 to {migrations()[-1][0]:04d}" in found.splitlines()[0]


# ---- functions.sql ----------------------------------------------------------------------


def _names(conn: psycopg.Connection[Any]) -> list[str]:
    return [r[0] for r in conn.execute(
        "SELECT 'atlantis.' || proname FROM pg_proc"
        " WHERE pronamespace = 'atlantis'::regnamespace ORDER BY 1")]


def test_every_function_has_one_definition_in_the_functions_file(
        db: psycopg.Connection[Any]) -> None:
    defined = [name for name, _ in functions.definitions(functions.functions_sql())]
    assert sorted(defined) == _names(db), "a function of the schema missing from functions.sql"
    assert len(set(defined)) == len(defined)


def test_migrate_applies_the_functions_file_every_time(db: psycopg.Connection[Any]) -> None:
    db.execute("CREATE OR REPLACE FUNCTION atlantis.clamp_pct(p double precision)"
               " RETURNS smallint LANGUAGE sql IMMUTABLE AS 'SELECT 7::smallint'")
    assert db.execute("SELECT atlantis.clamp_pct(150)").fetchone() == (7,)
    assert migrate(db) == []
    assert db.execute("SELECT atlantis.clamp_pct(150)").fetchone() == (100,)


def test_migrate_leaves_the_functions_of_a_newer_schema_alone(
        db: psycopg.Connection[Any]) -> None:
    """A newer release migrated (a rolling upgrade): its definitions stand."""
    db.execute("INSERT INTO atlantis.schema_migrations (version, name) VALUES (%s, 'next')",
               (migrations()[-1][0] + 1,))
    db.execute("CREATE OR REPLACE FUNCTION atlantis.clamp_pct(p double precision)"
               " RETURNS smallint LANGUAGE sql IMMUTABLE AS 'SELECT 7::smallint'")
    assert migrate(db) == []
    assert db.execute("SELECT atlantis.clamp_pct(150)").fetchone() == (7,)


CLAMP: LiteralString = ("CREATE OR REPLACE FUNCTION atlantis.clamp_pct(p double precision)"
                        " RETURNS smallint")


def _edited(old: LiteralString, new: LiteralString) -> LiteralString:
    sql = functions.functions_sql()
    assert sql.count(old) == 1
    return sql.replace(old, new)


@pytest.mark.parametrize(("old", "new", "refused"), [
    (CLAMP, "CREATE OR REPLACE FUNCTION atlantis.clamp_pct(p numeric) RETURNS smallint",
     "atlantis.clamp_pct(numeric) made by no migration"),
    ("CREATE OR REPLACE FUNCTION atlantis.cancel(job_id bigint, by text DEFAULT current_user)",
     "CREATE OR REPLACE FUNCTION atlantis.cancel(job_id bigint, by text DEFAULT current_user,"
     " why text DEFAULT NULL)",
     "atlantis.cancel(bigint,text,text) made by no migration"),
    (CLAMP, "CREATE OR REPLACE FUNCTION atlantis.clamp_pct(p double precision) RETURNS int",
     "atlantis.clamp_pct: cannot change return type of existing function"),
    (CLAMP, "CREATE OR REPLACE FUNCTION atlantis.clamp_pct(pct double precision) RETURNS smallint",
     "atlantis.clamp_pct: cannot change name of input parameter"),
    ("-- Append one failure", "CREATE OR REPLACE FUNCTION atlantis.brand_new() RETURNS int"
     " LANGUAGE sql AS 'SELECT 1';\n-- Append one failure",
     "atlantis.brand_new() made by no migration"),
])
def test_a_new_signature_in_the_functions_file_is_refused(
        db: psycopg.Connection[Any], old: LiteralString, new: LiteralString,
        refused: str) -> None:
    with pytest.raises(functions.SignatureError) as info, db.transaction():
        functions.apply(db, _edited(old, new))
    assert refused in str(info.value)
    assert str(info.value).startswith("functions.sql: ")
    assert "needs a migration" in str(info.value)
    assert _names(db).count("atlantis.cancel") == 1  # rolled back


def test_a_refused_functions_file_rolls_the_whole_migration_back(
        db: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    db.execute("DROP FUNCTION atlantis.cancel_message(text)")  # as before migration 16
    db.execute("DELETE FROM atlantis.schema_migrations WHERE version = 16")
    edited = _edited(CLAMP, CLAMP.replace("RETURNS smallint", "RETURNS int"))
    monkeypatch.setattr(functions, "functions_sql", lambda: edited)
    with pytest.raises(functions.SignatureError, match="atlantis.clamp_pct"):
        migrate(db)
    assert "atlantis.cancel_message" not in _names(db)
    assert db.execute("SELECT count(*) FROM atlantis.schema_migrations WHERE version = 16"
                      ).fetchone() == (0,)
    monkeypatch.undo()
    assert 16 in migrate(db)


def test_a_new_body_with_the_same_signature_is_applied(db: psycopg.Connection[Any]) -> None:
    body = "SELECT CASE WHEN p IS NULL OR p = 'NaN'::float8 THEN 0"
    with db.transaction(force_rollback=True):
        functions.apply(db, _edited(body, "SELECT CASE WHEN p IS NULL OR p = 'NaN'::float8 THEN 5"))
        assert db.execute("SELECT atlantis.clamp_pct(NULL)").fetchone() == (5,)
    assert db.execute("SELECT atlantis.clamp_pct(NULL)").fetchone() == (0,)
