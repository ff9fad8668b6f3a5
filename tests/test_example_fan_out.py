"""The contact import fanned out (examples/contacts/fan_out.py): a parent counts the pages,
spawns one child job per page and joins them; each child imports its page in a transaction
step. Under a real ``atlantis-supervise`` on the real embedded PostgreSQL: every contact is
written exactly once (a trigger counts every committed write, as ``./scripts/demo
--durable`` does), there is one child per page, and the parent returns the totals; and with
the supervisor killed by SIGKILL in the middle of the parent's spawns, another supervisor
finishes the import without spawning a page twice or writing a contact twice. Last,
``./scripts/demo --fan-out`` (examples/contacts/fan_out_demo.py) on the test's database.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import psutil
import psycopg
import pytest

import atlantis
from atlantis.store import migrate, sync
from examples.contacts.app import CRM_URL_ENV, ensure_schema
from examples.contacts.crm import FakeCRM
from examples.contacts.durable_demo import WITNESS, QuietCRM
from examples.contacts.fan_out import JOB, PAGE_JOB, registry
from tests.conftest import ROOT, job_row, run_tide, wait_for, wait_state

APP = "examples.contacts.fan_out:registry"


@pytest.fixture
def fan_db(db_url: str) -> Iterator[psycopg.Connection[Any]]:
    """The test database with the example's declarations, its tables and the witness of
    writes (``contact_writes``: one count per contact, bumped by every committed write)."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        migrate(conn)
        sync(conn, list(registry.decls.values()))
        ensure_schema(conn)
        conn.execute(WITNESS)
        yield conn


def start_worker(supervise: Any, crm: FakeCRM, concurrency: int = 4) -> Any:
    return supervise("--drain-timeout", "5s", queues=("contacts",), app=APP,
                     concurrency=concurrency, env={CRM_URL_ENV: crm.url})


def enqueue(conn: psycopg.Connection[Any], account: str) -> int:
    with conn.transaction():
        return atlantis.enqueue(conn, JOB, {"account_id": account})


def children(conn: psycopg.Connection[Any], parent: int) -> list[tuple[int, int, str, Any]]:
    """The parent's children: (job id, page, state, result), by id."""
    return [(r[0], r[1], r[2], r[3]) for r in conn.execute(
        "SELECT id, (args->>'page')::int, state, result FROM atlantis.jobs"
        " WHERE parent_id = %s ORDER BY id", (parent,))]


def spawns(conn: psycopg.Connection[Any], parent: int) -> list[tuple[str, int, Any]]:
    """The parent's spawn records: (name, the job it enqueued, the run that recorded it)."""
    return [(r[0], int(r[1]), r[2]) for r in conn.execute(
        "SELECT name, value->>'job', run_id FROM atlantis.job_steps"
        " WHERE job_id = %s AND kind = 'spawn' ORDER BY recorded_at", (parent,))]


def writes(conn: psycopg.Connection[Any], account: str) -> tuple[int, int, int]:
    """(contacts stored, committed writes of them, the most writes of one) for an account."""
    row = conn.execute(
        "SELECT count(*), coalesce(sum(w.writes), 0), coalesce(max(w.writes), 0)"
        " FROM contacts c LEFT JOIN contact_writes w USING (account_id, contact_id)"
        " WHERE c.account_id = %s", (account,)).fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2])


def test_the_fan_out_imports_each_page_in_a_child_of_its_own_exactly_once(
        fan_db: psycopg.Connection[Any], db_url: str, supervise: Any) -> None:
    # 450 contacts, pages of 50 (the CRM hands out fewer than the 100 asked for): 9 pages.
    with FakeCRM(page_delay=0.01, page_size=50, contacts_per_account=450) as crm:
        accounts = ["acme", "globex"]
        parents = {account: enqueue(fan_db, account) for account in accounts}
        start_worker(supervise, crm)
        for account, parent in parents.items():
            row = wait_state(fan_db, parent, "complete", "dead", timeout=60)
            assert row["state"] == "complete", row["last_error"]
            assert row["result"] == {"pages": 9, "contacts": 450}
            # The join suspended the run (no attempt spent); the last page's end woke it.
            assert row["attempt"] == 1
            kids = children(fan_db, parent)
            assert [page for _, page, _, _ in kids] == list(range(9))
            assert {(state, result) for _, _, state, result in kids} == {("complete", 50)}
            assert {job for _, job, _ in spawns(fan_db, parent)} == {k[0] for k in kids}
            kinds = dict(fan_db.execute(
                "SELECT name, kind FROM atlantis.job_steps WHERE job_id = %s", (parent,)))
            assert kinds == {"count": "step", "pages": "join",
                             **{f"page-{n}": "spawn" for n in range(9)}}
            assert writes(fan_db, account) == (450, 450, 1)
            # The count fetched the first page; each child its own page, once.
            assert [crm.request_count(account, f"page={n}") for n in range(9)] == [1] * 9
            assert crm.request_count(account, "") == 1

        parent = parents["acme"]
        status = run_tide(["--database-url", db_url, "job", "status", str(parent)]).stdout
        assert "9 complete" in status, status
        page = children(fan_db, parent)[0][0]
        shown = run_tide(["--database-url", db_url, "job", "status", str(page)]).stdout
        assert "parent" in shown and str(parent) in shown, shown
        assert job_row(fan_db, page)["job"] == PAGE_JOB


def test_kill_9_mid_fan_out_spawns_no_page_twice_and_writes_no_contact_twice(
        fan_db: psycopg.Connection[Any], supervise: Any) -> None:
    account = "kill-me"
    # 100 pages of 3: a spawn takes about 2 ms, so the kill lands among the parent's spawns
    # with a tenth of a second to spare; the children take a moment each (the CRM's delay),
    # so some are in the middle of their transaction step too. A page's request cut off by
    # the kill is not worth a traceback (QuietCRM).
    with QuietCRM(page_delay=0.02, page_size=3, contacts_per_account=300) as crm:
        pages = crm.expected_pages(account)
        parent = enqueue(fan_db, account)
        first = start_worker(supervise, crm)

        def spawned() -> int:
            return len(spawns(fan_db, parent))

        wait_for(lambda: spawned() >= 5, timeout=30, interval=0.005, message="some spawns")
        # SIGKILL: no drain. The handlers' children die with their supervisor; wait until
        # they are really gone before another supervisor takes their rows over.
        procs = psutil.Process(first.pid).children(recursive=True)
        first.signal(signal.SIGKILL)
        first.wait(10)
        _, alive = psutil.wait_procs(procs, timeout=10)
        assert not alive, f"children outlived their supervisor: {alive}"
        at_kill = spawned()

        # The heartbeat is 5s: stand in for it by ending the killed runs' leases.
        fan_db.execute("UPDATE atlantis.jobs SET claimed_until = now() - interval '1 second'"
                       " WHERE state = 'running'")
        start_worker(supervise, crm)
        row = wait_state(fan_db, parent, "complete", "dead", timeout=90)
        assert row["state"] == "complete", row["last_error"]
        assert row["result"] == {"pages": pages, "contacts": 300}

        kids = children(fan_db, parent)
        assert sorted(page for _, page, _, _ in kids) == list(range(pages)), kids
        assert {state for _, _, state, _ in kids} == {"complete"}
        recorded = spawns(fan_db, parent)
        assert sorted(name for name, _, _ in recorded) == sorted(
            f"page-{n}" for n in range(pages))
        assert {job for _, job, _ in recorded} == {k[0] for k in kids}
        assert fan_db.execute("SELECT count(*) FROM atlantis.jobs WHERE job = %s",
                              (PAGE_JOB,)).fetchone() == (pages,)  # no page job but these
        # The kill landed among the spawns: the first run recorded some, the next the rest
        # (and got the first run's back without spawning them again).
        runs = list(dict.fromkeys(run for _, _, run in recorded))
        assert len(runs) == 2 and 5 <= at_kill < pages, (at_kill, len(runs))
        assert row["attempt"] == 2  # the killed run's lease ran out: one attempt spent
        assert writes(fan_db, account) == (300, 300, 1)


def test_scripts_demo_fan_out_runs_the_fan_out_demo_and_its_proof_holds(
        fan_db: psycopg.Connection[Any], db_url: str) -> None:
    text = (ROOT / "scripts" / "demo").read_text("utf-8")
    assert ('if [[ "${1:-}" == "--fan-out" ]]; then\n    shift\n'
            '    exec .venv/bin/python -m examples.contacts.fan_out_demo "$@"\nfi') in text
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ATLANTIS_", "PG"))}
    env["ATLANTIS_DATABASE_URL"] = db_url
    demo = subprocess.run([sys.executable, "-m", "examples.contacts.fan_out_demo", "--account",
                           "acme", "--page-delay", "0.05", "--deadline", "60"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120, check=False)
    said = demo.stdout + demo.stderr
    assert demo.returncode == 0, said[-5000:]
    lines = demo.stdout.splitlines()
    assert "  7 child jobs for 7 pages (complete); each page fetched once" in lines, said
    assert "  697 contacts stored, 697 committed writes, at most 1 of one" in lines, said
    assert any(x.startswith("  parent available (join:pages)") for x in lines), said
    assert lines[-1].startswith("demo: job ") and "written exactly once" in lines[-1]
    status = demo.stdout[demo.stdout.index("== 6. tide job status"):]
    assert "7 complete" in status, status
    assert fan_db.execute("SELECT result FROM atlantis.jobs WHERE job = %s",
                          (JOB,)).fetchall() == [({"pages": 7, "contacts": 697},)]
    assert fan_db.execute("SELECT tgname FROM pg_trigger WHERE tgrelid = 'contacts'::regclass"
                          " AND NOT tgisinternal").fetchall() == []  # the witness is gone
