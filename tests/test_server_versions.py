"""PostgreSQL majors of the embedded server: new homes get 18, an existing home keeps its
own, a home is never re-initialised, and `tide db upgrade-home` moves a 16 home to 18 with
its jobs. Also `tide db doctor`'s version warnings.

Each test makes its homes in a fresh folder directly under /tmp (unix socket paths stay
short) and stops every server it started by the pid in its ``postmaster.pid``.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import psutil
import psycopg
import pytest

import atlantis
from atlantis import environ
from atlantis.app import load_app
from atlantis.errors import ConfigurationError
from atlantis.store import doctor, embedded, homes, migrate, sync
from chaos.server import scratch_root
from tests.conftest import BIN, ROOT, TEST_APP

#: Only the tests on the suite's server are marked ``server_matrix``: the others start servers
#: of their own, of the majors they name, the same on every pass (the 16 pass would run them
#: again for nothing).


@pytest.fixture
def base() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="atl-v", dir=scratch_root()))
    folder.chmod(0o755)
    yield folder
    for pidfile in folder.rglob("postmaster.pid"):
        _kill(pidfile)
    shutil.rmtree(folder, ignore_errors=True)


def _kill(pidfile: Path) -> None:
    try:
        pid = int(pidfile.read_text().split("\n", 1)[0])
        proc = psutil.Process(pid)
    except (OSError, ValueError, psutil.Error):
        return
    proc.send_signal(signal.SIGQUIT)  # immediate shutdown
    try:
        proc.wait(30)
    except psutil.TimeoutExpired:
        proc.kill()


def start(home: Path, major: int = embedded.DEFAULT_MAJOR) -> str:
    """The embedded server of ``home`` in a new process, as every atlantis command starts it;
    it stays running (cleanup_mode None) until the test stops it."""
    code = ("import sys; from pathlib import Path; from atlantis.store.embedded import "
            "embedded_url; print(embedded_url(Path(sys.argv[1]), major=int(sys.argv[2])))")
    done = subprocess.run([sys.executable, "-c", code, str(home), str(major)],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def major_of(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT current_setting('server_version_num')::int").fetchone()
        assert row is not None
        return int(row[0]) // 10000


def tide(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != environ.DATABASE_URL}
    env[environ.HOME] = str(home)
    return subprocess.run([str(BIN / "tide"), *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=300, env=env)


def test_a_new_home_gets_the_default_major(base: Path) -> None:
    home = base / "new"
    url = start(home)
    assert major_of(url) == embedded.DEFAULT_MAJOR == 18
    assert (home / "pgdata" / "PG_VERSION").read_text().strip() == "18"
    homes.stop(home / "pgdata")


def test_an_existing_home_keeps_its_major(base: Path) -> None:
    """A 16 home (as pgserver 0.1.4 made them) runs on the wheel's 16 programs: never a
    silent initdb over it, whatever major a new home would get."""
    home = base / "old"
    url = start(home, major=16)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE kept (x int); INSERT INTO kept VALUES (16)")
    homes.stop(home / "pgdata")
    url = start(home)  # the default major (18) is asked for: the home's own wins
    assert major_of(url) == 16
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT x FROM kept").fetchone() == (16,)
    homes.stop(home / "pgdata")


def test_a_home_of_a_major_the_wheel_lacks_is_refused_untouched(base: Path) -> None:
    home = base / "h17"
    data = home / "pgdata"
    data.mkdir(parents=True)
    (data / "PG_VERSION").write_text("17\n")
    (data / "user-file").write_text("precious")
    with pytest.raises(ConfigurationError) as caught:
        embedded.embedded_url(home)
    message = str(caught.value)
    assert "PostgreSQL 17 data folder" in message and environ.DATABASE_URL in message
    assert "\n" not in message
    assert sorted(p.name for p in data.iterdir()) == ["PG_VERSION", "user-file"]


def test_doctor_explains_and_upgrade_home_moves_a_16_home_with_its_jobs(base: Path) -> None:
    home = base / "move"
    url = start(home, major=16)
    registry = load_app(TEST_APP)
    with psycopg.connect(url) as conn:
        migrate(conn)
        sync(conn, list(registry.decls.values()), list(registry.workflows.values()))
        conn.execute("SELECT atlantis.set_queue_limit('moved', 2)")
        job_id = atlantis.enqueue(conn, "tests.Echo", {"key": "moved"}, queue="moved")
        conn.commit()

    # doctor on the embedded home: a warning with the way to move it, not a problem (the
    # waiting job with no supervisor is one: unserved_jobs).
    done = tide(home, "db", "doctor", "--json")
    assert done.returncode in (0, 1), done.stderr
    doc = orjson.loads(done.stdout)
    assert "embedded_home" in doc["warnings"] and "embedded_home" not in doc["problems"]
    assert doc["checks"]["embedded_home"]["ok"] is True
    summary = doc["checks"]["embedded_home"]["summary"]
    assert "tide db upgrade-home" in summary and "dump and restore" in summary
    assert doc["checks"]["embedded_home"]["items"][0]["major"] == 16

    # Refused while another session uses the server; nothing moved.
    with psycopg.connect(url):
        refused = tide(home, "db", "upgrade-home")
        assert refused.returncode == 1
        assert "1 other session is connected" in refused.stderr
    assert embedded.home_major(home / "pgdata") == 16 and not (home / "pgdata.16").exists()

    moved = tide(home, "db", "upgrade-home")
    assert moved.returncode == 0, moved.stderr
    assert "moved" in moved.stderr and "pgdata.16" in moved.stderr
    assert embedded.home_major(home / "pgdata") == 18
    assert embedded.home_major(home / "pgdata.16") == 16  # kept for the operator

    url = start(home)
    assert major_of(url) == 18
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT job, queue, state FROM atlantis.jobs WHERE id = %s",
                           (job_id,)).fetchone()
        assert row == ("tests.Echo", "moved", "available")
        limit = conn.execute("SELECT concurrency FROM atlantis.queues WHERE name = 'moved'")
        assert limit.fetchone() == (2,)
        assert migrate(conn) == []  # the schema came across whole
    again = tide(home, "db", "upgrade-home")
    assert again.returncode == 0 and "already runs PostgreSQL 18" in again.stderr
    after = tide(home, "db", "doctor", "--json")
    assert after.returncode in (0, 1), after.stderr
    assert "embedded_home" not in orjson.loads(after.stdout)["warnings"]
    homes.stop(home / "pgdata")


def test_upgrade_home_refuses_a_url(base: Path) -> None:
    env_home = base / "none"
    done = subprocess.run([str(BIN / "tide"), "--database-url", "postgresql:///x", "db",
                           "upgrade-home"], capture_output=True, text=True, cwd=ROOT,
                          timeout=60, env={**os.environ, environ.HOME: str(env_home)})
    assert done.returncode == 2 and "moves the embedded home" in done.stderr
    assert not env_home.exists()


@pytest.mark.server_matrix
def test_doctor_warns_below_the_newest_known_minor(db: psycopg.Connection[Any],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    number, text = doctor.server_version(db)
    major, minor = number // 10000, number % 10000
    monkeypatch.setitem(doctor.NEWEST_MINORS, major, minor + 1)
    report = doctor.diagnose(db)
    assert report.problems == [] and [c.name for c in report.warnings] == ["server_version"]
    check = report.checks[0]
    assert check.summary.startswith(f"PostgreSQL {text}: {major}.{minor + 1} is out")
    assert report.document()["warnings"] == ["server_version"]
    monkeypatch.setitem(doctor.NEWEST_MINORS, major, minor)
    assert doctor.diagnose(db).warnings == []
    monkeypatch.delitem(doctor.NEWEST_MINORS, major)  # a major it does not know: no opinion
    assert doctor.diagnose(db).warnings == []


@pytest.mark.server_matrix
def test_the_suite_runs_on_the_major_it_was_asked_for(db: psycopg.Connection[Any]) -> None:
    from tests.conftest import suite_major

    row = db.execute("SELECT current_setting('server_version_num')::int / 10000").fetchone()
    assert row == (suite_major(),)
