"""``./scripts/demo --workflow``: the onboarding workflow, twice, on a real worker.

What it does, in order:

1. picks the database (``ATLANTIS_DATABASE_URL``, else the database ``atlantis_demo``
   of the embedded PostgreSQL, never its default one: ``examples/demo_db.py``) and runs
   ``tide db migrate --app examples.onboarding.app:registry`` (the jobs and the workflow),
   then creates the examples' tables and empties them, so the demo can run again and again;
2. starts the fake CRM of the contacts example in this process, slowed down so that the
   import step takes a few seconds;
3. starts ``atlantis-supervise`` on the queues of the workflow's jobs;
4. run 1: starts ``onboarding.Onboard`` for one account and prints each step's state as it
   changes, until the workflow is complete; then ``tide workflow status`` of it;
5. run 2: turns the mail provider off (a row in ``mail_outage``), starts the workflow for
   another account, and prints the welcome step going ``dead`` and the two compensations
   running, newest step first; then ``tide workflow status``, and ``tide job logs`` of
   each compensation (the ``ctx.compensating`` it printed);
6. checks both runs in the database: run 1 complete with every step's result, run 2
   ``failed`` with the welcome dead, each compensation complete exactly once and in reverse
   order, and the account and its contacts gone.

It exits 0 when everything checks out, 1 with the reason otherwise. Whatever happens, the
worker and the CRM it started are stopped before it exits.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, LiteralString

import psycopg
from psycopg import sql

import atlantis
from atlantis.store.database import announce
from atlantis.store.workflows import WORKFLOW_FINISHED
from examples.contacts.crm import FakeCRM
from examples.contacts.demo import DemoError, _show_log_tail, bar, run_tide, say, step, supervisor
from examples.demo_db import demo_database, where
from examples.onboarding.app import WORKFLOW, ensure_schema, registry

APP = "examples.onboarding.app:registry"
RUN_ONE_ACCOUNT = "acme"
RUN_TWO_ACCOUNT = "globex"
OUTAGE = "550 mailbox service unavailable (the demo's mail_outage switch)"


@dataclass(frozen=True)
class StepRow:
    """One row of a workflow's steps or compensations, as ``atlantis.jobs`` has it."""

    id: int
    step: str
    compensation: bool
    job: str
    state: str
    attempt: int
    max_attempts: int
    pct: int
    msg: str
    last_error: str
    result: Any
    started_at: datetime | None
    finished_at: datetime | None

    @property
    def label(self) -> str:
        return f"undo {self.step}" if self.compensation else self.step


@dataclass(frozen=True)
class WorkflowView:
    """A workflow and its rows: forward steps in dependency order, then its compensations in
    the order they were created (what ``tide workflow status`` shows)."""

    id: int
    workflow: str
    state: str
    args: dict[str, Any]
    created_at: datetime
    finished_at: datetime | None
    error: str | None
    failed_step: str | None
    cause: str | None
    rows: list[StepRow]
    waiting: list[str]  # declared steps that have no row yet (not runnable yet)

    def row(self, step: str, *, compensation: bool = False) -> StepRow | None:
        found = [r for r in self.rows if r.step == step and r.compensation == compensation]
        return found[0] if found else None


# ---- reading a workflow ----------------------------------------------------------------------

def dependency_order(steps: Sequence[tuple[str, int, Sequence[str]]]) -> list[str]:
    """Step names so that each comes after the steps it waits for, else in declaration order."""
    placed: list[str] = []
    left = sorted(steps, key=lambda s: s[1])
    while left:
        ready = next((s for s in left if set(s[2]) <= set(placed)), left[0])
        placed.append(ready[0])
        left.remove(ready)
    return placed


def read_workflow(conn: psycopg.Connection[Any], workflow_id: int) -> WorkflowView:
    head = conn.execute(
        "SELECT id, workflow, state, args, created_at, finished_at, error, failed_step, cause"
        "  FROM atlantis.workflows WHERE id = %s", (workflow_id,)).fetchone()
    if head is None:
        raise DemoError(f"no workflow with id {workflow_id}")
    graph = conn.execute(
        "SELECT step, ord, after FROM atlantis.workflow_steps WHERE workflow_id = %s",
        (workflow_id,)).fetchall()
    rows = [StepRow(*r) for r in conn.execute(
        """SELECT id, step, compensation, job, state, attempt, max_attempts,
                  coalesce(progress_pct, 0), coalesce(progress_msg, ''),
                  coalesce(last_error, ''), result, started_at, finished_at
             FROM atlantis.jobs WHERE workflow_id = %s ORDER BY id""",
        (workflow_id,)).fetchall()]
    order = {name: i for i, name in enumerate(dependency_order(graph))}
    forward = sorted((r for r in rows if not r.compensation), key=lambda r: order.get(r.step, 0))
    undo = [r for r in rows if r.compensation]
    with_rows = {r.step for r in forward}
    waiting = [name for name in order if name not in with_rows]
    wid, name, state, args, created_at, finished_at, error, failed_step, cause = head
    return WorkflowView(id=wid, workflow=name, state=state, args=args, created_at=created_at,
                        finished_at=finished_at, error=error, failed_step=failed_step,
                        cause=cause, rows=forward + undo, waiting=waiting)


# ---- showing it --------------------------------------------------------------------------------

def clip(text: str, width: int = 110) -> str:
    text = text.replace("\n", " ")
    return text if len(text) <= width else text[: width - 3] + "..."


def as_json(value: Any) -> str:
    return "-" if value is None else json.dumps(value, separators=(", ", ": "))


def describe(row: StepRow) -> str:
    """What a row's new state means, in one line."""
    if row.state == "available" and row.attempt == 0:
        return f"runnable: its row is job {row.id} ({row.job})"
    if row.state == "available":
        return f"waiting to retry: {row.last_error}"
    if row.state == "running":
        return f"attempt {row.attempt}/{row.max_attempts} on a worker"
    if row.state == "complete":
        return f"result {as_json(row.result)}"
    return row.last_error


def event(elapsed: float, label: str, state: str, text: str) -> None:
    say(clip(f"  +{elapsed:5.2f}s  {label:<13} {state:<13} {text}", 140))


class Watcher:
    """Prints what changed since the last look: a line per step or compensation whose state
    or attempt changed, the import's progress at most once a second, and the workflow's
    state."""

    def __init__(self) -> None:
        self.seen: dict[tuple[str, bool], tuple[str, int]] = {}
        self.progress: dict[int, tuple[float, int, str]] = {}
        self.state = ""

    def rows(self, view: WorkflowView, compensation: bool, now: float, elapsed: float) -> None:
        for row in (r for r in view.rows if r.compensation == compensation):
            key = (row.step, row.compensation)
            if self.seen.get(key) != (row.state, row.attempt):
                self.seen[key] = (row.state, row.attempt)
                self.progress[row.id] = (now, row.pct, row.msg)
                event(elapsed, row.label, row.state, describe(row))
            elif row.state == "running" and row.msg:
                at, pct, msg = self.progress.get(row.id, (0.0, -1, ""))
                if (pct, msg) != (row.pct, row.msg) and now - at >= 1.0:
                    self.progress[row.id] = (now, row.pct, row.msg)
                    event(elapsed, row.label, row.state, f"{bar(row.pct)} {row.pct:>3}%  {row.msg}")

    def workflow(self, view: WorkflowView, elapsed: float) -> None:
        if view.state != self.state:
            self.state = view.state
            event(elapsed, f"workflow {view.id}", view.state,
                  view.error if view.state != "running" and view.error else "")


def watch(conn: psycopg.Connection[Any], workflow_id: int, sup: Any, deadline: float,
          started: float) -> WorkflowView:
    """Print each step's and the workflow's state as it changes until the workflow ends;
    DemoError if it cannot. A workflow that starts compensating is named before its
    compensations; one that ends, after its last row."""
    show = Watcher()
    while True:
        view = read_workflow(conn, workflow_id)
        now = time.monotonic()
        if not show.state:
            show.workflow(view, now - started)
        show.rows(view, False, now, now - started)
        if view.state in ("running", "compensating"):
            show.workflow(view, now - started)
        show.rows(view, True, now, now - started)
        show.workflow(view, now - started)
        if view.state in WORKFLOW_FINISHED:
            return view
        if sup.poll() is not None:
            raise DemoError(f"atlantis-supervise exited early with status {sup.returncode}")
        if time.monotonic() > deadline:
            raise DemoError(f"workflow {workflow_id} did not finish within the deadline; it is "
                            f"{view.state}: " + ", ".join(f"{r.label}={r.state}" for r in view.rows))
        time.sleep(0.1)


def show_trail(url: str, conn: psycopg.Connection[Any], view: WorkflowView) -> None:
    """The trail as an operator sees it: ``tide workflow status`` (each step in dependency
    order with its state, attempt, progress, timing and result, then the compensations),
    and what each compensation printed (``tide job logs``: it names ``ctx.compensating``)."""
    say(f"$ tide workflow status {view.id}")
    say(run_tide(url, "workflow", "status", str(view.id)).rstrip())
    undo = [r.id for r in view.rows if r.compensation]
    compensation_logs(conn, undo)
    for job_id in undo:
        say(f"$ tide job logs {job_id}")
        say(run_tide(url, "job", "logs", str(job_id)).rstrip())


def compensation_logs(conn: psycopg.Connection[Any], job_ids: Sequence[int],
                      wait: float = 5.0) -> list[tuple[int, str]]:
    """What the compensations printed (``tide job logs``). An attempt's output is written
    shortly after its outcome, so wait a little for every job to have a line."""
    give_up = time.monotonic() + wait
    while True:
        lines = [(int(r[0]), str(r[1])) for r in conn.execute(
            "SELECT job_id, line FROM atlantis.logs WHERE job_id = ANY(%s) AND stream = 'stdout'"
            " ORDER BY id", (list(job_ids),)).fetchall()]
        if {job_id for job_id, _ in lines} >= set(job_ids) or time.monotonic() > give_up:
            return lines
        time.sleep(0.1)


# ---- the runs ----------------------------------------------------------------------------------

def prepare(url: str) -> None:
    """Schema and declarations, the examples' tables, empty; and no workflow of an earlier,
    interrupted demo still running."""
    say(f"$ tide db migrate --app {APP}")
    run_tide(url, "db", "migrate", "--app", APP)
    with psycopg.connect(url, autocommit=True) as conn:
        ensure_schema(conn)
        conn.execute("TRUNCATE accounts, welcome_messages, onboarding_journal, mail_outage,"
                     " contacts, contact_import_state")
        leftovers = [r[0] for r in conn.execute(
            "SELECT id FROM atlantis.workflows WHERE workflow = %s AND state = 'running'"
            " ORDER BY id", (WORKFLOW,))]
        for workflow_id in leftovers:
            say(f"(cancelling workflow {workflow_id}, left running by an earlier run)")
            atlantis.cancel_workflow(conn, workflow_id, by="demo")


def wait_ready(url: str, sup: Any, deadline: float) -> None:
    """Until the supervisor's worker row says a child is ready for every job of the app, so
    that the runs' timings show the workflow, not the worker's start-up."""
    begun = time.monotonic()
    jobs = set(registry.registrations)
    with psycopg.connect(url, autocommit=True) as conn:
        while True:
            row = conn.execute("SELECT job_types FROM atlantis.workers WHERE pid = %s"
                               " AND expires_at > now()", (sup.pid,)).fetchone()
            if row is not None and row[0] is not None and jobs <= set(row[0]):
                say(f"(ready in {time.monotonic() - begun:.1f}s: {', '.join(sorted(jobs))})")
                return
            if sup.poll() is not None:
                raise DemoError(f"atlantis-supervise exited early with status {sup.returncode}")
            if time.monotonic() > deadline:
                raise DemoError("atlantis-supervise did not get ready within the deadline")
            time.sleep(0.1)


def set_outage(url: str, reason: str | None) -> None:
    """The mail provider's switch: down with ``reason``, or up (None)."""
    with psycopg.connect(url, autocommit=True) as conn, conn.transaction():
        conn.execute("DELETE FROM mail_outage")
        if reason is not None:
            conn.execute("INSERT INTO mail_outage (reason) VALUES (%s)", (reason,))


def start(url: str, account: str) -> int:
    with psycopg.connect(url) as conn:
        try:
            workflow_id = atlantis.start_workflow(conn, WORKFLOW, {"account_id": account})
        except atlantis.AtlantisError as exc:
            raise DemoError(f"start_workflow refused: {exc}") from None
        conn.commit()
    say(f">>> atlantis.start_workflow(conn, {WORKFLOW!r}, {{'account_id': {account!r}}})"
        f"   # committed: workflow {workflow_id}")
    return workflow_id


def run(url: str, account: str, sup: Any, deadline: float) -> WorkflowView:
    """Start the workflow for ``account``, watch it to its end, print its trail."""
    workflow_id = start(url, account)
    with psycopg.connect(url, autocommit=True) as conn:
        view = watch(conn, workflow_id, sup, deadline, time.monotonic())
        say("")
        show_trail(url, conn, view)
    return view


@dataclass(frozen=True)
class Runs:
    """The two workflows the demo ran: the completed one and the compensated one."""

    completed: int
    compensated: int


def run_demo(url: str, crm: FakeCRM, *, seconds: float, deadline: float,
             log_path: str) -> Runs:
    """Everything but the database's choice: prepare, start the worker, both runs, verify."""
    step("1. schema, declarations and the examples' tables")
    prepare(url)

    step("2. the upstream CRM (fake, in this process)")
    crm.page_delay = min(2.0, max(0.02, seconds / crm.expected_pages(RUN_ONE_ACCOUNT)))
    crm.start()
    say(f"serving contacts at {crm.url}, {crm.page_size} per page, "
        f"{crm.page_delay:.2f}s per page")

    step("3. the worker")
    queues = sorted(registry.queues())
    with open(log_path, "ab") as log, supervisor(url, crm.url, 2, log, app=APP,
                                                 queues=queues) as sup:
        say(f"(its log: {log_path})")
        wait_ready(url, sup, deadline)

        step(f"4. run 1: {WORKFLOW} for {RUN_ONE_ACCOUNT}, to completion")
        set_outage(url, None)
        first = run(url, RUN_ONE_ACCOUNT, sup, deadline)

        step(f"5. run 2: {WORKFLOW} for {RUN_TWO_ACCOUNT}, with the welcome made to fail")
        say(f"(mail_outage: {OUTAGE})")
        set_outage(url, OUTAGE)
        try:
            second = run(url, RUN_TWO_ACCOUNT, sup, deadline)
        finally:
            set_outage(url, None)


    step("6. verify")
    with psycopg.connect(url, autocommit=True) as conn:
        verify_completed(conn, first.id, crm)
        verify_compensated(conn, second.id)
    return Runs(first.id, second.id)


# ---- checks --------------------------------------------------------------------------------------

def _check(problems: list[str], ok: bool, what: str, otherwise: str) -> None:
    say(f"  {'ok  ' if ok else 'FAIL'}  {what}")
    if not ok:
        problems.append(f"{what}: {otherwise}")


def _count(conn: psycopg.Connection[Any], query: LiteralString | sql.Composed,
           *params: Any) -> int:
    row = conn.execute(query, params).fetchone()
    return int(row[0]) if row else 0


def _ordered(first: StepRow | None, then: StepRow | None) -> bool:
    """``first`` ended no later than ``then`` started (from the rows' recorded times)."""
    return bool(first and then and first.finished_at and then.started_at
                and first.finished_at <= then.started_at)


def verify_completed(conn: psycopg.Connection[Any], workflow_id: int, crm: FakeCRM) -> None:
    """Run 1: complete, every step complete once with its result, in dependency order, and
    the results passed on (the welcome names the import's count)."""
    view = read_workflow(conn, workflow_id)
    account = view.args["account_id"]
    say(f"run 1 (workflow {workflow_id}, {account}):")
    problems: list[str] = []
    _check(problems, view.state == "complete", "the workflow is complete", view.state)
    forward = [r for r in view.rows if not r.compensation]
    _check(problems, [r.step for r in forward] == ["create", "import", "welcome"]
           and all(r.state == "complete" and r.result is not None for r in forward),
           "create, import and welcome each complete, with a result",
           ", ".join(f"{r.label}={r.state} result {as_json(r.result)}" for r in forward))
    _check(problems, not any(r.compensation for r in view.rows), "no compensation ran",
           ", ".join(r.label for r in view.rows if r.compensation))
    create, imported, welcome = (view.row(s) for s in ("create", "import", "welcome"))
    _check(problems, _ordered(create, imported) and _ordered(imported, welcome),
           "each step started after the one it waits for ended", "times out of order")
    expected = crm.expected_contacts(account)
    stored = _count(conn, "SELECT count(*) FROM contacts WHERE account_id = %s", account)
    counted = (imported.result or {}).get("contacts") if imported else None
    passed = (welcome.result or {}).get("contacts") if welcome else None
    _check(problems, counted == passed == stored == expected,
           f"the import's result ({counted}) reached the welcome ({passed}): "
           f"{expected} contacts stored",
           f"{stored} contacts stored")
    _check(problems, _count(conn, "SELECT count(*) FROM accounts WHERE account_id = %s",
                            account) == 1
           and _count(conn, "SELECT count(*) FROM welcome_messages WHERE account_id = %s",
                      account) == 1,
           "the account exists and got one welcome", "missing")
    if problems:
        raise DemoError("run 1: " + "; ".join(problems))


def verify_compensated(conn: psycopg.Connection[Any], workflow_id: int) -> None:
    """Run 2: failed at the welcome; both compensations complete exactly once, the import's
    before the account's, each after its step left running; nothing of the account left."""
    view = read_workflow(conn, workflow_id)
    account = view.args["account_id"]
    say(f"run 2 (workflow {workflow_id}, {account}):")
    problems: list[str] = []
    _check(problems, view.state == "failed" and view.failed_step == "welcome",
           "the workflow failed at step welcome", f"{view.state} (failed step {view.failed_step})")
    welcome = view.row("welcome")
    _check(problems, welcome is not None and welcome.state == "dead", "the welcome is dead",
           welcome.state if welcome else "no row")
    undo = [r for r in view.rows if r.compensation]
    _check(problems, [r.step for r in undo] == ["import", "create"]
           and all(r.state == "complete" for r in undo),
           "one compensation each for import and create, both complete",
           ", ".join(f"{r.label}={r.state}" for r in undo) or "none")
    finishes = {r.id: _count(conn, "SELECT count(*) FROM atlantis.attempts"
                                   " WHERE job_id = %s AND outcome = 'complete'", r.id)
                for r in undo}
    journal = _count(conn, "SELECT count(*) FROM onboarding_journal WHERE workflow_id = %s"
                           " AND compensation", workflow_id)
    _check(problems, list(finishes.values()) == [1, 1] and journal == 2,
           "each compensation completed exactly once (one attempt, one effect)",
           f"completed attempts {finishes}, effects {journal}")
    undo_import = view.row("import", compensation=True)
    undo_create = view.row("create", compensation=True)
    _check(problems, _ordered(welcome, undo_import) and _ordered(undo_import, undo_create),
           "reverse order: welcome ended, then undo import, then undo create",
           "times out of order")
    left = {table: _count(conn, sql.SQL("SELECT count(*) FROM {} WHERE account_id = %s").format(
                              sql.Identifier(table)), account)
            for table in ("accounts", "contacts", "contact_import_state", "welcome_messages")}
    _check(problems, not any(left.values()), "the account and its contacts are gone",
           ", ".join(f"{n} in {t}" for t, n in left.items() if n))
    if problems:
        raise DemoError("run 2: " + "; ".join(problems))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/demo --workflow", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=4.0,
                        help="about how long the import step should take (the CRM's page delay)")
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
    assert WORKFLOW in registry.workflows

    crm = FakeCRM(host="127.0.0.1", port=0)
    log = tempfile.NamedTemporaryFile(prefix="atlantis-demo-", suffix=".log", delete=False)  # noqa: SIM115
    log.close()
    try:
        runs = run_demo(url, crm, seconds=opts.seconds, deadline=started + opts.deadline,
                        log_path=log.name)
    except DemoError as exc:
        _show_log_tail(log.name)
        print(f"\ndemo: FAILED: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ndemo: interrupted", file=sys.stderr)
        return 130
    finally:
        crm.stop()
    say(f"\ndemo: workflow {runs.completed} complete, workflow {runs.compensated} compensated;"
        f" verified in {time.monotonic() - started:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
