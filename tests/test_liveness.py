"""A dead holder, seen and handled (issue 36): supervisors' marks of life, silent holders in
tide, the doctor and the console's data, and the same-host rescue of a supervisor that is
provably gone (its lock file free, none of its processes left), with real processes."""

from __future__ import annotations

import fcntl
import os
import signal
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import psycopg
import pytest

import atlantis
from atlantis.store import liveness
from atlantis.supervisor import identity
from tests.conftest import BIN, Supervisor, events, job_row, run_tide, wait_for, wait_state

LIVE = ["--liveness-interval", "0.5s"]


def _run(tmp_path: Path) -> list[str]:
    """The options every supervisor of a test gets: a short liveness interval, and one
    runtime folder of the test's own (the lock files)."""
    return [*LIVE, "--runtime-dir", str(tmp_path / "run")]


def _long_job(db: psycopg.Connection[Any], key: str, heartbeat: float) -> int:
    """A tests.Sleep that sleeps an hour on its first attempt and 0.1 s on the next ones,
    with a lease of ``heartbeat`` seconds."""
    job_id = atlantis.enqueue(db, "tests.Sleep", {"key": key, "seconds": 3600,
                                                  "retry_seconds": 0.1})
    db.execute("UPDATE atlantis.jobs SET heartbeat = make_interval(secs => %s), "
               "timeout = interval '2 hours', max_attempts = 3 WHERE id = %s",
               (heartbeat, job_id))
    db.commit()
    return job_id


def _tide(db_url: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return run_tide(["--database-url", db_url, *args], check=check)


def _started(db: psycopg.Connection[Any], key: str, n: int) -> Callable[[], bool]:
    return lambda: sum(1 for e in events(db, key) if e[2] == "started") >= n


def _last_error(db: psycopg.Connection[Any], job_id: int) -> str:
    errors = job_row(db, job_id)["errors"]
    return str(errors[-1]["message"]) if errors else ""


def test_a_killed_supervisor_is_silent_and_one_restarted_on_its_host_runs_its_job_at_once(
        db: psycopg.Connection[Any], db_url: str, supervise: Callable[..., Supervisor],
        tmp_path: Path) -> None:
    first = supervise(*_run(tmp_path))
    job_id = _long_job(db, "killed", 60)
    wait_for(_started(db, "killed", 1), message="the first attempt")
    worker = job_row(db, job_id)["claimed_by"]
    lease_end = job_row(db, job_id)["claimed_until"]
    first.signal(signal.SIGKILL)
    first.wait()
    status = wait_for(lambda: (out := _tide(db_url, "job", "status", str(job_id)).stdout)
                      and "holder silent for" in out and out, 15,
                      message="tide job status saying the holder is silent")
    assert "lease ends in" in status
    doc = _json(_tide(db_url, "job", "status", str(job_id), "--json").stdout)
    assert doc["holder_silent"] is True and doc["holder_silent_seconds"] > 1
    assert 0 < doc["lease_ends_in_seconds"] <= 60
    workers = _tide(db_url, "worker", "list").stdout
    assert "silent for" in workers and worker in workers
    assert str(job_id) in _tide(db_url, "job", "list", "--orphaned").stdout
    doctor = _json(_tide(db_url, "db", "doctor", "--json", check=False).stdout)
    assert "silent_holders" in doctor["warnings"]
    assert worker in doctor["checks"]["silent_holders"]["summary"]
    # Restarted on the same host, with the default rescue interval (5 s): the job runs again
    # now (the first look, or the half-second looks just after a start), not after its 60 s
    # lease.
    supervise(*_run(tmp_path), "--rescue-interval", "5s")
    wait_for(_started(db, "killed", 2), 15, message="the job run again by the new supervisor")
    assert job_row(db, job_id)["started_at"] < lease_end
    wait_state(db, job_id, "complete")
    assert "gone: no process of it is left on its host" in _last_error(db, job_id)
    assert not (tmp_path / "run" / f"{worker}.lock").exists()
    assert _tide(db_url, "job", "list", "--orphaned").stdout.count("\n") <= 1


def test_a_stopped_supervisor_is_waited_for_until_its_lease_ends(
        db: psycopg.Connection[Any], db_url: str, supervise: Callable[..., Supervisor],
        tmp_path: Path) -> None:
    first = supervise(*_run(tmp_path))
    job_id = _long_job(db, "stopped", 4)
    wait_for(_started(db, "stopped", 1), message="the first attempt")
    worker = job_row(db, job_id)["claimed_by"]
    first.signal(signal.SIGSTOP)
    try:
        wait_for(lambda: "holder silent" in _tide(db_url, "job", "status", str(job_id)).stdout,
                 15, message="the stopped supervisor silent")
        cancel = _tide(db_url, "job", "cancel", str(job_id)).stdout
        assert "its holder silent for" in cancel and "when its lease ends" in cancel
        assert "its supervisor is stopping it" not in cancel
        supervise(*_run(tmp_path))  # same host: its lock is held, so it may be alive
        row = wait_state(db, job_id, "cancelled")
        # Released by the rescue of an expired lease, never as a supervisor gone.
        assert "lease expired" in str(row["errors"][-1]["message"])
        assert "gone" not in str(row["errors"][-1]["message"])
        assert row["errors"][-1]["worker"] == worker
    finally:
        first.signal(signal.SIGCONT)  # it finds its lease lost; the fixture stops it


def _forge(db: psycopg.Connection[Any], key: str, worker: str, *, host: str, boot: str | None,
           pid: int, lease: float = 60) -> int:
    """A job running under the worker row ``worker``, written by hand: a supervisor that no
    process of this test runs. One transaction: a supervisor running meanwhile never sees
    the job available (it claimed and finished one once, and the update then broke the
    finished row's check)."""
    with db.transaction():
        job_id = atlantis.enqueue(db, "tests.Echo", {"key": key})
        db.execute("INSERT INTO atlantis.workers (id, host, pid, queues, concurrency, "
                   "expires_at, seen_at, liveness_interval, boot_id) VALUES (%s, %s, %s, "
                   "'{tests}', 1, now() - interval '1 minute', now() - interval '90 seconds', "
                   "1, %s)", (worker, host, pid, boot))
        db.execute("UPDATE atlantis.jobs SET state = 'running', attempt = 1, max_attempts = 3, "
                   "claimed_by = %s, "
                   "claimed_until = now() + make_interval(secs => %s), started_at = now() "
                   "WHERE id = %s", (worker, lease, job_id))
    return job_id


def _ticks(db: psycopg.Connection[Any], n: int = 2) -> None:
    """Wait until the supervisor's rescue ran ``n`` more whole ticks: each of ``n`` rows
    with an expired lease (a worker nobody knows) rescued in turn."""
    for i in range(n):
        job_id = _forge(db, f"tick-{i}", f"ghost-{os.urandom(4).hex()}", host="ghost",
                        boot=None, pid=1, lease=-1)
        wait_state(db, job_id, "available", "complete", "dead")


def test_the_lock_file_decides_not_the_pid_and_no_process_of_it_may_be_left(
        db: psycopg.Connection[Any], supervise: Callable[..., Supervisor],
        tmp_path: Path) -> None:
    folder = tmp_path / "run"
    folder.mkdir(mode=0o700)
    host, boot = socket.gethostname(), identity.boot_id()
    # Its recorded pid is a live process (this one): the free lock file decides.
    reused = f"{host}:{os.getpid()}:0000aaaa"
    (folder / f"{reused}.lock").touch()
    reused_job = _forge(db, "reused", reused, host=host, boot=boot, pid=os.getpid())
    # Its pid is long gone, but its lock is held: it may be alive.
    held = f"{host}:999999:0000bbbb"
    held_fd = os.open(folder / f"{held}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(held_fd, fcntl.LOCK_EX)
    held_job = _forge(db, "held", held, host=host, boot=boot, pid=999999)
    # Its lock is free, but a process carrying its mark is left.
    left = f"{host}:999998:0000cccc"
    (folder / f"{left}.lock").touch()
    left_job = _forge(db, "left", left, host=host, boot=boot, pid=999998)
    leftover = subprocess.Popen(["sleep", "600"], env={**os.environ, "ATLANTIS_WORKER": left})
    # Another host (another boot of it): its free lock file is not its proof.
    other = f"{host}:999997:0000dddd"
    (folder / f"{other}.lock").touch()
    other_job = _forge(db, "other", other, host=host, boot="another-boot", pid=999997)
    try:
        supervise(*LIVE, "--runtime-dir", str(folder))
        wait_state(db, reused_job, "complete", timeout=15)
        _ticks(db)
        for job_id in (held_job, left_job, other_job):
            assert job_row(db, job_id)["state"] == "running"
        leftover.kill()
        leftover.wait()
        wait_state(db, left_job, "complete", timeout=15)
    finally:
        os.close(held_fd)
        if leftover.poll() is None:
            leftover.kill()
            leftover.wait()
    wait_state(db, held_job, "complete", timeout=15)  # its lock is free now
    assert job_row(db, other_job)["state"] == "running"
    assert "gone" in _last_error(db, reused_job)


def _unshare_works() -> str | None:
    """Why a supervisor cannot run in UTS and PID namespaces of its own here, or None."""
    try:
        done = subprocess.run(["unshare", "-u", "-p", "-f", "--mount-proc", "sh", "-c",
                               "hostname elsewhere && hostname"], capture_output=True,
                              text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unshare: {exc}"
    if done.returncode or done.stdout.strip() != "elsewhere":
        return f"unshare -u -p -f --mount-proc refused: {done.stderr.strip()}"
    return None


def test_a_supervisor_of_another_host_is_waited_for(
        db: psycopg.Connection[Any], db_url: str, supervise: Callable[..., Supervisor],
        tmp_path: Path) -> None:
    why = _unshare_works()
    if why:
        pytest.skip(f"needs UTS and PID namespaces (root): {why}")
    folder = tmp_path / "run"
    log = open(tmp_path / "elsewhere.log", "wb")  # noqa: SIM115 - closed below
    argv = ["--database-url", db_url, "--queue", "tests", "--app", "tests.apps.basic:registry",
            "--concurrency", "1", "--rescue-interval", "0.5s", *LIVE,
            "--runtime-dir", str(folder)]
    outer = subprocess.Popen(
        ["unshare", "-u", "-p", "-f", "--mount-proc", "sh", "-c",
         'hostname elsewhere && exec "$0" "$@"', str(BIN / "atlantis-supervise"), *argv],
        cwd=Path(__file__).resolve().parent.parent, stdout=log, stderr=subprocess.STDOUT)
    try:
        job_id = _long_job(db, "elsewhere", 4)
        wait_for(_started(db, "elsewhere", 1), 60, message="the first attempt, elsewhere")
        worker = job_row(db, job_id)["claimed_by"]
        assert worker.startswith("elsewhere:")
        assert (folder / f"{worker}.lock").exists()  # the same folder: only the host differs
        inner = wait_for(lambda: psutil.Process(outer.pid).children(), message="its init")
        inner[0].kill()  # PID 1 of its namespace: every process of it goes
        outer.wait(30)
        supervise(*_run(tmp_path))
        row = wait_state(db, job_id, "complete", timeout=30)
        assert row["attempt"] == 2
        assert "lease expired" in _last_error(db, job_id)
    finally:
        if outer.poll() is None:
            outer.kill()
            outer.wait()
        log.close()


def test_worker_rows_record_their_liveness_and_the_holder_reads(
        db: psycopg.Connection[Any], supervise: Callable[..., Supervisor],
        tmp_path: Path) -> None:
    # The worker row's full refresh an hour apart: only the marks of life move seen_at.
    sup = supervise(*_run(tmp_path), "--worker-refresh", "1h")
    job_id = _long_job(db, "alive", 60)
    wait_for(_started(db, "alive", 1), message="the first attempt")
    seen: set[Any] = set()

    def marks() -> bool:
        seen.add(db.execute("SELECT seen_at FROM atlantis.workers").fetchone())
        return len(seen) >= 3

    wait_for(marks, 15, message="three marks of life")
    row = db.execute("SELECT liveness_interval, boot_id FROM atlantis.workers").fetchone()
    assert row == (0.5, identity.boot_id())
    holder = liveness.job_holder(db, job_id)
    assert holder is not None and not holder.silent
    assert liveness.holder_document(holder)["holder_silent"] is False
    lock = tmp_path / "run" / f"{holder.worker}.lock"
    assert lock.exists()
    sup.stop(hurry=True)
    assert not lock.exists()


def test_a_runtime_folder_others_may_write_is_refused_with_a_warning(
        db: psycopg.Connection[Any], supervise: Callable[..., Supervisor],
        tmp_path: Path) -> None:
    folder = tmp_path / "open"
    folder.mkdir()
    folder.chmod(0o777)
    sup = supervise(*LIVE, "--runtime-dir", str(folder))
    job_id = atlantis.enqueue(db, "tests.Echo", {"key": "open"})
    db.commit()
    wait_state(db, job_id, "complete")  # it serves, holding no lock
    assert (f"runtime folder {folder} is not a folder of this user's own that only it may "
            "write; no same-host rescue") in sup.log()
    assert list(folder.iterdir()) == []


def _json(text: str) -> Any:
    import orjson

    return orjson.loads(text)
