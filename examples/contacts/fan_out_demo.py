"""``./scripts/demo --fan-out``: the import fanned out, one child job per page.

What it does, in order:

1. picks the database as the other demos do (``ATLANTIS_DATABASE_URL``, else the database
   ``atlantis_demo`` of the embedded PostgreSQL: ``examples/demo_db.py``), runs
   ``tide db migrate --app examples.contacts.fan_out:registry``, creates the example's tables
   and empties them, with the witness of writes ``./scripts/demo --durable`` uses (a trigger
   counting every committed write of each contact, dropped at the end);
2. starts the fake CRM in this process, slowed down so that each page takes a moment;
3. starts ``atlantis-supervise --concurrency 4`` and enqueues one
   ``directory.ImportContactsFanOut`` (:mod:`examples.contacts.fan_out`): the parent counts
   the pages, spawns one ``directory.ImportContactsPage`` per page and joins them;
4. shows the parent and its children as they change: the spawns, the parent waiting in its
   join (no process, no slot held), the pages running side by side, the parent woken;
5. prints the proof: one child per page, each page fetched once, every contact written
   exactly once, the parent's result; then ``tide job status`` of the parent.

It exits 0 when the proof holds, 1 saying what failed otherwise. The supervisor it started
and the CRM are stopped before it exits.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from typing import IO, Any

import psycopg

import atlantis
from atlantis.store.database import announce
from examples.contacts.app import PAGE_LIMIT, ensure_schema
from examples.contacts.crm import FakeCRM
from examples.contacts.demo import DemoError, _show_log_tail, run_tide, say, step, supervisor
from examples.contacts.durable_demo import WITNESS, QuietCRM, _unwitness
from examples.contacts.fan_out import JOB, PAGE_JOB, registry
from examples.demo_db import demo_database, where

APP = "examples.contacts.fan_out:registry"

_STATES = ("available", "running", "complete", "dead", "cancelled")


def prepare(url: str) -> None:
    """Declarations, the example's tables and the witness, emptied; leftover imports
    cancelled (their pages with them)."""
    say(f"$ tide db migrate --app {APP}")
    run_tide(url, "db", "migrate", "--app", APP)
    with psycopg.connect(url, autocommit=True) as conn:
        ensure_schema(conn)
        with conn.transaction():
            conn.execute(WITNESS)
            conn.execute("TRUNCATE contacts, contact_writes")
        leftovers = [r[0] for r in conn.execute(
            "SELECT id FROM atlantis.jobs WHERE job = ANY(%s) AND state IN ('available',"
            " 'running') ORDER BY id", ([JOB, PAGE_JOB],))]
    for job_id in leftovers:
        say(f"$ tide job cancel {job_id}   (left by an earlier run)")
        run_tide(url, "job", "cancel", str(job_id))


def snapshot(conn: psycopg.Connection[Any], parent: int) -> tuple[str, str, dict[str, int]]:
    """The parent's state, what it waits for, and its children by state."""
    row = conn.execute("SELECT state, coalesce(suspended_for, ''), coalesce(last_error, '')"
                       " FROM atlantis.jobs WHERE id = %s", (parent,)).fetchone()
    if row is None:
        raise DemoError(f"job {parent} is gone")
    if row[0] in ("dead", "cancelled"):
        raise DemoError(f"job {parent} is {row[0]}: {row[2]}")
    kids = dict(conn.execute("SELECT state, count(*) FROM atlantis.jobs WHERE parent_id = %s"
                             " GROUP BY state", (parent,)).fetchall())
    return str(row[0]), str(row[1]) if row[0] == "available" else "", kids


def line(state: str, waits: str, kids: dict[str, int]) -> str:
    """One line of the watch: ``parent running | children 3 waiting, 4 running``."""
    names = {"available": "waiting"}
    counts = ", ".join(f"{kids[s]} {names.get(s, s)}" for s in _STATES if kids.get(s))
    what = f"{state} ({waits})" if waits else state
    return f"  parent {what:<24} | children {counts or 'none yet'}"


def watch(url: str, parent: int, sup: Any, deadline: float) -> None:
    """Print what changes until the parent is complete."""
    seen: tuple[str, str, dict[str, int]] | None = None
    with psycopg.connect(url, autocommit=True) as conn:
        while True:
            now = snapshot(conn, parent)
            if now != seen:
                seen = now
                say(line(*now))
            if now[0] == "complete":
                return
            if sup.poll() is not None:
                raise DemoError(f"atlantis-supervise exited early with status {sup.returncode}")
            if time.monotonic() > deadline:
                raise DemoError("the import did not complete within the deadline")
            time.sleep(0.05)


def prove(url: str, crm: FakeCRM, parent: int, account: str) -> str:
    """Check the outcome against the CRM; the summary line, or DemoError saying what failed."""
    pages, contacts = crm.expected_pages(account, PAGE_LIMIT), crm.expected_contacts(account)
    with psycopg.connect(url, autocommit=True) as conn:
        result = conn.execute("SELECT result FROM atlantis.jobs WHERE id = %s",
                              (parent,)).fetchone()
        kids = conn.execute("SELECT (args->>'page')::int, state FROM atlantis.jobs"
                            " WHERE parent_id = %s", (parent,)).fetchall()
        stored, written, most = conn.execute(
            "SELECT count(*), coalesce(sum(w.writes), 0), coalesce(max(w.writes), 0)"
            " FROM contacts c LEFT JOIN contact_writes w USING (account_id, contact_id)"
            " WHERE c.account_id = %s", (account,)).fetchone() or (0, 0, 0)
    problems = []
    if sorted(page for page, _ in kids) != list(range(pages)):
        problems.append(f"{len(kids)} children, not one for each of the {pages} pages")
    if {state for _, state in kids} != {"complete"}:
        problems.append("not every page is complete")
    fetched = [crm.request_count(account, f"page={n}") for n in range(pages)]
    if fetched != [1] * pages:
        problems.append(f"pages fetched other than once: {fetched}")
    if (stored, written, most) != (contacts, contacts, 1):
        problems.append(f"{stored} contacts stored, {written} writes (at most {most} of one);"
                        f" the CRM holds {contacts}")
    if result is None or result[0] != {"pages": pages, "contacts": contacts}:
        problems.append(f"the parent returned {result[0] if result else None}")
    states = ", ".join(sorted({state for _, state in kids}))
    say(f"  {len(kids)} child jobs for {pages} pages ({states}); each page fetched "
        f"{'once' if fetched == [1] * pages else fetched}")
    say(f"  {stored} contacts stored, {written} committed writes, at most {most} of one")
    say(f"  the parent's result: {result[0] if result else None}")
    if problems:
        raise DemoError("; ".join(problems))
    return (f"job {parent} imported {contacts} contacts of {account!r} in {pages} child jobs,"
            " side by side: every contact written exactly once")


def run(url: str, crm: FakeCRM, account: str, concurrency: int, deadline: float,
        log: IO[bytes]) -> str:
    """Steps 3 to 5; the supervisor is stopped on the way out."""
    step("3. a worker, and the import")
    with supervisor(url, crm.url, concurrency, log, app=APP) as sup:
        with psycopg.connect(url) as conn:
            parent = atlantis.enqueue(conn, JOB, {"account_id": account})
            conn.commit()
        say(f"enqueued {JOB} job {parent} for {account!r}")
        step("4. the parent and its children")
        watch(url, parent, sup, deadline)
    step("5. the proof")
    summary = prove(url, crm, parent, account)
    step(f"6. tide job status {parent}")
    say(run_tide(url, "job", "status", str(parent)).rstrip())
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/demo --fan-out", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--account", default="initech", help="the account to import")
    parser.add_argument("--page-delay", type=float, default=1.0,
                        help="seconds the CRM takes per page")
    parser.add_argument("--concurrency", type=int, default=4,
                        help="attempts the supervisor runs at once")
    parser.add_argument("--deadline", type=float, default=120.0,
                        help="give up after this many seconds")
    opts = parser.parse_args(argv)
    started = time.monotonic()
    try:
        url, explicit = demo_database()
    except Exception as exc:
        print(f"demo: cannot start the embedded PostgreSQL: {exc}", file=sys.stderr)
        return 1
    print(where(explicit), flush=True)
    announce(url, embedded=not explicit)
    assert JOB in registry.registrations and PAGE_JOB in registry.registrations

    crm = QuietCRM(host="127.0.0.1", port=0, page_delay=opts.page_delay)
    log = tempfile.NamedTemporaryFile(prefix="atlantis-demo-", suffix=".log", delete=False)  # noqa: SIM115
    try:
        step("1. schema, declarations and the witness of writes")
        prepare(url)
        step("2. the upstream CRM (fake, in this process)")
        crm.start()
        say(f"serving {crm.expected_contacts(opts.account)} contacts of {opts.account!r} at "
            f"{crm.url}: {crm.expected_pages(opts.account, PAGE_LIMIT)} pages of "
            f"{crm.page_size}, {crm.page_delay:.2f}s per page")
        say(f"(the supervisor's log: {log.name})")
        summary = run(url, crm, opts.account, opts.concurrency, started + opts.deadline, log)
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
        _unwitness(url)
    say(f"\ndemo: {summary} ({time.monotonic() - started:.1f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
