"""Fault containment (issue 7): a fault that belongs to one attempt ends that attempt only.

Each test makes one attempt misbehave next to ordinary neighbours, and checks that the
misbehaving job ends with a clear error kind, that every neighbour completes, and that the
supervisor is still alive. Real supervisors, children, signals and PostgreSQL.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import subprocess
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import psutil
import psycopg
import pytest

import atlantis
from atlantis.store.queries import Q
from atlantis.store.supervision import ClaimedRow, Result, finish_params
from atlantis.supervisor.attempt_logs import AttemptLogs
from atlantis.supervisor.attempts import Attempt
from atlantis.supervisor.completer import Completer, linger_for
from atlantis.supervisor.db import DatabaseUnavailable, Db, StatementRejected, Timing, classify
from atlantis.supervisor.output import Label
from atlantis.supervisor.runtime import Runtime
from atlantis.supervisor.service import Service
from atlantis.supervisor.settings import Settings
from tests.conftest import BIN, ROOT, events, job_row, wait_for, wait_state

APP = "tests.apps.contain:registry"
QUEUES = ("contain",)


def _start(supervise: Any, *args: str, concurrency: int = 2, **kw: Any) -> Any:
    return supervise(*args, queues=QUEUES, app=APP, concurrency=concurrency, **kw)


def _neighbours(db: psycopg.Connection[Any], n: int = 4) -> list[int]:
    return atlantis.enqueue_many(db, "contain.Act", [{"key": f"n{i}", "mode": "ok"} for i in range(n)])


def _all_complete(db: psycopg.Connection[Any], ids: list[int]) -> None:
    for job_id in ids:
        wait_state(db, job_id, "complete")


def _one(db: psycopg.Connection[Any], mode: str, **extra: Any) -> int:
    return atlantis.enqueue(db, "contain.Act", {"key": mode, "mode": mode, **extra})


@pytest.mark.parametrize(("mode", "why"), [
    ("forge-release", "'release' is not one of"),
    ("forge-attempt", "unknown field 'attempt'"),
    ("oversize", "exceeds the limit"),
])
def test_forged_and_oversized_frames_fail_only_their_attempt(
        db: psycopg.Connection[Any], supervise: Any, mode: str, why: str) -> None:
    sup = _start(supervise)
    bad = _one(db, mode)
    row = wait_state(db, bad, "dead")
    assert row["errors"][-1]["kind"] == "protocol", row["errors"]
    assert why in row["last_error"] and row["attempt"] == 1
    _all_complete(db, _neighbours(db))
    assert sup.proc.poll() is None
    assert "protocol violation" in sup.log()


def test_nul_in_an_error_and_in_a_checkpoint_is_cleaned_not_fatal(
        db: psycopg.Connection[Any], supervise: Any) -> None:
    sup = _start(supervise)
    ids = _neighbours(db)
    nul = _one(db, "nul-error")
    ckpt = _one(db, "checkpoint-nul")
    row = wait_state(db, nul, "dead")
    assert row["last_error"] == "ValueError: badbyte"
    row = wait_state(db, ckpt, "complete")
    assert row["progress_pct"] == 40 and row["progress_msg"] == "halfway \\ud800 there"
    _all_complete(db, ids)
    assert sup.proc.poll() is None


def test_a_huge_snooze_is_clamped(db: psycopg.Connection[Any], supervise: Any) -> None:
    sup = _start(supervise)
    job_id = _one(db, "snooze-huge")
    row = wait_for(lambda: (r := job_row(db, job_id))["state"] == "available" and r["started_at"] and r,
                   message="the snooze")
    assert row["attempt"] == 0
    days = (row["run_at"] - row["started_at"]).total_seconds() / 86400
    assert 364 <= days <= 366
    _all_complete(db, _neighbours(db))
    assert sup.proc.poll() is None


def test_a_child_that_stops_reading_never_blocks_the_supervisor(
        db: psycopg.Connection[Any], supervise: Any) -> None:
    """A stopped child's control pipe fills up (a 1 MB Run frame); the loop must go on."""
    sup = _start(supervise, concurrency=2)
    wait_for(lambda: len([c for c in psutil.Process(sup.pid).children()
                          if "atlantis.child" in " ".join(c.cmdline())]) == 2, message="children")
    kids = [c for c in psutil.Process(sup.pid).children() if "atlantis.child" in " ".join(c.cmdline())]
    victim = kids[0]
    victim.suspend()
    try:
        blob = "x" * 900_000
        stuck = atlantis.enqueue_many(db, "contain.Stuck", [{"key": f"s{i}", "blob": blob} for i in range(2)])
        ids = _neighbours(db, 6)
        _all_complete(db, ids)
        # The attempt given to the stopped child times out and is killed (SIGKILL reaches a
        # stopped process); the other one timed out in its running child.
        for job_id in stuck:
            row = wait_state(db, job_id, "dead")
            assert row["errors"][-1]["kind"] == "timeout", row["errors"]
        assert sup.proc.poll() is None
    finally:
        try:
            victim.resume()
        except psutil.Error:
            pass


def test_a_thirty_digit_numeric_runs_and_its_neighbours_too(
        db: psycopg.Connection[Any], supervise: Any) -> None:
    sup = supervise(queues=("values",), app="tests.apps.values:registry", concurrency=2)
    big = atlantis.enqueue(db, "values.Big", {"n": 123456789012345678901234567890})
    assert isinstance(big, int)
    row = wait_state(db, big, "complete", "dead")
    assert row["state"] == "complete", row["errors"]
    assert events(db, "big")[0][2] == "Decimal('123456789012345678901234567890')"
    assert sup.proc.poll() is None


def test_args_that_cannot_be_decoded_fail_with_kind_args(
        db: psycopg.Connection[Any], supervise: Any) -> None:
    """A row written around validation (nested past any decoder's depth) fails one attempt."""
    sup = _start(supervise)
    deep = "[" * 2000 + "]" * 2000
    job_id = db.execute(
        "INSERT INTO atlantis.jobs (job, queue, args, max_attempts, timeout, heartbeat, backoff)"
        " VALUES ('contain.Act', 'contain', jsonb_build_object('key', 'deep', 'mode', 'ok',"
        " 'blob', %s::jsonb), 1, '30s', '3s', '0s') RETURNING id", (deep,)).fetchone()
    assert job_id is not None

    def ended() -> Any:
        # Not SELECT *: decoding the args in the test would hit Python's recursion limit.
        return db.execute("SELECT state, errors->-1->>'kind' FROM atlantis.jobs WHERE id = %s",
                          (job_id[0],)).fetchone()

    assert wait_for(lambda: (r := ended()) is not None and r[0] == "dead" and r) == ("dead", "args")
    _all_complete(db, _neighbours(db))
    assert sup.proc.poll() is None


def test_output_is_rate_limited_per_attempt_and_the_rest_counted(
        db: psycopg.Connection[Any], supervise: Any) -> None:
    sup = _start(supervise, "--output-lines-per-second", "10")
    job_id = _one(db, "chatty")
    wait_state(db, job_id, "complete")
    line = wait_for(lambda: next((x for x in sup.log().splitlines() if "not logged" in x), None),
                    message="the count of dropped lines")
    dropped = int(line.split(": ")[-1].split()[0])
    logged = sum(1 for x in sup.log().splitlines() if f"job={job_id} attempt=1 line " in x)
    assert logged + dropped == 5000 and logged < 500, (logged, dropped)
    assert f"job={job_id} attempt=1" in line


# ---- secrets ---------------------------------------------------------------------------------

def test_handler_database_url_replaces_the_supervisors_credentials(
        db: psycopg.Connection[Any], db_url: str, supervise: Any) -> None:
    handler_url = db_url + " application_name=handler"
    _start(supervise, env={"ATLANTIS_HANDLER_DATABASE_URL": handler_url, "PGPASSWORD": "sekrit",
                           "PGCONNECT_TIMEOUT": "7"})
    job_id = _one(db, "env")
    wait_state(db, job_id, "complete")
    seen = {e[2].split("=", 1)[0]: e[2].split("=", 1)[1] for e in events(db, "env")}
    assert seen["url"] == handler_url and seen["ctx"] == handler_url
    assert seen["pg"] == ""
    assert handler_url not in seen["repr"] and "application_name" not in seen["repr"]


def test_without_a_handler_url_children_get_the_supervisors(
        db: psycopg.Connection[Any], db_url: str, supervise: Any) -> None:
    _start(supervise)
    job_id = _one(db, "env")
    wait_state(db, job_id, "complete")
    seen = {e[2].split("=", 1)[0]: e[2].split("=", 1)[1] for e in events(db, "env")}
    assert seen["url"] == db_url and seen["ctx"] == db_url


def test_a_password_never_reaches_the_supervisors_output(db_url: str) -> None:
    for url in ("postgresql://u:pa%zzss@127.0.0.1:1/db", "postgresql://u:sekrit99@127.0.0.1:1/db",
                "host=127.0.0.1 port=1 password='sekrit99"):
        done = subprocess.run(
            [str(BIN / "atlantis-supervise"), "--queue", "q", "--app", APP, "--database-url", url,
             "--startup-timeout", "1s"], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert done.returncode in (1, 2), done.stderr
        assert "zzss" not in done.stderr and "sekrit99" not in done.stderr, done.stderr
        assert "Traceback" not in done.stderr


# ---- settings ----------------------------------------------------------------------------------

@pytest.mark.parametrize("option", [
    ["--kill-grace", "nan"], ["--drain-timeout", "inf"], ["--kill-grace", "-1s"],
    ["--max-memory-per-child", "nanMB"], ["--concurrency", "many"],
])
def test_nan_inf_and_negative_settings_exit_2(db_url: str, option: list[str]) -> None:
    done = subprocess.run(
        [str(BIN / "atlantis-supervise"), "--queue", "q", "--app", APP, "--database-url", db_url,
         *option], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, (option, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and option[0] in lines[0], done.stderr


def test_every_setting_has_an_option() -> None:
    from atlantis.supervisor.cli import main

    names = {p.name for p in main.params}
    assert {f.name for f in dataclasses.fields(Settings)} <= names


# ---- the database's refusals -------------------------------------------------------------------

def test_errors_are_classified() -> None:
    assert classify(psycopg.errors.UntranslatableCharacter()) == "rejected"
    assert classify(psycopg.errors.NumericValueOutOfRange()) == "rejected"
    assert classify(psycopg.errors.UniqueViolation()) == "rejected"
    assert classify(psycopg.errors.ProgramLimitExceeded()) == "rejected"
    assert classify(psycopg.errors.ReadOnlySqlTransaction()) == "outage"
    assert classify(psycopg.errors.AdminShutdown()) == "outage"
    assert classify(psycopg.errors.InternalError_()) == "outage"
    assert classify(psycopg.errors.UndefinedColumn()) == "outage"
    assert classify(ValueError("NUL")) == "rejected"


def test_a_read_only_database_is_an_outage_not_a_crash(db_url: str, admin_url: str) -> None:
    dbname = psycopg.conninfo.conninfo_to_dict(db_url)["dbname"]
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f"ALTER DATABASE {dbname} SET default_transaction_read_only = on")

    async def go() -> None:
        conn = Db(db_url, "test", Timing.of(Settings(queues=("q",))))
        with pytest.raises(DatabaseUnavailable):
            await conn.fetch(Q.worker_delete, {"id": "x"}, timeout=5)
        await conn.close()

    asyncio.run(go())


def test_a_refused_batch_is_written_row_by_row(db: psycopg.Connection[Any], db_url: str) -> None:
    ids = _neighbours(db, 3)
    db.execute(Q.claim, {"limited": [], "queues": ["contain"], "jobs": ["contain.Act"], "limit": 3, "worker": "w",
                         "within": 5.0})
    good = [Result(i, 1, "complete", True, 0.0, None, None) for i in ids[:2]]
    # Bypasses every cleaning on purpose: only the database refuses this one.
    bad = Result(ids[2], 1, "dead", True, 0.0, {"attempt": 1, "kind": "exception",
                                                 "message": "bad\x00byte"}, None)

    async def go() -> None:
        rt = Runtime(Settings(queues=("contain",), database_url=db_url))
        rt.worker_id = "w"
        completer = Completer(rt)
        with pytest.raises(StatementRejected):
            await completer.db.fetch(Q.finish, finish_params("w", [*good, bad]), timeout=5)
        batch = []
        for r in (*good, bad):
            row = ClaimedRow(r.job_id, "contain.Act", "contain", "{}", 1, 1, False, 30.0, 3.0, 0.0,
                             datetime.now(UTC))
            batch.append((Attempt(row=row, lease_end=0, renewed_at=0), r))
        await completer._write(batch)
        await rt.close_databases()

    asyncio.run(go())
    for i in ids[:2]:
        assert job_row(db, i)["state"] == "complete"
    row = job_row(db, ids[2])
    assert row["state"] == "dead" and row["last_error"].startswith("badbyte (the attempt's outcome")


@pytest.mark.parametrize("pace, batches", [(0.002, [4]), (1.0, [1, 3]), (0.0002, [1, 3])])
def test_results_that_come_fast_share_a_write_and_slow_ones_go_at_once(
    db: psycopg.Connection[Any], db_url: str, pace: float, batches: list[int]
) -> None:
    """While rows are claimed ahead, a write waits for more results only while they come
    faster than completer.BUSY_LINGER (one commit for several, as a fresh worker's results
    come a few milliseconds apart); a supervisor whose results are far apart writes each at
    once, and so does one whose results come faster than a write takes (they gather while
    one is under way). Three results come while the first one's write waits, or is under
    way."""
    ids = _neighbours(db, 4)
    db.execute(Q.claim, {"limited": [], "queues": ["contain"], "jobs": ["contain.Act"], "limit": 4,
                         "worker": "w", "within": 5.0})
    assert linger_for(0.002, True, 0.001, 0.0005) == 0.003
    assert linger_for(0.002, True, 0.01, 0.0005) == 0.0  # slower than BUSY_LINGER
    assert linger_for(0.002, True, 0.001, 0.002) == 0.0  # faster than a write takes
    assert linger_for(0.002, False, 1.0, 0.001) == 0.002 and linger_for(0.0, True, 0.001, 0.0) == 0.0

    async def go() -> list[int]:
        rt = Runtime(Settings(queues=("contain",), database_url=db_url))
        rt.worker_id = "w"
        assert rt.claim_mode.ahead
        completer = Completer(rt)
        for _ in range(10):  # results one right after another: the pace falls toward 0
            completer._ended()
        assert completer.pace < 0.005
        completer.flush.clear()
        completer.pace, completer.write_time = pace, 0.0005
        sizes: list[int] = []
        finish = completer._finish

        async def counted(results: Sequence[Result]) -> set[int]:
            sizes.append(len(results))
            return await finish(results)

        completer._finish = counted  # type: ignore[method-assign]
        writer = asyncio.create_task(completer._write_loop())
        for n, job_id in enumerate(ids):
            row = ClaimedRow(job_id, "contain.Act", "contain", "{}", 1, 1, False, 30.0, 3.0, 0.0,
                             datetime.now(UTC))
            rt.ledger.ended.append((Attempt(row=row, lease_end=0, renewed_at=0),
                                    Result(job_id, 1, "complete", True, 0.0, None, None)))
            completer.flush.set()
            if n == 0:  # the writer takes the first one: it waits, or writes it alone
                for _ in range(3):
                    await asyncio.sleep(0)
        while rt.ledger.ended or rt.ledger.writing:
            await asyncio.sleep(0.01)
        writer.cancel()
        await rt.close_databases()
        return sizes

    assert asyncio.run(go()) == batches
    _all_complete(db, ids)


def test_an_attempts_output_is_written_before_its_outcome(
    db: psycopg.Connection[Any], db_url: str
) -> None:
    """A job seen finished has its attempt's output in atlantis.logs (tide job logs shows
    it): the completer writes the lines still waiting before the outcome, without waiting
    for the logs' own flush (its loop never runs here)."""
    (job_id,) = _neighbours(db, 1)
    db.execute(Q.claim, {"limited": [], "queues": ["contain"], "jobs": ["contain.Act"], "limit": 1,
                         "worker": "w", "within": 5.0})

    async def go() -> None:
        rt = Runtime(Settings(queues=("contain",), database_url=db_url))
        rt.worker_id = "w"
        logs = AttemptLogs(rt)
        completer = Completer(rt, logs)
        logs.line(Label(job_id, 1, "contain"), "stdout", "hello, world")
        row = ClaimedRow(job_id, "contain.Act", "contain", "{}", 1, 1, False, 30.0, 3.0, 0.0,
                         datetime.now(UTC))
        await completer._write([(Attempt(row=row, lease_end=0, renewed_at=0),
                                 Result(job_id, 1, "complete", True, 0.0, None, None))])
        assert not logs.pending([(job_id, 1, 1)])
        await rt.close_databases()

    asyncio.run(go())
    assert job_row(db, job_id)["state"] == "complete"
    assert db.execute("SELECT line FROM atlantis.logs WHERE job_id = %s",
                      (job_id,)).fetchall() == [("hello, world",)]


def _fail_5000_times(db: psycopg.Connection[Any], job_id: int) -> None:
    for attempt in range(1, 5001):
        db.execute(Q.claim, {"limited": [], "queues": ["contain"], "jobs": ["contain.Fails"], "limit": 1,
                             "worker": "w", "within": 5.0})
        state = "dead" if attempt == 5000 else "available"
        err = {"attempt": attempt, "kind": "exception", "message": f"failure {attempt}",
               "traceback": "x" * 2000}
        done = db.execute(Q.finish, finish_params("w", [
            Result(job_id, attempt, state, True, 0.0, err, None)])).fetchall()
        assert done == [(job_id, state)], attempt


def test_five_thousand_failures_keep_twenty_errors_and_count_all(db: psycopg.Connection[Any]) -> None:
    job_id = atlantis.enqueue(db, "contain.Fails", {"key": "many"})
    _fail_5000_times(db, job_id)  # a commit each: one transaction would keep every row version
    row = job_row(db, job_id)
    assert row["state"] == "dead" and row["error_count"] == 5000 and row["attempt"] == 5000
    assert [e["attempt"] for e in row["errors"]] == list(range(4981, 5001))
    assert row["last_error"] == "failure 5000"


# ---- services ----------------------------------------------------------------------------------

def test_a_service_loop_that_dies_is_logged_and_restarted(caplog: pytest.LogCaptureFixture) -> None:
    calls: list[int] = []

    class Flaky(Service):
        name = "flaky"

        def loops(self) -> list[Any]:
            return [self._work]

        async def _work(self) -> None:
            calls.append(1)
            if len(calls) < 3:
                raise RuntimeError(f"bug number {len(calls)}")

    async def go() -> None:
        svc = Flaky(Runtime(Settings(queues=("q",), respawn_max=0.01)))
        await svc.start()
        for _ in range(200):
            if len(calls) >= 3:
                break
            await asyncio.sleep(0.01)
        await svc.stop()
        assert svc.restarts == 2

    with caplog.at_level(logging.ERROR, logger="atlantis.supervisor"):
        asyncio.run(go())
    assert len(calls) == 3
    assert "internal error in flaky.work; restarting it" in caplog.text
    assert "bug number 1" in caplog.text  # the traceback is logged


def test_decimal_arrives_exactly(db: psycopg.Connection[Any]) -> None:
    """The row keeps all thirty digits (the handler side is tested in test_args)."""
    job_id = atlantis.enqueue(db, "values.Big", {"n": Decimal("123456789012345678901234567890")})
    assert db.execute("SELECT args->>'n' FROM atlantis.jobs WHERE id = %s",
                      (job_id,)).fetchone() == ("123456789012345678901234567890",)


def test_tide_enqueue_keeps_every_digit(db: psycopg.Connection[Any], db_url: str) -> None:
    done = subprocess.run(
        [str(BIN / "tide"), "--database-url", db_url, "job", "enqueue", "values.Big",
         "--args", '{"n": 123456789012345678901234567890.000000000000000001}'],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=True)
    job_id = int(done.stdout)
    assert db.execute("SELECT args->>'n' FROM atlantis.jobs WHERE id = %s", (job_id,)).fetchone() \
        == ("123456789012345678901234567890.000000000000000001",)
    refused = subprocess.run(
        [str(BIN / "tide"), "--database-url", db_url, "job", "enqueue", "values.Big",
         "--args", '{"n": NaN}'], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and "NaN is not a JSON number" in refused.stderr


HOSTILE = {
    # mode: (state, kind, a piece of last_error)
    "discard-int": ("dead", "discarded", "123"),
    "unprintable": ("dead", "exception", "<unprintable UnprintableError>"),
    "evil-str": ("dead", "exception", "EvilStrError"),
    "surrogate": ("dead", "exception", "bad \\ud800 value"),
    "huge-error": ("dead", "exception", "truncated"),
    "exit3": ("dead", "exit", "sys.exit(3)"),
    "keyboard-interrupt": ("dead", "exception", "KeyboardInterrupt"),
    # The result cannot be sent; unless the watchdog thread, awake for the attempt's start,
    # saw its control pipe closed first.
    "close-fds": ("dead", "crash", ("child exited with code 4: the child lost its events pipe (",
                                    "killed by SIGKILL: the child lost its control pipe (")),
    "close-fds-sleep": ("dead", "crash", "killed by SIGKILL: the child lost its control pipe ("),
    "kill-watchdog": ("dead", "crash", "killed by SIGKILL: the child's watchdog failed ("),
}


def test_whatever_a_handler_does_ends_its_attempt_only(
        db: psycopg.Connection[Any], supervise: Any) -> None:
    """Every hostile mode at once, among ordinary jobs, on one supervisor with two children."""
    sup = supervise(queues=("hostile",), app="tests.apps.hostile:registry", concurrency=2)
    ids = {mode: atlantis.enqueue(db, "hostile.Misbehave", {"mode": mode}) for mode in HOSTILE}
    ids["args"] = atlantis.enqueue(db, "hostile.ArgsBoom", {})
    ok = atlantis.enqueue_many(db, "hostile.Misbehave", [{"mode": "ok"}] * 6)
    for mode, (state, kind, text) in HOSTILE.items():
        row = wait_state(db, ids[mode], "complete", "dead")
        assert row["state"] == state and row["errors"][-1]["kind"] == kind, (mode, row["errors"])
        texts = (text,) if isinstance(text, str) else text
        assert any(t in row["last_error"] for t in texts), (mode, row["last_error"])
    assert wait_state(db, ids["args"], "dead")["errors"][-1]["kind"] == "args"
    _all_complete(db, ok)
    assert sup.proc.poll() is None


def test_a_backlog_of_results_goes_out_in_batches_of_bounded_size(
        db: psycopg.Connection[Any], db_url: str) -> None:
    """After a stall, 1,200 queued results are written 500 at most a statement (one
    statement for all made a NOTIFY payload, and so the whole batch, too long)."""
    ids = atlantis.enqueue_many(db, "contain.Act", [{"key": f"b{i}", "mode": "ok"}
                                                    for i in range(1200)])
    db.execute(Q.claim, {"limited": [], "queues": ["contain"], "jobs": ["contain.Act"], "limit": 1200,
                         "worker": "w", "within": 5.0})
    sizes: list[int] = []

    async def go() -> None:
        rt = Runtime(Settings(queues=("contain",), database_url=db_url))
        rt.worker_id = "w"
        completer = Completer(rt)
        finish = completer._finish

        async def counted(results: Sequence[Result]) -> set[int]:
            sizes.append(len(results))
            return await finish(results)

        completer._finish = counted  # type: ignore[method-assign]
        for i in ids:
            row = ClaimedRow(i, "contain.Act", "contain", "{}", 1, 1, False, 30.0, 3.0, 0.0,
                             datetime.now(UTC))
            rt.ledger.ended.append((Attempt(row=row, lease_end=0, renewed_at=0),
                                    Result(i, 1, "complete", True, 0.0, None, None)))
        task = asyncio.create_task(completer._write_loop())
        completer.flush.set()
        while rt.ledger.unwritten:
            await rt.wait_changed(1.0)
        task.cancel()
        await rt.close_databases()

    asyncio.run(go())
    assert sizes == [500, 500, 200]
    states = db.execute("SELECT state, count(*) FROM atlantis.jobs WHERE id = ANY(%s) GROUP BY 1",
                        (ids,)).fetchall()
    assert states == [("complete", 1200)]


def test_starting_a_child_out_of_descriptors_leaks_none() -> None:
    """``spawn_child`` makes four pipes and a lease cell: running out half way closes what
    it made (the pool tries again later) instead of leaking descriptors on every retry."""
    script = """
import asyncio, os, resource
from atlantis.supervisor.spawn import spawn_child
loop = asyncio.new_event_loop()
before = len(os.listdir("/proc/self/fd"))
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
for room in range(0, 9):
    resource.setrlimit(resource.RLIMIT_NOFILE, (before + room, hard))
    try:
        spawn_child("tests.apps.basic:registry", dict(os.environ), 0, loop, None, 10.0)
    except OSError:
        pass
    else:
        raise SystemExit(f"a child started with room for {room} more descriptors")
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    after = len(os.listdir("/proc/self/fd"))
    assert after == before, (room, before, after)
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
