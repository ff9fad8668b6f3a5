"""Rolling upgrades (docs/upgrading.md): migrations stay additive for one release, and this
release keeps working on a schema one release ahead of it.

The "next release" here is a migration written by the test the way the rules allow: a
nullable column on ``atlantis.jobs``, a column with a default on ``atlantis.job_types``, a
column appended to the view ``atlantis.job_rows`` (which tide and the console read with
``SELECT *``), a new function, and its version in ``atlantis.schema_migrations``.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from importlib import resources
from typing import Any

import orjson
import psycopg
import pytest

import atlantis
from atlantis.store.migrate import migrate, migrations, schema_ahead, schema_problem
from tests.conftest import ROOT, run_tide, wait_state
from tests.test_roles import login  # noqa: F401 - a fixture

#: Database-facing: also run on PostgreSQL 16 (ATLANTIS_TEST_PG=16).
pytestmark = pytest.mark.server_matrix

# ---- the additive check --------------------------------------------------------------------

#: Migrations up to this version shipped before rolling upgrades were promised; every later
#: one is checked. (0001 is the first release's schema.)
FIRST_CHECKED = 2

#: Statements that break a supervisor, tide or an application of the previous release while
#: it runs against the new schema: what it reads or calls disappears or changes type, or
#: what it writes is refused.
BREAKING = {
    "drops an object": r"\bDROP\s+(?:TABLE|COLUMN|VIEW|MATERIALIZED\s+VIEW|FUNCTION|PROCEDURE"
                       r"|TYPE|SCHEMA|SEQUENCE|TRIGGER|DEFAULT)\b",
    "renames": r"\bRENAME\b",
    "changes a column's type": r"\bALTER\s+(?:COLUMN\s+)?\w+\s+(?:SET\s+DATA\s+)?TYPE\b",
    "makes a column NOT NULL": r"\bSET\s+NOT\s+NULL\b",
    "adds a constraint old writers may break": r"\bADD\s+CONSTRAINT\b",
    "adds a NOT NULL column without a default": r"\bADD\s+COLUMN\b(?:(?!\bDEFAULT\b)[^,;])*"
                                                r"\bNOT\s+NULL\b(?:(?!\bDEFAULT\b)[^,;])*[,;]",
}

#: (file, text of the offending line, reason): a breaking statement that is accepted.
ALLOWED = [
    ("0028_children.sql", "DROP CONSTRAINT job_steps_kind_check",
     "replaced at once by a wider check (two more kinds, 'spawn' and 'join'): every row a "
     "release one behind writes still passes it"),
    ("0028_children.sql", "ADD CONSTRAINT job_steps_kind_check",
     "the same check with two more kinds: every row a release one behind writes passes it"),
    ("0027_events.sql", "DROP CONSTRAINT job_steps_kind_check",
     "replaced at once by a wider check (one more kind, 'event'): every row a release one "
     "behind writes still passes it"),
    ("0027_events.sql", "ADD CONSTRAINT job_steps_kind_check",
     "the same check with one more kind: every row a release one behind writes passes it"),
    ("0026_handler_steps.sql", "DROP FUNCTION atlantis.claim(text[], text[], text, int, text[])",
     "made anew at once with one more result column (run_id): a release one behind selects "
     "its columns by name, and the live bodies (this release's) set the run id for its claims"),
    ("0026_handler_steps.sql", "DROP FUNCTION atlantis.claim_limited(text[], text[], text, int, text)",
     "made anew at once with one more result column (run_id), read by column name by the "
     "release one behind as by this one"),
    ("0023_retry_delay.sql", "DROP FUNCTION atlantis.retry_delay(interval, int)",
     "no statement of any release called it (issue 32); 0.3.0's finish and rescue call the "
     "new signature, created by the same migration"),
    ("0002_containment.sql", "ADD CONSTRAINT jobs_error_count_check",
     "shipped before rolling upgrades were promised; a supervisor of 0001 never writes "
     "error_count (it has a default of 0), so the check cannot refuse it"),
    ("0002_containment.sql", "ADD CONSTRAINT jobs_errors_bounded_check",
     "shipped before rolling upgrades were promised: a supervisor of 0001 appending its 21st "
     "error would be refused; fleets upgraded from 0001 all at once"),
    ("0017_workflows.sql", "ADD CONSTRAINT jobs_step_check",
     "on columns the same migration adds: a writer of 0.2.0 never sets workflow_id or step, "
     "and both null satisfy it"),
    ("0017_workflows.sql", "ADD CONSTRAINT jobs_compensation_check",
     "on columns the same migration adds: a writer of 0.2.0 never sets compensation, whose "
     "default (false) satisfies it"),
    ("0022_workflow_keys.sql", "ADD CONSTRAINT workflow_instances_dismissed_check",
     "on columns the same migration adds: no earlier release sets dismissed_at, and null "
     "satisfies it"),
    ("0019_trace.sql", "DROP FUNCTION atlantis.enqueue(",
     "replaced at once by the same function with one more argument, defaulted: every call of "
     "0.2.0 (Python's named query, SQL callers, the schedules) resolves to it unchanged"),
    ("0019_trace.sql", "DROP FUNCTION atlantis.enqueue_many(",
     "replaced at once by the same function with one more argument, defaulted: every call of "
     "0.2.0 resolves to it unchanged"),
    ("0019_trace.sql", "DROP FUNCTION atlantis.start_workflow(",
     "replaced at once by the same function with one more argument, defaulted: every call "
     "made before (0.3.0's workflows predate it) resolves to it unchanged"),
]


def _breaking(name: str, sql: str) -> list[tuple[int, str, str]]:
    """(line, line's text, what it does) for every breaking statement of one migration."""
    text = re.sub(r"--[^\n]*", lambda m: " " * len(m.group()), sql)  # keep offsets
    found = []
    for what, pattern in BREAKING.items():
        for m in re.finditer(pattern, text, re.IGNORECASE):
            line = text.count("\n", 0, m.start()) + 1
            source = sql.splitlines()[line - 1].strip()
            if not any(f == name and allowed in source for f, allowed, _ in ALLOWED):
                found.append((line, source, what))
    return found


def test_migrations_after_the_first_release_are_additive() -> None:
    problems = [f"{name}:{line}: {what}: {source}"
                for version, name, sql in migrations() if version >= FIRST_CHECKED
                for line, source, what in _breaking(name, sql)]
    assert not problems, ("a migration is not additive; keep it for the release after, or add an "
                          "ALLOWED entry with its reason:\n" + "\n".join(problems))


@pytest.mark.parametrize(("sql", "what"), [
    ("ALTER TABLE atlantis.jobs DROP COLUMN queue;", "drops an object"),
    ("DROP TABLE atlantis.logs;", "drops an object"),
    ("DROP FUNCTION atlantis.enqueue(text, jsonb);", "drops an object"),
    ("ALTER TABLE atlantis.jobs RENAME COLUMN queue TO lane;", "renames"),
    ("ALTER TABLE atlantis.jobs ALTER COLUMN priority TYPE bigint;", "changes a column's type"),
    ("ALTER TABLE atlantis.jobs ALTER priority SET DATA TYPE bigint;", "changes a column's type"),
    ("ALTER TABLE atlantis.jobs ALTER COLUMN run_at SET NOT NULL;", "makes a column NOT NULL"),
    ("ALTER TABLE atlantis.jobs ADD COLUMN tenant text NOT NULL;",
     "adds a NOT NULL column without a default"),
    ("ALTER TABLE atlantis.jobs ADD CONSTRAINT x CHECK (priority > 0);",
     "adds a constraint old writers may break"),
])
def test_the_additive_check_catches(sql: str, what: str) -> None:
    assert [w for _, _, w in _breaking("0099_next.sql", sql)] == [what]


@pytest.mark.parametrize("sql", [
    "ALTER TABLE atlantis.jobs ADD COLUMN tenant text;",
    "ALTER TABLE atlantis.jobs ADD COLUMN tenant text NOT NULL DEFAULT 'none';",
    "ALTER TABLE atlantis.jobs ADD COLUMN n int DEFAULT 0 NOT NULL, ADD COLUMN m text;",
    "CREATE INDEX jobs_tenant_idx ON atlantis.jobs (tenant);",
    "-- we never DROP TABLE here\nCREATE FUNCTION atlantis.f() RETURNS int LANGUAGE sql AS 'SELECT 1';",
])
def test_the_additive_check_lets_additions_through(sql: str) -> None:
    assert _breaking("0099_next.sql", sql) == []


def test_every_allowed_entry_still_matches_a_line() -> None:
    files = {name: sql for _, name, sql in migrations()}
    for name, text, _reason in ALLOWED:
        assert text in files[name], f"stale ALLOWED entry: {name}: {text}"


# ---- a schema one release ahead ------------------------------------------------------------

def _next_release(conn: psycopg.Connection[Any]) -> int:
    """Apply a "next release" migration the rules allow; returns its version."""
    version = migrations()[-1][0] + 1
    row = conn.execute("SELECT pg_get_viewdef('atlantis.job_rows'::regclass)").fetchone()
    assert row is not None
    view = re.sub(r"\s+FROM atlantis\.jobs j;?\s*$", ", j.tenant FROM atlantis.jobs j", row[0])
    assert "j.tenant" in view
    with conn.transaction():
        conn.execute("ALTER TABLE atlantis.jobs ADD COLUMN tenant text")
        conn.execute("ALTER TABLE atlantis.job_types ADD COLUMN owner text NOT NULL DEFAULT ''")
        conn.execute(f"CREATE OR REPLACE VIEW atlantis.job_rows AS {view}")
        conn.execute("CREATE FUNCTION atlantis.next_release() RETURNS int LANGUAGE sql"
                     " AS 'SELECT 1'")
        conn.execute("INSERT INTO atlantis.schema_migrations (version, name) VALUES (%s, %s)",
                     (version, f"{version:04d}_next_release.sql"))
    return version


def _tide(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run_tide(["--database-url", url, *args], check=False)


def test_this_release_accepts_a_schema_one_release_ahead(db: psycopg.Connection[Any]) -> None:
    version = _next_release(db)
    latest = migrations()[-1][0]
    assert schema_problem(db) is None
    assert schema_ahead(db) == (
        f"the atlantis schema is at version {version}, ahead of this atlantis ({latest}): "
        "fine while a fleet rolls (migrations stay additive for a release); upgrade this "
        "host next")
    assert migrate(db) == []  # nothing to apply, nothing refused
    assert schema_ahead(db) is not None


@pytest.mark.parametrize("role", ["owner", "atlantis_worker"])
def test_a_supervisor_and_tide_run_on_a_schema_one_release_ahead(
        db: psycopg.Connection[Any], db_url: str, supervise: Any,
        login: Callable[[str], str], role: str) -> None:  # noqa: F811 - the fixture
    """The owner's supervisor migrates (nothing to do), a worker's checks the version: both
    run jobs; tide reads the view that gained a column."""
    _next_release(db)
    url = db_url if role == "owner" else login(role)
    # Handlers get their own database URL: test_events is not the worker's.
    sup = supervise("--handler-database-url", db_url, database_url=url)
    job_id = atlantis.enqueue(db, "tests.Echo", {"key": "rolling"})
    wait_state(db, job_id, "complete")
    assert sup.proc.poll() is None
    assert "ahead of this atlantis" in sup.log()
    status = _tide(url, "job", "status", str(job_id), "--json")
    assert status.returncode == 0, status.stderr
    assert orjson.loads(status.stdout)["state"] == "complete"
    listing = _tide(url, "job", "list", "--json")
    assert listing.returncode == 0, listing.stderr


def test_upgrading_md_names_what_the_code_does() -> None:
    """The document quotes the warning and the check; keep them in step."""
    doc = (ROOT / "docs" / "upgrading.md").read_text("utf-8")
    assert "ahead of this atlantis" in doc
    assert "tests/test_upgrading.py" in doc
    assert resources.files("atlantis.store").joinpath("migrations").is_dir()
