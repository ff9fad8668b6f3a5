"""``./scripts/demo``: the contact-import example, end to end, on a real worker.

What it does, in order:

1. picks the database (``ATLANTIS_DATABASE_URL``, else the database ``atlantis_demo``
   of the embedded PostgreSQL, never its default one: ``examples/demo_db.py``) and runs
   ``tide db migrate --app examples.contacts.app:registry``, then creates the example's
   tables and empties them, so the demo can run again and again on the same database;
2. starts the fake CRM in this process, slowed down so the imports take about 12 seconds
   (plus the worker's start-up);
3. starts ``atlantis-supervise`` on the ``contacts`` queue with ``CONTACTS_CRM_URL`` set;
4. enqueues one import per account in a single transaction (``atlantis.enqueue_many``);
5. shows every job's progress live, as recorded in ``atlantis.jobs`` by the handler's
   checkpoints;
6. checks the outcome against the CRM (every contact exactly once, every import
   ``complete``) and prints ``tide job status`` of one job.

It exits 0 when everything checks out, 1 with the reason otherwise. Whatever happens, the
worker and the CRM it started are stopped before it exits.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import psycopg

import atlantis
from atlantis.store.database import announce
from examples.contacts.app import CRM_URL_ENV, PAGE_LIMIT, ensure_schema, registry
from examples.contacts.crm import FakeCRM
from examples.demo_db import demo_database, where

APP = "examples.contacts.app:registry"
JOB = "directory.ImportContacts"
QUEUE = "contacts"
ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
DEFAULT_ACCOUNTS = ("acme", "globex", "initech", "umbrella")


class DemoError(Exception):
    """Something the demo checks went wrong; the message says what."""


@dataclass
class JobView:
    """One row of the live table: what ``atlantis.jobs`` says about an import."""

    id: int
    account: str
    state: str
    attempt: int
    max_attempts: int
    pct: int
    msg: str
    last_error: str


def say(text: str = "") -> None:
    print(text, flush=True)


def step(text: str) -> None:
    say(f"\n== {text}")


# ---- the pieces the demo starts -----------------------------------------------------------

def run_tide(url: str, *args: str) -> str:
    """Run the ``tide`` of this virtualenv against ``url``; its stdout, or DemoError."""
    cmd = [str(BIN / "tide"), "--database-url", url, *args]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise DemoError(f"`tide {' '.join(args)}` failed ({proc.returncode}): "
                          f"{proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout


def page_delay_for(crm: FakeCRM, accounts: Sequence[str], concurrency: int, seconds: float) -> float:
    """The per-page delay that makes the whole import take about ``seconds``.

    Simulates the workers taking the jobs in enqueue order (each job to the first free
    worker) to find how many pages the busiest worker fetches one after another.
    """
    workers = [0] * max(1, concurrency)
    for account in accounts:
        idle = workers.index(min(workers))
        workers[idle] += crm.expected_pages(account, PAGE_LIMIT)
    return min(2.0, max(0.02, seconds / max(workers)))


@contextmanager
def supervisor(url: str, crm_url: str, concurrency: int, log: IO[bytes], *, app: str = APP,
               queues: Sequence[str] = (QUEUE,)) -> Iterator[subprocess.Popen[bytes]]:
    """``atlantis-supervise`` on the contacts queue (or ``queues``), stopped by pid on the way
    out.

    SIGTERM drains it (in-flight attempts may finish for the drain timeout, then are
    released without spending an attempt); SIGKILL only if it does not exit in time.
    """
    queue_args = [arg for queue in queues for arg in ("--queue", queue)]
    cmd = [str(BIN / "atlantis-supervise"), *queue_args, "--app", app,
           "--concurrency", str(concurrency), "--drain-timeout", "5s", "--database-url", url]
    env = {**os.environ, CRM_URL_ENV: crm_url}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=False)
    say(f"$ atlantis-supervise {' '.join(queue_args)} --app {app} --concurrency {concurrency}"
        f"  (pid {proc.pid})")
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.returncode not in (0, None):
            say(f"(atlantis-supervise exited with status {proc.returncode})")


# ---- steps ----------------------------------------------------------------------------------

def prepare(url: str) -> None:
    """Schema, declarations, the example's tables; and a clean slate for this run.

    The state rows are truncated as well as the contacts: an account whose import state
    says ``complete`` would otherwise make this run's jobs finish at once (by design: a
    re-run of a finished import is a no-op). Waiting imports left by an interrupted
    earlier demo are cancelled so they do not compete with this run's jobs.
    """
    say(f"$ tide db migrate --app {APP}")
    run_tide(url, "db", "migrate", "--app", APP)
    with psycopg.connect(url, autocommit=True) as conn:
        ensure_schema(conn)
        conn.execute("TRUNCATE contacts, contact_import_state")
        leftovers = [r[0] for r in conn.execute(
            "SELECT id FROM atlantis.jobs WHERE job = %s AND state = 'available' ORDER BY id",
            (JOB,))]
        others = conn.execute(
            "SELECT count(*) FROM atlantis.workers WHERE %s = ANY(queues) AND expires_at > now()",
            (QUEUE,)).fetchone()
    for job_id in leftovers:
        say(f"$ tide job cancel {job_id}   (left waiting by an earlier run)")
        run_tide(url, "job", "cancel", str(job_id))
    if others and others[0]:
        say(f"note: {others[0]} other supervisor(s) serve the {QUEUE!r} queue on this database; "
            "they may pick up some of the demo's jobs")


def enqueue_imports(url: str, accounts: Sequence[str]) -> list[int]:
    """One job per account, all in one transaction: either every import is queued or none."""
    with psycopg.connect(url) as conn:
        try:
            ids = atlantis.enqueue_many(conn, JOB, [{"account_id": a} for a in accounts])
        except atlantis.AtlantisError as exc:
            raise DemoError(f"enqueue refused: {exc}") from None
        conn.commit()
    return ids


def fetch_views(conn: psycopg.Connection[Any], ids: Sequence[int]) -> list[JobView]:
    rows = conn.execute(
        """SELECT id, args->>'account_id', state, attempt, max_attempts,
                  coalesce(progress_pct, 0), coalesce(progress_msg, ''), coalesce(last_error, '')
             FROM atlantis.jobs WHERE id = ANY(%s) ORDER BY id""",
        (list(ids),)).fetchall()
    return [JobView(*row) for row in rows]


def bar(pct: int, width: int = 20) -> str:
    fancy = (sys.stdout.encoding or "").lower().startswith("utf")
    full, empty = ("█", "░") if fancy else ("#", "-")
    filled = round(width * max(0, min(100, pct)) / 100)
    return full * filled + empty * (width - filled)


def render(views: Sequence[JobView], elapsed: float) -> str:
    lines = [f"{'job':>6}  {'account':<10} {'state':<9} {'progress':<20} {'pct':>4}  message"]
    for v in views:
        msg = v.msg if v.state != "available" or not v.last_error else f"retrying: {v.last_error}"
        lines.append(f"{v.id:>6}  {v.account:<10} {v.state:<9} {bar(v.pct)} {v.pct:>3}%  {msg}")
    lines.append(f"{'':>6}  elapsed {elapsed:4.1f}s")
    return "\n".join(lines)


def watch(url: str, ids: Sequence[int], sup: subprocess.Popen[bytes], deadline: float,
          started: float) -> list[JobView]:
    """Show the jobs live until all are complete; DemoError if that cannot happen."""
    tty = sys.stdout.isatty()
    with psycopg.connect(url, autocommit=True) as conn:
        if tty:
            from rich.console import Console
            from rich.live import Live
            from rich.text import Text

            with Live(Text(""), console=Console(), auto_refresh=False) as live:
                def show(views: Sequence[JobView], text: str) -> None:
                    # Cut long lines rather than wrap them: wrapped rows break the redraw.
                    live.update(Text(text, no_wrap=True, overflow="ellipsis"), refresh=True)
                return _watch_loop(conn, ids, sup, deadline, started, show)
        printed: dict[str, Any] = {"states": None, "progress": None, "at": -1e9}

        def show_changes(views: Sequence[JobView], text: str) -> None:
            # Without a terminal (a CI log, a pipe) the table is reprinted, not redrawn:
            # at once when a job changes state, else at most every few seconds.
            states = [v.state for v in views]
            progress = [(v.pct, v.msg) for v in views]
            now = time.monotonic()
            if states != printed["states"] or (
                progress != printed["progress"] and now - printed["at"] >= 3
            ):
                printed.update(states=states, progress=progress, at=now)
                say(text)
        return _watch_loop(conn, ids, sup, deadline, started, show_changes)


def _watch_loop(conn: psycopg.Connection[Any], ids: Sequence[int], sup: subprocess.Popen[bytes],
                deadline: float, started: float,
                show: Callable[[Sequence[JobView], str], None]) -> list[JobView]:
    while True:
        views = fetch_views(conn, ids)
        show(views, render(views, time.monotonic() - started))
        states = {v.state for v in views}
        failed = [v for v in views if v.state in ("dead", "cancelled")]
        if failed:
            raise DemoError("; ".join(f"job {v.id} ({v.account}) is {v.state}: {v.last_error}"
                                        for v in failed))
        if states == {"complete"}:
            return views
        if sup.poll() is not None:
            raise DemoError(f"atlantis-supervise exited early with status {sup.returncode}")
        if time.monotonic() > deadline:
            raise DemoError("the imports did not finish within the deadline; states: "
                              + ", ".join(f"{v.id}={v.state}" for v in views))
        time.sleep(0.5)


def verify(url: str, crm: FakeCRM, views: Sequence[JobView]) -> None:
    """Every account holds exactly the CRM's contacts, once each, and its import is complete."""
    problems = []
    with psycopg.connect(url, autocommit=True) as conn:
        for v in views:
            expected = crm.expected_contacts(v.account)
            rows, distinct = conn.execute(
                "SELECT count(*), count(DISTINCT contact_id) FROM contacts WHERE account_id = %s",
                (v.account,)).fetchone() or (0, 0)
            state = conn.execute(
                "SELECT status, pages_done, contacts_done FROM contact_import_state"
                " WHERE account_id = %s", (v.account,)).fetchone()
            status, pages, done = state if state else ("missing", 0, 0)
            ok = rows == distinct == done == expected and status == "complete"
            say(f"  {v.account:<10} expected {expected:>5}  imported {rows:>5}  "
                f"pages {pages:>3}  state {status:<8}  {'ok' if ok else 'MISMATCH'}")
            if not ok:
                problems.append(f"{v.account}: expected {expected} contacts, found {rows} rows "
                                f"({distinct} distinct), state {status} with {done} counted")
    if problems:
        raise DemoError("; ".join(problems))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--accounts", default=",".join(DEFAULT_ACCOUNTS),
                        help="comma-separated account ids to import")
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=12.0,
                        help="about how long the imports should take (sets the CRM's page delay)")
    parser.add_argument("--deadline", type=float, default=120.0,
                        help="give up after this many seconds")
    opts = parser.parse_args(argv)
    accounts = [a.strip() for a in opts.accounts.split(",") if a.strip()]
    if not accounts:
        parser.error("--accounts names no account")

    started = time.monotonic()
    deadline = started + opts.deadline
    try:
        url, explicit = demo_database()
    except Exception as exc:
        print(f"demo: cannot start the embedded PostgreSQL: {exc}", file=sys.stderr)
        return 1
    print(where(explicit), flush=True)
    announce(url, embedded=not explicit)
    assert JOB in registry.decls

    crm = FakeCRM(host="127.0.0.1", port=0)
    crm.page_delay = page_delay_for(crm, accounts, opts.concurrency, opts.seconds)
    log = tempfile.NamedTemporaryFile(prefix="atlantis-demo-", suffix=".log", delete=False)  # noqa: SIM115
    try:
        step("1. schema and declarations")
        prepare(url)

        step("2. the upstream CRM (fake, in this process)")
        crm.start()
        total = sum(crm.expected_contacts(a) for a in accounts)
        say(f"serving {total} contacts of {len(accounts)} accounts at {crm.url}, "
            f"{crm.page_size} per page, {crm.page_delay:.2f}s per page")

        step("3. the worker")
        with supervisor(url, crm.url, opts.concurrency, log) as sup:
            say(f"(its log: {log.name})")

            step("4. enqueue, in one transaction")
            ids = enqueue_imports(url, accounts)
            say(f"enqueued {JOB} jobs {', '.join(map(str, ids))} for {', '.join(accounts)}")

            step("5. live progress (from atlantis.jobs)")
            views = watch(url, ids, sup, deadline, started)

            step("6. verify against the CRM")
            verify(url, crm, views)

            step(f"7. tide job status {ids[0]}")
            say(run_tide(url, "job", "status", str(ids[0])).rstrip())
    except DemoError as exc:
        _show_log_tail(log.name)
        print(f"\ndemo: FAILED: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ndemo: interrupted", file=sys.stderr)
        return 130
    finally:
        crm.stop()
        log.close()
    say(f"\ndemo: all {len(accounts)} imports complete and verified "
        f"in {time.monotonic() - started:.1f}s")
    return 0


def _show_log_tail(path: str, lines: int = 30) -> None:
    try:
        tail = Path(path).read_text("utf-8", errors="replace").splitlines()[-lines:]
    except OSError:
        return
    if tail:
        print(f"\n-- last lines of the supervisor log ({path}):", file=sys.stderr)
        print("\n".join(tail), file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
