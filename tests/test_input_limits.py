"""Input past what the database holds is refused where it is written, naming what is wrong
(issue 18): durations past 100 years, ids and priorities past ``bigint`` and ``int``, field
names Python cannot take as attributes, NUL and lone surrogates in `.atl` strings, and a
`tide gen` output that cannot be written. Each refusal used to surface later, elsewhere,
as a raw database error, a ``dataclasses`` TypeError or a traceback.

Every message asserted here is quoted in docs/reference/bad-input/
(``test_the_bad_input_table_quotes_these_messages``).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner

import atlantis
from atlantis.cli.tide import main as tide_main
from atlantis.declarations import Field, JobDecl, parse_atl
from atlantis.declarations.codegen import generate_module
from atlantis.errors import DeclarationError, JobNotFoundError, ValidationError
from atlantis.registry import args_class
from atlantis.units import MAX_DURATION, format_duration, parse_duration
from tests.conftest import BIN, ROOT, job_row, run_tide, wait_for, wait_state
from tests.docs import bad_input_text
from tests.test_retention import make_job

HUGE = "99999999999999999999"  # past a bigint (9223372036854775807)
TOO_LONG = "(at most 36500d, 100 years)"


def tide(db_url: str, *args: str, cwd: Path = ROOT,
         env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """Exit status, stdout and the last line of stderr of one `tide` command: in-process
    (tests/conftest.py:run_tide), or a process of its own for an app in another folder."""
    if cwd == ROOT and env is None:
        done = run_tide(["--database-url", db_url, *args], check=False)
    else:
        done = subprocess.run([str(BIN / "tide"), "--database-url", db_url, *args],
                              capture_output=True, text=True, cwd=cwd, timeout=60, env=env)
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, done.stdout, (done.stderr.strip().splitlines() or [""])[-1]


def tide_all(db_url: str, commands: dict[str, list[str]]) -> dict[str, tuple[int, str, str]]:
    """What :func:`tide` says of each command, by name."""
    return {name: tide(db_url, *argv) for name, argv in commands.items()}


def _app_env(folder: Path) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": f"{folder}{os.pathsep}{ROOT}",
           "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("ATLANTIS_APP", None)
    return env


def _write_app(folder: Path, module: str, atl: str, handlers: tuple[str, ...] = ()) -> None:
    (folder / f"{module}.atl").write_text(atl, "utf-8")
    lines = ["import atlantis", f"registry = atlantis.Registry.from_atl({module + '.atl'!r})"]
    for job in handlers:
        lines += [f"@registry.handler({job!r})", "def run(ctx, args):", "    print('ran')"]
    (folder / f"{module}.py").write_text("\n".join(lines) + "\n", "utf-8")


# ---- durations ----------------------------------------------------------------------------


def test_the_longest_duration_is_100_years_and_said_so() -> None:
    assert MAX_DURATION == 100 * 365 * 86_400
    assert f"(at most {format_duration(MAX_DURATION)}, 100 years)" == TOO_LONG
    assert parse_duration("36500d") == MAX_DURATION
    for text in ("36500d1ms", "36501d", "3153600001", "200000000d"):
        with pytest.raises(ValueError) as refused:
            parse_duration(text)
        assert str(refused.value) == f"duration {text!r} is too long {TOO_LONG}"


#: id: (a .atl file, its exact refusal)
ATL_REFUSALS: dict[str, tuple[str, str]] = {
    "timeout-too-long": ("job J in ns {\n  timeout 200000000d\n}\n",
                         "jobs.atl:2:11: timeout '200000000d' is too long (at most 36500d, "
                         "100 years)"),
    "heartbeat-too-long": ("job J in ns { heartbeat 36501d }\n",
                           "jobs.atl:1:25: heartbeat '36501d' is too long (at most 36500d, "
                           "100 years)"),
    "stall-too-long": ("job J in ns { stall 999999999d }\n",
                       "jobs.atl:1:21: stall '999999999d' is too long (at most 36500d, "
                       "100 years)"),
    "backoff-too-long": ("job J in ns { backoff 36500d1s }\n",
                         "jobs.atl:1:23: backoff '36500d1s' is too long (at most 36500d, "
                         "100 years)"),
    "keyword-field": ("job J in ns {\n  args { id int, from text }\n}\n",
                      "jobs.atl:2:18: field name 'from' is a Python keyword, and handlers get "
                      "each field as an attribute of that name; rename the field"),
    "keyword-field-class": ("job J in ns { args { class int } }\n",
                            "jobs.atl:1:22: field name 'class' is a Python keyword, and "
                            "handlers get each field as an attribute of that name; rename the "
                            "field"),
    "keyword-field-none": ("job J in ns { args { None int } }\n",
                           "jobs.atl:1:22: field name 'None' is a Python keyword, and handlers "
                           "get each field as an attribute of that name; rename the field"),
    "dunder-field": ("job J in ns { args { __init__ int } }\n",
                     "jobs.atl:1:22: field name '__init__' starts with '__', which Python keeps "
                     "for its own attributes (and mangles in a class body); rename the field"),
    "nul-in-default": ('job J in ns {\n  args { s text default "a\\u0000b" }\n}\n',
                       "jobs.atl:2:27: string '\"a\\u0000b\"' holds a NUL character (\\u0000), "
                       "which PostgreSQL cannot store"),
    "nul-in-queue": ('job J in ns { queue "q\\u0000" }\n',
                     "jobs.atl:1:23: string '\"q\\u0000\"' holds a NUL character (\\u0000), "
                     "which PostgreSQL cannot store"),
    "nul-in-tz": ('job J in ns {\n  schedule "* * * * *"\n  tz "UTC\\u0000"\n}\n',
                  "jobs.atl:3:10: string '\"UTC\\u0000\"' holds a NUL character (\\u0000), "
                  "which PostgreSQL cannot store"),
    "nul-in-jsonb-key": ('job J in ns { args { d jsonb default {"\\u0000": 1} } }\n',
                         "jobs.atl:1:40: string '\"\\u0000\"' holds a NUL character (\\u0000), "
                         "which PostgreSQL cannot store"),
    "nul-after-a-pair": ('job J in ns { queue "\\ud83d\\ude00\\n\\u0000" }\n',
                         "jobs.atl:1:36: string '\"\\ud83d\\ude00\\n\\u0000\"' holds a NUL "
                         "character (\\u0000), which PostgreSQL cannot store"),
    "lone-surrogate": ('job J in ns { args { s text default "x\\ud800" } }\n',
                       "jobs.atl:1:39: string '\"x\\ud800\"' holds a lone surrogate (\\ud800), "
                       "which is not valid Unicode"),
}


@pytest.mark.parametrize("case", list(ATL_REFUSALS))
def test_the_checker_refuses_at_file_line_column(case: str) -> None:
    text, message = ATL_REFUSALS[case]
    with pytest.raises(DeclarationError) as refused:
        parse_atl(text, "jobs.atl")
    assert str(refused.value) == message


def test_the_longest_durations_and_soft_keywords_are_accepted() -> None:
    (decl,) = parse_atl("job J in ns {\n  args { match int, case text, type int, _ int }\n"
                        "  timeout 36500d, heartbeat 36500d, stall 36500d, backoff 36500d\n}\n")
    assert (decl.timeout, decl.heartbeat, decl.stall, decl.backoff) == (MAX_DURATION,) * 4
    cls = args_class(decl)
    args = cls(match=1, case="x", type=2, _=3)
    assert (args.match, args.case, args.type, args._) == (1, "x", 2, 3)
    source = generate_module([decl], "jobs.atl")
    namespace: dict[str, Any] = {}
    exec(compile(source, "jobs_gen.py", "exec"), namespace)
    generated = namespace["JArgs"](match=1, case="x", type=2, _=3)
    assert (generated.match, generated.type, generated._) == (1, 2, 3)


def test_a_keyword_field_declared_in_python_is_refused_at_registration() -> None:
    """The checker never sees a JobDecl made in Python: registering its handler says where
    it was declared, instead of a dataclasses TypeError naming nothing."""
    decl = JobDecl("J", "ns", fields=(Field("from", "int"),), source="app.py:7")
    registry = atlantis.Registry([decl])
    with pytest.raises(DeclarationError) as refused:
        registry.register("ns.J", lambda ctx, args: None)
    assert str(refused.value) == PYTHON_DECL_REFUSAL


PYTHON_DECL_REFUSAL = ("app.py:7: job ns.J: its fields cannot be attributes of an args class: "
                       "Field names must not be keywords: 'from'")


#: id: (the .atl of an app, the line `tide db sync` ends with, after /srv/app/)
SYNC_REFUSALS = {
    "timeout-too-long": ("job J in ns {\n  timeout 200000000d\n}\n",
                         "bad.atl:2:11: timeout '200000000d' is too long (at most 36500d, "
                         "100 years)"),
    "keyword-field": ("job J in ns {\n  args { id int, from text }\n}\n",
                      "bad.atl:2:18: field name 'from' is a Python keyword, and handlers get "
                      "each field as an attribute of that name; rename the field"),
    "nul-in-default": ('job J in ns {\n  args { s text default "a\\u0000b" }\n}\n',
                       "bad.atl:2:27: string '\"a\\u0000b\"' holds a NUL character (\\u0000), "
                       "which PostgreSQL cannot store"),
}


@pytest.mark.parametrize("case", list(SYNC_REFUSALS))
def test_sync_refuses_before_the_database_with_one_line(
        db: psycopg.Connection[Any], db_url: str, tmp_path: Path, case: str) -> None:
    atl, message = SYNC_REFUSALS[case]
    _write_app(tmp_path, "bad", atl)
    code, out, last = tide(db_url, "db", "sync", "--app", "bad:registry", cwd=tmp_path,
                           env=_app_env(tmp_path))
    assert (code, out) == (2, "")
    assert last == f"tide: --app 'bad:registry': {tmp_path}/{message}"
    assert db.execute("SELECT count(*) FROM atlantis.job_types WHERE job = 'ns.J'"
                      ).fetchone() == (0,)


#: id: tide arguments after the database URL: the one line it exits 2 with
TIDE_DURATIONS: dict[str, tuple[list[str], str]] = {
    "prune": (["job", "prune", "--older-than", "3000000d"],
              "tide: Invalid value for --older-than: duration '3000000d' is too long (at most "
              "36500d, 100 years) (see `tide job prune --help`)"),
    "delay": (["job", "enqueue", "tests.Echo", "--args", '{"key": "x"}', "--delay", "200000000d"],
              "tide: Invalid value for --delay: duration '200000000d' is too long (at most "
              "36500d, 100 years) (see `tide job enqueue --help`)"),
    "watch": (["job", "watch", "1", "--interval", "3000000d"],
              "tide: Invalid value for --interval: duration '3000000d' is too long (at most "
              "36500d, 100 years) (see `tide job watch --help`)"),
    "doctor": (["db", "doctor", "--lease-grace", "3000000d"],
               "tide: Invalid value for --lease-grace: duration '3000000d' is too long (at "
               "most 36500d, 100 years) (see `tide db doctor --help`)"),
}


def test_tide_refuses_long_durations_naming_the_option(
        db: psycopg.Connection[Any], db_url: str) -> None:
    said = tide_all(db_url, {name: argv for name, (argv, _) in TIDE_DURATIONS.items()})
    assert said == {name: (2, "", line) for name, (_, line) in TIDE_DURATIONS.items()}
    assert db.execute("SELECT count(*) FROM atlantis.jobs").fetchone() == (0,)


#: id: atlantis-supervise option and value: the one line it exits 2 with
SUPERVISOR_DURATIONS: dict[str, tuple[list[str], str]] = {
    "retention": (["--retention", "3000000d"],
                  "atlantis-supervise: --retention: duration '3000000d' is too long (at most "
                  "36500d, 100 years)"),
    "dead-retention": (["--dead-retention", "36501d"],
                       "atlantis-supervise: --dead-retention: duration '36501d' is too long (at "
                       "most 36500d, 100 years)"),
    "kill-grace": (["--kill-grace", "200000000d"],
                   "atlantis-supervise: --kill-grace: duration '200000000d' is too long (at "
                   "most 36500d, 100 years)"),
}


@pytest.mark.parametrize("case", list(SUPERVISOR_DURATIONS))
def test_the_supervisor_refuses_long_durations_at_start(db_url: str, case: str) -> None:
    """It used to start, then fail every retention round in the database."""
    argv, line = SUPERVISOR_DURATIONS[case]
    done = subprocess.run([str(BIN / "atlantis-supervise"), "--database-url", db_url,
                           "--queue", "tests", "--app", "tests.apps.basic:registry", *argv],
                          capture_output=True, text=True, cwd=ROOT, timeout=30)
    assert (done.returncode, done.stdout, done.stderr.strip().splitlines()) == (2, "", [line])


LONGEST_ATL = """\
job Longest in limits {
  timeout 36500d, heartbeat 36500d, stall 36500d, backoff 36500d
  queue "limits"
}
job LongestLease in limits {
  heartbeat 36500d
  queue "limits"
}
"""


def test_the_longest_durations_work_everywhere(
        db: psycopg.Connection[Any], db_url: str, supervise: Any, tmp_path: Path) -> None:
    """100 years is safe, not merely accepted: synced, leased, timed, stalled (3 heartbeats),
    delayed, shown, pruned and checked by the doctor without a database error."""
    _write_app(tmp_path, "longest", LONGEST_ATL, ("limits.Longest", "limits.LongestLease"))
    ancient = make_job(db, "complete", 36_600)  # finished more than 100 years ago
    sup = supervise("--retention", "36500d", "--dead-retention", "36500d",
                    "--retention-interval", "1s", "--max-backoff", "36500d",
                    queues=("limits",), app="longest:registry", env=_app_env(tmp_path))
    wait_for(lambda: db.execute("SELECT count(*) FROM atlantis.job_types WHERE job LIKE "
                                "'limits.%'").fetchone() == (2,), message="the app synced")
    ids = [atlantis.enqueue(db, job, {}) for job in ("limits.Longest", "limits.LongestLease")]
    for job_id in ids:
        assert wait_state(db, job_id, "complete", "dead")["state"] == "complete"
    wait_for(lambda: db.execute("SELECT count(*) FROM atlantis.jobs WHERE id = %s",
                                (ancient,)).fetchone() == (0,), message="the ancient job pruned")
    code, out, _ = tide(db_url, "job", "enqueue", "limits.Longest", "--delay", "36500d")
    assert code == 0
    later = job_row(db, int(out))
    assert later["state"] == "available" and later["run_at"].year >= 2100
    said = tide_all(db_url, {
        "status": ["job", "status", out.strip()], "stalled": ["job", "list", "--stalled"],
        "prune": ["job", "prune", "--older-than", "36500d"],
        "doctor": ["db", "doctor", "--lease-grace", "36500d", "--xact-age", "36500d",
                   "--missed-within", "36500d"]})
    assert {name: code for name, (code, _, _) in said.items()} == {
        "status": 0, "stalled": 0, "prune": 0, "doctor": said["doctor"][0]}
    assert said["doctor"][0] in (0, 1), said["doctor"]  # it may warn, never fail
    assert "timeout 36500d, heartbeat 36500d, stall 36500d" in said["status"][1]
    assert sup.proc.poll() is None
    assert "Traceback" not in sup.log() and "out of range" not in sup.log()


# ---- ids and integers ---------------------------------------------------------------------


def _id_line(command: str) -> str:
    return (f"tide: Invalid value for 'JOB_ID': {HUGE} is out of range for bigint (at most "
            f"9223372036854775807) (see `tide job {command} --help`)")


#: tide arguments: the one line it exits 2 with
TIDE_INTEGERS: dict[str, tuple[list[str], str]] = {
    **{command: (["job", command, HUGE], _id_line(command))
       for command in ("status", "watch", "logs", "retry", "cancel")},
    "cancel-negative": (["job", "cancel", "--", "-" + HUGE],
                        f"tide: Invalid value for 'JOB_ID': -{HUGE} is out of range for bigint "
                        "(at least -9223372036854775808) (see `tide job cancel --help`)"),
    "priority": (["job", "enqueue", "tests.Echo", "--args", '{"key": "x"}', "--priority",
                  "2147483648"],
                 "tide: Invalid value for '--priority': 2147483648 is out of range for int (at "
                 "most 2147483647) (see `tide job enqueue --help`)"),
    "list-limit": (["job", "list", "--limit", HUGE],
                   f"tide: Invalid value for '--limit': {HUGE} is out of range for bigint (at "
                   "most 9223372036854775807) (see `tide job list --help`)"),
    "dlq-limit": (["dlq", "list", "--limit", HUGE],
                  f"tide: Invalid value for '--limit': {HUGE} is out of range for bigint (at "
                  "most 9223372036854775807) (see `tide dlq list --help`)"),
    "logs-attempt": (["job", "logs", "1", "--attempt", "2147483648"],
                     "tide: Invalid value for '--attempt': 2147483648 is out of range for int "
                     "(at most 2147483647) (see `tide job logs --help`)"),
}


def test_tide_refuses_integers_the_database_cannot_hold(
        db: psycopg.Connection[Any], db_url: str) -> None:
    """They used to be blamed on the schema ("run tide db migrate")."""
    biggest = "9223372036854775807"  # in range, and no job has it: as any unknown id
    unknown = {f"unknown-{c}": ["job", c, biggest] for c in ("status", "cancel")}
    said = tide_all(db_url, {**{name: argv for name, (argv, _) in TIDE_INTEGERS.items()},
                             **unknown})
    assert {name: said[name] for name in TIDE_INTEGERS} == {
        name: (2, "", line) for name, (_, line) in TIDE_INTEGERS.items()}
    assert {name: said[name] for name in unknown} == {
        name: (1, "", f"tide: no job with id {biggest}") for name in unknown}
    assert db.execute("SELECT count(*) FROM atlantis.jobs").fetchone() == (0,)
    code, out, _ = tide(db_url, "job", "enqueue", "tests.Echo", "--args", '{"key": "x"}',
                        "--priority", "-2147483648")
    assert code == 0 and job_row(db, int(out))["priority"] == -2147483648


#: id: (a call, the ValidationError's exact text)
PYTHON_INTEGERS: dict[str, tuple[str, str]] = {
    "cancel": ("cancel", f"job_id: {HUGE} is out of range for bigint (at most "
                         "9223372036854775807)"),
    "retry": ("retry", f"job_id: {HUGE} is out of range for bigint (at most 9223372036854775807)"),
    "cancel-not-an-integer": ("cancel-bool", "job_id: expected an integer, got bool"),
    "enqueue-priority": ("enqueue", "priority: 2147483648 is out of range for int (at most "
                                    "2147483647)"),
    "enqueue-many-priority": ("enqueue_many", "priority: -2147483649 is out of range for int (at "
                                              "least -2147483648)"),
    "enqueue-priority-not-an-integer": ("enqueue-float", "priority: expected an integer, got "
                                                         "float"),
}


def _python_call(conn: psycopg.Connection[Any], call: str) -> Any:
    big = int(HUGE)
    calls: dict[str, Callable[[], object]] = {
        "cancel": lambda: atlantis.cancel(conn, big),
        "retry": lambda: atlantis.retry(conn, big),
        "cancel-bool": lambda: atlantis.cancel(conn, True),
        "enqueue": lambda: atlantis.enqueue(conn, "tests.Echo", {"key": "x"}, priority=2**31),
        "enqueue_many": lambda: atlantis.enqueue_many(conn, "tests.Echo", [{"key": "x"}],
                                                      priority=-(2**31) - 1),
        "enqueue-float": lambda: atlantis.enqueue(conn, "tests.Echo", {"key": "x"},
                                                  priority=1.5),  # type: ignore[arg-type]
    }
    return calls[call]()


@pytest.mark.parametrize("case", list(PYTHON_INTEGERS))
def test_the_python_api_names_the_parameter_out_of_range(db_url: str, case: str) -> None:
    """It used to raise psycopg.errors.UndefinedFunction."""
    call, message = PYTHON_INTEGERS[case]
    with psycopg.connect(db_url) as conn:  # inside the caller's open transaction
        conn.execute("SELECT 1")
        with pytest.raises(ValidationError) as refused:
            _python_call(conn, call)
        assert str(refused.value) == message
        assert conn.execute("SELECT count(*) FROM atlantis.jobs").fetchone() == (0,)
        with pytest.raises(JobNotFoundError):  # in range, unknown: as before
            atlantis.cancel(conn, 2**63 - 1)


def test_the_async_twins_refuse_alike(db_url: str) -> None:
    async def go() -> list[str]:
        said = []
        async with await psycopg.AsyncConnection.connect(db_url) as conn:
            calls: list[Callable[[], Awaitable[object]]] = [
                lambda: atlantis.cancel_async(conn, int(HUGE)),
                lambda: atlantis.retry_async(conn, -int(HUGE)),
                lambda: atlantis.enqueue_async(conn, "tests.Echo", {"key": "x"}, priority=2**31),
                lambda: atlantis.enqueue_many_async(conn, "tests.Echo", [{"key": "x"}],
                                                    priority=2**63)]
            for call in calls:
                try:
                    await call()
                except ValidationError as exc:
                    said.append(str(exc).split(":")[0])
        return said

    assert asyncio.run(go()) == ["job_id", "job_id", "priority", "priority"]


def test_the_console_treats_an_id_past_bigint_as_unknown(
        db: psycopg.Connection[Any], db_url: str) -> None:
    """Path ids past a bigint are unknown ids (404, JSON), reads and writes alike: the
    console looks the job up before it acts (already so on 120c77f; kept as a guard)."""
    from tests.test_console_api import BEARER, SECRET

    pytest.importorskip("starlette")
    from starlette.testclient import TestClient

    from atlantis.console.app import create_app
    from atlantis.console.settings import Settings, Token

    settings = Settings(db_url, token=Token("ops", SECRET), poll_interval=0.5, log_interval=0.2,
                        debounce=0.05)
    with TestClient(create_app(settings), base_url="http://127.0.0.1") as c:
        for r in (c.get(f"/api/jobs/{HUGE}"), c.get(f"/api/jobs/{HUGE}/logs"),
                  c.post(f"/api/jobs/{HUGE}/cancel", headers=BEARER),
                  c.post(f"/api/jobs/{HUGE}/retry", headers=BEARER),
                  c.delete(f"/api/jobs/{HUGE}", headers=BEARER)):
            assert (r.status_code, r.json()) == (404, {"error": f"no job with id {HUGE}"})
        assert c.get(f"/jobs/{HUGE}").status_code == 404


# ---- tide gen -----------------------------------------------------------------------------


def test_gen_says_in_one_line_what_it_cannot_do(db_url: str, tmp_path: Path) -> None:
    """A keyword field, a field hiding a name the module uses, and an output it cannot
    write used to end in a traceback."""
    keyword = tmp_path / "keyword.atl"
    keyword.write_text("job J in ns {\n  args { from text }\n}\n")
    shadow = tmp_path / "shadow.atl"
    shadow.write_text("job J in ns {\n  args {\n    a int\n    str text\n  }\n}\n")
    good = ROOT / "examples" / "contacts" / "jobs.atl"
    out = tmp_path / "out.py"
    missing = tmp_path / "no" / "such" / "folder" / "out.py"
    binary = tmp_path / "binary.py"
    binary.write_bytes(b"\xff\xfe")
    said = tide_all(db_url, {
        "keyword": ["gen", str(keyword), "-o", str(out)],
        "shadow": ["gen", str(shadow), "-o", str(out)],
        "unwritable": ["gen", str(good), "-o", str(missing)],
        "not-utf8": ["gen", str(good), "-o", str(binary), "--check"],
    })
    assert said == {
        "keyword": (2, "", f"tide: {keyword}:2:10: field name 'from' is a Python keyword, and "
                    "handlers get each field as an attribute of that name; rename the field"),
        "shadow": (2, "", f"tide: {shadow}:4:5: field 'str' of job ns.J cannot be an attribute "
                   "of the generated args class; rename the field"),
        "unwritable": (1, "", f"tide: cannot write {missing}: No such file or directory"),
        "not-utf8": (1, "", f"tide: {binary} is stale; run: tide gen {good} -o {binary}"),
    }
    assert not out.exists()


# ---- priority: which way it runs ----------------------------------------------------------


def test_lower_priority_runs_first_and_every_doc_says_so(
        db: psycopg.Connection[Any], db_url: str, supervise: Any) -> None:
    ids = {p: atlantis.enqueue(db, "tests.Echo", {"key": f"p{p}"}, priority=p)
           for p in (5, -3, 0)}
    supervise(concurrency=1)
    for job_id in ids.values():
        wait_state(db, job_id, "complete")
    ran = db.execute("SELECT key FROM test_events WHERE event = 'ran' ORDER BY id").fetchall()
    assert [key for (key,) in ran] == ["p-3", "p0", "p5"]
    helped = CliRunner().invoke(tide_main, ["job", "enqueue", "--help"]).output
    assert "Lower runs first" in " ".join(helped.split())
    grammar = " ".join((ROOT / "docs" / "reference" / "atl.md").read_text("utf-8").split())
    assert "`priority N` (lower runs first" in grammar
    assert "(lower `--priority` runs first)" in grammar
    assert "lower runs first" in (atlantis.enqueue.__doc__ or "")


# ---- the document -------------------------------------------------------------------------


#: One row per class of error: the cases the table quotes.
DOCUMENTED_ATL = ("timeout-too-long", "keyword-field", "dunder-field", "nul-in-default",
                  "lone-surrogate")


def test_the_bad_input_table_quotes_these_messages() -> None:
    text = bad_input_text().replace("\\|", "|")
    quoted = ([ATL_REFUSALS[c][1] for c in DOCUMENTED_ATL]
              + [TIDE_DURATIONS[c][1] for c in ("prune", "delay")]
              + [SUPERVISOR_DURATIONS["retention"][1]]
              + [TIDE_INTEGERS[c][1] for c in ("cancel", "priority", "list-limit", "logs-attempt")]
              + [PYTHON_INTEGERS[c][1] for c in ("cancel", "cancel-not-an-integer",
                                                  "enqueue-priority")]
              + [PYTHON_DECL_REFUSAL])
    missing = [m for m in quoted if m not in text]
    assert not missing, "docs/reference/bad-input/ lacks:\n" + "\n".join(missing)

