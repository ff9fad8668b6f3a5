"""Operators see handler steps (issue 34): ``tide job status`` (text and ``--json``) shows a
job's records and what it sleeps for, and ``tide job steps`` lists every record, against a
real supervisor running tests/apps/durable.py on real PostgreSQL. The console's side:
tests/test_console_steps.py.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import psycopg
import pytest

import atlantis
from atlantis.app import load_app
from atlantis.cli.tables import STEP_VALUE_CHARS, step_value
from atlantis.store import sync
from atlantis.store.steps import StepRow
from tests.apps.durable import EFFECTS_DDL
from tests.conftest import job_row, run_tide, wait_for, wait_state

APP = "tests.apps.durable:registry"
QUEUES = ("durable",)
#: A sleep of 600 s seen a moment later, as a person reads it.
TEN_MINUTES = r"(10m|9m\d+s)"


@pytest.fixture
def ddb(db: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    """The test's database with the durable app's declarations and its effects table."""
    registry = load_app(APP)
    sync(db, list(registry.decls.values()), list(registry.workflows.values()))
    db.execute(EFFECTS_DDL)
    db.commit()
    return db


def _start(supervise: Any) -> Any:
    return supervise(queues=QUEUES, app=APP, concurrency=2)


def _asleep(db: psycopg.Connection[Any], job_id: int) -> dict[str, Any] | None:
    row = job_row(db, job_id)
    return row if row["state"] == "available" and row["suspended_for"] else None


def _nap(db: psycopg.Connection[Any], key: str, seconds: float) -> int:
    return atlantis.enqueue(db, "durable.Nap", {"key": key, "seconds": seconds})


def _status(db_url: str, job_id: int, *more: str) -> str:
    return run_tide(["--database-url", db_url, "job", "status", str(job_id), *more]).stdout


def _steps(db_url: str, job_id: int, *more: str) -> Any:
    return run_tide(["--database-url", db_url, "job", "steps", str(job_id), *more],
                    check=False)


def _field(text: str, label: str) -> str:
    """The text after ``label`` on its line of ``tide job status``."""
    found = re.search(rf"^  {label} +(.*)$", text, re.MULTILINE)
    assert found, f"no {label!r} line in:\n{text}"
    return found.group(1)


# ---- tide job status -----------------------------------------------------------------------

def test_status_of_a_sleeping_job_says_what_it_sleeps_for_and_its_steps(
        ddb: psycopg.Connection[Any], db_url: str, supervise: Any) -> None:
    _start(supervise)
    job_id = _nap(ddb, "status-nap", 600)
    row = wait_for(lambda: _asleep(ddb, job_id), message="the job to sleep")
    text = _status(db_url, job_id)
    wake = row["run_at"].astimezone(UTC)
    assert re.fullmatch(rf"in handler step nap until {wake:%Y-%m-%d %H:%M:%S} UTC "
                        rf"\(in {TEN_MINUTES}\)", _field(text, "asleep"))
    assert _field(text, "steps").startswith("2 records, ")
    assert f"tide job steps {job_id}" in _field(text, "steps")
    after = text.split("\n  steps", 1)[1].splitlines()
    assert re.match(r"^ {13}before  step   (just now|\S+ ago)  4B$", after[1]), after
    assert re.match(r"^ {13}nap {5}sleep  (just now|\S+ ago)  \d+B$", after[2]), after
    # The run that went to sleep spent no attempt, and says so.
    assert "suspend (no attempt spent)" in _field(text, "attempts")
    assert "attempt 0/1" in _field(text, "state")

    doc = orjson.loads(_status(db_url, job_id, "--json"))
    assert doc["suspended_for"] == "sleep:nap"
    assert datetime.fromisoformat(doc["suspended_until"]) == row["run_at"]
    steps = doc["handler_steps"]
    assert steps["records"] == 2
    assert [(s["name"], s["kind"]) for s in steps["last"]] == [("before", "step"),
                                                                ("nap", "sleep")]
    assert steps["bytes"] == sum(s["bytes"] for s in steps["last"]) > 0
    assert all(datetime.fromisoformat(s["at"]) <= row["run_at"] for s in steps["last"])
    assert [a["outcome"] for a in doc["attempts"]] == ["suspend"]


def test_status_after_the_wake_shows_every_step_and_no_sleep(
        ddb: psycopg.Connection[Any], db_url: str, supervise: Any) -> None:
    _start(supervise)
    job_id = _nap(ddb, "status-woke", 0.5)
    wait_state(ddb, job_id, "complete")
    text = _status(db_url, job_id)
    assert "asleep" not in text
    assert _field(text, "steps").startswith("3 records, ")
    timeline = text.split("\n  attempts", 1)[1]
    assert "suspend (no attempt spent)" in timeline and "complete" in timeline
    doc = orjson.loads(_status(db_url, job_id, "--json"))
    assert doc["suspended_for"] is None and doc["suspended_until"] is None
    assert [s["name"] for s in doc["handler_steps"]["last"]] == ["before", "nap", "after"]
    assert [a["outcome"] for a in doc["attempts"]] == ["suspend", "complete"]


def test_status_shows_the_last_five_of_many_steps(ddb: psycopg.Connection[Any], db_url: str,
                                                   supervise: Any) -> None:
    _start(supervise)
    job_id = atlantis.enqueue(ddb, "durable.Steps", {"key": "many", "n": 8, "hold_at": -1})
    wait_state(ddb, job_id, "complete")
    text = _status(db_url, job_id)
    assert _field(text, "steps").startswith("8 records, ")
    assert f"the last 5 below, tide job steps {job_id} lists them all" in text
    shown = [ln.split()[0] for ln in text.split("\n  steps", 1)[1].splitlines()[1:6]]
    assert shown == ["s-3", "s-4", "s-5", "s-6", "s-7"]
    doc = orjson.loads(_status(db_url, job_id, "--json"))
    assert doc["handler_steps"]["records"] == 8
    assert [s["name"] for s in doc["handler_steps"]["last"]] == shown


def test_status_of_a_job_without_steps_has_no_steps_line(ddb: psycopg.Connection[Any],
                                                          db_url: str) -> None:
    job_id = _nap(ddb, "no-steps", 1)  # no supervisor: it waits, with no records
    text = _status(db_url, job_id)
    assert "\n  steps" not in text and "asleep" not in text
    doc = orjson.loads(_status(db_url, job_id, "--json"))
    assert doc["handler_steps"] == {"records": 0, "bytes": 0, "last": []}
    assert doc["suspended_for"] is None


# ---- tide job steps ------------------------------------------------------------------------

def test_steps_lists_every_record_oldest_first(ddb: psycopg.Connection[Any], db_url: str,
                                               supervise: Any) -> None:
    _start(supervise)
    job_id = _nap(ddb, "steps-nap", 600)
    row = wait_for(lambda: _asleep(ddb, job_id), message="the job to sleep")
    listed = _steps(db_url, job_id)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].split() == ["NAME", "KIND", "RECORDED", "ATTEMPT", "SIZE", "VALUE"]
    assert lines[1].split()[:2] == ["before", "step"] and lines[1].rstrip().endswith("null")
    wake = row["run_at"].astimezone(UTC)
    assert lines[2].split()[:2] == ["nap", "sleep"]
    assert re.search(rf"wakes in {TEN_MINUTES} \({wake:%Y-%m-%d %H:%M:%S} UTC\)$", lines[2])
    assert len(lines) == 3

    docs = orjson.loads(_steps(db_url, job_id, "--json").stdout)
    assert [(d["name"], d["kind"], d["attempt"]) for d in docs] == [("before", "step", 1),
                                                                   ("nap", "sleep", 1)]
    assert docs[0]["value"] is None
    assert datetime.fromisoformat(docs[1]["value"]["until"]) == row["run_at"]
    assert docs[0]["bytes"] == len("null") and docs[1]["bytes"] > len('{"until": ""}')
    assert docs[0]["recorded_at"] <= docs[1]["recorded_at"]


def test_steps_values_and_attempts_across_runs(ddb: psycopg.Connection[Any], db_url: str,
                                               supervise: Any) -> None:
    _start(supervise)
    job_id = atlantis.enqueue(ddb, "durable.AsyncSteps", {"key": "steps-async", "n": 2})
    wait_state(ddb, job_id, "complete")
    docs = orjson.loads(_steps(db_url, job_id, "--json").stdout)
    assert [(d["name"], d["kind"], d["value"]) for d in docs[:-1]] == [
        ("a-0", "step", 0), ("s-0", "step", 0), ("a-1", "step", 1), ("s-1", "step", 1),
        ("write", "transaction", 1)]
    assert (docs[-1]["name"], docs[-1]["kind"]) == ("nap", "sleep")
    assert set(docs[-1]["value"]) == {"until"}
    # All recorded by the first attempt, which then failed: the second ran none again.
    assert {d["attempt"] for d in docs} == {1}
    text = _steps(db_url, job_id).stdout
    assert [ln.split()[0] for ln in text.splitlines()[1:]] == [d["name"] for d in docs]


def test_steps_of_an_unknown_job_or_one_without_steps(ddb: psycopg.Connection[Any],
                                                      db_url: str) -> None:
    unknown = _steps(db_url, 987654)
    assert unknown.returncode == 1
    assert unknown.stderr.splitlines()[-1] == "tide: no job with id 987654"
    assert unknown.stdout == ""
    job_id = _nap(ddb, "no-steps", 1)
    none = _steps(db_url, job_id)
    assert none.returncode == 0 and none.stdout == ""
    assert none.stderr.splitlines()[-1] == f"tide: job {job_id} has no handler step records"
    assert orjson.loads(_steps(db_url, job_id, "--json").stdout) == []


def test_a_long_step_value_is_cut_for_a_person() -> None:
    now = datetime.now(UTC)
    long = orjson.dumps({"rows": list(range(200))}).decode()
    row = StepRow("page-1", "step", long, len(long), 1, now)
    text = step_value(row, now)
    assert text.startswith(long[:STEP_VALUE_CHARS] + "...")
    assert text.endswith("; --json shows it whole)") and len(text) < len(long)
    short = StepRow("page-2", "transaction", "[1, 2]", 6, 1, now)
    assert step_value(short, now) == "[1, 2]"
    woke = StepRow("nap", "sleep", orjson.dumps({"until": (now - timedelta(seconds=90))
                                                  .isoformat()}).decode(), 40, 1, now)
    assert step_value(woke, now).startswith("woke 1m30s ago (")
