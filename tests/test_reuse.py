"""A reused child (``--isolation reuse``) starts every attempt with the process it started with.

Each test runs a real supervisor with one child, so consecutive jobs share that child: a
``proc.Look`` records what a handler sees of its process, then ``proc.Misuse`` changes
the process one way (tests/apps/process.py, ``MISUSES``) and returns, then another
``proc.Look`` must see the same process as the first one, in the same child, or, when the
change cannot be undone, in a fresh child, its own attempt never charged for it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import psycopg
import pytest

import atlantis
from tests.conftest import events, wait_for, wait_state

APP = "tests.apps.process:registry"


def _start(supervise: Any, *args: str) -> Any:
    return supervise(*args, queues=("proc",), app=APP, concurrency=1)


def _ended(db: psycopg.Connection[Any], sup: Any, job_id: int) -> dict[str, Any]:
    try:
        row = wait_state(db, job_id, "complete", "dead", "cancelled")
    except pytest.fail.Exception:
        pytest.fail(f"job {job_id} did not end; the supervisor's log:\n{sup.log()[-6000:]}")
    assert row["state"] == "complete", row["last_error"]
    assert row["attempt"] == 1 and row["errors"] == [], row["errors"]
    return row


def _seen(db: psycopg.Connection[Any], key: str) -> dict[str, Any]:
    """What the ``proc.Look`` of ``key`` saw."""
    state: dict[str, Any] = json.loads(events(db, key)[0][2])
    return state


def _around(db: psycopg.Connection[Any], supervise: Any, mode: str,
            *args: str) -> tuple[dict[str, Any], int, dict[str, Any], Any]:
    """A look, the misuse, a look, in this order in one child (lower priorities run first).

    Returns what the first look saw, the pid the misuse ran in, what the second saw, and
    the supervisor."""
    ids = [atlantis.enqueue(db, "proc.Look", {"key": "before", "seconds": 0}, priority=1),
           atlantis.enqueue(db, "proc.Misuse", {"key": mode, "mode": mode}, priority=2),
           atlantis.enqueue(db, "proc.Look", {"key": "after", "seconds": 0}, priority=3)]
    sup = _start(supervise, *args)
    for job_id in ids:  # each complete at its first attempt: none charged for another
        _ended(db, sup, job_id)
    [(_job, _attempt, seen, pid)] = events(db, mode)
    assert seen == f"pid={pid}"
    return _seen(db, "before"), pid, _seen(db, "after"), sup


def _stdout_lines(db: psycopg.Connection[Any], job_id: int) -> list[str]:
    return [r[0] for r in db.execute(
        "SELECT line FROM atlantis.logs WHERE job_id = %s AND stream = 'stdout' ORDER BY id",
        (job_id,)).fetchall()]


def test_closed_descriptors_0_to_2_are_given_back_to_the_next_job(
        db: psycopg.Connection[Any], supervise: Any) -> None:
    # The next job prints first thing: on closed descriptors it died of EBADF.
    before, pid, after, _sup = _around(db, supervise, "close-stdio")
    assert pid == before["pid"]
    assert after == before
    job_id = events(db, "after")[0][0]
    wait_for(lambda: _stdout_lines(db, job_id), message="the next job's output to be logged")
    assert _stdout_lines(db, job_id) == [f"look after pid={pid}"]


@pytest.mark.parametrize("mode", ["steal-sigterm", "steal-sigterm-in-c"])
def test_a_stolen_sigterm_is_taken_back_so_a_cancelled_job_sees_terminated(
        db: psycopg.Connection[Any], supervise: Any, mode: str) -> None:
    # A library's SIGTERM handler (or C's SIG_IGN) stayed: the next job, cancelled, never
    # saw its Terminated, its finally never ran, and the kill grace (2 s) ended it.
    misuse = atlantis.enqueue(db, "proc.Misuse", {"key": mode, "mode": mode})
    sup = _start(supervise, "--cancel-grace", "0.1s")
    _ended(db, sup, misuse)
    pid = events(db, mode)[0][3]
    job_id = atlantis.enqueue(db, "proc.Look", {"key": "victim", "seconds": 60})
    wait_for(lambda: events(db, "victim"), message="the next job to start")
    assert events(db, "victim")[0][3] == pid  # the same child
    atlantis.cancel(db, job_id)
    row = wait_state(db, job_id, "cancelled", "dead", "complete")
    assert row["state"] == "cancelled"
    wait_for(lambda: len(events(db, "victim")) == 2, message="the job's finally to run")
    assert events(db, "victim")[1][2] == "finally"
    assert [e["kind"] for e in row["errors"]] == ["terminated", "cancelled"], row["errors"]
    assert "SIGKILL" not in sup.log()


@pytest.mark.parametrize("mode", [
    "replace-streams",      # sys.stdout and sys.stderr replaced by StringIO
    "close-streams",        # sys.stdout and sys.stderr closed (print raised ValueError)
    "nonblocking-stdout",   # O_NONBLOCK on descriptor 1
    "signals",              # SIGCHLD and SIGINT ignored, SIGPIPE default, a SIGUSR1 handler
    "block-signals",        # SIGTERM, SIGINT, SIGUSR1 blocked by pthread_sigmask
    "pending-signal",       # SIGUSR1 blocked and raised: unblocked, it would kill the child
    "alarm",                # signal.alarm(600) left armed
    "itimers",              # ITIMER_VIRTUAL and ITIMER_PROF left running
    "cwd",                  # os.chdir(tempdir)
    "umask",                # os.umask(0o077)
    "environ",              # a variable added, PATH changed, one removed, TZ set (tzset)
    "rlimit",               # the soft limit of open files lowered
])
def test_what_a_handler_changed_in_its_process_is_put_back_for_the_next_job(
        db: psycopg.Connection[Any], supervise: Any, mode: str) -> None:
    before, pid, after, _sup = _around(db, supervise, mode)
    assert pid == before["pid"]
    assert after == before  # the same child, as it was


def _can_raise_a_hard_limit() -> bool:
    probe = ("import resource as r\n"
             "s, h = r.getrlimit(r.RLIMIT_NOFILE)\n"
             "r.setrlimit(r.RLIMIT_NOFILE, (256, 256))\n"
             "try:\n    r.setrlimit(r.RLIMIT_NOFILE, (s, h))\n"
             "except (ValueError, OSError):\n    raise SystemExit(1)\n")
    return subprocess.run([sys.executable, "-c", probe], check=False).returncode == 0


def test_a_child_that_cannot_restore_itself_is_replaced_before_the_next_job(
        db: psycopg.Connection[Any], supervise: Any) -> None:
    # Lowering a hard rlimit cannot be undone without CAP_SYS_RESOURCE. The next job
    # completes at its first attempt (_around): it never ran in the spoilt child.
    before, pid, after, sup = _around(db, supervise, "rlimit-hard")
    assert pid == before["pid"]
    assert after["nofile"] == before["nofile"]
    if _can_raise_a_hard_limit():  # privileged: put back in place
        assert after == before
        return
    assert after["pid"] != before["pid"]
    assert (f"job={events(db, 'rlimit-hard')[0][0]} attempt=1: the handler left the child unfit "
            "for another attempt: RLIMIT_NOFILE could not be put back to") in sup.log()
    assert "; replacing the child" in sup.log()
    same = ("streams", "handlers", "mask", "timers", "cwd", "umask")
    assert {k: after[k] for k in same} == {k: before[k] for k in same}


def test_a_child_whose_stdout_is_gone_for_good_is_replaced_before_the_next_job(
        db: psycopg.Connection[Any], supervise: Any) -> None:
    # The handler closed descriptor 1 and every copy of it: the pipe cannot be had again.
    before, pid, after, sup = _around(db, supervise, "lose-stdout")
    assert pid == before["pid"] != after["pid"]
    assert (f"job={events(db, 'lose-stdout')[0][0]} attempt=1: the handler left the child unfit "
            "for another attempt: descriptor 1 could not be put back") in sup.log()
    assert "; replacing the child" in sup.log()
    job_id = events(db, "after")[0][0]
    wait_for(lambda: _stdout_lines(db, job_id), message="the next job's output to be logged")
    assert _stdout_lines(db, job_id) == [f"look after pid={after['pid']}"]


def test_a_supervised_child_cannot_be_taken_out_of_its_session(
        db: psycopg.Connection[Any], supervise: Any) -> None:
    # Every child leads its own session, so the handler's os.setsid() fails (EPERM): a
    # timeout's killpg still reaches the child. (A child outside a supervisor, not leading
    # a session, is replaced instead: tests/test_child.py.)
    ids = [atlantis.enqueue(db, "proc.Look", {"key": "before", "seconds": 0}, priority=1),
           atlantis.enqueue(db, "proc.Misuse", {"key": "setsid", "mode": "setsid"}, priority=2),
           atlantis.enqueue(db, "proc.Look", {"key": "after", "seconds": 0}, priority=3)]
    sup = _start(supervise)
    row = wait_state(db, ids[1], "dead")
    assert row["last_error"].startswith("PermissionError: [Errno 1]")
    _ended(db, sup, ids[2])
    assert _seen(db, "after") == _seen(db, "before")
