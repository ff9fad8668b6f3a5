"""`tide workflow start|status|list|cancel|retry` end to end, `tide job` on a workflow's row,
and the supervisor's workflow gauges: real PostgreSQL, ``tide`` in-process (click's runner), and real
supervisors where the workflow has to run.

The workflows are the console test app's (tests/apps/console_app.atl, synced into every
test database): console.Quick returns at once, console.Fail raises.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from typing import Any

import orjson
import psycopg

from atlantis.cli.common import operator_name
from atlantis.store.workflows import (
    WorkflowStep,
    dependency_order,
    workflow_counts,
    workflow_document,
)
from tests.conftest import free_port, scrape_metrics, wait_for
from tests.test_roles import login
from tests.test_tide import tide
from tests.test_workflow_store import rows, run

__all__ = ["login"]  # a fixture used here

APP = "tests.apps.console_app:registry"
STEP_KEYS = {"step", "job", "job_id", "compensation", "state", "attempt", "result",
             "started_at", "finished_at"}


def start(db_url: str, name: str, **args: Any) -> int:
    out = tide(db_url, "workflow", "start", name, "--args", orjson.dumps(args).decode())
    assert out.stdout.strip().isdigit(), out.stdout
    return int(out.stdout)


def status(db_url: str, workflow_id: int) -> dict[str, Any]:
    doc: dict[str, Any] = orjson.loads(
        tide(db_url, "workflow", "status", str(workflow_id), "--json").stdout)
    return doc


def said(out: subprocess.CompletedProcess[str]) -> str:
    """What a command said on stderr, past the line naming the embedded database."""
    lines = [ln for ln in out.stderr.splitlines() if not ln.startswith("atlantis: using ")]
    assert len(lines) == 1, out.stderr
    return lines[0]


def wait_workflow(db_url: str, workflow_id: int, *states: str) -> dict[str, Any]:
    found: dict[str, Any] = wait_for(
        lambda: (doc := status(db_url, workflow_id))["state"] in states and doc,
        timeout=60, message=f"workflow {workflow_id} in {states}")
    return found


def test_start_then_status_in_dependency_order_and_list(db: psycopg.Connection[Any],
                                                         db_url: str) -> None:
    workflow_id = start(db_url, "console.Diamond", account_id="acme")
    doc = status(db_url, workflow_id)
    assert set(doc) >= {"id", "workflow", "state", "args", "created_at", "finished_at",
                        "steps"}
    assert (doc["id"], doc["workflow"], doc["state"], doc["args"]) == (
        workflow_id, "console.Diamond", "running", {"account_id": "acme"})
    assert doc["finished_at"] is None
    # first; then left and right (both after first: right was declared first); then last.
    assert [s["step"] for s in doc["steps"]] == ["first", "right", "left", "last"]
    assert all(set(s) >= STEP_KEYS for s in doc["steps"])
    first, *rest = doc["steps"]
    assert first["state"] == "available" and first["job_id"] is not None
    assert first["job"] == "console.Quick" and first["compensation"] is False
    assert all(s["state"] is None and s["job_id"] is None for s in rest)
    assert doc["steps"][3]["after"] == ["left", "right"]
    stored = workflow_document(db, workflow_id)
    assert stored is not None and [s["step"] for s in stored["steps"]] == [
        "first", "right", "left", "last"]

    human = tide(db_url, "workflow", "status", str(workflow_id)).stdout
    assert f"workflow {workflow_id}  console.Diamond  running" in human
    lines = human.splitlines()
    order = [next(i for i, ln in enumerate(lines) if f" {name} " in f" {ln} ")
             for name in ("first", "└─ right", "└─ left", "└─ last")]
    assert order == sorted(order), human
    assert "waiting" in human and "after left, right" in human
    assert "no compensation has run" in human

    listed = orjson.loads(tide(db_url, "workflow", "list", "--json").stdout)
    assert [(w["id"], w["state"], w["steps"], w["steps_complete"]) for w in listed] == [
        (workflow_id, "running", 4, 0)]
    assert orjson.loads(tide(db_url, "workflow", "list", "--state", "complete",
                             "--json").stdout) == []
    assert "console.Diamond" in tide(db_url, "workflow", "list").stdout
    assert workflow_counts(db)["running"] == 1


def test_unknown_ids_and_bad_input_are_one_line_and_exit_1(db: psycopg.Connection[Any],
                                                          db_url: str) -> None:
    for verb in ("status", "cancel", "retry", "dismiss"):
        out = tide(db_url, "workflow", verb, "999999", check=False)
        assert (out.returncode, said(out), out.stdout) == (
            1, "tide: no workflow with id 999999", "")
    unknown = tide(db_url, "workflow", "start", "console.Nothing", check=False)
    assert unknown.returncode == 1 and said(unknown).startswith("tide: ")
    assert "console.Nothing" in said(unknown) and unknown.stdout == ""
    bad = tide(db_url, "workflow", "start", "console.Diamond", "--args", "[1]", check=False)
    assert (bad.returncode, said(bad)) == (1, "tide: --args must be a JSON object")
    missing = tide(db_url, "workflow", "start", "console.Diamond", check=False)
    assert missing.returncode == 1 and "account_id" in said(missing)
    assert db.execute("SELECT count(*) FROM atlantis.workflows").fetchone() == (0,)
    state = tide(db_url, "workflow", "list", "--state", "bogus", check=False)
    assert state.returncode == 2


def test_cancel_before_a_step_ran_and_job_commands_on_a_step(db: psycopg.Connection[Any],
                                                             db_url: str) -> None:
    workflow_id = start(db_url, "console.Doomed", account_id="acme", message="boom")
    step_row = status(db_url, workflow_id)["steps"][0]["job_id"]
    job = tide(db_url, "job", "status", str(step_row)).stdout
    assert f"workflow   {workflow_id}  step create" in job
    job_doc = orjson.loads(tide(db_url, "job", "status", str(step_row), "--json").stdout)
    assert (job_doc["workflow_id"], job_doc["step"], job_doc["compensation"]) == (
        workflow_id, "create", False)

    out = tide(db_url, "workflow", "cancel", str(workflow_id))
    assert out.stdout.startswith(f"workflow {workflow_id} ")
    doc = status(db_url, workflow_id)
    # Nothing had started: nothing to compensate, and the waiting step is cancelled.
    assert doc["state"] == "cancelled" and doc["finished_at"] is not None
    assert [(s["step"], s["state"], s["compensation"]) for s in doc["steps"]] == [
        ("create", "cancelled", False), ("welcome", None, False)]
    assert "never ran" in tide(db_url, "workflow", "status", str(workflow_id)).stdout
    again = tide(db_url, "workflow", "cancel", str(workflow_id), check=False)
    assert (again.returncode, said(again)) == (
        1, f"tide: workflow {workflow_id} is cancelled; nothing to cancel")
    refused = tide(db_url, "job", "retry", str(step_row), check=False)
    assert refused.returncode == 1 and said(refused).startswith("tide: ")
    assert f"use tide workflow retry {workflow_id}" in said(refused)
    not_failed = tide(db_url, "workflow", "retry", str(workflow_id), check=False)
    assert not_failed.returncode == 1 and "compensation_failed" in said(not_failed)

    # A step's row cancelled as a job cancels its whole workflow, and says so.
    other = start(db_url, "console.Doomed", account_id="beta", message="boom")
    other_row = status(db_url, other)["steps"][0]["job_id"]
    said_cancel = tide(db_url, "job", "cancel", str(other_row)).stdout
    assert f"is step create of workflow {other}: the workflow is cancelled" in said_cancel
    assert status(db_url, other)["state"] == "cancelled"


def test_a_failed_step_compensates_and_the_gauges_count_workflows(
        db: psycopg.Connection[Any], db_url: str, supervise: Any) -> None:
    doomed = start(db_url, "console.Doomed", account_id="acme", message="smtp down")
    bad_undo = start(db_url, "console.BadUndo", account_id="acme", message="no undo")
    port = free_port()
    supervise("--metrics-port", str(port), "--worker-refresh", "0.3s", queues=("console",),
              app=APP, concurrency=2)
    doc = wait_workflow(db_url, doomed, "failed")
    assert [(s["step"], s["job"], s["state"], s["compensation"]) for s in doc["steps"]] == [
        ("create", "console.Quick", "complete", False),
        ("welcome", "console.Fail", "dead", False),
        ("create", "console.Quick", "complete", True)]
    assert doc["failed_step"] == "welcome" and "smtp down" in (doc["error"] or "")
    assert [s["result"] for s in doc["steps"]] == [
        {"account": "acme", "step": "create"}, None, {"account": "acme", "step": "create"}]
    assert all(s["attempt"] == 1 and s["started_at"] and s["finished_at"] for s in doc["steps"])
    human = tide(db_url, "workflow", "status", str(doomed)).stdout
    trail = human.split("compensations, in the order they started:")
    assert len(trail) == 2 and "create" in trail[1] and "complete" in trail[1]
    assert "step welcome died" in human and "smtp down" in human
    assert '"account":"acme"' in human  # the result, short

    failed = wait_workflow(db_url, bad_undo, "compensation_failed")
    assert [(s["step"], s["state"], s["compensation"]) for s in failed["steps"]] == [
        ("create", "complete", False), ("welcome", "dead", False), ("create", "dead", True)]
    listed = orjson.loads(tide(db_url, "workflow", "list", "--state", "compensation_failed",
                               "--json").stdout)
    assert [w["id"] for w in listed] == [bad_undo]
    wait_for(lambda: 'atlantis_workflows{state="compensation_failed"} 1.0' in (t := scrape_metrics(port))
             and 'atlantis_workflows{state="failed"} 1.0' in t
             and 'atlantis_workflows{state="running"} 0.0' in t,
             message="the workflow gauges")

    out = tide(db_url, "workflow", "retry", str(bad_undo))
    assert out.stdout.startswith(f"workflow {bad_undo} is ")
    # console.Fail fails again: the rerun compensation dies once more.
    before = [s for s in failed["steps"] if s["compensation"]]

    def ended_again() -> dict[str, Any] | None:
        d = status(db_url, bad_undo)
        undo = [s for s in d["steps"] if s["compensation"]]
        moved = len(undo) > len(before) or undo[-1]["finished_at"] != before[-1]["finished_at"]
        return d if moved and d["state"] == "compensation_failed" else None

    again = wait_for(ended_again, timeout=60, message="the retried compensation to end")
    assert [(s["step"], s["compensation"]) for s in again["steps"]][:2] == [
        ("create", False), ("welcome", False)]


def test_a_reader_reads_workflows_and_an_operator_cancels_them(
        db: psycopg.Connection[Any], db_url: str, login: Callable[[str], str]) -> None:
    workflow_id = start(db_url, "console.Doomed", account_id="acme", message="boom")
    reader = login("atlantis_reader")
    for args in (("status", str(workflow_id)), ("status", str(workflow_id), "--json"),
                 ("list",), ("list", "--json")):
        out = tide(reader, "workflow", *args, check=False)
        assert out.returncode == 0, (args, out.stderr)
    denied = tide(reader, "workflow", "cancel", str(workflow_id), check=False)
    assert denied.returncode == 1 and "permission denied" in said(denied)
    assert status(db_url, workflow_id)["state"] == "running"
    operator = login("atlantis_operator")
    tide(operator, "workflow", "cancel", str(workflow_id))
    assert status(db_url, workflow_id)["state"] == "cancelled"


def owes_its_undo(db: psycopg.Connection[Any], db_url: str, account_id: str) -> int:
    """A console.BadUndo (declared ``unique (account_id)`` here) whose welcome step and whose
    undo of create died, driven by SQL as supervisors would: compensation_failed."""
    db.execute("UPDATE atlantis.workflow_types SET unique_fields = '{account_id}'"
               " WHERE workflow = 'console.BadUndo'")
    workflow_id = start(db_url, "console.BadUndo", account_id=account_id, message="boom")
    run(db, rows(db, workflow_id)["create", False]["id"])
    run(db, rows(db, workflow_id)["welcome", False]["id"], "dead")
    run(db, rows(db, workflow_id)["create", True]["id"], "dead")
    assert status(db_url, workflow_id)["state"] == "compensation_failed"
    return workflow_id


def test_a_workflow_owing_its_undo_keeps_its_key_until_tide_workflow_dismiss(
        db: psycopg.Connection[Any], db_url: str) -> None:
    first = owes_its_undo(db, db_url, "acme")
    assert start(db_url, "console.BadUndo", account_id="acme", message="again") == first
    doc = status(db_url, first)
    assert (doc["dismissed_at"], doc["dismissed_by"]) == (None, None)
    out = tide(db_url, "workflow", "dismiss", str(first))
    assert out.stdout == (f"workflow {first} dismissed: its undo is given up and its unique "
                          "key is free\n")
    doc = status(db_url, first)
    assert doc["state"] == "compensation_failed" and doc["dismissed_at"] is not None
    assert doc["dismissed_by"] == operator_name()
    assert "dismissed" in tide(db_url, "workflow", "status", str(first)).stdout
    again = tide(db_url, "workflow", "dismiss", str(first))
    assert again.stdout.startswith(f"workflow {first} was dismissed already, by ")

    second = start(db_url, "console.BadUndo", account_id="acme", message="again")
    assert second != first
    retry = tide(db_url, "workflow", "retry", str(first), check=False)
    assert (retry.returncode, said(retry), retry.stdout) == (
        1, f'tide: workflow {second} (console.BadUndo) holds the unique key ["acme"] now; '
           f"retry workflow {first} once workflow {second} has finished or been dismissed", "")
    refused = tide(db_url, "workflow", "dismiss", str(second), check=False)
    assert (refused.returncode, said(refused)) == (
        1, f"tide: workflow {second} is running: only a compensation_failed workflow can be "
           "dismissed")


def _step(name: str, position: int, *after: str) -> WorkflowStep:
    return WorkflowStep(step=name, position=position, job="j", after=list(after),
                        compensate=None, job_id=None, compensation=False, state=None,
                        attempt=None, max_attempts=None, progress_pct=None, progress_msg=None,
                        result=None, created_at=None, started_at=None, finished_at=None,
                        last_error=None)


def test_dependency_order_puts_each_step_after_its_dependencies_then_declaration() -> None:
    steps = [_step("d", 0, "b", "c"), _step("c", 1, "a"), _step("b", 2, "a"), _step("a", 3),
             _step("e", 4)]
    assert [s.step for s in dependency_order(steps)] == ["a", "c", "b", "d", "e"]
    # A graph the checker refuses (a cycle, an unknown name) still shows every step once.
    odd = [_step("x", 0, "y"), _step("y", 1, "x"), _step("z", 2, "nowhere")]
    assert [s.step for s in dependency_order(odd)] == ["z", "x", "y"]
