"""``./scripts/demo --durable`` (examples/contacts/durable_demo.py) on a new embedded home: the
durable contact import is killed with its supervisor (SIGKILL) mid-import, another supervisor
resumes it, and the demo's proof holds. Checked here again from the database, not only from
what the demo prints: every page recorded once, by two runs; every contact written once (the
demo's trigger counts every committed write); the default database left alone.

Seen to fail with the records not read back (``atlantis/steps.py``'s ``_Rules.recorded``
made to return ``_MISSING``, on a copy of the tree): the second run starts over at page-0,
whose record is refused, and the job ends dead; the demo exits 1.

The home is a fresh folder under /tmp (unix socket paths must stay short); the server the
demo starts there is stopped by the pid in its ``postmaster.pid``.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import psycopg

from examples.contacts.crm import expected_contacts
from examples.contacts.durable import JOB
from examples.demo_db import DEMO_DATABASE
from tests.conftest import BIN, ROOT
from tests.demo_home import home as home  # the fixture
from tests.demo_home import run_in

ACCOUNT = "initech"
PAGES = -(-expected_contacts(ACCOUNT) // 100)


def _run(argv: list[str], home: Path) -> subprocess.CompletedProcess[str]:
    return run_in(home, argv)


def test_scripts_demo_dispatches_durable_to_the_durable_demo() -> None:
    text = (ROOT / "scripts" / "demo").read_text("utf-8")
    assert ('if [[ "${1:-}" == "--durable" ]]; then\n    shift\n'
            '    exec .venv/bin/python -m examples.contacts.durable_demo "$@"\nfi') in text


def test_the_durable_demo_resumes_after_kill_9_and_writes_every_page_once(home: Path) -> None:
    demo = _run([sys.executable, "-m", "examples.contacts.durable_demo", "--account", ACCOUNT,
                 "--page-delay", "0.1", "--kill-after", "3"], home)
    said = demo.stdout + demo.stderr
    assert demo.returncode == 0, said[-5000:]
    lines = demo.stdout.splitlines()
    assert lines[0].startswith(f"demo: in the database {DEMO_DATABASE}")
    assert "  proof holds: no page written twice" in lines
    assert lines[-1].startswith("demo: job ") and "every contact written exactly once" in lines[-1]
    status = demo.stdout[demo.stdout.index("== 7. tide job status"):]
    assert "complete" in status and f"{PAGES} records" in status, status
    assert re.search(rf"page-{PAGES - 1}\s+transaction", status), status

    default = _run([str(BIN / "tide"), "db", "url"], home).stdout.strip()
    demo_url = psycopg.conninfo.make_conninfo(default, dbname=DEMO_DATABASE)
    with psycopg.connect(demo_url, autocommit=True) as conn:
        (job_id, state, attempt), = conn.execute(
            "SELECT id, state, attempt FROM atlantis.jobs WHERE job = %s", (JOB,)).fetchall()
        steps = conn.execute(
            "SELECT name, run_id FROM atlantis.job_steps WHERE job_id = %s ORDER BY recorded_at",
            (job_id,)).fetchall()
        contacts, written, most = conn.execute(
            "SELECT count(*), sum(w.writes), max(w.writes) FROM contacts c"
            " JOIN contact_writes w USING (account_id, contact_id)"
            " WHERE c.account_id = %s", (ACCOUNT,)).fetchone() or (0, 0, 0)
        triggers = conn.execute("SELECT tgname FROM pg_trigger WHERE tgrelid = 'contacts'::regclass"
                                " AND NOT tgisinternal").fetchall()
    assert (state, attempt) == ("complete", 2)  # the kill cost one attempt (the lease expired)
    assert [name for name, _ in steps] == [f"page-{i}" for i in range(PAGES)]
    runs = list(dict.fromkeys(run for _, run in steps))
    assert len(runs) == 2, "the pages were not recorded by a first run and its resume"
    first = [name for name, run in steps if run == runs[0]]
    assert 3 <= len(first) < PAGES
    assert (contacts, written, most) == (expected_contacts(ACCOUNT),) * 2 + (1,)
    assert triggers == []  # the demo's witness is taken off the example's table

    with psycopg.connect(default, autocommit=True) as conn:
        tables = conn.execute("SELECT table_name FROM information_schema.tables"
                              " WHERE table_schema = 'public'").fetchall()
        declared = conn.execute("SELECT job FROM atlantis.job_types").fetchall()
        jobs = conn.execute("SELECT count(*) FROM atlantis.jobs").fetchone()
    assert (tables, declared, jobs) == ([], [], (0,))
