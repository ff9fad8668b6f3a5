"""Mistakes said where people look (issue 36, item 4): a handler that cannot take
``(ctx, args)`` refused when the app loads, `;` between a block's statements, every `tide`
error as one JSON object under ``--json``, listings that show no stale error, rate or ETA,
a waiting job no supervisor serves, and leftover work recorded on the attempt."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

import atlantis
from atlantis.app import load_app
from atlantis.declarations.parser import read_atl
from atlantis.errors import ConfigurationError, DeclarationError
from atlantis.store.migrate import sync
from tests.conftest import BIN, ROOT, job_row, run_tide, wait_for, wait_state

# ---- 1. a handler that cannot take (ctx, args) ------------------------------------------------

SIG_ATL = "job Three in sig {\n  queue \"q\"\n}\n"
SIG_APP = ("import atlantis\nregistry = atlantis.Registry.from_atl('sig.atl')\n\n"
           "@registry.handler('sig.Three')\ndef three(ctx, args, extra):\n    pass\n")
SIG_LINE = ("--app 'badsig:registry': the handler of job sig.Three, badsig.three(ctx, args, "
            "extra), cannot take (ctx, args): missing a required argument: 'extra'")


def _registry() -> atlantis.Registry:
    return atlantis.Registry(read_atl(SIG_ATL, "sig.atl").jobs)


async def _async_ok(ctx: Any, args: Any) -> None:
    return None


@pytest.mark.parametrize("fn", [
    lambda ctx, args: None,
    lambda ctx, args=None, more=1: None,
    lambda *everything: None,
    lambda ctx, *rest, flag=False: None,
    _async_ok,
], ids=["plain", "defaults", "varargs", "varargs-and-keyword", "async"])
def test_handlers_that_take_ctx_and_args_are_accepted(fn: Any) -> None:
    _registry().register("sig.Three", fn)


@pytest.mark.parametrize(("fn", "why"), [
    (lambda ctx: None, "too many positional arguments"),
    (lambda: None, "too many positional arguments"),
    (lambda ctx, args, extra: None, "missing a required argument: 'extra'"),
    (lambda ctx, args, *, must: None, "missing a required argument: 'must'"),
    (lambda *, ctx, args: None, "too many positional arguments"),
], ids=["one", "none", "three", "keyword-only", "keywords-only"])
def test_a_handler_that_cannot_take_ctx_and_args_is_refused(fn: Any, why: str) -> None:
    registry = _registry()
    with pytest.raises(ConfigurationError) as refused:
        registry.handler("sig.Three")(fn)
    assert str(refused.value).startswith("the handler of job sig.Three, tests.test_mistakes.")
    assert str(refused.value).endswith(f"cannot take (ctx, args): {why}")
    assert registry.registrations == {}


def test_a_bad_signature_stops_the_supervisor_and_tide_at_load(
        db_url: str, tmp_path: Path) -> None:
    (tmp_path / "sig.atl").write_text(SIG_ATL)
    (tmp_path / "badsig.py").write_text(SIG_APP)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}",
           "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("ATLANTIS_APP", None)
    commands = {
        "atlantis-supervise": [str(BIN / "atlantis-supervise"), "--database-url", db_url,
                               "--queue", "q", "--app", "badsig:registry"],
        "tide": [str(BIN / "tide"), "--database-url", db_url, "db", "sync",
                 "--app", "badsig:registry"],
    }
    for prog, argv in commands.items():
        done = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, env=env,
                              timeout=60)
        assert (done.returncode, done.stdout, done.stderr) == (2, "", f"{prog}: {SIG_LINE}\n")


# ---- 2. `;` between a block's statements ----------------------------------------------------

ONE_LINE = ('job Hello in demo { args { name text not null; greeting text default "hi" }; '
            'queue "demo"; retries 3; timeout 10s }\n'
            "workflow Greet in demo { args { name text }; step one Hello }\n")


def test_statements_share_a_line_separated_by_semicolons() -> None:
    found = read_atl(ONE_LINE, "jobs.atl")
    (hello,) = found.jobs
    assert (hello.qualified_name, hello.queue, hello.retries, hello.timeout) == (
        "demo.Hello", "demo", 3, 10.0)
    assert [(f.name, f.not_null, f.default) for f in hello.fields] == [
        ("name", True, None), ("greeting", False, "hi")]
    (greet,) = found.workflows
    assert [s.name for s in greet.steps] == ["one"]
    spread = read_atl('job Hello in demo {\n  args {\n    name text not null;\n'
                       '    greeting text default "hi"\n  };\n  queue "demo";\n'
                       '  retries 3; timeout 10s;\n}\n', "jobs.atl")
    assert spread.jobs == found.jobs
    with pytest.raises(DeclarationError) as refused:
        read_atl('job Ping in health { queue "q" retries 2 }\n', "jobs.atl")
    assert str(refused.value) == (
        "jobs.atl:1:32: unexpected 'retries' (expected one of: ',', ';', '}', end of line)")
    with pytest.raises(DeclarationError):  # literals keep their commas
        read_atl('job J in ns { args { a int[] default [1; 2] } }\n', "jobs.atl")


# ---- 3. --json errors -------------------------------------------------------------------------

def _json_error(db_url: str, *argv: str, code: int) -> dict[str, Any]:
    done = run_tide(["--database-url", db_url, *argv], check=False)
    plain = run_tide(["--database-url", db_url, *[a for a in argv if a != "--json"]],
                     check=False)
    assert (done.returncode, plain.returncode) == (code, code), done
    assert "tide:" not in done.stderr and done.stdout.count("\n") == 1
    doc: dict[str, Any] = orjson.loads(done.stdout)
    assert plain.stdout == "" and plain.stderr.endswith(f"tide: {doc['error']}\n")
    return doc


def test_every_tide_error_is_one_json_object_under_json(db_url: str) -> None:
    missing = _json_error(db_url, "job", "status", "999999", "--json", code=1)
    assert missing == {"error": "no job with id 999999", "kind": "not_found"}
    assert _json_error(db_url, "workflow", "status", "999999", "--json", code=1) == {
        "error": "no workflow with id 999999", "kind": "not_found"}
    assert _json_error(db_url, "dlq", "list", "--queue", "nowhere", "--json", code=1) == {
        "error": "unknown queue 'nowhere': no declaration, job or supervisor uses it",
        "kind": "not_found"}
    usage = run_tide(["--database-url", db_url, "job", "list", "--json", "--limit", "x"],
                     check=False)
    assert (usage.returncode, usage.stderr) == (2, ""), usage
    assert orjson.loads(usage.stdout) == {
        "error": "Invalid value for '--limit': 'x' is not a valid integer range. "
                 "(see `tide job list --help`)", "kind": "usage"}
    unreachable = run_tide(["--database-url", "postgresql://u@127.0.0.1:1/db", "--timeout",
                            "1s", "queue", "stats", "--json"], check=False)
    assert unreachable.returncode == 1 and "tide:" not in unreachable.stderr
    assert orjson.loads(unreachable.stdout)["kind"] == "database"
    assert orjson.loads(unreachable.stdout)["error"].startswith("cannot connect to ")


# ---- 4. listings: no stale error, rate or ETA -------------------------------------------------

def test_listings_show_no_earlier_error_and_rate_only_while_running(
        db: psycopg.Connection[Any], db_url: str, supervise: Any) -> None:
    flaky = atlantis.enqueue(db, "tests.Fail", {"key": "flaky", "mode": "flaky"})
    supervise(concurrency=1)
    wait_state(db, flaky, "complete", timeout=60)
    assert job_row(db, flaky)["last_error"] == "RuntimeError: first attempt fails"
    # Its checkpoints, as a long run leaves them (the first sample a minute before the last).
    db.execute("""UPDATE atlantis.jobs SET progress_pct = 100, progress_at = finished_at,
                         progress_history = jsonb_build_array(
                             jsonb_build_object('at', finished_at - interval '1 minute',
                                                'pct', 10),
                             jsonb_build_object('at', finished_at, 'pct', 100))
                   WHERE id = %s""", (flaky,))
    listed = run_tide(["--database-url", db_url, "job", "list"]).stdout
    (line,) = [row for row in listed.splitlines() if row.split()[0] == str(flaky)]
    assert "complete" in line and "first attempt fails" not in line
    status = run_tide(["--database-url", db_url, "job", "status", str(flaky)]).stdout
    assert "%/min" not in status and "ETA" not in status
    doc = orjson.loads(run_tide(["--database-url", db_url, "job", "status", str(flaky),
                                 "--json"]).stdout)
    assert (doc["rate"], doc["eta_seconds"]) == (None, None)
    # Resumed: running again, its checkpoints all of the run before; no rate from those.
    db.execute("""UPDATE atlantis.jobs SET state = 'running', finished_at = NULL,
                         claimed_by = 'host-a:4242:0badc0de', started_at = now(),
                         claimed_until = now() + interval '1 hour'
                   WHERE id = %s""", (flaky,))
    again = orjson.loads(run_tide(["--database-url", db_url, "job", "status", str(flaky),
                                   "--json"]).stdout)
    assert (again["rate"], again["eta_seconds"]) == (None, None)
    status = run_tide(["--database-url", db_url, "job", "status", str(flaky)]).stdout
    assert "rate       -  ETA -" in status


# ---- 5. a waiting job no supervisor serves ----------------------------------------------------

def test_a_waiting_job_nobody_serves_says_so(
        db: psycopg.Connection[Any], db_url: str, supervise: Any) -> None:
    later = atlantis.enqueue(db, "tests.Echo", {"key": "later"}, delay=3600)
    astray = atlantis.enqueue(db, "tests.Echo", {"key": "astray"}, queue="elsewhere",
                              delay=3600)

    def status(job_id: int) -> tuple[str, Any]:
        text = run_tide(["--database-url", db_url, "job", "status", str(job_id)]).stdout
        doc = orjson.loads(run_tide(["--database-url", db_url, "job", "status", str(job_id),
                                     "--json"]).stdout)
        return text, doc["no_handler"]

    alone = "no running supervisor serves tests.Echo in queue tests (tide worker list)"
    assert status(later) == (status(later)[0], alone)
    assert f"  no handler {alone}\n" in status(later)[0]
    supervise(concurrency=1)
    wait_for(lambda: status(later)[1] is None, message="the supervisor's row")
    assert "no handler" not in status(later)[0]
    text, note = status(astray)
    assert note == ("no running supervisor serves tests.Echo in queue elsewhere "
                    "(tide worker list)") and "  no handler no running supervisor" in text


# ---- 6. leftover work recorded on the attempt -------------------------------------------------

def test_leftover_work_is_recorded_on_the_attempt(
        db: psycopg.Connection[Any], db_url: str, supervise: Any) -> None:
    registry = load_app("tests.apps.leftover:registry")
    sync(db, list(registry.decls.values()), list(registry.workflows.values()))
    job_id = atlantis.enqueue(db, "leftover.Fork", {})
    supervise(queues=("leftover",), app="tests.apps.leftover:registry", concurrency=1)
    wait_state(db, job_id, "complete")
    doc = orjson.loads(run_tide(["--database-url", db_url, "job", "status", str(job_id),
                                 "--json"]).stdout)
    (attempt,) = doc["attempts"]
    assert attempt["warning"].startswith("the handler returned but left work running: ")
    assert attempt["warning"].endswith("; atlantis ended it") and "sleep" in attempt["warning"]
    assert doc["warning"] == f"attempt 1: {attempt['warning']}"
    text = run_tide(["--database-url", db_url, "job", "status", str(job_id)]).stdout
    assert f"  warning    attempt 1: {attempt['warning']}\n" in text
    wait_for(lambda: f"atlantis: {attempt['warning']}" in run_tide(
        ["--database-url", db_url, "job", "logs", str(job_id)]).stdout,
        message="the warning in the attempt's log")
