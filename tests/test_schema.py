"""The current schema in one file (``atlantis/store/schema.sql``), and every SQL function's
and view's one live definition (``atlantis/store/live/*.sql``), which migrate applies after
the migrations when it changed, and which may change a body, never a signature; the sizes
of the SQL files and functions."""

from __future__ import annotations

import re
from pathlib import Path
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
    the live definitions) drift."""
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


# ---- live/*.sql ---------------------------------------------------------------------------


def _names(conn: psycopg.Connection[Any]) -> list[str]:
    return [r[0] for r in conn.execute(
        "SELECT 'atlantis.' || proname FROM pg_proc"
        " WHERE pronamespace = 'atlantis'::regnamespace ORDER BY 1")]


def _views(conn: psycopg.Connection[Any]) -> list[str]:
    return [r[0] for r in conn.execute(
        "SELECT 'atlantis.' || relname FROM pg_class"
        " WHERE relnamespace = 'atlantis'::regnamespace AND relkind = 'v' ORDER BY 1")]


def test_every_function_and_view_has_one_live_definition(db: psycopg.Connection[Any]) -> None:
    defined = [name for name, _ in functions.definitions(functions.functions_sql())]
    assert sorted(defined) == sorted(_names(db) + _views(db)), \
        "a function or view of the schema missing from atlantis/store/live"
    assert len(set(defined)) == len(defined)
    views = [name for name, _ in functions.definitions(functions.file_sql("views"))]
    assert sorted(views) == _views(db)


def test_migrate_applies_a_hand_edited_body_again(db: psycopg.Connection[Any]) -> None:
    """The database no longer holds what was applied (an edit by hand, or a host of the
    previous release re-applying its own bodies): migrate applies the live files again."""
    db.execute("CREATE OR REPLACE FUNCTION atlantis.clamp_pct(p double precision)"
               " RETURNS smallint LANGUAGE sql IMMUTABLE AS 'SELECT 7::smallint'")
    assert db.execute("SELECT atlantis.clamp_pct(150)").fetchone() == (7,)
    assert migrate(db) == []
    assert db.execute("SELECT atlantis.clamp_pct(150)").fetchone() == (100,)


def _written(conn: psycopg.Connection[Any]) -> dict[str, str]:
    """The transaction that last wrote each function's catalog row (CREATE OR REPLACE writes
    it anew, even with the same text) and each view's rewrite rule."""
    return dict(conn.execute(
        "SELECT p.oid::regprocedure::text, p.xmin::text FROM pg_proc p"
        " WHERE p.pronamespace = 'atlantis'::regnamespace"
        " UNION ALL SELECT r.ev_class::regclass::text, r.xmin::text FROM pg_rewrite r"
        " JOIN pg_class c ON c.oid = r.ev_class"
        " WHERE c.relnamespace = 'atlantis'::regnamespace AND c.relkind = 'v'").fetchall())


def _record(conn: psycopg.Connection[Any]) -> tuple[Any, ...]:
    row = conn.execute("SELECT checksum, schema_version, package_version, fingerprint"
                       " FROM atlantis.live_definitions").fetchone()
    assert row is not None
    return tuple(row)


def test_an_unchanged_text_is_not_applied_again(db: psycopg.Connection[Any]) -> None:
    before, record = _written(db), _record(db)
    assert record[1] == migrations()[-1][0]
    assert record[2] == functions.package_version()
    assert migrate(db) == []
    assert _written(db) == before
    assert _record(db) == record


def test_a_changed_text_is_applied_and_recorded(db: psycopg.Connection[Any]) -> None:
    db.execute("UPDATE atlantis.live_definitions SET checksum = 'older text'")
    before = _written(db)
    assert migrate(db) == []
    after = _written(db)
    assert all(after[name] != before[name] for name in before), "every definition applied"
    assert _record(db)[0] != "older text"
    assert migrate(db) == [] and _written(db) == after  # and then left alone


def test_the_definitions_of_a_newer_package_are_left_alone(db: psycopg.Connection[Any]) -> None:
    """A newer release applied other bodies on the same schema version (a rolling upgrade):
    they stand, until the database no longer holds them."""
    db.execute("UPDATE atlantis.live_definitions"
               " SET checksum = 'newer text', package_version = '999.0.0'")
    before = _written(db)
    assert migrate(db) == []
    assert _written(db) == before
    with db.transaction():
        assert functions.refresh(db, migrations()[-1][0], version="1000.0") is True
    assert _record(db)[2] == "1000.0"


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
    assert str(info.value).startswith("the given SQL: ")
    assert "needs a migration" in str(info.value)
    assert _names(db).count("atlantis.cancel") == 1  # rolled back


def test_a_refused_functions_file_rolls_the_whole_migration_back(
        db: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    db.execute("DROP FUNCTION atlantis.cancel_message(text)")  # as before migration 16
    db.execute("DELETE FROM atlantis.schema_migrations WHERE version = 16")
    edited = _edited(CLAMP, CLAMP.replace("RETURNS smallint", "RETURNS int"))
    monkeypatch.setattr(functions, "live_files", lambda: [("live/edited.sql", edited)])
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


# ---- sizes ----------------------------------------------------------------------------------

STORE = Path(functions.__file__).parent
MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 80


def sql_files() -> list[Path]:
    """The SQL files a reader edits: all under atlantis/store but the migrations (history)
    and the generated schema.sql."""
    return sorted(p for p in STORE.rglob("*.sql")
                  if "migrations" not in p.relative_to(STORE).parts and p.name != "schema.sql")


def function_lengths(text: str) -> dict[str, int]:
    """{name:line: lines} of every function defined in ``text`` (overloads apart), from its
    CREATE line to the line that closes its body."""
    lengths = {}
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"CREATE (?:OR REPLACE )?FUNCTION (atlantis\.\w+)", line, re.IGNORECASE)
        if m:
            end = next(j for j in range(i, len(lines)) if lines[j].rstrip().endswith("$$;"))
            lengths[f"{m.group(1)}:{i + 1}"] = end - i + 1
    return lengths


def test_no_sql_file_passes_600_lines_nor_a_function_80() -> None:
    files = sql_files()
    assert {p.name for p in files} >= {f"{name}.sql" for name in functions.FILES}
    too_long = {str(p.relative_to(STORE)): n for p in files
                if (n := len(p.read_text("utf-8").splitlines())) > MAX_FILE_LINES}
    assert not too_long, f"SQL files over {MAX_FILE_LINES} lines: {too_long}"
    long_functions = {f"{p.relative_to(STORE)}: {name}": n for p in files
                      for name, n in function_lengths(p.read_text("utf-8")).items()
                      if n > MAX_FUNCTION_LINES}
    assert not long_functions, f"SQL functions over {MAX_FUNCTION_LINES} lines: {long_functions}"


def test_the_size_check_sees_a_long_function() -> None:
    body = "\n".join(["CREATE OR REPLACE FUNCTION atlantis.f() RETURNS int LANGUAGE sql AS $$"]
                     + ["SELECT 1"] * 80 + ["$$;"])
    assert function_lengths(body) == {"atlantis.f:1": 82}
    # Every definition of the live files is measured, overloads included.
    for p in sql_files():
        text = p.read_text("utf-8")
        assert len(function_lengths(text)) == len(
            re.findall(r"^CREATE (?:OR REPLACE )?FUNCTION", text, re.MULTILINE | re.IGNORECASE))
