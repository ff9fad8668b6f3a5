"""Issue 18: values read as their declared types.

* ``unique (...)`` keys are built from the values (``atlantis.unique_key``, migration 0012),
  not from their JSON spelling, on every enqueue path; the migration re-keys waiting and
  running rows, ``tide db doctor`` lists duplicates left from before, a retry recomputes
  the key.
* ``timestamptz`` takes RFC 3339 with an offset, ``date`` takes YYYY-MM-DD, on every path;
  Python's rules (``atlantis.declarations.formats``, the `.atl` checker's defaults) and the
  database's agree.
* ``delay`` and ``run_at`` are checked before anything is sent; ``Snooze`` of NaN, an
  infinity or a negative fails its own attempt.
"""

from __future__ import annotations

import asyncio
import math
import os
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import orjson
import psycopg
import pytest

import atlantis
from atlantis.declarations import parse_atl
from atlantis.errors import DeclarationError, ValidationError
from atlantis.store.migrate import migrate
from tests.conftest import job_row, run_tide, wait_state

JOB = "values.Keyed"
UID = "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"


def _count(db: psycopg.Connection[Any], job: str = JOB) -> int:
    row = db.execute("SELECT count(*) FROM atlantis.jobs WHERE job = %s", (job,)).fetchone()
    assert row is not None
    return int(row[0])


# ---- one key per value -----------------------------------------------------------------------

#: id: (field, spellings as Python values, the same spellings as JSON text for SQL)
SPELLINGS: dict[str, tuple[str, list[Any], list[str]]] = {
    "int": ("n", [1, 1.0, Decimal("1.00"), Decimal("1E+0")], ["1", "1.0", "1.00", "1e0"]),
    "bigint": ("b", [10, Decimal("10.0"), Decimal("1E+1")], ["10", "10.000", "1E1"]),
    "numeric": ("x", [Decimal("1.5"), Decimal("1.50"), Decimal("15E-1")],
                ["1.5", "1.50", "0.15e1"]),
    "double": ("d", [0.5, Decimal("0.50"), Decimal("5E-1")], ["0.5", "0.500", "5e-1"]),
    "uuid": ("u", [UID, UID.upper(), "{" + UID + "}", UID.replace("-", "")],
             [f'"{UID}"', f'"{UID.upper()}"', '"{' + UID + '}"', f'"{UID.replace("-", "")}"']),
    "timestamptz": ("at", ["2024-01-31T12:00:00Z", "2024-01-31T12:00:00+00:00",
                           "2024-01-31T13:00:00+01", "2024-01-31 07:00:00.000-05:00"],
                    ['"2024-01-31T12:00:00z"', '"2024-01-31 12:00:00+0000"',
                     '"2024-01-31T13:00:00+01:00"', '"2024-01-31T12:00:00.000000Z"']),
    "int-array": ("ns", [[1, 2], [1.0, Decimal("2.00")]], ["[1, 2]", "[1.0, 2.00]"]),
}


@pytest.mark.server_matrix  # database-facing: also run on PostgreSQL 16
@pytest.mark.parametrize("case", list(SPELLINGS))
def test_one_value_spelled_several_ways_is_one_job_on_every_path(
        db: psycopg.Connection[Any], db_url: str, case: str) -> None:
    field, values, texts = SPELLINGS[case]
    # Python, one at a time and in a batch
    ids = [atlantis.enqueue(db, JOB, {field: v}) for v in values]
    ids += atlantis.enqueue_many(db, JOB, [{field: v} for v in values])
    # ... and in a batch of 8 or more (the set-based check of migration 0011)
    ids += atlantis.enqueue_many(db, JOB, [{field: values[i % len(values)]} for i in range(9)])

    async def from_async() -> list[int]:
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
            one = await atlantis.enqueue_async(conn, JOB, {field: values[-1]})
            return [one, *await atlantis.enqueue_many_async(conn, JOB, [{field: values[1]}])]

    ids += asyncio.run(from_async())
    # SQL, single and batch, written as JSON text
    for text in texts:
        row = db.execute("SELECT atlantis.enqueue(%s, %s::jsonb)",
                         (JOB, f'{{"{field}": {text}}}')).fetchone()
        assert row is not None
        ids.append(row[0])
    row = db.execute("SELECT atlantis.enqueue_many(%s, %s::jsonb[])",
                     (JOB, [f'{{"{field}": {t}}}' for t in texts * 3])).fetchone()
    assert row is not None
    ids += row[0]
    # tide
    for text in texts[:2]:
        done = run_tide(["--database-url", db_url, "job", "enqueue", JOB,
                         "--args", f'{{"{field}": {text}}}'], check=False)
        assert done.returncode == 0, done.stderr
        ids.append(int(done.stdout.split()[-1]))
    assert set(ids) == {ids[0]}, ids
    assert _count(db) == 1


@pytest.mark.server_matrix  # database-facing: also run on PostgreSQL 16
def test_the_key_is_the_canonical_value_whichever_side_enqueued(
        db: psycopg.Connection[Any]) -> None:
    """Python and SQL callers build one key: the values as their types read them."""
    py = atlantis.enqueue(db, JOB, {"n": 7.0, "x": Decimal("2.50"), "d": 0.25, "u": UID.upper(),
                                    "at": "2024-01-31T13:00:00.5+01:00", "day": "2024-02-29",
                                    "ns": [3.0], "t": "a"})
    row = db.execute(
        "SELECT atlantis.enqueue(%s, %s::jsonb)",
        (JOB, '{"n": 7, "x": 2.5, "d": 25e-2, "u": "{' + UID + '}", '
              '"at": "2024-01-31 12:00:00.500Z", "day": "2024-02-29", "ns": [3], "t": "a"}'),
    ).fetchone()
    assert row is not None and row[0] == py
    assert job_row(db, py)["unique_key"] == (
        f'[7, null, 2.5, 0.25, "{UID}", "2024-01-31T12:00:00.500000Z", "2024-02-29", [3], "a"]')


@pytest.mark.server_matrix  # database-facing: also run on PostgreSQL 16
def test_distinct_values_stay_distinct_jobs(db: psycopg.Connection[Any]) -> None:
    ids = atlantis.enqueue_many(db, JOB, [
        {"n": 1}, {"n": 2}, {"n": -0.0}, {"n": 0}, {"x": Decimal("1.5")}, {"x": Decimal("1.05")},
        {"at": "2024-01-31T12:00:00Z"}, {"at": "2024-01-31T12:00:00+01:00"},
        {"t": "1"}, {"t": "1.0"}, {"d": 0.1 + 0.2}, {"d": 0.3},
    ])
    assert ids[2] == ids[3]  # -0 is 0
    assert len(set(ids)) == len(ids) - 1


def test_a_handler_runs_once_for_one_value(db: psycopg.Connection[Any], supervise: Any) -> None:
    ids = [atlantis.enqueue(db, JOB, {"key": "once", "at": at}) for at in
           ("2024-01-31T12:00:00Z", "2024-01-31T12:00:00+00:00", "2024-01-31T13:00:00+01")]
    assert len(set(ids)) == 1
    sup = supervise(queues=("values",), app="tests.apps.values:registry")
    wait_state(db, ids[0], "complete")
    ran = db.execute("SELECT event FROM test_events WHERE key = 'once'").fetchall()
    assert ran == [("ran 2024-01-31T12:00:00Z",)]
    assert sup.proc.poll() is None


# ---- the migration, the doctor, retry --------------------------------------------------------

def _old_row(db: psycopg.Connection[Any], args: str, key: str, state: str = "available") -> int:
    """A row as 120c77f wrote it: the key is the JSON spelling of the unique fields."""
    row = db.execute(
        "INSERT INTO atlantis.jobs (job, queue, args, max_attempts, priority, run_at, timeout, "
        " heartbeat, backoff, unique_key, state, finished_at, attempt) "
        "SELECT t.job, t.queue, atlantis.check_args(t, %s::jsonb), t.max_attempts, t.priority, "
        " now() + interval '1 hour', t.timeout, t.heartbeat, t.backoff, %s, %s, "
        " CASE WHEN %s IN ('dead', 'cancelled') THEN now() END, "
        " CASE WHEN %s = 'dead' THEN 1 ELSE 0 END "
        "FROM atlantis.job_types t WHERE t.job = %s RETURNING id",
        (args, key, state, state, state, JOB)).fetchone()
    assert row is not None
    return int(row[0])


def _old_key(**fields: Any) -> str:
    names = ["n", "b", "x", "d", "u", "at", "day", "ns", "t"]
    return "[" + ", ".join(fields.get(n, "null") for n in names) + "]"


def _rerun_migration_12(db: psycopg.Connection[Any]) -> None:
    db.execute("DROP FUNCTION atlantis.unique_key(atlantis.job_types, jsonb)")
    db.execute("DROP FUNCTION atlantis.canonical_value(text, boolean, jsonb)")
    db.execute("DROP FUNCTION atlantis.canonical_double(numeric)")
    db.execute("DELETE FROM atlantis.schema_migrations WHERE version = 12")
    assert migrate(db) == [12]


@pytest.fixture
def reader_url(admin_url: str, db_url: str) -> Iterator[str]:
    """A LOGIN user in atlantis_reader (tide db doctor's least role), for the test's database."""
    name = f"u_keys_{os.getpid()}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f"DROP ROLE IF EXISTS {name}")
        conn.execute(f"CREATE ROLE {name} LOGIN IN ROLE atlantis_reader")
    yield psycopg.conninfo.make_conninfo(db_url, user=name)
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                     (name,))
        conn.execute(f"DROP ROLE IF EXISTS {name}")


def _doctor(db_url: str) -> dict[str, Any]:
    done = run_tide(["--database-url", db_url, "db", "doctor", "--json"], check=False)
    assert done.returncode in (0, 1), done.stderr
    return dict(orjson.loads(done.stdout)["checks"]["duplicate_unique_keys"])


@pytest.mark.server_matrix  # database-facing: also run on PostgreSQL 16
def test_the_migration_rekeys_waiting_rows_and_the_doctor_lists_duplicates(
        db: psycopg.Connection[Any], db_url: str, reader_url: str) -> None:
    alone = _old_row(db, '{"n": 5.0}', _old_key(n="5.0"))
    upper = _old_row(db, f'{{"u": "{UID.upper()}"}}', _old_key(u=f'"{UID.upper()}"'))
    dup_a = _old_row(db, '{"n": 6}', _old_key(n="6"))
    dup_b = _old_row(db, '{"n": 6.00}', _old_key(n="6.00"))
    dead = _old_row(db, '{"n": 9.0}', _old_key(n="9.0"), state="dead")
    _rerun_migration_12(db)
    keys = dict(db.execute("SELECT id, unique_key FROM atlantis.jobs WHERE job = %s",
                           (JOB,)).fetchall())
    assert keys[alone] == _old_key(n="5")
    assert keys[upper] == _old_key(u=f'"{UID}"')
    # duplicates that already exist stay as they are; finished rows are left to retry
    assert (keys[dup_a], keys[dup_b], keys[dead]) == (
        _old_key(n="6"), _old_key(n="6.00"), _old_key(n="9.0"))
    assert atlantis.enqueue(db, JOB, {"n": 5}) == alone
    assert atlantis.enqueue(db, JOB, {"u": UID}) == upper
    check = _doctor(db_url)
    assert not check["ok"]
    assert check["items"] == [{"job": JOB, "key": _old_key(n="6"), "jobs": 2,
                               "ids": [dup_a, dup_b]}]
    assert f"{JOB} {_old_key(n='6')} (jobs {dup_a}, {dup_b})" in check["summary"]
    assert _doctor(reader_url) == check  # what a read-only role runs
    db.execute("UPDATE atlantis.jobs SET state = 'cancelled', finished_at = now() WHERE id = %s",
               (dup_b,))
    assert _doctor(db_url)["ok"]


@pytest.mark.server_matrix  # database-facing: also run on PostgreSQL 16
def test_retry_recomputes_the_key(db: psycopg.Connection[Any], db_url: str) -> None:
    dead = _old_row(db, '{"n": 3.0}', _old_key(n="3.0"), state="dead")
    holder = atlantis.enqueue(db, JOB, {"n": 3})
    done = run_tide(["--database-url", db_url, "job", "retry", str(dead)], check=False)
    assert done.returncode == 1
    assert f"job {holder} ({JOB}) already holds the unique key {_old_key(n='3')}" in done.stderr
    db.execute("UPDATE atlantis.jobs SET state = 'cancelled', finished_at = now() WHERE id = %s",
               (holder,))
    done = run_tide(["--database-url", db_url, "job", "retry", str(dead)], check=False)
    assert done.returncode == 0, done.stderr
    assert job_row(db, dead)["unique_key"] == _old_key(n="3")
    assert atlantis.enqueue(db, JOB, {"n": Decimal("3.000")}) == dead


# ---- timestamptz and date --------------------------------------------------------------------

NO_OFFSET = ("has no time zone offset: a timestamptz needs Z or an offset such as +02:00 "
             "(RFC 3339)")
NOT_TIMESTAMPTZ = ('is not a valid timestamptz: expected RFC 3339 with Z or an offset, such as '
                   '"2024-01-31T12:00:00Z"')
NOT_DATE = 'is not a valid date: expected YYYY-MM-DD, such as "2024-01-31"'

#: (type, value, the reason after the quoted value, or None when accepted)
SAMPLES: list[tuple[str, str, str | None]] = [
    *[("timestamptz", v, None) for v in (
        "2024-01-31T12:00:00Z", "2024-01-31 12:00:00+01:00", "2024-01-31t12:00:00.123456789z",
        "2024-01-31T12:00:00-0530", "2024-01-31T12:00:00+01", "2024-02-29T23:59:59+15:59",
        "0001-01-01T00:00:00Z", "9999-12-31T23:59:59Z")],
    *[("timestamptz", v, NO_OFFSET) for v in (
        "2024-01-31 12:00:00", "2024-01-31T12:00", "2024-01-31T12:00:00.5")],
    *[("timestamptz", v, NOT_TIMESTAMPTZ) for v in (
        "now", "today", "tomorrow", "yesterday", "infinity", "-infinity", "epoch", "allballs",
        "J2451187", "2024-01-31T12:00:00Z BC", "2024-01-31 12:00:00 BC", "2024-01-31",
        "2024-02-30T12:00:00Z", "2024-01-31T24:00:00Z", "2024-01-31T12:00:60Z",
        "2024-01-31T12:00:00+16:00", "2024-01-31T12:00:00 Europe/Paris",
        "2024-01-31T12:00:00 UTC", "Jan 31 2024 12:00Z", "0000-01-01T00:00:00Z",
        "20240131T120000Z", "2024-01-31T12:00:00+1", " 2024-01-31T12:00:00Z", "")],
    *[("date", v, None) for v in ("2024-01-31", "2024-02-29", "0001-01-01", "9999-12-31")],
    *[("date", v, NOT_DATE) for v in (
        "now", "today", "tomorrow", "infinity", "-infinity", "epoch", "J2451187",
        "2024-01-31 BC", "01/31/2024", "2024-1-5", "2023-02-29", "2024-01-31T00:00:00Z",
        "0000-01-01", "20240131", "")],
]


@pytest.mark.server_matrix  # database-facing: also run on PostgreSQL 16
@pytest.mark.parametrize(("ftype", "value", "reason"), SAMPLES)
def test_python_and_the_database_read_dates_alike(
        db: psycopg.Connection[Any], ftype: str, value: str, reason: str | None) -> None:
    from atlantis.declarations.formats import date_problem, timestamptz_problem

    python = (timestamptz_problem if ftype == "timestamptz" else date_problem)(value)
    row = db.execute("SELECT atlantis.type_mismatch(%s, NULL, to_jsonb(%s::text))",
                     (ftype, value)).fetchone()
    assert row is not None
    shown = orjson.dumps(value).decode()
    assert (python, row[0]) == (reason, None if reason is None else f"{shown} {reason}")


@pytest.mark.server_matrix  # database-facing: also run on PostgreSQL 16
@pytest.mark.parametrize(("field", "value", "reason"), [
    ("at", "now", NOT_TIMESTAMPTZ), ("at", "tomorrow", NOT_TIMESTAMPTZ),
    ("at", "infinity", NOT_TIMESTAMPTZ), ("at", "epoch", NOT_TIMESTAMPTZ),
    ("at", "J2451187", NOT_TIMESTAMPTZ), ("at", "2024-01-31 12:00:00 BC", NOT_TIMESTAMPTZ),
    ("at", "2024-01-31 12:00:00", NO_OFFSET),
    ("day", "tomorrow", NOT_DATE), ("day", "epoch", NOT_DATE), ("day", "J2451187", NOT_DATE),
    ("day", "2024-01-31 BC", NOT_DATE), ("day", "infinity", NOT_DATE),
])
def test_special_words_and_naive_timestamps_are_refused_on_every_path(
        db: psycopg.Connection[Any], field: str, value: str, reason: str) -> None:
    message = f"job tests.Typed: field {field}: {orjson.dumps(value).decode()} {reason}"
    args = {"name": "a", field: value}
    with pytest.raises(ValidationError) as one:
        atlantis.enqueue(db, "tests.Typed", args)
    with pytest.raises(ValidationError) as batch:  # 9 rows: the set-based check first
        atlantis.enqueue_many(db, "tests.Typed", [{"name": f"n{i}"} for i in range(8)] + [args])
    with pytest.raises(psycopg.Error) as sql:
        db.execute("SELECT atlantis.enqueue('tests.Typed', %s::jsonb)",
                   (orjson.dumps(args).decode(),))
    assert str(one.value) == str(batch.value) == message
    assert sql.value.sqlstate == "ATL02" and sql.value.diag.message_primary == message
    assert _count(db, "tests.Typed") == 0


@pytest.mark.server_matrix  # database-facing: also run on PostgreSQL 16
def test_a_typed_job_gets_the_timestamp_as_written(db: psycopg.Connection[Any]) -> None:
    job_id = atlantis.enqueue(db, "tests.Typed", {"name": "a", "at": "2024-01-31 12:00:00+01",
                                                   "day": "2024-01-31"})
    assert job_row(db, job_id)["args"]["at"] == "2024-01-31 12:00:00+01"


@pytest.mark.server_matrix  # database-facing: also run on PostgreSQL 16
@pytest.mark.parametrize(("default", "message"), [
    ('"2024-01-31 12:00:00"', f"default '\"2024-01-31 12:00:00\"' {NO_OFFSET}"),
    ('"now"', "default '\"now\"' does not fit type timestamptz: expected an RFC 3339 timestamp "
              'with Z or an offset, such as "2024-01-31T12:00:00Z"'),
    ('"2024-01-31 12:00:00 BC"', "default '\"2024-01-31 12:00:00 BC\"' does not fit type "
     'timestamptz: expected an RFC 3339 timestamp with Z or an offset, such as '
     '"2024-01-31T12:00:00Z"'),
], ids=["default-without-offset", "default-now", "default-bc"])
def test_timestamptz_defaults_follow_the_same_rule(default: str, message: str) -> None:
    source = f"job J in ns {{\n  args {{ a timestamptz default {default} }}\n}}\n"
    with pytest.raises(DeclarationError) as err:
        parse_atl(source, "jobs.atl")
    assert str(err.value) == f"jobs.atl:2:32: {message}"


@pytest.mark.server_matrix  # database-facing: also run on PostgreSQL 16
def test_rfc3339_defaults_are_accepted() -> None:
    source = ('job J in ns {\n  args { a timestamptz default "2024-01-31 12:00:00+01",'
              ' b date default "2024-01-31" }\n}\n')
    parse_atl(source, "jobs.atl")


# ---- delay, run_at, Snooze -------------------------------------------------------------------

@pytest.mark.server_matrix  # database-facing: also run on PostgreSQL 16
@pytest.mark.parametrize(("delay", "shown"), [
    (math.nan, "nan"), (math.inf, "inf"), (-math.inf, "-inf"), (-1, "-1"), (-0.5, "-0.5"),
    (timedelta(seconds=-1), "datetime.timedelta(days=-1, seconds=86399)"),
    (10**400, "1" + "0" * 400),
], ids=["nan", "inf", "-inf", "-1", "-0.5", "negative-timedelta", "int-past-float"])
def test_a_bad_delay_is_a_validation_error_naming_delay(
        db: psycopg.Connection[Any], db_url: str, delay: Any, shown: str) -> None:
    message = f"job tests.Echo: delay must be a finite number of seconds, 0 or more, not {shown}"
    for call in (lambda: atlantis.enqueue(db, "tests.Echo", {"key": "k"}, delay=delay),
                 lambda: atlantis.enqueue_many(db, "tests.Echo", [{"key": "k"}], delay=delay)):
        with pytest.raises(ValidationError) as err:
            call()
        assert str(err.value) == message

    async def from_async() -> None:
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
            for one in (True, False):
                with pytest.raises(ValidationError) as err:
                    if one:
                        await atlantis.enqueue_async(conn, "tests.Echo", {"key": "k"}, delay=delay)
                    else:
                        await atlantis.enqueue_many_async(conn, "tests.Echo", [{"key": "k"}],
                                                          delay=delay)
                assert str(err.value) == message

    asyncio.run(from_async())
    assert _count(db, "tests.Echo") == 0


@pytest.mark.server_matrix  # database-facing: also run on PostgreSQL 16
def test_a_negative_delay_is_refused_by_sql(db: psycopg.Connection[Any]) -> None:
    with pytest.raises(psycopg.Error) as err:
        db.execute("SELECT atlantis.enqueue('tests.Echo', '{\"key\": \"k\"}', delay => "
                   "interval '-1 second')")
    assert err.value.sqlstate == "ATL02"
    assert err.value.diag.message_primary == ("job tests.Echo: delay must be 0 or more, not "
                                              "-00:00:01")
    assert _count(db, "tests.Echo") == 0


@pytest.mark.server_matrix  # database-facing: also run on PostgreSQL 16
def test_run_at_must_say_its_time_zone(db: psycopg.Connection[Any]) -> None:
    with pytest.raises(ValidationError) as err:
        atlantis.enqueue(db, "tests.Echo", {"key": "k"}, run_at=datetime(2030, 1, 1))
    assert str(err.value) == ("job tests.Echo: run_at must be a datetime with a time zone "
                              "(tzinfo), not a naive datetime: it would be read in the server's "
                              "time zone")
    with pytest.raises(ValidationError) as err:
        atlantis.enqueue(db, "tests.Echo", {"key": "k"}, run_at="2030-01-01")  # type: ignore[arg-type]
    assert str(err.value) == "job tests.Echo: run_at must be a datetime with a time zone, got str"
    assert _count(db, "tests.Echo") == 0
    at = datetime(2030, 1, 1, tzinfo=UTC)
    assert job_row(db, atlantis.enqueue(db, "tests.Echo", {"key": "k"}, run_at=at))["run_at"] == at


@pytest.mark.parametrize(("mode", "shown"), [
    ("snooze-nan", "nan"), ("snooze-inf", "inf"), ("snooze-negative", "-1.0"),
])
def test_a_snooze_of_nan_inf_or_negative_fails_its_own_attempt(
        db: psycopg.Connection[Any], supervise: Any, mode: str, shown: str) -> None:
    sup = supervise(queues=("contain",), app="tests.apps.contain:registry", concurrency=2)
    bad = atlantis.enqueue(db, "contain.Act", {"key": mode, "mode": mode})
    row = wait_state(db, bad, "dead")
    assert row["errors"][-1]["kind"] == "exception", row["errors"]
    assert row["last_error"] == (f"invalid Snooze({shown}): the delay must be a finite number "
                                 "of seconds, 0 or more")
    ok = atlantis.enqueue(db, "contain.Act", {"key": "after", "mode": "ok"})
    wait_state(db, ok, "complete")
    assert sup.proc.poll() is None


@pytest.mark.server_matrix  # database-facing: also run on PostgreSQL 16
@pytest.mark.parametrize("delay", [timedelta(days=200_000_000), 4e15],
                         ids=["timedelta", "seconds"])
def test_a_delay_past_100_years_is_refused_before_the_database(
        db: psycopg.Connection[Any], delay: Any) -> None:
    with pytest.raises(ValidationError) as err:
        atlantis.enqueue(db, "tests.Echo", {"key": "k"}, delay=delay)
    assert str(err.value) == f"job tests.Echo: delay of {delay!r} is too long (at most 36500d, 100 years)"
    assert db.execute("SELECT count(*) FROM atlantis.jobs").fetchone() == (0,)
