"""An operator's orders to one supervisor (issue 37): ``tide worker drain|evict|resume ID``,
carried through the database, with real supervisors, real attempts and real signals."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import psycopg

import atlantis
from tests.conftest import (
    Supervisor,
    events,
    free_port,
    job_row,
    run_tide,
    wait_for,
    wait_state,
)
from tests.test_readiness import probe

#: Orders looked up every half second without a NOTIFY; marks of life as often.
FAST = ["--pause-poll", "0.5s", "--liveness-interval", "0.5s"]


def _start(supervise: Callable[..., Supervisor], tmp_path: Path, name: str,
           *args: str) -> Supervisor:
    return supervise(*FAST, "--name", name, "--runtime-dir", str(tmp_path / "run"), *args,
                     concurrency=1)


def _tide(db_url: str, *args: str, check: bool = True) -> Any:
    return run_tide(["--database-url", db_url, *args], check=check)


def _workers(db_url: str) -> dict[str, dict[str, Any]]:
    """The live supervisors by name, as ``tide worker list --json`` shows them."""
    docs = orjson.loads(_tide(db_url, "worker", "list", "--json").stdout)
    return {d["name"]: d for d in docs}


def _status(db_url: str, name: str, status: str) -> Callable[[], bool]:
    return lambda: _workers(db_url).get(name, {}).get("status") == status


def _worker_id(db_url: str, name: str) -> str:
    found: dict[str, str] = wait_for(lambda: _workers(db_url).get(name),
                                     message=f"supervisor {name} registered")
    return found["id"]


def _sleep(db: psycopg.Connection[Any], key: str, seconds: float) -> int:
    job_id = atlantis.enqueue(db, "tests.Sleep", {"key": key, "seconds": seconds})
    db.commit()
    return job_id


def _echo(db: psycopg.Connection[Any], key: str) -> int:
    job_id = atlantis.enqueue(db, "tests.Echo", {"key": key, "value": "1"})
    db.commit()
    return job_id


def _ran_on(db: psycopg.Connection[Any], job_id: int) -> str:
    """The supervisor whose attempt completed ``job_id``."""
    row = db.execute("SELECT worker FROM atlantis.attempts WHERE job_id = %s "
                     "ORDER BY id DESC LIMIT 1", (job_id,)).fetchone()
    assert row is not None
    return str(row[0])


def test_drain_resume_by_id_from_another_process_across_two_supervisors(
        db: psycopg.Connection[Any], db_url: str, supervise: Callable[..., Supervisor],
        tmp_path: Path) -> None:
    a = _start(supervise, tmp_path, "alpha")
    a_id = _worker_id(db_url, "alpha")
    long_job = _sleep(db, "drained", 1.5)
    wait_for(lambda: job_row(db, long_job)["claimed_by"] == a_id, message="alpha runs it")
    b = _start(supervise, tmp_path, "beta")
    b_id = _worker_id(db_url, "beta")

    said = _tide(db_url, "worker", "drain", a_id).stdout
    assert "draining" in said and "finish" in said and "tide worker resume alpha" in said
    # Its attempt in flight finishes, once; everything new runs on the other supervisor.
    echoes = [_echo(db, f"after-drain-{n}") for n in range(3)]
    for job_id in [long_job, *echoes]:
        wait_state(db, job_id, "complete")
    assert [e[2] for e in events(db, "drained")] == ["started", "finished"]
    assert job_row(db, long_job)["attempt"] == 1
    assert {_ran_on(db, j) for j in echoes} == {b_id}
    wait_for(_status(db_url, "alpha", "drained"), message="alpha drained")
    assert a.proc.poll() is None  # drained: up and idle
    order = db.execute("SELECT action, drained_at IS NOT NULL, asked_by FROM "
                       "atlantis.worker_orders WHERE name = 'alpha'").fetchone()
    assert order is not None and order[0] == "drain" and order[1] and order[2]

    # Resumed by its name, and beta drained: new work runs on alpha again.
    assert "resumed" in _tide(db_url, "worker", "resume", "alpha").stdout
    wait_for(_status(db_url, "alpha", "running"), message="alpha running again")
    _tide(db_url, "worker", "drain", "beta")
    wait_for(_status(db_url, "beta", "drained"), message="beta drained")
    again = _echo(db, "after-resume")
    wait_state(db, again, "complete")
    assert _ran_on(db, again) == a_id
    nothing = _tide(db_url, "worker", "resume", a_id).stdout
    assert "nothing to resume" in nothing
    assert b.proc.poll() is None


def test_evict_stops_the_attempts_now_and_gives_their_rows_back(
        db: psycopg.Connection[Any], db_url: str, supervise: Callable[..., Supervisor],
        tmp_path: Path) -> None:
    a = _start(supervise, tmp_path, "alpha")
    a_id = _worker_id(db_url, "alpha")
    job_id = _sleep(db, "evicted", 3600)
    wait_for(lambda: [e[2] for e in events(db, "evicted")] == ["started"], message="started")
    said = orjson.loads(_tide(db_url, "worker", "evict", a_id, "--json").stdout)
    assert said.pop("in_flight") >= 0  # as its worker row last said
    assert said == {"id": a_id, "name": "alpha", "order": "evict", "exit": False,
                    "silent": False}
    # Stopped, given back unspent; beta, started after, runs it.
    wait_for(lambda: job_row(db, job_id)["state"] == "available", message="given back")
    assert job_row(db, job_id)["attempt"] == 0
    wait_for(_status(db_url, "alpha", "drained"), message="alpha drained")
    b = _start(supervise, tmp_path, "beta")
    b_id = _worker_id(db_url, "beta")
    wait_for(lambda: job_row(db, job_id)["claimed_by"] == b_id, message="beta runs it")
    assert a.proc.poll() is None
    b.stop(hurry=True)


def test_a_drained_supervisor_stays_drained_across_its_own_restart(
        db: psycopg.Connection[Any], db_url: str, supervise: Callable[..., Supervisor],
        tmp_path: Path) -> None:
    first = _start(supervise, tmp_path, "alpha")
    first_id = _worker_id(db_url, "alpha")
    said = _tide(db_url, "worker", "drain", first_id, "--exit").stdout
    assert "then exits" in said
    assert first.wait(30) == 0  # --exit: drained, then stopped as on SIGTERM
    assert "drained" in first.log() and "exiting (--exit)" in first.log()

    # A restart policy starts it again: it starts drained, and stays up (no second exit),
    # not ready for its probe.
    port = free_port()
    again = _start(supervise, tmp_path, "alpha", "--ready-port", str(port))
    wait_for(_status(db_url, "alpha", "drained"), message="restarted drained")
    assert "starts drained" in again.log()
    held = (503, "held by an operator's drain (tide worker resume)")
    wait_for(lambda: probe(port) == held or None, message="/ready: held")
    job_id = _echo(db, "after-restart")
    listed = _tide(db_url, "worker", "list").stdout
    assert "drained" in listed
    # Another supervisor, started only now, is the one that runs it.
    b = _start(supervise, tmp_path, "beta")
    b_id = _worker_id(db_url, "beta")
    wait_state(db, job_id, "complete")
    assert _ran_on(db, job_id) == b_id
    assert again.proc.poll() is None
    b.stop(hurry=True)
    _tide(db_url, "worker", "resume", "alpha")
    resumed = _echo(db, "after-resume")
    wait_state(db, resumed, "complete")
    assert _ran_on(db, resumed) == _workers(db_url)["alpha"]["id"]
    wait_for(lambda: probe(port) == (200, "ready") or None, message="/ready: ready again")


def test_an_evicted_silent_supervisor_keeps_its_leases_and_obeys_when_it_wakes(
        db: psycopg.Connection[Any], db_url: str, supervise: Callable[..., Supervisor],
        tmp_path: Path) -> None:
    a = _start(supervise, tmp_path, "alpha")
    a_id = _worker_id(db_url, "alpha")
    job_id = _sleep(db, "silent", 3600)
    wait_for(lambda: [e[2] for e in events(db, "silent")] == ["started"], message="started")
    lease = job_row(db, job_id)["claimed_until"]
    a.signal(signal.SIGSTOP)
    try:
        wait_for(lambda: _workers(db_url)["alpha"].get("silent_for") is not None,
                 message="alpha silent")
        said = _tide(db_url, "worker", "evict", "alpha").stdout
        assert "is silent" in said and "not sooner" in said
        row = job_row(db, job_id)
        assert row["state"] == "running" and row["claimed_by"] == a_id
        assert row["claimed_until"] == lease  # nothing released early
    finally:
        a.signal(signal.SIGCONT)
    # Awake: it stops the attempt, gives the row back and claims nothing.
    wait_for(lambda: job_row(db, job_id)["state"] == "available", message="given back")
    wait_for(_status(db_url, "alpha", "drained"), message="alpha drained")


def test_orders_to_no_supervisor_are_refused_with_one_line(
        db: psycopg.Connection[Any], db_url: str) -> None:
    for command in ("drain", "evict", "resume"):
        done = _tide(db_url, "worker", command, "nobody:1:x", check=False)
        assert done.returncode == 1
        assert done.stderr.strip().splitlines()[-1] == "tide: no supervisor nobody:1:x"
    assert db.execute("SELECT count(*) FROM atlantis.worker_orders").fetchone() == (0,)
