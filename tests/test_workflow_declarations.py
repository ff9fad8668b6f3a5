"""`workflow` blocks in `.atl` files: the grammar, the checks (each refusal at
file:line:column, naming the token), the Registry's cross-file checks, the sync into
``atlantis.workflow_types`` and the typed ``start_*`` functions of `tide gen`."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

import atlantis
from atlantis.app import load_app
from atlantis.declarations import (
    Field,
    StepDecl,
    WorkflowDecl,
    parse_atl,
    parse_atl_file,
    read_atl,
)
from atlantis.declarations.codegen import generate_module
from atlantis.errors import DeclarationError
from atlantis.store import sync
from atlantis.supervisor.appload import workflow_from_dict
from tests.conftest import BIN, ROOT
from tests.docs import bad_input_text

REPO = Path(atlantis.__file__).resolve().parent.parent

# The issue's example, verbatim.
ISSUE_EXAMPLE = """\
job CreateAccount in onboarding {
  args { account_id varchar(64) not null }
  retries 3
}
job DeleteAccount in onboarding {
  args { account_id varchar(64) not null }
  retries 10
}
job PurgeContacts in directory {
  args { account_id varchar(64) not null }
  retries 10
}
job SendWelcome in onboarding {
  args { account_id varchar(64) not null }
}

workflow Onboard in onboarding {
  args { account_id varchar(64) not null }
  step create  CreateAccount                                   compensate DeleteAccount
  step import  directory.ImportContacts  after create          compensate directory.PurgeContacts
  step welcome SendWelcome               after import
  timeout 6h
}
"""

# The job the example's `import` step runs, from the contacts example.
CONTACTS = (REPO / "examples" / "contacts" / "jobs.atl").read_text("utf-8")

ACCOUNT = "account_id varchar(64) not null"
ACCOUNT_FIELD = Field("account_id", "varchar", 64, not_null=True)


def onboard_steps() -> tuple[StepDecl, ...]:
    return (
        StepDecl("create", "onboarding.CreateAccount", (), "onboarding.DeleteAccount"),
        StepDecl("import", "directory.ImportContacts", ("create",), "directory.PurgeContacts"),
        StepDecl("welcome", "onboarding.SendWelcome", ("import",), None),
    )


def test_the_issue_example_parses_verbatim() -> None:
    found = read_atl(ISSUE_EXAMPLE, "onboarding.atl")
    assert [j.qualified_name for j in found.jobs] == [
        "onboarding.CreateAccount", "onboarding.DeleteAccount", "directory.PurgeContacts",
        "onboarding.SendWelcome",
    ]  # fmt: skip
    (onboard,) = found.workflows
    assert onboard == WorkflowDecl(
        "Onboard", "onboarding", (ACCOUNT_FIELD,), onboard_steps(), timeout=6 * 3600.0
    )
    assert onboard.qualified_name == "onboarding.Onboard"
    assert onboard.source == "onboarding.atl:17"
    create, imports, welcome = onboard.steps
    assert (create.source, create.job_at, create.compensate_at) == (
        "onboarding.atl:19:8", "onboarding.atl:19:16", "onboarding.atl:19:75",
    )  # fmt: skip
    assert imports.job_at == "onboarding.atl:20:16" and welcome.compensate_at == ""
    # parse_atl and parse_atl_file keep answering with the jobs alone.
    assert parse_atl(ISSUE_EXAMPLE) == found.jobs


def test_the_workflow_types_row() -> None:
    (onboard,) = read_atl(ISSUE_EXAMPLE, "onboarding.atl").workflows
    assert onboard.to_json() == {
        "workflow": "onboarding.Onboard",
        "fields": [ACCOUNT_FIELD.to_json()],
        "unique_fields": [],
        "timeout": 21600.0,
        "steps": [
            {"step": "create", "job": "onboarding.CreateAccount", "after": [],
             "compensate": "onboarding.DeleteAccount"},
            {"step": "import", "job": "directory.ImportContacts", "after": ["create"],
             "compensate": "directory.PurgeContacts"},
            {"step": "welcome", "job": "onboarding.SendWelcome", "after": ["import"],
             "compensate": None},
        ],
        "source": "onboarding.atl:17",
    }  # fmt: skip


def test_the_registry_reads_workflows_across_files(tmp_path: Path) -> None:
    (tmp_path / "onboarding.atl").write_text(ISSUE_EXAMPLE, "utf-8")
    (tmp_path / "contacts.atl").write_text(CONTACTS, "utf-8")
    registry = atlantis.Registry.from_atl(tmp_path / "onboarding.atl", tmp_path / "contacts.atl")
    assert list(registry.workflows) == ["onboarding.Onboard"]
    assert registry.workflows["onboarding.Onboard"].steps == onboard_steps()
    assert "directory.ImportContacts" in registry.decls
    assert parse_atl_file(tmp_path / "onboarding.atl") == read_atl(ISSUE_EXAMPLE).jobs
    # Alone, the example names a job no file declares.
    with pytest.raises(DeclarationError) as info:
        atlantis.Registry.from_atl(tmp_path / "onboarding.atl")
    assert str(info.value) == (
        f"{tmp_path / 'onboarding.atl'}:20:16: step 'import' of workflow onboarding.Onboard "
        "runs job directory.ImportContacts, which is not declared (declared in directory: "
        "directory.PurgeContacts)"
    )


def test_after_a_b_waits_for_both_and_unqualified_jobs_are_the_workflows_own() -> None:
    text = """\
workflow Fan in shop {
  args { order_id bigint not null, note text }
  step a Pick
  step b other.Pack,  step c Label after a,
                                     b
  step d Ship after a, b, c compensate Unship
  unique (order_id)
}
"""
    (fan,) = read_atl(text, "shop.atl").workflows
    assert [(s.name, s.job, s.after, s.compensate) for s in fan.steps] == [
        ("a", "shop.Pick", (), None),
        ("b", "other.Pack", (), None),
        ("c", "shop.Label", ("a", "b"), None),
        ("d", "shop.Ship", ("a", "b", "c"), "shop.Unship"),
    ]
    assert fan.unique == ("order_id",) and fan.timeout is None
    assert fan.to_json()["timeout"] is None


def test_keywords_of_workflows_stay_names_elsewhere() -> None:
    """`step`, `after`, `compensate` and `workflow` may name fields, and steps too."""
    text = """\
job after in ns { args { step int, after int, compensate int, workflow int } }
workflow W in ns {
  args { step int, after int, compensate int, workflow int }
  step after after
  step step after after after
}
"""
    found = read_atl(text, "kw.atl")
    atlantis.Registry(found.jobs, found.workflows)
    assert [(s.name, s.job, s.after) for s in found.workflows[0].steps] == [
        ("after", "ns.after", ()), ("step", "ns.after", ("after",)),
    ]  # fmt: skip


# --------------------------------------------------------------------------- refusals

W = "workflow Onboard in onboarding {{\n  args {{ {args} }}\n{body}\n}}\n"
J = "job CreateAccount in onboarding {{ args {{ {args} }} }}\n"

#: id: (text of flows.atl, the refusal); each names the token at fault.
IN_FILE = {
    "unknown-workflow-modifier": (
        W.format(args=ACCOUNT, body="  step s CreateAccount\n  retries 3"),
        "flows.atl:4:3: unknown workflow modifier 'retries' (expected one of: args, step, "
        "timeout, unique)",
    ),
    "step-without-job": (
        W.format(args=ACCOUNT, body="  step s"),
        "flows.atl:3:9: unexpected end of line (expected a job name)",
    ),
    "duplicate-step": (
        W.format(args=ACCOUNT, body="  step s CreateAccount\n  step s CreateAccount"),
        "flows.atl:4:8: duplicate step 's' in workflow onboarding.Onboard (first at flows.atl:3)",
    ),
    "after-names-no-step": (
        W.format(args=ACCOUNT, body="  step s CreateAccount after t"),
        "flows.atl:3:30: step 's' is after 't', which is no step of workflow "
        "onboarding.Onboard (steps: s)",
    ),
    "after-twice": (
        W.format(args=ACCOUNT, body="  step t CreateAccount\n  step s CreateAccount after t, t"),
        "flows.atl:4:33: step 't' is listed twice in the after of step 's'",
    ),
    "cycle": (
        W.format(args=ACCOUNT, body="  step a CreateAccount after c\n  step b CreateAccount "
                 "after a\n  step c CreateAccount after b\n  step d CreateAccount"),
        "flows.atl:3:30: the steps a, b, c of workflow onboarding.Onboard wait for each other "
        "in a cycle (a after c after b after a)",
    ),
    "after-itself": (
        W.format(args=ACCOUNT, body="  step a CreateAccount after a"),
        "flows.atl:3:30: step 'a' of workflow onboarding.Onboard is after itself",
    ),
    "no-step": (
        W.format(args=ACCOUNT, body=""),
        "flows.atl:1:10: workflow onboarding.Onboard has no step (add one: step NAME JOB)",
    ),
    "duplicate-workflow": (
        "workflow W in ns { step a J }\nworkflow W in ns { step a J }\n",
        "flows.atl:2:10: workflow ns.W is declared twice (first at flows.atl:1)",
    ),
    "workflow-named-like-a-job": (
        "job W in ns { }\nworkflow W in ns { step a J }\n",
        "flows.atl:2:10: workflow ns.W has the name of a job (declared at flows.atl:1); a "
        "workflow and a job cannot share a name",
    ),
    "invalid-timeout": (
        W.format(args=ACCOUNT, body="  step a CreateAccount\n  timeout 6x"),
        "flows.atl:4:11: invalid duration '6x' (use e.g. 500ms, 30s, 10m, 2h, 1d, 1h30m)",
    ),
    "zero-timeout": (
        W.format(args=ACCOUNT, body="  step a CreateAccount\n  timeout 0s"),
        "flows.atl:4:11: timeout must be longer than 0, not '0s'",
    ),
    "duplicate-modifier": (
        W.format(args=ACCOUNT, body="  timeout 1h\n  step a CreateAccount\n  timeout 2h"),
        "flows.atl:5:3: duplicate modifier 'timeout' (first at flows.atl:3)",
    ),
    "unique-unknown-field": (
        W.format(args=ACCOUNT, body="  step a CreateAccount\n  unique (b)"),
        "flows.atl:4:11: unique field 'b' is not declared in args",
    ),
    "workflow-inside-a-block": (
        "workflow W in ns { step a J\nworkflow V in ns { step a J }\n",
        "flows.atl:2:1: unexpected 'workflow': '{' opened at line 1, column 18 is not closed",
    ),
    "misspelt-workflow": (
        "workflw W in ns { step a J }\n",
        "flows.atl:1:1: unexpected 'workflw' (expected 'job' or 'workflow')",
    ),
}


@pytest.mark.parametrize("case", list(IN_FILE))
def test_workflow_refusals(case: str) -> None:
    text, message = IN_FILE[case]
    with pytest.raises(DeclarationError) as info:
        read_atl(text, "flows.atl")
    assert str(info.value) == message


#: id: (the job's args, the workflow's args, more steps, the refusal)
ACROSS_FILES = {
    "unknown-job": (
        ACCOUNT, ACCOUNT, "  step import directory.ImportContacts after create",
        "flows.atl:4:15: step 'import' of workflow onboarding.Onboard runs job "
        "directory.ImportContacts, which is not declared (declared in directory: "
        "directory.Purge)",
    ),
    "unknown-compensate-job": (
        ACCOUNT, ACCOUNT, "  step two CreateAccount compensate Undo",
        "flows.atl:4:37: step 'two' of workflow onboarding.Onboard is compensated by job "
        "onboarding.Undo, which is not declared (declared in onboarding: "
        "onboarding.CreateAccount)",
    ),
    "missing-arg": (
        ACCOUNT, "id int", "",
        "flows.atl:3:15: step 'create' of workflow onboarding.Onboard runs job "
        "onboarding.CreateAccount, which needs arg 'account_id' (varchar(64) not null); the "
        "workflow has no arg 'account_id'",
    ),
    "arg-of-another-type": (
        ACCOUNT, "account_id text not null", "",
        "flows.atl:3:15: step 'create' of workflow onboarding.Onboard runs job "
        "onboarding.CreateAccount, which takes arg 'account_id' as varchar(64); the workflow "
        "declares it text",
    ),
    "optional-arg-of-another-type": (
        "note text", "note int", "",
        "flows.atl:3:15: step 'create' of workflow onboarding.Onboard runs job "
        "onboarding.CreateAccount, which takes arg 'note' as text; the workflow declares it int",
    ),
    "nullable-arg": (
        ACCOUNT, "account_id varchar(64)", "",
        "flows.atl:3:15: step 'create' of workflow onboarding.Onboard runs job "
        "onboarding.CreateAccount, which needs arg 'account_id' not null; the workflow's "
        "'account_id' may be null (declare it not null)",
    ),
    "compensate-job-args": (
        ACCOUNT, ACCOUNT, "  step two CreateAccount compensate directory.Purge",
        "flows.atl:4:37: step 'two' of workflow onboarding.Onboard is compensated by job "
        "directory.Purge, which needs arg 'key' (int not null); the workflow has no arg 'key'",
    ),
}
PURGE = "job Purge in directory { args { key int not null } }\n"


@pytest.mark.parametrize("case", list(ACROSS_FILES))
def test_workflow_refusals_across_files(case: str) -> None:
    job_args, workflow_args, body, message = ACROSS_FILES[case]
    jobs = read_atl(J.format(args=job_args) + PURGE, "jobs.atl").jobs
    workflows = read_atl(W.format(args=workflow_args, body="  step create CreateAccount\n" + body),
                         "flows.atl").workflows
    with pytest.raises(DeclarationError) as info:
        atlantis.Registry(jobs, workflows)
    assert str(info.value) == message


def test_the_bad_input_table_quotes_every_refusal() -> None:
    text = bad_input_text()
    quoted = [m for _, m in IN_FILE.values()] + [m for *_, m in ACROSS_FILES.values()]
    quoted.append("jobs.atl:1: job onboarding.CreateAccount has the name of a workflow "
                  "(declared at flows.atl:1); a workflow and a job cannot share a name")
    missing = [m for m in quoted if f"`{m}`" not in text]
    # Rows stand for a class of error; these share one with another quoted row.
    assert missing == [IN_FILE["duplicate-modifier"][1], IN_FILE["unique-unknown-field"][1],
                       IN_FILE["workflow-inside-a-block"][1], IN_FILE["misspelt-workflow"][1],
                       ACROSS_FILES["optional-arg-of-another-type"][3],
                       ACROSS_FILES["compensate-job-args"][3]]


def test_args_a_job_can_do_without_may_be_missing_or_nullable() -> None:
    jobs = read_atl("job Tagged in ns { args { id int not null, tag text default \"x\", "
                    "note text, n int not null default 1 } }").jobs
    workflows = read_atl("workflow W in ns { args { id int not null, note text, n int, "
                         "extra jsonb }\n step a Tagged }").workflows
    registry = atlantis.Registry(jobs, workflows)
    assert list(registry.workflows) == ["ns.W"]


def test_the_registry_refuses_names_shared_across_files(tmp_path: Path) -> None:
    jobs = read_atl("job CreateAccount in onboarding { }\n", "jobs.atl").jobs
    flow = read_atl("workflow CreateAccount in onboarding { step a Other }\n"
                    "job Other in onboarding { }\n", "flows.atl")
    with pytest.raises(DeclarationError) as info:
        atlantis.Registry([*jobs, *flow.jobs], flow.workflows)
    assert str(info.value) == (
        "flows.atl:1:10: workflow onboarding.CreateAccount has the name of a job (declared at "
        "jobs.atl:1); a workflow and a job cannot share a name"
    )
    registry = atlantis.Registry(flow.jobs, flow.workflows)
    with pytest.raises(DeclarationError) as info:
        registry.add(jobs)
    assert str(info.value) == (
        "jobs.atl:1: job onboarding.CreateAccount has the name of a workflow (declared at "
        "flows.atl:1); a workflow and a job cannot share a name"
    )
    with pytest.raises(DeclarationError) as info:
        registry.add([], flow.workflows)
    assert str(info.value) == (
        "flows.atl:1:10: workflow onboarding.CreateAccount is declared twice (first at "
        "flows.atl:1)"
    )
    # A refused add adds nothing.
    assert list(registry.decls) == ["onboarding.Other"]
    assert list(registry.workflows) == ["onboarding.CreateAccount"]


def test_workflows_survive_the_reload_document() -> None:
    (onboard,) = read_atl(ISSUE_EXAMPLE, "onboarding.atl").workflows
    import orjson

    raw = orjson.loads(orjson.dumps(dataclasses.asdict(onboard)))
    again = workflow_from_dict(raw)
    assert again == onboard and again.steps[1].job_at == onboard.steps[1].job_at


# --------------------------------------------------------------------------- codegen

GEN = ISSUE_EXAMPLE + """
workflow Bare in other { step a onboarding.SendWelcome }
workflow Mixed in other {
  args {
    conn int not null, workflow_args text, tags text[] default ["a"], accountId text
    amount numeric default 1.5
  }
  step a onboarding.SendWelcome
}
"""


def load(source: str, path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    path.write_text(source, encoding="utf-8")
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, path.stem, module)
    spec.loader.exec_module(module)
    return module


def generated(text: str = GEN) -> str:
    found = read_atl(text, "onboarding.atl")
    return generate_module(found.jobs, "onboarding.atl", found.workflows)


def test_gen_writes_a_start_function_per_workflow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = generated()
    assert '"""Typed helpers for the jobs and workflows declared in onboarding.atl."""' in source
    assert 'WORKFLOW_ONBOARD = "onboarding.Onboard"' in source
    assert (
        "def start_onboard(\n"
        "    conn: psycopg.Connection[Any],\n"
        "    *,\n"
        "    account_id: str,\n"
        ") -> int:\n"
    ) in source
    assert "async def start_onboard_async(\n    conn: psycopg.AsyncConnection[Any],\n" in source
    assert "def start_bare(\n    conn: psycopg.Connection[Any],\n) -> int:\n" in source
    module = load(source, tmp_path / "onboarding_gen.py", monkeypatch)
    calls: list[tuple[Any, ...]] = []

    def start(conn: object, name: str, args: dict[str, Any]) -> int:
        calls.append((conn, name, args))
        return 7

    async def start_async(conn: object, name: str, args: dict[str, Any]) -> int:
        return start(conn, name, args)

    monkeypatch.setattr(atlantis, "start_workflow", start, raising=False)
    monkeypatch.setattr(atlantis, "start_workflow_async", start_async, raising=False)
    assert module.start_onboard("c", account_id="a1") == 7
    import asyncio

    assert asyncio.run(module.start_onboard_async("c", account_id="a2")) == 7
    assert module.start_bare("c") == 7
    assert module.start_mixed("c", conn_=1, account_id="x") == 7
    assert calls == [
        ("c", "onboarding.Onboard", {"account_id": "a1"}),
        ("c", "onboarding.Onboard", {"account_id": "a2"}),
        ("c", "other.Bare", {}),
        ("c", "other.Mixed", {"conn": 1, "workflow_args": None, "accountId": "x",
                              "amount": module.decimal.Decimal("1.5")}),
    ]  # fmt: skip
    args: Any = module.OnboardArgs(account_id="a1")
    assert dataclasses.fields(args)[0].name == "account_id" and args.account_id == "a1"
    with pytest.raises(dataclasses.FrozenInstanceError):
        args.account_id = "b"


def test_tide_gen_writes_and_checks_workflows(tmp_path: Path) -> None:
    source = tmp_path / "onboarding.atl"
    source.write_text(ISSUE_EXAMPLE, "utf-8")
    out = tmp_path / "onboarding_gen.py"

    def tide(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(Path(sys.executable).parent / "tide"), "gen", str(source), "-o",
                               str(out), *args], capture_output=True, text=True, timeout=60,
                              check=False)

    assert tide().returncode == 0
    assert out.read_text("utf-8") == generated(ISSUE_EXAMPLE).replace(
        "onboarding.atl", source.name)
    assert tide("--check").returncode == 0
    # tide gen reads one file: the jobs its steps run may be declared in others.
    source.write_text(ISSUE_EXAMPLE + "workflow Later in onboarding { step x Nowhere }\n")
    stale = tide("--check")
    assert stale.returncode == 1 and "stale" in stale.stderr


def test_a_jobless_file_gets_only_what_workflows_use() -> None:
    source = generated("workflow Bare in other { step a onboarding.SendWelcome }\n")
    assert "Callable" not in source and "timedelta" not in source


def test_workflow_and_job_names_that_would_collide_are_refused() -> None:
    text = "job Onboard_ in a { }\nworkflow Onboard in b { step s a.Onboard_ }\n"
    with pytest.raises(DeclarationError, match="would both generate the Python name"):
        generated(text)
    # The same name in two namespaces is prefixed, as for jobs.
    source = generated("job Onboard in a { }\nworkflow Onboard in b { step s a.Onboard }\n")
    assert "class AOnboardArgs:" in source and "class BOnboardArgs:" in source
    assert "def start_b_onboard(" in source and "def enqueue_a_onboard(" in source


@pytest.mark.parametrize(
    "text",
    [GEN, "workflow Bare in other { step a onboarding.SendWelcome }\n"],
    ids=["jobs-and-workflows", "workflows-only"],
)
def test_generated_workflow_module_passes_ruff_and_mypy_strict(tmp_path: Path, text: str) -> None:
    path = tmp_path / "flows_gen.py"
    path.write_text(generated(text), encoding="utf-8")
    config = str(REPO / "pyproject.toml")

    def run(*command: str, env: dict[str, str] | None = None) -> None:
        result = subprocess.run(
            [sys.executable, "-m", *command], cwd=tmp_path, env=env, capture_output=True,
            text=True, check=False,
        )  # fmt: skip
        assert result.returncode == 0, result.stdout + result.stderr

    run("ruff", "check", "--no-cache", "--config", config, str(path))
    run("ruff", "format", "--check", "--no-cache", "--config", config, str(path))
    if not hasattr(atlantis, "start_workflow"):
        pytest.skip("atlantis.start_workflow is not in this tree yet (the integrator adds it)")
    env = {**os.environ, "MYPYPATH": str(REPO)}
    run("mypy", "--strict", "--follow-imports=silent", "--no-error-summary", "--cache-dir",
        str(tmp_path / ".mypy_cache"), str(path), env=env)


# --------------------------------------------------------------------------- sync

FLOWS_APP = "tests.apps.decl_flows:registry"


def workflow_type(conn: psycopg.Connection[Any], name: str) -> dict[str, Any] | None:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(
            "SELECT workflow, fields, unique_fields, extract(epoch FROM timeout)::float AS timeout,"
            " steps, source FROM atlantis.workflow_types WHERE workflow = %s", (name,)
        ).fetchone()


def test_sync_stores_workflow_types_and_starts_follow_them(db: psycopg.Connection[Any]) -> None:
    registry = load_app(FLOWS_APP)
    (onboard,) = registry.workflows.values()
    sync(db, list(registry.decls.values()), registry.workflows.values())
    db.commit()
    row = workflow_type(db, "onboarding.Onboard")
    assert row is not None
    assert row == {**onboard.to_json(), "unique_fields": ["account_id"], "timeout": 21600.0}
    assert row["source"].endswith("decl_flows.atl:21")
    first = atlantis.start_workflow(db, "onboarding.Onboard", {"account_id": "a1"})
    # unique (account_id): a second start while it runs gives the same instance.
    assert atlantis.start_workflow(db, "onboarding.Onboard", {"account_id": "a1"}) == first
    with pytest.raises(atlantis.ValidationError, match="account_id"):
        atlantis.start_workflow(db, "onboarding.Onboard", {"account_id": 5})
    db.rollback()
    # A sync again replaces the row: the timeout dropped, a step added.
    changed = dataclasses.replace(
        onboard, timeout=None, unique=(),
        steps=(*onboard.steps, StepDecl("bye", "onboarding.SendWelcome", ("welcome",))),
    )  # fmt: skip
    sync(db, [], [changed])
    db.commit()
    row = workflow_type(db, "onboarding.Onboard")
    assert row is not None and row["timeout"] is None and row["unique_fields"] == []
    assert [s["step"] for s in row["steps"]] == ["create", "import", "welcome", "bye"]


def test_tide_db_sync_and_migrate_store_the_apps_workflows(
    db: psycopg.Connection[Any], db_url: str
) -> None:
    tide = [str(BIN / "tide"), "--database-url", db_url, "db"]
    for command in (["sync", "--app", FLOWS_APP], ["migrate", "--app", FLOWS_APP]):
        db.execute("DELETE FROM atlantis.workflow_types")
        db.commit()
        done = subprocess.run([*tide, *command], capture_output=True, text=True, cwd=ROOT,
                              timeout=120, check=False)
        assert done.returncode == 0, done.stderr
        row = workflow_type(db, "onboarding.Onboard")
        db.commit()
        assert row is not None and [s["step"] for s in row["steps"]] == [
            "create", "import", "welcome"]
