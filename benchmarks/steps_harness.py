"""What the parts of ``python -m benchmarks.steps`` share: the app's tables, a supervisor
started and stopped by its pid, a polling connection that counts its statements."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg

from atlantis.app import load_app
from atlantis.store import migrate, sync
from atlantis.store.database import resolve_url
from benchmarks.runs import stop

ROOT = Path(__file__).resolve().parent.parent
APP = "benchmarks.steps_app:registry"
SUPERVISE = Path(sys.executable).parent / "atlantis-supervise"
LOGS = Path(tempfile.mkdtemp(prefix="atl-steps-"))


def say(text: str) -> None:
    print(f"steps: {text}", file=sys.stderr, flush=True)


def verdict(ok: bool) -> str:
    return "met" if ok else "**missed**"


def prepare(url: str) -> None:
    """Migrate, sync the app, and make the tables the handlers write."""
    from benchmarks.steps_app import EVENTS_DDL
    from examples.contacts.app import ensure_schema

    with psycopg.connect(url) as conn:
        migrate(conn)
        app = load_app(APP)
        sync(conn, list(app.decls.values()), workflows=list(app.workflows.values()))
        conn.execute(EVENTS_DDL)
        conn.commit()
        ensure_schema(conn)


def start(url: str, concurrency: int, env: dict[str, str] | None = None,
          name: str = "supervisor") -> subprocess.Popen[bytes]:
    log = LOGS / f"{name}-{time.monotonic_ns()}.log"
    with open(log, "wb") as out:
        return subprocess.Popen(
            [str(SUPERVISE), "--queue", "bench", "--app", APP, "--database-url", url,
             "--concurrency", str(concurrency), "--isolation", "reuse"],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


@contextlib.contextmanager
def supervising(url: str, concurrency: int, env: dict[str, str] | None = None
                ) -> Iterator[subprocess.Popen[bytes]]:
    proc = start(url, concurrency, env)
    try:
        yield proc
    finally:
        stop(proc)


class Poller:
    """One autocommit connection that polls a condition, counting its transactions."""

    def __init__(self, url: str) -> None:
        self.conn = psycopg.connect(url, autocommit=True)
        self.statements = 0

    def one(self, sql: str, params: Any = None) -> Any:
        self.statements += 1
        row = self.conn.execute(sql, params).fetchone()
        return row[0] if row else None

    def until(self, sql: str, params: Any, done: Callable[[Any], bool],
              proc: subprocess.Popen[bytes], timeout: float, poll: float = 0.05) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            got = self.one(sql, params)
            if done(got):
                return got
            if proc.poll() is not None:
                raise RuntimeError(f"the supervisor exited with {proc.returncode} (logs: {LOGS})")
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {sql!r} "
                                   f"(last {got!r}; logs: {LOGS})")
            time.sleep(poll)

    def close(self) -> None:
        self.conn.close()


def checkpoint() -> None:
    """Start a drain with no dirty buffers (as ``benchmarks.runs`` does)."""
    with psycopg.connect(resolve_url(None), autocommit=True) as conn:
        conn.execute("CHECKPOINT")


def header() -> str:
    import datetime as dt
    import platform

    with psycopg.connect(resolve_url(None), autocommit=True) as conn:
        row = conn.execute("SHOW server_version").fetchone()
    return (f"PostgreSQL {row[0] if row else '?'} (embedded, unix socket); "
            f"{dt.date.today().isoformat()}, {platform.python_implementation()} "
            f"{platform.python_version()}, {os.cpu_count()} CPUs, "
            f"load average {os.getloadavg()[0]:.1f} at the end")
