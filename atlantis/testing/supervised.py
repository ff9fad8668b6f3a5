"""``drain``: enqueued jobs through a real ``atlantis-supervise`` and real children until
their queues are idle; ``wake``: suspended jobs run now."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import psycopg

from atlantis.registry import Registry


@dataclass(frozen=True)
class JobEnd:
    """One job as :func:`drain` leaves it: its state (``complete``, ``dead``,
    ``cancelled``; ``available`` when it waits: a retry's backoff, a sleep), the attempts
    it spent, its result (JSON, decoded) and its last error."""

    id: int
    job: str
    state: str
    attempts: int
    result: Any
    error: str | None


def wake(conn: psycopg.Connection[Any], job_id: int | None = None, *,
         retries: bool = False) -> list[int]:
    """Make suspended jobs (a durable sleep, a wait for an event, a join) due now, those of
    ``job_id`` alone when given, without waiting real time: their ``run_at`` becomes now and
    a recorded sleep's wake time too, so that the resumed run finds its sleep over. A wait
    for an event or a join whose event or jobs have not come suspends again. ``retries``:
    rows waiting out a retry's backoff or a snooze run now too. Returns the ids woken.
    ``conn`` commits on its own (autocommit) or is committed by the caller."""
    from atlantis.store.queries import Q

    rows = conn.execute(Q.testing_wake, {"id": job_id, "retries": retries}).fetchall()
    return sorted(r[0] for r in rows)


def ends(conn: psycopg.Connection[Any], queues: Sequence[str] = (),
         ids: Sequence[int] = ()) -> list[JobEnd]:
    from atlantis.store.queries import Q

    rows = conn.execute(Q.testing_ends, {"queues": list(queues), "ids": list(ids)}).fetchall()
    return [JobEnd(id=r[0], job=r[1], state=r[2], attempts=r[3],
                   result=None if r[4] is None else orjson.loads(orjson.dumps(r[4])),
                   error=r[5]) for r in rows]


def app_spec(app: Registry | str) -> str:
    """``package.module:attribute`` of ``app``: itself, or where a loaded module holds it."""
    if isinstance(app, str):
        return app
    for name, module in list(sys.modules.items()):
        for attr, value in list(getattr(module, "__dict__", {}).items()):
            if value is app and name != "__main__":
                return f"{name}:{attr}"
    raise ValueError("the registry is held by no imported module's attribute: pass its "
                     "name, \"package.module:registry\"")


def supervise_argv() -> list[str]:
    """The ``atlantis-supervise`` of this interpreter."""
    program = Path(sys.executable).parent / "atlantis-supervise"
    if program.exists():
        return [str(program)]
    return [sys.executable, "-c", "from atlantis.supervisor.cli import main; main()"]


class Supervisor:
    """A real ``atlantis-supervise`` process on ``url`` serving ``queues``; stopped by pid.
    ``isolation`` is its ``--isolation``: ``fresh`` forks each attempt from a zygote that
    imported the app once, so that an attempt killed costs a fork, not an interpreter."""

    def __init__(self, url: str, app: str, queues: Iterable[str], *, concurrency: int = 2,
                 env: dict[str, str] | None = None, isolation: str = "reuse") -> None:
        from atlantis.testing.database import python_path

        self.log = tempfile.NamedTemporaryFile(prefix="atlantis-supervise-", suffix=".log")  # noqa: SIM115
        argv = [*supervise_argv(), "--database-url", url, "--app", app,
                *(f"--queue={q}" for q in sorted(set(queues))),
                "--concurrency", str(concurrency), "--isolation", isolation,
                "--poll-interval", "0.1s",
                "--rescue-interval", "0.5s", "--drain-timeout", "5s", "--kill-grace", "1s"]
        self.proc = subprocess.Popen(
            argv, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**os.environ, "PYTHONPATH": python_path(), **(env or {})})

    def alive(self) -> bool:
        return self.proc.poll() is None

    def output(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text("utf-8", errors="replace")[-4000:]

    def stop(self) -> None:
        """SIGTERM (a drain of at most a few seconds), SIGKILL if it is still there."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


def wait_until(done: Callable[[], bool], sup: Supervisor, timeout: float, what: str) -> None:
    """Poll ``done`` until it holds; TimeoutError (with the supervisor's log) after
    ``timeout`` seconds, RuntimeError if the supervisor exits first."""
    deadline = time.monotonic() + timeout
    while not done():
        if not sup.alive():
            raise RuntimeError(f"atlantis-supervise exited ({sup.proc.returncode}) before "
                               f"{what}:\n{sup.output()}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not after {timeout:g}s; the supervisor's log:\n"
                               f"{sup.output()}")
        time.sleep(0.05)


def drain(db: str, app: Registry | str, queues: Iterable[str] | None = None, *,
          timeout: float = 60.0, concurrency: int = 2) -> list[JobEnd]:
    """Run the jobs enqueued on ``queues`` (default: every queue of the app) in ``db``
    through a real ``atlantis-supervise`` and real children, until no row of them is running
    or due; stop the supervisor, and return every job of those queues by id
    (:class:`JobEnd`). A job waiting out a retry's backoff, a sleep or a wait is left
    ``available`` (:func:`wake` makes it due; drain again). ``app`` is the Registry, or
    ``package.module:registry``; its modules must be importable by a new process (this
    process's ``sys.path`` is passed on). TimeoutError after ``timeout`` seconds."""
    from atlantis.store.queries import Q
    from atlantis.testing.inline import registry_of

    spec = app_spec(app)
    wanted = sorted(set(queues) if queues is not None else registry_of(app).queues())
    url = str(db)
    sup = Supervisor(url, spec, wanted, concurrency=concurrency)
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            def idle() -> bool:
                row = conn.execute(Q.testing_busy, {"queues": wanted}).fetchone()
                return row is not None and row[0] == 0

            wait_until(idle, sup, timeout, f"the queues {', '.join(wanted)} idle")
            return ends(conn, wanted)
    finally:
        sup.stop()
