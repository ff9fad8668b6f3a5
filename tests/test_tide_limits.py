"""The operators' side of limits: `tide queue limit`, the limits in `tide queue stats`, what
holds a waiting job in `tide job status`, the Python call behind them
(:func:`atlantis.operations.set_queue_limit`) and the supervisor's limit gauges. Real
PostgreSQL, ``tide`` in-process (click's runner), a real supervisor for the gauges.

The jobs are tests/apps/limited.atl's (synced into every test database, queue ``limited``):
limited.PerKey runs at most one at a time per ``key``. A job is made to run by claiming it
as a supervisor of this release does (``atlantis.claim_limited``), so it stays running.
"""

from __future__ import annotations

import getpass
import re
from collections.abc import Callable
from typing import Any

import orjson
import psycopg
import pytest

import atlantis
from atlantis import operations
from atlantis.errors import ValidationError
from tests.conftest import free_port, scrape_metrics, wait_for
from tests.docs import bad_input_text
from tests.test_roles import login
from tests.test_tide import tide
from tests.test_tide_workflow import said

__all__ = ["login"]  # a fixture used here

APP = "tests.apps.limited:registry"
PER_KEY = "limited.PerKey"
#: The keys `tide queue stats --json` had before limits; each is kept as it was.
STATS_KEYS = {"queue", "available", "due", "running", "stalled", "complete", "dead",
              "cancelled", "oldest_waiting_seconds", "completed_last_minute",
              "completed_last_hour", "paused", "paused_reason", "paused_by", "paused_at",
              "declared", "supervisors", "unserved", "approximate", "unserved_jobs"}
LIMIT_KEYS = {"concurrency_limit", "limited_running", "held"}


def enqueue(db: psycopg.Connection[Any], *keys: str, job: str = PER_KEY, **extra: Any
            ) -> list[int]:
    return [atlantis.enqueue(db, job, {"key": k, **extra}) for k in keys]


def claim(db: psycopg.Connection[Any], n: int = 8) -> list[int]:
    """Claim up to ``n`` limited rows as worker w1 does; the ids it got (the limits allow)."""
    rows = db.execute("SELECT id FROM atlantis.claim_limited(ARRAY['limited'], %s::text[],"
                      " 'w1', %s)", (["limited.PerKey", "limited.Global"], n)).fetchall()
    return [r[0] for r in rows if r[0] is not None]


def stats(db_url: str) -> dict[str, dict[str, Any]]:
    rows = orjson.loads(tide(db_url, "queue", "stats", "--json").stdout)
    return {q["queue"]: q for q in rows}


def status(db_url: str, job_id: int) -> dict[str, Any]:
    doc: dict[str, Any] = orjson.loads(tide(db_url, "job", "status", str(job_id), "--json").stdout)
    return doc


def queue_limit(db: psycopg.Connection[Any], queue: str = "limited") -> tuple[Any, ...] | None:
    return db.execute("SELECT concurrency, limit_by FROM atlantis.queues WHERE name = %s",
                      (queue,)).fetchone()


# ---- tide queue limit ---------------------------------------------------------------------

def test_tide_sets_shows_and_removes_a_queue_limit(db: psycopg.Connection[Any],
                                                    db_url: str) -> None:
    assert tide(db_url, "queue", "limit", "limited").stdout == (
        "queue limited: no concurrency limit; slots in use 0, held 0\n")
    out = tide(db_url, "queue", "limit", "limited", "--concurrency", "4")
    assert out.stdout == "queue limited: concurrency limit 4 (was none)\n"
    assert queue_limit(db) == (4, getpass.getuser())
    changed = orjson.loads(tide(db_url, "queue", "limit", "limited", "--concurrency", "2",
                                "--json").stdout)
    assert changed == {"queue": "limited", "concurrency": 2, "was": 4}
    assert orjson.loads(tide(db_url, "queue", "limit", "limited", "--json").stdout) == {
        "queue": "limited", "concurrency_limit": 2, "limited_running": 0, "held": 0}
    assert tide(db_url, "queue", "limit", "limited").stdout == (
        "queue limited: concurrency limit 2; slots in use 0, held 0\n")
    assert tide(db_url, "queue", "limit", "limited", "--concurrency", "none").stdout == (
        "queue limited: no concurrency limit (was 2)\n")
    assert queue_limit(db) == (None, getpass.getuser())
    assert orjson.loads(tide(db_url, "queue", "limit", "limited", "--concurrency", "None",
                             "--json").stdout) == {"queue": "limited", "concurrency": None,
                                                   "was": None}
    # A queue nothing names is a typo, as for pause: nothing is written.
    unknown = tide(db_url, "queue", "limit", "nope", "--concurrency", "3", check=False)
    assert (unknown.returncode, said(unknown), unknown.stdout) == (
        1, "tide: unknown queue 'nope': no declaration, job or supervisor uses it", "")
    assert queue_limit(db, "nope") is None


#: id: (the arguments after QUEUE, what tide says on stderr); each exits 2.
BAD_LIMITS: dict[str, tuple[list[str], str]] = {
    "zero": (["--concurrency", "0"],
             "tide: Invalid value for '--concurrency': a concurrency limit must be 1 or more, "
             "not 0 (none removes it) (see `tide queue limit --help`)"),
    "negative": (["--concurrency", "-1"],
                 "tide: Invalid value for '--concurrency': a concurrency limit must be 1 or "
                 "more, not -1 (none removes it) (see `tide queue limit --help`)"),
    "not-a-number": (["--concurrency", "four"],
                     "tide: Invalid value for '--concurrency': expected a whole number (1 or "
                     "more) or none, not 'four' (see `tide queue limit --help`)"),
    "fraction": (["--concurrency", "1.5"],
                 "tide: Invalid value for '--concurrency': expected a whole number (1 or more) "
                 "or none, not '1.5' (see `tide queue limit --help`)"),
    "past-int": (["--concurrency", "2147483648"],
                 "tide: Invalid value for '--concurrency': 2147483648 is out of range for int "
                 "(at most 2147483647) (see `tide queue limit --help`)"),
    "no-value": (["--concurrency"], "tide: Option '--concurrency' requires an argument."),
    "unknown-option": (["--max", "3"],
                       "tide: No such option '--max'. (see `tide queue limit --help`)"),
}


@pytest.mark.parametrize("case", list(BAD_LIMITS))
def test_a_bad_limit_is_a_usage_error_and_changes_nothing(db: psycopg.Connection[Any],
                                                          db_url: str, case: str) -> None:
    operations.set_queue_limit(db, "limited", 3, by="before")
    args, message = BAD_LIMITS[case]
    out = tide(db_url, "queue", "limit", "limited", *args, check=False)
    assert (out.returncode, out.stderr.strip(), out.stdout) == (2, message, "")
    assert queue_limit(db) == (3, "before")


def test_the_bad_input_table_quotes_these_messages() -> None:
    text = bad_input_text()
    for case, (_, message) in BAD_LIMITS.items():
        assert f"exit 2, ``{message}``" in text or f"exit 2, `{message}`" in text, case
        assert f"test_a_bad_limit_is_a_usage_error_and_changes_nothing[{case}]" in text, case
    for message in PYTHON_REFUSALS.values():
        assert f"`{message}`" in text, message


#: The Python call's refusals (ValidationError), by the concurrency given.
PYTHON_REFUSALS: dict[Any, str] = {
    0: "queue limited: a concurrency limit must be 1 or more, not 0",
    True: "queue limited: concurrency: expected an integer, got bool",
    2**31: "queue limited: concurrency: 2147483648 is out of range for int (at most 2147483647)",
}


def test_python_sets_a_limit_in_the_callers_transaction(db_url: str) -> None:
    with psycopg.connect(db_url) as conn:  # not autocommit: a transaction is open
        assert operations.set_queue_limit(conn, "limited", 3, by="gus") is None
        for bad, message in PYTHON_REFUSALS.items():
            with pytest.raises(ValidationError) as caught:
                operations.set_queue_limit(conn, "limited", bad)
            assert str(caught.value) == message
        # The refusals left the transaction usable, and nothing is visible until it commits.
        assert operations.set_queue_limit(conn, "limited", 5, by="gus") == 3
        with psycopg.connect(db_url, autocommit=True) as other:
            assert queue_limit(other) is None
        conn.commit()
        with psycopg.connect(db_url, autocommit=True) as other:
            assert queue_limit(other) == (5, "gus")
        assert operations.set_queue_limit(conn, "limited", None) == 5
        conn.commit()
        assert queue_limit(conn)[0] is None  # type: ignore[index]


def test_an_operator_sets_a_limit_and_a_reader_only_reads_it(
        db: psycopg.Connection[Any], db_url: str, login: Callable[[str], str]) -> None:
    waiting = enqueue(db, "r1")
    reader = login("atlantis_reader")
    denied = tide(reader, "queue", "limit", "limited", "--concurrency", "2", check=False)
    assert denied.returncode == 1 and "permission denied" in said(denied)
    assert queue_limit(db) is None
    for args in (("queue", "limit", "limited"), ("queue", "stats", "--json"),
                 ("job", "status", str(waiting[0]), "--json")):
        out = tide(reader, *args, check=False)
        assert out.returncode == 0, (args, out.stderr)
    operator = login("atlantis_operator")
    tide(operator, "queue", "limit", "limited", "--concurrency", "2")
    found = queue_limit(db)
    assert found is not None and found[0] == 2


# ---- tide queue stats ---------------------------------------------------------------------

def test_queue_stats_show_the_limit_the_slots_in_use_and_the_held_jobs(
        db: psycopg.Connection[Any], db_url: str) -> None:
    enqueue(db, "k1", "k1", "k2")
    atlantis.enqueue(db, "tests.Echo", {"key": "x"})
    running = claim(db)
    assert len(running) == 2  # one of k1, k2's
    doc = stats(db_url)
    assert set(doc["limited"]) == STATS_KEYS | LIMIT_KEYS
    assert set(doc["tests"]) == STATS_KEYS | LIMIT_KEYS
    assert {k: doc["limited"][k] for k in LIMIT_KEYS} == {
        "concurrency_limit": None, "limited_running": 2, "held": 1}
    assert {k: doc["tests"][k] for k in LIMIT_KEYS} == {
        "concurrency_limit": None, "limited_running": 0, "held": 0}
    assert (doc["limited"]["running"], doc["limited"]["due"]) == (2, 1)

    text = tide(db_url, "queue", "stats").stdout.splitlines()
    header = text[0].split()
    assert header[:9] == ["QUEUE", "WAITING", "OLDEST", "LATER", "RUNNING", "STALLED", "LIMIT",
                          "SLOTS", "HELD"]
    assert header[-2:] == ["SUPERVISORS", "STATUS"]
    limited = next(line for line in text if line.startswith("limited "))
    # RUNNING, STALLED (these claims never checkpoint), LIMIT, SLOTS, HELD
    assert re.search(r" 2 +\d +- +2 +1 ", limited), limited

    # A queue limit counts every running attempt of the queue.
    tide(db_url, "queue", "limit", "limited", "--concurrency", "2")
    doc = stats(db_url)
    assert doc["limited"]["concurrency_limit"] == 2
    limited = next(line for line in tide(db_url, "queue", "stats").stdout.splitlines()
                   if line.startswith("limited "))
    assert re.search(r" 2 +\d +2 +2/2 +1 ", limited), limited


# ---- tide job status ----------------------------------------------------------------------

def test_job_status_says_what_limit_holds_a_waiting_job(db: psycopg.Connection[Any],
                                                         db_url: str) -> None:
    first, second = enqueue(db, "k1", "k1")
    (free,) = enqueue(db, "k9", job="limited.Free")
    assert claim(db) == [first]
    held = f"waiting for a slot of `concurrency 1 by key=k1`: job {first} running"
    assert status(db_url, second)["held"] == held
    human = tide(db_url, "job", "status", str(second)).stdout
    assert f"  held       {held}\n" in human
    lines = human.splitlines()
    assert lines.index(f"  held       {held}") == 2  # right under the state
    # Nothing holds a running job, nor one of a job without limits.
    for job_id in (first, free):
        assert status(db_url, job_id)["held"] is None
        assert "  held  " not in tide(db_url, "job", "status", str(job_id)).stdout
    # Once the slot is free, nothing holds it.
    db.execute("UPDATE atlantis.jobs SET state = 'complete', finished_at = now(),"
               " claimed_until = NULL WHERE id = %s", (first,))
    assert status(db_url, second)["held"] is None
    assert "  held  " not in tide(db_url, "job", "status", str(second)).stdout


def test_a_held_line_shows_control_characters_escaped(db: psycopg.Connection[Any],
                                                      db_url: str) -> None:
    hostile = "\x1b]0;owned\x07\x1b[2J"
    first, second = enqueue(db, hostile, hostile)
    assert claim(db) == [first]
    held = status(db_url, second)["held"]
    assert held == (f"waiting for a slot of `concurrency 1 by key={hostile}`: job {first} "
                    "running")
    human = tide(db_url, "job", "status", str(second)).stdout
    assert "\x1b" not in human and "\x07" not in human
    assert "key=\\x1b]0;owned\\x07\\x1b[2J`" in human


# ---- the metrics --------------------------------------------------------------------------

def test_the_supervisor_exports_held_jobs_and_the_queue_limit(
        db: psycopg.Connection[Any], db_url: str, supervise: Any) -> None:
    operations.set_queue_limit(db, "limited", 1)
    ids = enqueue(db, "m1", "m2", "m3", hold=60.0)
    port = free_port()
    supervise("--metrics-port", str(port), "--worker-refresh", "0.3s", queues=("limited",),
              app=APP, concurrency=2)
    wait_for(lambda: 'atlantis_jobs_held{queue="limited"} 2.0' in (t := scrape_metrics(port))
             and 'atlantis_queue_concurrency_limit{queue="limited"} 1.0' in t,
             message="the gauges under a queue limit of 1")
    assert db.execute("SELECT count(*) FROM atlantis.jobs WHERE state = 'running'"
                      " AND id = ANY(%s)", (ids,)).fetchone() == (1,)
    # Removed: the sample goes, and a second attempt starts (the supervisor runs 2).
    tide(db_url, "queue", "limit", "limited", "--concurrency", "none")
    wait_for(lambda: 'atlantis_jobs_held{queue="limited"} 1.0' in (t := scrape_metrics(port))
             and "atlantis_queue_concurrency_limit{" not in t,
             message="the held gauge at 1 and no limit sample")
    assert "# TYPE atlantis_queue_concurrency_limit gauge" in scrape_metrics(port)
