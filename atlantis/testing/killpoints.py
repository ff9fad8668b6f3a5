"""The app ``assert_idempotent`` runs: the user's app (``ATLANTIS_TESTING_APP``) with each
handler wrapped so that its run passes kill points, and the child kills itself (SIGKILL) at
the one ``ATLANTIS_TESTING_KILL_AT`` names, once per job.

The kill points of a run, in order: just before and just after each checkpoint, each step
record (``ctx.run_step``'s record; a transaction step's, spawn's), and just after each
commit of a connection the handler opened with ``ctx.connect()``. Each run writes the ones it
passes, one a line, to ``{ATLANTIS_TESTING_POINTS}.{job id}``; the kill leaves
``{ATLANTIS_TESTING_POINTS}.killed``. Async handlers pass the checkpoints' and steps' points.
"""

from __future__ import annotations

import functools
import inspect
import os
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg

from atlantis import environ
from atlantis.app import load_app
from atlantis.context import JobContext
from atlantis.registry import Registration, Registry


class Points:
    """One run's kill points: counted, written, and the chosen one fired."""

    def __init__(self, job_id: int) -> None:
        self.base = os.environ.get(environ.TESTING_POINTS, "")
        self.kill_at = int(os.environ.get(environ.TESTING_KILL_AT, "0") or 0)
        self.path = f"{self.base}.{job_id}"
        self.count = 0
        self.commits = 0
        self.checkpoints = 0
        self.last = ""

    def at(self, label: str) -> None:
        self.count += 1
        if "checkpoint" in label:
            where = label
        else:
            where = f"{label} ({self.last or 'before the first checkpoint'})"
        if self.base:
            with open(self.path, "a", encoding="utf-8") as out:
                out.write(where.replace("\n", " ") + "\n")
        killed = f"{self.base}.killed"
        if self.count == self.kill_at and self.base and not os.path.exists(killed):
            with open(killed, "w", encoding="utf-8") as out:
                out.write(where + "\n")
            os.kill(os.getpid(), signal.SIGKILL)


_IDLE = psycopg.pq.TransactionStatus.IDLE
_READS = ("SELECT", "SHOW")


class _Counted(psycopg.Connection[Any]):
    """A connection whose commits are kill points: ``commit()`` of an open transaction, the
    end of an outermost ``transaction()`` block, a write ``execute`` in autocommit."""

    points: Points

    def commit(self) -> None:
        open_ = self.info.transaction_status != _IDLE
        super().commit()
        if open_:
            self._committed()

    def _committed(self) -> None:
        self.points.commits += 1
        self.points.at(f"after commit {self.points.commits}")

    @contextmanager
    def transaction(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
        outer = self.info.transaction_status == _IDLE
        with super().transaction(*args, **kwargs) as tx:
            yield tx
        if outer:
            self._committed()

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        cur = super().execute(*args, **kwargs)
        if (self.autocommit and self.info.transaction_status == _IDLE
                and not (cur.statusmessage or "SELECT").startswith(_READS)):
            self._committed()
        return cur


def _connect(ctx: JobContext, points: Points) -> Callable[..., Any]:
    def connect(**kwargs: Any) -> Any:
        conn = _Counted.connect(ctx.database_url or "", **kwargs)
        conn.points = points
        return conn

    return connect


def _checkpoint(ctx: JobContext, points: Points) -> Callable[..., Any]:
    send = ctx.checkpoint

    def checkpoint(pct: float, msg: str = "") -> Exception | None:
        points.checkpoints += 1
        n = points.checkpoints
        label = f"checkpoint {n} ({str(msg)[:80]!r})" if msg else f"checkpoint {n}"
        points.at(f"before {label}")
        got = send(pct, msg)
        points.last = f"after checkpoint {str(msg)[:80]!r}" if msg else f"after checkpoint {n}"
        points.at(f"after {label}")
        return got

    return checkpoint


def _steps(book: Any, points: Points) -> None:
    """Wrap the book's writes: a run step's record, a transaction step, a spawn."""
    write = book._write

    def record(conn: Any, name: str, kind: str, text: str) -> None:
        points.at(f"before the record of step {name!r}")
        write(conn, name, kind, text)
        points.at(f"after the record of step {name!r}")

    async def arecord(conn: Any, name: str, kind: str, text: str) -> None:
        points.at(f"before the record of step {name!r}")
        await write(conn, name, kind, text)
        points.at(f"after the record of step {name!r}")

    book._write = arecord if inspect.iscoroutinefunction(write) else record
    for method in ("transaction", "spawn", "spawn_many"):
        original = getattr(book, method, None)
        if original is None:
            continue
        setattr(book, method, _fresh_only(book, original, method, points))


def _fresh_only(book: Any, original: Callable[..., Any], method: str,
                points: Points) -> Callable[..., Any]:
    what = "transaction step" if method == "transaction" else "spawn"

    def fresh(name: object) -> bool:
        return book.found is not None and name not in book.found

    if inspect.iscoroutinefunction(original):
        async def awrapped(name: Any, *rest: Any) -> Any:
            if book.found is None and book.url:  # the records are read at the first step
                await book._open(str(name))
            new = fresh(name)
            if new:
                points.at(f"before the {what} {name!r}")
            got = await original(name, *rest)
            if new:
                points.at(f"after the {what} {name!r}")
            return got
        return awrapped

    def wrapped(name: Any, *rest: Any) -> Any:
        if book.found is None and book.url:  # the records are read at the first step
            book._open(str(name))
        new = fresh(name)
        if new:
            points.at(f"before the {what} {name!r}")
        got = original(name, *rest)
        if new:
            points.at(f"after the {what} {name!r}")
        return got

    return wrapped


def _instrument(ctx: JobContext) -> None:
    points = Points(ctx.job_id)
    setattr(ctx, "checkpoint", _checkpoint(ctx, points))  # noqa: B010
    setattr(ctx, "connect", _connect(ctx, points))  # noqa: B010
    if ctx.steps is not None:
        _steps(ctx.steps, points)


def _wrap(handler: Callable[..., Any]) -> Callable[..., Any]:
    if inspect.iscoroutinefunction(handler):
        @functools.wraps(handler)
        async def arun(ctx: JobContext, args: Any) -> Any:
            _instrument(ctx)
            return await handler(ctx, args)
        return arun

    @functools.wraps(handler)
    def run(ctx: JobContext, args: Any) -> Any:
        _instrument(ctx)
        return handler(ctx, args)

    return run


def wrapped_registry(real: Registry) -> Registry:
    """``real`` with every handler wrapped."""
    registry = Registry(real.decls.values(), real.workflows.values())
    for job, reg in real.registrations.items():
        registry.registrations[job] = Registration(reg.decl, _wrap(reg.handler), reg.args_type)
    return registry


registry = wrapped_registry(load_app(os.environ.get(environ.TESTING_APP)))
