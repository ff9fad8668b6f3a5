"""The supervisor as PID 1 of its own PID namespace (a container without an init process),
started with ``unshare --pid --fork --mount-proc`` (root only): its children do not take
it for dead, jobs run, the orphans re-parented to PID 1 are reaped (a handler's daemon too,
once it ends), and SIGTERM to PID 1 drains as in a container (docs/howto/containers.md)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import psutil
import psycopg
import pytest

import atlantis
from atlantis.app import load_app
from atlantis.store.migrate import sync
from tests.conftest import BIN, ROOT, job_row, wait_for, wait_state

APP = "tests.apps.pidone:registry"
UNSHARE = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"]


def _skip_unless_unshare() -> None:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) to start a PID namespace")
    done = subprocess.run([*UNSHARE, "true"], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        pytest.skip(f"unshare --pid is not permitted here: {done.stderr.strip()}")


def _ns_pid(pid: int) -> int:
    """The pid of host process ``pid`` inside its innermost PID namespace."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("NSpid:"):
                return int(line.split()[-1])
    raise AssertionError(f"no NSpid for {pid}")


def _zombies_of(init: psutil.Process) -> list[int]:
    """The namespace pids of the zombies PID 1 (``init``, a host process) has not reaped."""
    found = []
    for proc in init.children():
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                found.append(_ns_pid(proc.pid))
        except (psutil.NoSuchProcess, OSError):
            continue
    return found


@pytest.mark.parametrize("isolation", ["reuse", "fresh"])
def test_as_pid_1_jobs_run_and_orphans_are_reaped(
        db: psycopg.Connection[Any], db_url: str, tmp_path: Path, isolation: str) -> None:
    _skip_unless_unshare()
    registry = load_app(APP)
    sync(db, list(registry.decls.values()), list(registry.workflows.values()))
    marker = tmp_path / "orphan.pid"
    job_id = atlantis.enqueue(db, "pidone.Orphan", {"path": str(marker)})
    log = (tmp_path / "supervisor.log").open("wb")
    proc = subprocess.Popen(
        [*UNSHARE, str(BIN / "atlantis-supervise"), "--database-url", db_url,
         "--queue", "pidone", "--app", APP, "--isolation", isolation, "--concurrency", "1",
         "--poll-interval", "0.2s", "--drain-timeout", "5s", "--kill-grace", "1s"],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        init: psutil.Process = wait_for(
            lambda: next(iter(psutil.Process(proc.pid).children()), None),
            message="PID 1 of the namespace")
        assert _ns_pid(init.pid) == 1
        wait_state(db, job_id, "complete")
        orphan = int(marker.read_text())
        wait_for(lambda: orphan not in _zombies_of(init), message="the orphan reaped")
        # PID 1 passes a stop on to the supervisor, which drains and exits 0, and so does it.
        os.kill(init.pid, signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()  # --kill-child: the namespace's PID 1, and so all of it, dies too
            proc.wait(30)
        log.close()
    text = (tmp_path / "supervisor.log").read_text("utf-8", "replace")
    assert "child exited before it was ready" not in text, text


def test_as_pid_1_a_daemon_is_reaped_and_sigterm_drains(
        db: psycopg.Connection[Any], db_url: str, tmp_path: Path) -> None:
    """As in a container (docs/howto/containers.md): a handler's daemon, left running after
    its attempt, is PID 1's child until it ends, then reaped; PID 1's only child is then the
    supervisor again. SIGTERM to PID 1 (what a container runtime sends) drains: the attempt
    in flight finishes, and the exit status is 0."""
    _skip_unless_unshare()
    registry = load_app(APP)
    sync(db, list(registry.decls.values()), list(registry.workflows.values()))
    release, hold = tmp_path / "release", tmp_path / "hold"
    daemon_id = atlantis.enqueue(db, "pidone.Daemon", {"release": str(release)})
    log_path = tmp_path / "supervisor.log"
    log = log_path.open("wb")
    proc = subprocess.Popen(
        [*UNSHARE, str(BIN / "atlantis-supervise"), "--database-url", db_url,
         "--queue", "pidone", "--app", APP, "--concurrency", "1", "--poll-interval", "0.2s",
         "--drain-timeout", "30s", "--kill-grace", "1s"],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        init: psutil.Process = wait_for(
            lambda: next(iter(psutil.Process(proc.pid).children()), None),
            message="PID 1 of the namespace")
        supervisor = wait_for(lambda: next(iter(init.children()), None),
                              message="the supervisor, PID 1's child")
        wait_state(db, daemon_id, "complete")

        def the_daemon() -> psutil.Process | None:
            for p in init.children():
                try:
                    if str(release) in " ".join(p.cmdline()):
                        return p
                except psutil.Error:
                    continue
            return None

        daemon: psutil.Process = wait_for(the_daemon, message="the daemon, PID 1's child")
        release.touch()
        wait_for(lambda: not daemon.is_running(), message="the daemon reaped by PID 1")
        assert _zombies_of(init) == []
        assert init.children() == [supervisor], "PID 1 has a child other than the supervisor"

        hold_id = atlantis.enqueue(db, "pidone.Hold", {"path": str(hold)})
        wait_state(db, hold_id, "running")
        # Running in its child, not only claimed (a row claimed ahead is given back unspent
        # by a drain, which then has no attempt in flight to wait for).
        wait_for(lambda: (tmp_path / "hold.started").exists(), message="the attempt to start")
        os.kill(init.pid, signal.SIGTERM)
        wait_for(lambda: "draining: 1 attempts in flight" in log_path.read_text("utf-8", "replace"),
                 message="the drain")
        assert proc.poll() is None and job_row(db, hold_id)["state"] == "running"
        hold.touch()
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()  # --kill-child: the namespace's PID 1, and so all of it, dies too
            proc.wait(30)
        log.close()
    assert job_row(db, hold_id)["state"] == "complete"
    assert "still running at the end of the drain" not in log_path.read_text("utf-8", "replace")
    # The daemon's fork of the child ran threading's after-fork hooks without an error (the
    # child's watchdog thread once overrode Thread._stop, and every fork printed a TypeError).
    assert "_after_fork" not in log_path.read_text("utf-8", "replace")
