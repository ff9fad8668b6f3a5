"""``./scripts/demo --durable``: the import with transaction steps survives kill -9 of its worker.

What it does, in order:

1. picks the database as the other demos do (``ATLANTIS_DATABASE_URL``, else the database
   ``atlantis_demo`` of the embedded PostgreSQL: ``examples/demo_db.py``), runs
   ``tide db migrate --app examples.contacts.durable:registry``, creates the example's tables
   and empties them; it also puts a trigger on ``contacts`` that counts every committed write
   of each contact row in ``contact_writes`` (the demo's witness, dropped at the end: the
   handler knows nothing of it);
2. starts the fake CRM in this process, slowed down so that each page takes a moment;
3. starts ``atlantis-supervise`` and enqueues one ``directory.ImportContactsDurable``
   (:mod:`examples.contacts.durable`: one ``ctx.transaction`` per page, no state table);
4. once a few pages are recorded, kills that supervisor with SIGKILL (by its pid) in the
   middle of a page; its lease keeper kills the attempt, whose open transaction is rolled back;
5. starts another supervisor, which finds the job once its lease ran out (5 seconds), and
   waits for the import to complete: the new run gets the recorded pages back without
   fetching or writing them and carries on at the first page that was not committed;
6. prints the proof, page by page: every contact written exactly once (``contact_writes``),
   every page fetched once but the one in flight at the kill, which run recorded each page;
   then ``tide job status`` of the job, with its handler steps.

It exits 0 when the proof holds, 1 saying what failed otherwise. The supervisors it started
and the CRM are stopped before it exits.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import IO, Any

import psycopg

import atlantis
from atlantis.store.database import announce
from examples.contacts.app import CRM_URL_ENV, PAGE_LIMIT, ensure_schema
from examples.contacts.crm import FakeCRM
from examples.contacts.demo import BIN, ROOT, DemoError, _show_log_tail, run_tide, say, step
from examples.contacts.durable import JOB, registry
from examples.contacts.proof import Proof, prove
from examples.demo_db import demo_database, where

APP = "examples.contacts.durable:registry"
QUEUE = "contacts"

#: The demo's witness: a count of the committed writes of each contact row. A row trigger
#: writes in the transaction that writes the contact, so a write rolled back is not counted.
WITNESS = """
CREATE TABLE IF NOT EXISTS contact_writes (
  account_id varchar(64) NOT NULL,
  contact_id text NOT NULL,
  writes     int NOT NULL,
  PRIMARY KEY (account_id, contact_id)
);
CREATE OR REPLACE FUNCTION contact_writes_count() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO contact_writes VALUES (NEW.account_id, NEW.contact_id, 1)
  ON CONFLICT (account_id, contact_id) DO UPDATE SET writes = contact_writes.writes + 1;
  RETURN NULL;
END $$;
CREATE OR REPLACE TRIGGER contact_writes_count AFTER INSERT OR UPDATE ON contacts
  FOR EACH ROW EXECUTE FUNCTION contact_writes_count();
"""
UNWITNESS = "DROP TRIGGER IF EXISTS contact_writes_count ON contacts"


class QuietCRM(FakeCRM):
    """The fake CRM, but a client that hangs up before its answer is sent (the attempt the
    demo kills, in the middle of a page) is expected here, not worth a traceback."""

    def start(self) -> QuietCRM:
        super().start()
        assert self._server is not None
        self._server.handle_error = _hung_up  # type: ignore[method-assign]
        return self


def _hung_up(request: object, client_address: object) -> None:
    kind = sys.exc_info()[0]
    if kind is None or not issubclass(kind, ConnectionError):
        traceback.print_exc()


def prepare(url: str) -> None:
    """Declarations, the example's tables and the witness, emptied; leftover imports
    cancelled (an interrupted earlier demo's would otherwise run beside this one)."""
    say(f"$ tide db migrate --app {APP}")
    run_tide(url, "db", "migrate", "--app", APP)
    with psycopg.connect(url, autocommit=True) as conn:
        ensure_schema(conn)
        with conn.transaction():
            conn.execute(WITNESS)
            conn.execute("TRUNCATE contacts, contact_writes")
        leftovers = [r[0] for r in conn.execute(
            "SELECT id FROM atlantis.jobs WHERE job = %s AND state IN ('available', 'running')"
            " ORDER BY id", (JOB,))]
    for job_id in leftovers:
        say(f"$ tide job cancel {job_id}   (left by an earlier run)")
        run_tide(url, "job", "cancel", str(job_id))


def start_supervisor(url: str, crm_url: str, log: IO[bytes]) -> subprocess.Popen[bytes]:
    """``atlantis-supervise`` for the durable import. ``--rescue-interval 1s``: it looks for
    leases that ran out every second rather than every 5 (a hidden timing option)."""
    cmd = [str(BIN / "atlantis-supervise"), "--queue", QUEUE, "--app", APP, "--concurrency",
           "1", "--drain-timeout", "5s", "--rescue-interval", "1s", "--database-url", url]
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, CRM_URL_ENV: crm_url},
                            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    say(f"$ atlantis-supervise --queue {QUEUE} --app {APP} --concurrency 1  (pid {proc.pid})")
    return proc


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM (a drain), SIGKILL if it does not exit in time; nothing if it is gone."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class Watch:
    """Prints what changes on the job's row and each new step record, as it happens."""

    def __init__(self, conn: psycopg.Connection[Any], job_id: int) -> None:
        self.conn, self.job_id = conn, job_id
        self.state: tuple[str, int] | None = None
        self.recorded: list[str] = []

    def poll(self) -> str:
        row = self.conn.execute("SELECT state, attempt, coalesce(last_error, '')"
                                " FROM atlantis.jobs WHERE id = %s", (self.job_id,)).fetchone()
        if row is None:
            raise DemoError(f"job {self.job_id} is gone")
        state, attempt, error = row
        for name, kind, at, size in self.conn.execute(
                "SELECT name, kind, attempt, bytes FROM atlantis.job_steps WHERE job_id = %s"
                " AND NOT name = ANY(%s::text[]) ORDER BY recorded_at, name",
                (self.job_id, self.recorded)).fetchall():
            self.recorded.append(name)
            say(f"    recorded {kind} step {name} (attempt {at}, {size} bytes)")
        if (state, attempt) != self.state:
            self.state = (state, attempt)
            why = f": {error}" if error and state != "complete" else ""
            say(f"  job {self.job_id} is {state} (attempt {attempt}){why}")
        if state in ("dead", "cancelled"):
            raise DemoError(f"job {self.job_id} is {state}: {error}")
        return str(state)

    def until(self, done: Callable[[str], bool], sup: subprocess.Popen[bytes],
              deadline: float, what: str) -> None:
        while not done(self.poll()):
            if sup.poll() is not None:
                raise DemoError(f"atlantis-supervise exited early with status {sup.returncode}")
            if time.monotonic() > deadline:
                raise DemoError(f"{what}: not within the deadline")
            time.sleep(0.05)


def run(url: str, crm: FakeCRM, account: str, kill_after: int, deadline: float,
        log: IO[bytes]) -> Proof:
    """Steps 3 to 6; the supervisors started are stopped on the way out."""
    started: list[subprocess.Popen[bytes]] = []
    try:
        step("3. a worker, and the import")
        first = start_supervisor(url, crm.url, log)
        started.append(first)
        with psycopg.connect(url) as conn:
            job_id = atlantis.enqueue(conn, JOB, {"account_id": account})
            conn.commit()
        say(f"enqueued {JOB} job {job_id} for {account!r}")
        with psycopg.connect(url, autocommit=True) as conn:
            watch = Watch(conn, job_id)
            watch.until(lambda _: len(watch.recorded) >= kill_after, first, deadline,
                        f"{kill_after} pages recorded")

            step(f"4. kill -9 {first.pid} (the supervisor), in the middle of a page")
            os.kill(first.pid, signal.SIGKILL)
            first.wait()
            say(f"atlantis-supervise {first.pid} is gone (status {first.returncode}); its "
                "lease keeper kills the attempt, and its open transaction is rolled back")
            watch.poll()
            say(f"  job {job_id} still says running until its lease runs out "
                f"(heartbeat {registry.decls[JOB].heartbeat:g}s)")

            step("5. another worker: the job runs again once its lease ran out")
            second = start_supervisor(url, crm.url, log)
            started.append(second)
            watch.until(lambda state: state == "complete", second, deadline, "the import")

        step("6. the proof")
        proof = prove(url, crm, job_id, account, page_size=min(PAGE_LIMIT, crm.page_size))
        say(proof.table())

        step(f"7. tide job status {job_id}")
        say(run_tide(url, "job", "status", str(job_id)).rstrip())
        return proof
    finally:
        for proc in reversed(started):
            stop(proc)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/demo --durable", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--account", default="initech", help="the account to import")
    parser.add_argument("--page-delay", type=float, default=0.25,
                        help="seconds the CRM takes per page")
    parser.add_argument("--kill-after", type=int, default=4,
                        help="kill the first supervisor once this many pages are recorded")
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
    assert JOB in registry.registrations

    crm = QuietCRM(host="127.0.0.1", port=0, page_delay=opts.page_delay)
    pages = crm.expected_pages(opts.account, PAGE_LIMIT)
    if not 1 <= opts.kill_after < pages:
        parser.error(f"--kill-after must be between 1 and {pages - 1}: {opts.account!r} has "
                     f"{pages} pages")
    log = tempfile.NamedTemporaryFile(prefix="atlantis-demo-", suffix=".log", delete=False)  # noqa: SIM115
    try:
        step("1. schema, declarations and the witness of writes")
        prepare(url)
        step("2. the upstream CRM (fake, in this process)")
        crm.start()
        say(f"serving {crm.expected_contacts(opts.account)} contacts of {opts.account!r} at "
            f"{crm.url}: {pages} pages of {crm.page_size}, {crm.page_delay:.2f}s per page")
        say(f"(the supervisors' log: {log.name})")
        proof = run(url, crm, opts.account, opts.kill_after, started + opts.deadline, log)
        proof.check()
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
    say(f"\ndemo: {proof.summary()} ({time.monotonic() - started:.1f}s)")
    return 0


def _unwitness(url: str) -> None:
    """Take the trigger off ``contacts`` (the table of counts stays, for a look)."""
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(UNWITNESS)
    except psycopg.Error:
        pass


if __name__ == "__main__":
    sys.exit(main())
