"""The bad-input table (docs/bad-input.md): every row names the test that backs it, and the
tests here back the rows no other file covers.

The first test reads the table and checks that each referenced test exists, so the
document cannot name a test that was renamed or removed.
"""

from __future__ import annotations

import secrets
from typing import Any

import psutil
import psycopg

import atlantis
from tests.conftest import wait_for, wait_state

CONTAIN = "tests.apps.contain:registry"


def _survivors(marker: str) -> list[int]:
    """Live (not zombie) processes whose environment carries ``BOMB=marker``."""
    found = []
    for p in psutil.process_iter():
        try:
            if p.status() != psutil.STATUS_ZOMBIE and p.environ().get("BOMB") == marker:
                found.append(p.pid)
        except psutil.Error:
            continue
    return found


def test_a_fork_bomb_is_stopped_by_the_task_limit(
        db: psycopg.Connection[Any], supervise: Any) -> None:
    """A handler forking 2,500 processes is killed past 64 tasks, tree and all; the
    supervisor stays and runs the next job."""
    sup = supervise("--max-tasks-per-child", "64", queues=("contain",), app=CONTAIN)
    marker = f"bomb-{secrets.token_hex(4)}"
    bomb = atlantis.enqueue(db, "contain.Act", {"key": marker, "mode": "forkbomb"})
    row = wait_state(db, bomb, "dead")
    assert row["errors"][-1]["kind"] == "tasks", row["errors"]
    assert row["last_error"] == ("task limit (64 processes and threads) exceeded "
                                 "(--max-tasks-per-child)")
    wait_for(lambda: not _survivors(marker), message="no process of the fork bomb left")
    after = atlantis.enqueue(db, "contain.Act", {"key": "after", "mode": "ok"})
    wait_state(db, after, "complete")
    assert sup.proc.poll() is None
    assert "over --max-tasks-per-child; killing its whole tree" in sup.log()
