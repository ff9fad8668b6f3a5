"""``assert_idempotent``: the guide's definition (run it twice: the effects are those of one
run) as a test, and the same again with the child killed at each kill point in turn
(:mod:`atlantis.testing.killpoints`), each run through a real supervisor on a fresh copy of
the test's database."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg

from atlantis import environ
from atlantis.registry import Registry
from atlantis.testing.database import TestDatabase
from atlantis.testing.supervised import JobEnd, Supervisor, app_spec, ends, wait_until, wake

Check = Callable[[psycopg.Connection[Any]], object]
Setup = Callable[[psycopg.Connection[Any]], object]
KILL_APP = "atlantis.testing.killpoints:registry"
_ENDED = ("complete", "dead", "cancelled")


class _Runs:
    """What every run of one assert_idempotent shares."""

    def __init__(self, db: TestDatabase, app: str, job: str, args: Mapping[str, Any],
                 check: Check, setup: Setup | None, queues: list[str], timeout: float,
                 folder: Path) -> None:
        self.db, self.app, self.job, self.args = db, app, job, dict(args)
        self.check, self.setup, self.queues = check, setup, queues
        self.timeout, self.folder = timeout, folder

    def run(self, kill_at: int, times: int = 1) -> list[str]:
        """``times`` complete runs of the job on a fresh database (the child killed at point
        ``kill_at`` of the first, 0: never), ``check`` after each; the kill points of the
        first run, or the label of the point killed at."""
        from atlantis.enqueue import enqueue
        from atlantis.store.queries import Q

        base = str(self.folder / f"run{kill_at}")
        env = {environ.TESTING_APP: self.app, environ.TESTING_POINTS: base,
               environ.TESTING_KILL_AT: str(kill_at)}
        with self.db.fresh(self.setup) as fresh, fresh.connect() as conn:
            sup = Supervisor(str(fresh), KILL_APP, self.queues, concurrency=1, env=env,
                             isolation="fresh")
            try:
                first = 0
                for n in range(times):
                    job_id = enqueue(conn, self.job, self.args)
                    first = first or job_id
                    conn.execute(Q.testing_budget, {"id": job_id, "more": 2})
                    end = self._finished(conn, sup, job_id)
                    self._checked(conn, end, kill_at, base, n)
            finally:
                sup.stop()
        if kill_at:
            return _lines(Path(f"{base}.killed"))
        return _lines(Path(f"{base}.{first}"))

    def _finished(self, conn: psycopg.Connection[Any], sup: Supervisor, job_id: int) -> JobEnd:
        got: list[JobEnd] = []

        def ended() -> bool:
            wake(conn, retries=True)  # a killed attempt's backoff, a sleep: no real waiting
            got[:] = ends(conn, ids=[job_id])
            return bool(got) and got[0].state in _ENDED

        wait_until(ended, sup, self.timeout, f"job {job_id} ({self.job}) ended")
        return got[0]

    def _checked(self, conn: psycopg.Connection[Any], end: JobEnd, kill_at: int, base: str,
                 n: int) -> None:
        where = ("run twice from the start, after the second complete run" if n else
                 "after one complete run")
        if kill_at:
            killed = _lines(Path(f"{base}.killed"))
            if not killed:
                raise AssertionError(f"{self.job}: kill point {kill_at} was not reached when "
                                     "the job ran again: its runs pass different kill points")
            where = f"killed just {killed[0]} and run again"
        if end.state != "complete":
            raise AssertionError(f"{self.job} is not idempotent: {where}, the job ended "
                                 f"{end.state}: {end.error}")
        try:
            self.check(conn)
        except AssertionError as exc:
            raise AssertionError(f"{self.job} is not idempotent: {where}, check failed: "
                                 f"{exc}") from exc


def _lines(path: Path) -> list[str]:
    try:
        return [line for line in path.read_text("utf-8").splitlines() if line]
    except FileNotFoundError:
        return []


def assert_idempotent(app: Registry | str, job: str, args: Mapping[str, Any] | None,
                      check: Check, *, db: TestDatabase, setup: Setup | None = None,
                      timeout: float = 60.0, parallel: int | None = None) -> list[str]:
    """Assert that running ``job`` with ``args`` twice leaves the effects of one run, and
    so does a run killed at any of its kill points and run again.

    Each run goes through a real ``atlantis-supervise`` with real children, on a fresh
    database made like ``db`` (the ``atlantis_db`` fixture): the app's declarations, then
    ``setup(conn)`` (your tables). First the job runs to completion, ``check(conn)``, and
    runs again from the start (a new job with the same args), ``check(conn)``; that run
    counts the kill points (:mod:`atlantis.testing.killpoints`): just before and just after
    each checkpoint and each step record, just after each commit through ``ctx.connect()``.
    Then, for each point in turn, the job runs with its child killed (SIGKILL) at that point,
    is retried by the supervisor (its attempt budget raised, the backoff skipped) until it
    completes, and ``check(conn)`` runs. ``check`` raises AssertionError when the effects
    are wrong; this raises AssertionError naming the run and the kill point ("killed just
    after commit 3 (after checkpoint 'page=2')"). Returns the kill points. ``parallel``:
    how many kill runs go at once (each with its own supervisor); the machine's cores by
    default (the runs are CPU-bound: more only slows every one of them)."""
    from atlantis.testing.inline import registry_of

    spec = app_spec(app)
    queues = sorted(registry_of(app).queues())
    folder = Path(tempfile.mkdtemp(prefix="atlantis-idempotent-"))
    try:
        runs = _Runs(db, spec, job, args or {}, check, setup, queues, timeout, folder)
        points = runs.run(0, times=2)
        at_once = parallel if parallel is not None else (os.cpu_count() or 1)
        with ThreadPoolExecutor(max_workers=max(1, at_once)) as pool:
            futures = [pool.submit(runs.run, i) for i in range(1, len(points) + 1)]
            failures = [f.exception() for f in futures]
        for failure in failures:
            if failure is not None:
                raise failure
        return points
    finally:
        shutil.rmtree(folder, ignore_errors=True)
