"""The onboarding example (examples/onboarding): the contacts import as a workflow's step.

The demo itself (``./scripts/demo --workflow``) runs on this test's database with its own
real supervisor: both runs end as it says, its checks pass, and they fail on the other run.
Then the handlers under the suite's supervisor: a compensation tolerates a step that did
nothing, and a cancel during the import compensates the import and the account.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import atlantis
from atlantis.store import migrate, sync
from atlantis.store.database import ENV_URL
from examples.contacts.app import CRM_URL_ENV
from examples.contacts.crm import FakeCRM
from examples.contacts.demo import DemoError
from examples.onboarding import demo
from examples.onboarding.app import WORKFLOW, ensure_schema, registry
from tests.conftest import wait_for

APP = "examples.onboarding.app:registry"


def workflow_state(conn: psycopg.Connection[Any], workflow_id: int, *states: str,
                   timeout: float = 30.0) -> demo.WorkflowView:
    def check() -> demo.WorkflowView | None:
        view = demo.read_workflow(conn, workflow_id)
        return view if view.state in states else None

    found: demo.WorkflowView = wait_for(check, timeout,
                                        message=f"workflow {workflow_id} in {states}")
    return found


def journal(conn: psycopg.Connection[Any], workflow_id: int) -> list[tuple[str, Any]]:
    """The effects recorded under each idempotency key, in the order they happened."""
    return [(str(r[0]), r[1]) for r in conn.execute(
        "SELECT idempotency_key, detail FROM onboarding_journal WHERE workflow_id = %s"
        " ORDER BY at", (workflow_id,)).fetchall()]


def test_the_demo_runs_both_workflows_and_verifies_them(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv(ENV_URL, db_url)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the supervisor's log goes here
    assert demo.main(["--seconds", "1", "--deadline", "90"]) == 0
    out = capsys.readouterr().out
    assert "FAIL" not in out
    assert re.search(r"demo: workflow \d+ complete, workflow \d+ compensated; verified", out)

    with psycopg.connect(db_url, autocommit=True) as conn:
        ids = [int(r[0]) for r in conn.execute(
            "SELECT id FROM atlantis.workflows WHERE workflow = %s ORDER BY id", (WORKFLOW,))]
        assert len(ids) == 2
        completed, compensated = ids
        # Each step's effect once under its key; the undos newest step first.
        assert [key for key, _ in journal(conn, completed)] == [
            f"{completed}:create", f"{completed}:import", f"{completed}:welcome"]
        trail = journal(conn, compensated)
        assert [key for key, _ in trail] == [
            f"{compensated}:create", f"{compensated}:import",
            f"{compensated}:import:compensate", f"{compensated}:create:compensate"]
        contacts = trail[1][1]["contacts"]
        assert trail[2][1] == {"purged": contacts, "imported": contacts}
        assert trail[3][1] == {"deleted": True, "step_completed": True}
        # The compensations saw why they ran (ctx.compensating), and said so in their logs.
        view = demo.read_workflow(conn, compensated)
        undo = [r.id for r in view.rows if r.compensation]
        logs = demo.compensation_logs(conn, undo, wait=20)
        assert len(logs) == 2
        assert all("Compensating(step='welcome'" in line for _, line in logs)
        assert "undoing step import" in logs[0][1] and "undoing step create" in logs[1][1]

        # The demo's checks are real: each refuses the other run.
        with pytest.raises(DemoError, match="the workflow is complete"):
            demo.verify_completed(conn, compensated, FakeCRM())
        with pytest.raises(DemoError, match="the workflow failed at step welcome"):
            demo.verify_compensated(conn, completed)
    assert "demo: FAILED" not in capsys.readouterr().err


# ---- the handlers under the suite's supervisor ---------------------------------------------------

@pytest.fixture
def onboarding_db(db_url: str) -> Iterator[psycopg.Connection[Any]]:
    """The test database with the example's jobs and workflow synced and its tables made."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        migrate(conn)
        sync(conn, list(registry.decls.values()), list(registry.workflows.values()))
        ensure_schema(conn)
        yield conn


def start_worker(supervise: Any, crm: FakeCRM) -> Any:
    return supervise(queues=tuple(sorted(registry.queues())), app=APP, concurrency=2,
                     env={CRM_URL_ENV: crm.url})


def start(conn: psycopg.Connection[Any], account: str) -> int:
    with conn.transaction():
        return atlantis.start_workflow(conn, WORKFLOW, {"account_id": account})


def test_a_compensation_tolerates_a_step_that_did_nothing(
    onboarding_db: psycopg.Connection[Any], supervise: Any
) -> None:
    """An account that exists already (another owner) discards the create step: it started,
    so its compensation runs, and deletes nothing that is not its own."""
    conn = onboarding_db
    conn.execute("INSERT INTO accounts (account_id, created_by) VALUES ('taken', 'someone')")
    with FakeCRM(page_delay=0) as crm:
        workflow_id = start(conn, "taken")
        start_worker(supervise, crm)
        view = workflow_state(conn, workflow_id, "failed", "compensation_failed", "complete")
    assert view.state == "failed" and view.failed_step == "create"
    assert [(r.label, r.state) for r in view.rows] == [
        ("create", "dead"), ("undo create", "complete")]
    assert "account taken already exists (created by someone)" in (view.error or "")
    assert view.rows[1].result == {"deleted": False, "step_completed": False}
    assert view.waiting == ["import", "welcome"]
    assert conn.execute("SELECT created_by FROM accounts WHERE account_id = 'taken'"
                        ).fetchone() == ("someone",)


def test_a_cancel_during_the_import_compensates_it_and_the_account(
    onboarding_db: psycopg.Connection[Any], supervise: Any
) -> None:
    conn = onboarding_db
    with FakeCRM(page_delay=0.2, contacts_per_account=3000) as crm:
        workflow_id = start(conn, "slow")
        start_worker(supervise, crm)

        def importing() -> bool:
            row = conn.execute("SELECT contacts_done FROM contact_import_state"
                               " WHERE account_id = 'slow'").fetchone()
            return row is not None and row[0] >= 100

        wait_for(importing, timeout=30, message="the import's first page stored")
        assert atlantis.cancel_workflow(conn, workflow_id, by="tester") == "compensating"
        view = workflow_state(conn, workflow_id, "cancelled", "compensation_failed")
    assert view.state == "cancelled" and view.cause == "cancelled"
    assert [(r.label, r.state) for r in view.rows] == [
        ("create", "complete"), ("import", "cancelled"),
        ("undo import", "complete"), ("undo create", "complete")]
    assert view.waiting == ["welcome"]
    undo_import = view.row("import", compensation=True)
    undo_create = view.row("create", compensation=True)
    assert undo_import and undo_create and undo_import.finished_at and undo_create.started_at
    assert undo_import.finished_at <= undo_create.started_at
    # The import stopped after some pages: its result is null, and what it stored is purged.
    assert undo_import.result is not None and undo_import.result["imported"] is None
    assert undo_import.result["purged"] >= 100
    for table in ("accounts", "contacts", "contact_import_state"):
        assert conn.execute(f"SELECT count(*) FROM {table} WHERE account_id = 'slow'"  # noqa: S608
                            ).fetchone() == (0,)
    logs = demo.compensation_logs(conn, [undo_import.id, undo_create.id], wait=20)
    assert len(logs) == 2
    assert all("the workflow was cancelled or timed out" in line
               and "Compensating(step=None" in line for _, line in logs)
