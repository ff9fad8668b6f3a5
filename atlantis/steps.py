"""Handler steps: what ``ctx.run_step``, ``ctx.transaction`` and ``ctx.sleep`` keep across a
job's runs (issue 34). The rules live here once; :class:`StepBook` and :class:`AsyncStepBook`
do their I/O (``atlantis.store.steps``) on the run's own connection to ``ctx.database_url``.

Records are read once, at a run's first step; a recorded step returns its value without
running, a new record is durable before its step returns. Steps are found by name, used once
a run, never nested. Values follow a job result's rules (NaN refused); a step returns the
recorded value, decoded. A lost lease (:class:`LeaseLost`), an unknown COMMIT or a suspension
is remembered (``stop``): a handler that catches it and goes on still fails.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import orjson

from atlantis.errors import EventTimeout, LeaseLost, StepError, Suspended
from atlantis.limits import MAX_STEP_BYTES, MAX_STEP_NAME, MAX_STEP_RECORDS
from atlantis.protocol import results

if TYPE_CHECKING:
    import psycopg

    from atlantis.protocol.fence import Fence
    from atlantis.store.steps import Opened

_MISSING: Any = object()
_METHODS = {"step": "run_step", "transaction": "transaction", "sleep": "sleep",
            "event": "wait_for_event", "spawn": "spawn", "join": "join"}  # by kind


def check_name(name: object) -> str:
    if type(name) is not str or not name or len(name) > MAX_STEP_NAME or "\x00" in name:
        raise StepError(f"a handler step's name must be a non-empty string of at most "
                        f"{MAX_STEP_NAME} characters without NUL, not {str(name)[:60]!r}")
    return name


def sleep_seconds(duration: object) -> float:
    """``ctx.sleep``'s duration in seconds: a timedelta or a number, finite, not negative."""
    if isinstance(duration, timedelta):
        seconds = duration.total_seconds()
    elif isinstance(duration, int | float) and not isinstance(duration, bool):
        seconds = float(duration)
    else:
        raise StepError(f"ctx.sleep needs a timedelta or a number of seconds, not "
                        f"{type(duration).__name__}")
    if not math.isfinite(seconds) or seconds < 0:
        raise StepError(f"ctx.sleep needs a finite duration of at least 0 seconds, "
                        f"not {seconds!r}")
    return seconds


def wake_time(when: object) -> datetime:
    if not isinstance(when, datetime) or when.tzinfo is None or when.utcoffset() is None:
        raise StepError("ctx.sleep_until needs a datetime with a time zone "
                        "(datetime.now(timezone.utc) + ...), not "
                        f"{when!r}"[:200])
    return when


def event_name(event: object) -> str:
    if type(event) is not str or not event or len(event) > 200:
        raise StepError(f"an event's name must be a non-empty string of at most 200 "
                        f"characters, not {str(event)[:60]!r}")
    return event


def event_timeout(timeout: object) -> float | None:
    """``ctx.wait_for_event``'s timeout in seconds (None: none), as a sleep's duration."""
    return None if timeout is None else sleep_seconds(timeout)


def encode(name: str, value: object) -> str:
    """The record of ``value``, or StepError (kind ``result``) saying why it cannot be."""
    text, why = results.encode(value)
    if why is None and text is not None:
        where = results.non_finite(value, text)
        if where is not None:
            why = f"it holds NaN or an infinity, which JSON cannot carry ({where})"
    if why is not None:
        raise StepError(f"handler step {name!r}: its value cannot be recorded: {why}",
                        kind="result")
    return "null" if text is None else text


class _Rules:
    """What both books share: the records read, the names used, the caps, the stop."""

    def __init__(self, fence: Fence, url: str | None) -> None:
        self.fence = fence
        self.url = url
        self.found: dict[str, tuple[str, str]] | None = None
        self.used: set[str] = set()
        self.count = 0
        self.bytes = 0
        self.written = 0
        self.stop: BaseException | None = None
        """Why the run must end (a suspension, a lost lease, an unknown COMMIT): the child
        fails the attempt with it if the handler caught it and went on."""
        self.inside: str | None = None  # the transaction step whose ``fn`` runs now

    def begin(self, name: object) -> str:
        if self.stop is not None:
            raise StepError(f"handler step {str(name)[:60]!r}: this run has ended "
                            f"({self.stop}); no step may run after that")
        checked = check_name(name)
        if self.inside is not None:
            raise StepError(f"handler step {checked!r} inside transaction step "
                            f"{self.inside!r}: steps do not nest; run it before or after")
        if checked in self.used:
            raise StepError(f"handler step {checked!r} was already used in this run: name "
                            "each step once (a loop names its steps: f\"page-{n}\")")
        self.used.add(checked)
        return checked

    def recorded(self, name: str, kind: str) -> Any:
        assert self.found is not None
        hit = self.found.get(name)
        if hit is None:
            return _MISSING
        if hit[0] != kind:
            raise StepError(f"handler step {name!r} was recorded by ctx.{_METHODS[hit[0]]} and "
                            f"is now run by ctx.{_METHODS[kind]}: give the new step a new name")
        return orjson.loads(hit[1])

    def loaded(self, opened: Opened, step: str) -> None:
        if opened.held != "ok":
            raise self.lost(step) if opened.held == "lost" else self.not_here()
        self.found = {name: (kind, value) for name, kind, value in opened.rows}
        self.count = len(opened.rows)
        self.bytes = sum(len(value) for _, _, value in opened.rows)

    def room(self, name: str, text: str) -> None:
        if self.count + 1 > MAX_STEP_RECORDS:
            raise StepError(f"handler step {name!r}: the job already holds {self.count} step "
                            f"records, the most a job may hold", kind="result")
        if self.bytes + len(text) > MAX_STEP_BYTES:
            raise StepError(f"handler step {name!r}: the job's step records would pass "
                            f"{MAX_STEP_BYTES // (1024 * 1024)} MiB in all", kind="result")

    def wrote(self, name: str, kind: str, text: str) -> None:
        assert self.found is not None
        self.found[name] = (kind, text)
        self.count, self.bytes, self.written = self.count + 1, self.bytes + len(text), self.written + 1

    def need_url(self) -> str:
        if not self.url:
            raise StepError("handler steps need the jobs' database: this attempt was given "
                            "no database URL (ctx.database_url)")
        return self.url

    def lost(self, name: str) -> LeaseLost:
        """The run no longer holds the job: it must stop (remembered as its stop)."""
        self.stop = stop = LeaseLost(f"handler step {name!r}: this run of job "
                                     f"{self.fence.job_id} no longer holds its lease; nothing "
                                     "it did in the step was committed")
        return stop

    def not_here(self) -> StepError:
        return StepError(
            f"handler steps need the handler's database to be the jobs' database: "
            f"ctx.database_url (--handler-database-url) holds no job {self.fence.job_id}")

    def fail(self, exc: BaseException, name: str) -> BaseException:
        """The exception a database error of step ``name`` becomes (and is remembered as
        the run's stop when the run must end)."""
        state = getattr(exc, "sqlstate", None)
        from atlantis.store import steps as store

        if state == store.LEASE_LOST:
            return self.lost(name)
        if state == store.NO_SUCH_JOB or state in ("42883", "3F000", "42P01"):
            return self.not_here()
        if state == "42501":
            return StepError("handler steps: the handler's database role may not call "
                             "atlantis's step functions; grant it atlantis_enqueuer")
        return exc

    def refused(self, exc: BaseException, name: str) -> BaseException:
        """A spawn's or a join's database error: a lost lease or another database as
        :meth:`fail`, else what :func:`atlantis.children.refused` makes of it."""
        from atlantis import children

        got = self.fail(exc, name)
        return children.refused(name, exc) if got is exc else got

    def joined(self, name: str, rows: list[tuple[Any, ...]], results: bool) -> list[Any]:
        """A join's end: what it returns, or the run suspended until its jobs have ended."""
        from atlantis import children

        got = children.joined(name, rows, results)
        if got is None:
            raise self.suspend(name, children.FOREVER, f"join:{name}")
        return got

    def unknown_commit(self, name: str, exc: BaseException) -> BaseException:
        self.stop = StepError(f"transaction step {name!r}: the connection failed during "
                              f"COMMIT, so whether it committed is unknown ({exc}); the "
                              "attempt fails and the next run reads the record")
        return self.stop

    def suspend(self, name: str, wake: datetime, waits: str = "") -> Suspended:
        self.stop = stop = Suspended(wake.isoformat(), waits or f"sleep:{name}")
        return stop

    def waited(self, name: str, event: str, got: tuple[bool, str | None, datetime | None]
               ) -> Any:
        """The end of a wait's step: the payload, EventTimeout, or the run suspended."""
        delivered, payload, wake = got
        if delivered:
            return None if payload is None else orjson.loads(payload)
        if wake is None:
            raise EventTimeout(f"handler step {name!r}: no event {event!r} reached job "
                               f"{self.fence.job_id} before the wait's deadline")
        raise self.suspend(name, wake, f"event:{event}")


class StepBook(_Rules):
    """A sync handler's steps."""

    def __init__(self, fence: Fence, url: str | None) -> None:
        super().__init__(fence, url)
        self._conn: psycopg.Connection[Any] | None = None

    def _open(self, name: str) -> psycopg.Connection[Any]:
        if self._conn is None:
            import psycopg

            from atlantis.store import steps as store

            try:
                self._conn, opened = store.open_run(self.need_url(), self.fence)
            except psycopg.Error as exc:
                raise self.fail(exc, name) from exc
            self.loaded(opened, name)
        return self._conn

    def run_step(self, name: object, fn: Callable[..., Any], args: tuple[Any, ...],
                 kwargs: dict[str, Any]) -> Any:
        key = self.begin(name)
        conn = self._open(key)
        value = self.recorded(key, "step")
        if value is not _MISSING:
            return value
        text = encode(key, fn(*args, **kwargs))
        self.room(key, text)
        self._write(conn, key, "step", text)
        return orjson.loads(text)

    def _write(self, conn: psycopg.Connection[Any], name: str, kind: str, text: str) -> None:
        import psycopg

        from atlantis.store import steps as store

        try:
            store.record(conn, self.fence, name, kind, text)
        except psycopg.Error as exc:
            raise self.fail(exc, name) from exc
        self.wrote(name, kind, text)

    def transaction(self, name: object, fn: Callable[..., Any], args: tuple[Any, ...],
                    kwargs: dict[str, Any]) -> Any:
        import psycopg

        from atlantis.store import steps as store

        key = self.begin(name)
        conn = self._open(key)
        value = self.recorded(key, "transaction")
        if value is not _MISSING:
            return value
        with store.StepTransaction(conn) as tx:
            self.inside = key
            try:
                got = fn(conn, *args, **kwargs)
            finally:
                self.inside = None
            text = encode(key, got)
            self.room(key, text)
            try:
                tx.commit(self.fence, key, "transaction", text)
            except psycopg.OperationalError as exc:
                raise self.unknown_commit(key, exc) from exc
            except psycopg.Error as exc:  # the fence: nothing was committed
                raise self.fail(exc, key) from exc
        self.wrote(key, "transaction", text)
        return orjson.loads(text)

    def sleep(self, name: object, seconds: float | None, until: datetime | None) -> None:
        import psycopg

        from atlantis.store import steps as store

        key = self.begin(name)
        conn = self._open(key)
        self.recorded(key, "sleep")  # refuses a name recorded as another kind
        try:
            wake, due = store.sleep(conn, self.fence, key, seconds, until)
        except psycopg.Error as exc:
            raise self.fail(exc, key) from exc
        if due:
            return
        raise self.suspend(key, wake)

    def wait_for_event(self, name: object, event: str, seconds: float | None) -> Any:
        import psycopg

        from atlantis.store import steps as store

        key = self.begin(name)
        conn = self._open(key)
        self.recorded(key, "event")  # refuses a name recorded as another kind
        try:
            got = store.wait_event(conn, self.fence, key, event_name(event), seconds)
        except psycopg.Error as exc:
            raise self.fail(exc, key) from exc
        return self.waited(key, event, got)

    def spawn(self, name: object, job: object, args: object, options: dict[str, Any]) -> int:
        import psycopg

        from atlantis import children
        from atlantis.store import steps as store

        key = self.begin(name)
        conn = self._open(key)
        value = self.recorded(key, "spawn")
        if value is not _MISSING:
            return children.spawned(key, value)
        params = children.spawn_params(key, job, args, options)
        try:
            child, fresh = store.spawn(conn, self.fence, key, params)
        except psycopg.Error as exc:
            raise self.refused(exc, key) from exc
        self.wrote(key, "spawn", orjson.dumps({"job": child, "child": fresh}).decode())
        return child

    def spawn_many(self, name: object, job: object, args_list: object,
                   options: dict[str, Any]) -> list[int]:
        import psycopg

        from atlantis import children
        from atlantis.store import steps as store

        key = self.begin(name)
        conn = self._open(key)
        value = self.recorded(key, "spawn")
        if value is not _MISSING:
            return children.spawned_many(key, value)
        params = children.spawn_many_params(key, job, args_list, options)
        try:
            rows = store.spawn_many(conn, self.fence, key, params)
        except psycopg.Error as exc:
            raise self.refused(exc, key) from exc
        ids = [i for i, _ in rows]
        self.wrote(key, "spawn", orjson.dumps({"jobs": ids}).decode())
        return ids

    def join(self, name: object, ids: object, results: bool) -> list[Any]:
        import psycopg

        from atlantis import children
        from atlantis.store import steps as store

        key = self.begin(name)
        conn = self._open(key)
        self.recorded(key, "join")  # refuses a name recorded as another kind
        wanted = children.job_ids(key, ids)
        try:
            rows = store.join(conn, self.fence, key, wanted, bool(results))
        except psycopg.Error as exc:
            raise self.refused(exc, key) from exc
        return self.joined(key, rows, bool(results))

    def close(self) -> None:
        """The attempt ended: its connection is kept for this process's next attempt."""
        if self._conn is not None and self.url:
            from atlantis.store import steps as store

            store.keep(self.url, self._conn)
        self._conn = None
