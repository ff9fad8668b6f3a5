"""Both demos run on a new embedded home and leave its default database to the user: no demo
table, no demo declaration, and ``tide db doctor`` finds nothing to report. They work in
``atlantis_demo`` instead, and say so on their first line (examples/demo_db.py).

The home is a fresh folder under /tmp (unix socket paths must stay short); the server the
demos start there is stopped by the pid in its ``postmaster.pid``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psycopg

from examples.demo_db import DEMO_DATABASE
from tests.conftest import BIN
from tests.demo_home import home as home  # the fixture
from tests.demo_home import run_in


def _run(argv: list[str], home: Path) -> subprocess.CompletedProcess[str]:
    return run_in(home, argv)


def test_the_demos_leave_the_default_database_alone(home: Path) -> None:
    contacts = _run([sys.executable, "-m", "examples.contacts.demo", "--seconds", "2",
                     "--accounts", "acme,globex"], home)
    assert contacts.returncode == 0, contacts.stdout[-3000:] + contacts.stderr[-3000:]
    assert contacts.stdout.splitlines()[0].startswith(f"demo: in the database {DEMO_DATABASE}")
    onboarding = _run([sys.executable, "-m", "examples.onboarding.demo", "--seconds", "1"], home)
    assert onboarding.returncode == 0, onboarding.stdout[-3000:] + onboarding.stderr[-3000:]
    assert onboarding.stdout.splitlines()[0].startswith(
        f"demo: in the database {DEMO_DATABASE}")

    url = _run([str(BIN / "tide"), "db", "url"], home)
    assert url.returncode == 0, url.stderr
    default = url.stdout.strip()
    code = _run([sys.executable, "-c", "import atlantis; print(atlantis.database_url())"], home)
    assert code.stdout.strip() == default, code.stderr
    with psycopg.connect(default, autocommit=True) as conn:
        tables = [r[0] for r in conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'")]
        declared = [r[0] for r in conn.execute("SELECT job FROM atlantis.job_types")]
        flows = [r[0] for r in conn.execute("SELECT workflow FROM atlantis.workflow_types")]
        jobs = conn.execute("SELECT count(*) FROM atlantis.jobs").fetchone()
    assert (tables, declared, flows, jobs) == ([], [], [], (0,))
    doctor = _run([str(BIN / "tide"), "db", "doctor"], home)
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr

    demo_url = psycopg.conninfo.make_conninfo(default, dbname=DEMO_DATABASE)
    with psycopg.connect(demo_url, autocommit=True) as conn:
        imported = conn.execute("SELECT count(*) FROM contacts").fetchone()
        names = {r[0] for r in conn.execute("SELECT job FROM atlantis.job_types")}
    assert imported is not None and imported[0] > 0
    assert "directory.ImportContacts" in names
