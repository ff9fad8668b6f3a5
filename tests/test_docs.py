"""The documentation as a reader meets it: the README stays a user's page (at most 12 KB,
``pip install`` on its first screen), ``benchmarks/README.md`` at most 15 KB, and the code of
the quickstart and of the tutorial runs as written, against a real database, real
supervisors and real signals.

A page's runnable code is marked with HTML comments, which neither GitHub nor the docs site
shows:

- ``<!-- file: PATH -->`` before a fenced block: the block is written to PATH;
- ``<!-- run -->`` before a fenced block: the block runs in one bash shell that lives for
  the whole page (its variables and background jobs carry over, as in a reader's terminal),
  with ``set -e``: a failing command fails the test;
- ``<!-- test: COMMAND -->``: a command only the test runs, in that same shell, where a
  reader would wait and watch (``until ...; do sleep 0.2; done``).

Everything the shell started is stopped at the end, by its process group.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import psycopg
import pytest

from tests.conftest import ROOT, wait_state

README = ROOT / "README.md"
BIN = Path(sys.executable).parent
#: How long one block (or one test-only command) may take.
BLOCK_DEADLINE = 120.0

_STEP = re.compile(
    r"<!-- (?:file: (?P<path>\S+)|(?P<run>run)|test: (?P<test>.*?)) -->\n"
    r"(?(test)|```[^\n]*\n(?P<body>.*?)\n```)",
    re.DOTALL,
)


@dataclass(frozen=True)
class Step:
    kind: str  # "file", "run" or "test"
    text: str
    path: str = ""


def steps(markdown: str) -> list[Step]:
    """The runnable steps of a page, in order."""
    found = []
    for m in _STEP.finditer(markdown):
        if m.group("path"):
            found.append(Step("file", m.group("body") + "\n", m.group("path")))
        elif m.group("run"):
            found.append(Step("run", m.group("body")))
        else:
            found.append(Step("test", m.group("test")))
    return found


def quickstart() -> str:
    text = README.read_text("utf-8")
    return text.split("<!-- quickstart: begin -->", 1)[1].split("<!-- quickstart: end -->", 1)[0]


class Shell:
    """One bash process, fed block after block, as a reader's terminal would be."""

    def __init__(self, folder: Path, env: dict[str, str]) -> None:
        self.folder = folder
        self.log = folder / ".shell.log"
        self._count = 0
        out = self.log.open("ab")
        self.proc = subprocess.Popen(["bash", "--norc", "--noprofile", "-s"], cwd=folder,
                                     env=env, stdin=subprocess.PIPE, stdout=out,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        out.close()
        self.send("set -e")

    def send(self, script: str) -> None:
        """Run ``script`` and wait until it is done; fail with the shell's output if it
        fails (under ``set -e`` a failing command ends the shell)."""
        self._count += 1
        done = self.folder / f".block-{self._count}.done"
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{script}\n: > {done.name}\n".encode())
        self.proc.stdin.flush()
        deadline = time.monotonic() + BLOCK_DEADLINE
        while not done.exists():
            if self.proc.poll() is not None:
                pytest.fail(f"this failed (shell exit {self.proc.returncode}):\n{script}\n"
                            f"--- output ---\n{self.output()}")
            if time.monotonic() > deadline:
                pytest.fail(f"not done after {BLOCK_DEADLINE}s:\n{script}\n"
                            f"--- output ---\n{self.output()}")
            time.sleep(0.05)

    def output(self) -> str:
        return self.log.read_text("utf-8", "replace")[-6000:]

    def stop(self) -> None:
        """SIGTERM to everything the shell started (a supervisor drains), SIGKILL to what is
        left after 30 s."""
        group = self.proc.pid
        members = [p for p in psutil.process_iter() if _group(p) == group]
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(group, sig)
            except ProcessLookupError:
                break
            _, members = psutil.wait_procs(members, timeout=30)
            if not members:
                break
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=10)


def _group(proc: psutil.Process) -> int | None:
    try:
        return os.getpgid(proc.pid)
    except (ProcessLookupError, PermissionError):
        return None


def run_page(markdown: str, folder: Path, db_url: str) -> Shell:
    """Run a page's steps in ``folder``; returns the (still running) shell."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ATLANTIS_", "PG"))}
    env.update({"PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}",
                "ATLANTIS_DATABASE_URL": db_url, "PYTHONUNBUFFERED": "1"})
    shell = Shell(folder, env)
    try:
        for step in steps(markdown):
            if step.kind == "file":
                target = folder / step.path
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(step.text, "utf-8")
            else:
                shell.send(step.text)
    except BaseException:
        shell.stop()
        raise
    return shell


# ---- size and shape ---------------------------------------------------------------------


def test_the_readme_is_a_users_page_of_at_most_12_kb_with_pip_install_on_its_first_screen(
        ) -> None:
    data = README.read_bytes()
    assert len(data) <= 12_000, f"README.md is {len(data)} bytes: reference goes in docs/"
    assert b"pip install" in data[:3000]


def test_the_benchmarks_readme_is_at_most_15_kb() -> None:
    size = len((ROOT / "benchmarks" / "README.md").read_bytes())
    assert size <= 15_000, f"benchmarks/README.md is {size} bytes: history goes in HISTORY.md"


def test_the_quickstart_has_a_declaration_a_handler_an_enqueue_and_commands() -> None:
    found = steps(quickstart())
    assert [s.path for s in found if s.kind == "file"] == [
        "hello/jobs.atl", "hello/jobs.py", "enqueue.py"]
    run = "\n".join(s.text for s in found if s.kind == "run")
    for command in ("tide db migrate", "atlantis-supervise", "tide job status"):
        assert command in run
    lines = sum(len(s.text.strip().splitlines()) for s in found)
    assert lines <= 40, f"the quickstart has {lines} lines of code"


def test_the_steps_of_a_page_are_read_in_order() -> None:
    page = ("<!-- file: a/b.py -->\n```python\nx = 1\n```\ntext\n<!-- run -->\n```sh\n"
            "echo hi\n```\n<!-- test: until true; do :; done -->\n```sh\nnot run\n```\n")
    assert steps(page) == [Step("file", "x = 1\n", "a/b.py"), Step("run", "echo hi"),
                           Step("test", "until true; do :; done")]


# ---- the code runs ----------------------------------------------------------------------


def test_the_quickstart_runs_as_written(db_url: str, tmp_path: Path) -> None:
    shell = run_page(quickstart(), tmp_path, db_url)
    try:
        with psycopg.connect(db_url, autocommit=True) as conn:
            row = conn.execute("SELECT id FROM atlantis.jobs WHERE job = 'hello.Greet'"
                               ).fetchone()
            assert row is not None
            done = wait_state(conn, row[0], "complete", "dead", "cancelled", timeout=60)
            assert done["state"] == "complete", done["errors"]
            assert done["progress_pct"] == pytest.approx(100.0)
            shell.send(f"tide job logs {row[0]} > logs.txt")
        assert "hello, world" in (tmp_path / "logs.txt").read_text("utf-8")
    finally:
        shell.stop()


def test_the_tutorial_runs_as_written(db_url: str, tmp_path: Path) -> None:
    """The contact import of the tutorial: killed with ``kill -9`` mid-import, resumed by a
    new supervisor from the cursor its first attempt committed, every contact once."""
    shell = run_page((ROOT / "docs" / "tutorial.md").read_text("utf-8"), tmp_path, db_url)
    try:
        with psycopg.connect(db_url, autocommit=True) as conn:
            jobs = conn.execute(
                "SELECT id, state, attempt, errors FROM atlantis.jobs"
                " WHERE job = 'directory.ImportContacts' ORDER BY id").fetchall()
            assert len(jobs) == 2, jobs  # the import, and the run again after it
            (_, state, attempt, errors), again = jobs
            assert state == "complete", errors
            assert attempt >= 2, "the kill -9 did not cost the import an attempt"
            assert errors[0]["kind"] == "lease_expired", errors
            assert again[1:3] == ("complete", 1), again  # a no-op: already imported

            rows, distinct = conn.execute(
                "SELECT count(*), count(DISTINCT contact_id) FROM contacts"
                " WHERE account_id = 'acme'").fetchone() or (0, 0)
            assert rows == distinct == 1000, (rows, distinct)
            state_row = conn.execute(
                "SELECT status, pages_done, contacts_done FROM contact_import_state"
                " WHERE account_id = 'acme'").fetchone()
            assert state_row == ("complete", 40, 1000), "a page was counted twice"

            # Who wrote what: attempt 1 the first pages, the later attempts the rest, starting
            # after them: the resumed attempt did not start again from page 1.
            split: dict[int, int] = dict(conn.execute(
                "SELECT attempt, count(*) FROM contacts WHERE account_id = 'acme'"
                " GROUP BY attempt").fetchall())
            first = split.get(1, 0)
            assert 0 < first < 1000 and first % 25 == 0, f"rows by attempt: {split}"
            bounds = conn.execute(
                "SELECT max(contact_id) FILTER (WHERE attempt = 1),"
                "       min(contact_id) FILTER (WHERE attempt > 1)"
                "  FROM contacts WHERE account_id = 'acme'").fetchone()
            assert bounds is not None and bounds[0] < bounds[1], bounds
        # What the reader sees: where each attempt started (in the supervisors' output, and
        # from tide job logs for the last one), and the re-run doing nothing.
        log = (tmp_path / ".shell.log").read_text("utf-8", "replace")
        assert "attempt=1 attempt 1: starting at page 1 " in log, shell.output()
        resumed = f"attempt=2 attempt 2: starting at page {first // 25 + 1} "
        assert resumed in log, shell.output()
        assert f"stdout attempt {attempt}: starting at page " in log, shell.output()
        assert "acme already imported, nothing to do" in log, shell.output()
    finally:
        shell.stop()
