"""The bad-input reference (docs/reference/bad-input/, one page per surface): every row of
its tables names the test that backs it, and the tests here back the rows no other file
covers, with the exact text a user sees.

``test_the_table_names_only_tests_that_exist`` reads the pages and checks that each test
they name exists (the function, and the parameter id when one is given),
``test_the_table_quotes_the_real_messages`` that every message asserted here stands in them
word for word, and ``test_every_case_here_is_named_by_a_row`` that no case of this file lost
its row: none can drift from the code. ``test_every_page_is_listed_and_holds_a_table`` keeps
the pages and the toctree of index.md in step.
"""

from __future__ import annotations

import ast
import math
import os
import re
import secrets
import subprocess
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson
import psutil
import psycopg
import pytest

import atlantis
from atlantis.errors import UnknownJobError, ValidationError
from tests.conftest import BIN, ROOT, wait_for, wait_state
from tests.docs import bad_input_pages, bad_input_text, table_headers, table_rows, toctree

CONTAIN = "tests.apps.contain:registry"
SYNC_HINT = ("sync the declarations into the database: tide db sync --app "
             "package.module:registry (atlantis-supervise does it at start)")

# ---- enqueue ----------------------------------------------------------------------------------

#: id: (job, args, the error's class, its exact text)
ENQUEUE_PY: dict[str, tuple[str, Any, type[Exception], str]] = {
    "unknown-job": ("nowhere.Nothing", {}, UnknownJobError,
                    f"unknown job nowhere.Nothing; {SYNC_HINT}"),
    "not-a-mapping": ("tests.Typed", ["name"], ValidationError,
                      "job tests.Typed: args must be a mapping (a JSON object), got list"),
    "wrong-type": ("tests.Typed", {"name": "a", "count": "1"}, ValidationError,
                   "job tests.Typed: field count: expected int, got string"),
    "fraction-for-int": ("tests.Typed", {"name": "a", "count": 1.5}, ValidationError,
                         "job tests.Typed: field count: expected int, got 1.5"),
    "int-out-of-range": ("tests.Typed", {"name": "a", "count": 2**31}, ValidationError,
                         "job tests.Typed: field count: 2147483648 is out of range for int"),
    "missing": ("tests.Typed", {"count": 1}, ValidationError,
                "job tests.Typed: field name is required (declared not null)"),
    "null-for-not-null": ("tests.Typed", {"name": None}, ValidationError,
                          "job tests.Typed: field name is required (declared not null)"),
    "unknown-field": ("tests.Typed", {"name": "a", "nope": 1}, ValidationError,
                      "job tests.Typed: unknown field nope"),
    "varchar-too-long": ("tests.Typed", {"name": "waytoolongname"}, ValidationError,
                         "job tests.Typed: field name: value of 14 characters is longer than "
                         "varchar(8)"),
    "bad-uuid": ("tests.Typed", {"name": "a", "id": "not-a-uuid"}, ValidationError,
                 'job tests.Typed: field id: "not-a-uuid" is not a valid uuid'),
    "timestamptz-without-offset": (
        "tests.Typed", {"name": "a", "at": "2024-01-31 12:00:00"}, ValidationError,
        'job tests.Typed: field at: "2024-01-31 12:00:00" has no time zone offset: a timestamptz '
        "needs Z or an offset such as +02:00 (RFC 3339)"),
    "timestamptz-special-word": (
        "tests.Typed", {"name": "a", "at": "tomorrow"}, ValidationError,
        'job tests.Typed: field at: "tomorrow" is not a valid timestamptz: expected RFC 3339 '
        'with Z or an offset, such as "2024-01-31T12:00:00Z"'),
    "date-special-word": (
        "tests.Typed", {"name": "a", "day": "epoch"}, ValidationError,
        'job tests.Typed: field day: "epoch" is not a valid date: expected YYYY-MM-DD, such as '
        '"2024-01-31"'),
    "bad-array-element": ("tests.Typed", {"name": "a", "tags": ["x", 1]}, ValidationError,
                          "job tests.Typed: field tags[1]: expected text, got number"),
    "oversized": ("tests.Echo", {"key": "big", "value": "x" * (1024 * 1024 + 10)},
                  ValidationError, "job tests.Echo: args are 1048613 bytes, larger than the "
                  "limit of 1048576 bytes"),
    "too-deep": ("values.Deep", {"doc": orjson.loads("[" * 65 + "]" * 65)}, ValidationError,
                 "job values.Deep: field doc: nested 65 levels deep, more than the limit of 64"),
    "nan-float": ("values.Big", {"n": 1, "d": math.nan}, ValidationError,
                  "job values.Big: field d: float('nan') cannot be enqueued: JSON numbers must "
                  "be finite"),
    "nan-decimal": ("values.Big", {"n": Decimal("NaN")}, ValidationError,
                    "job values.Big: field n: Decimal('NaN') cannot be enqueued: JSON numbers "
                    "must be finite"),
    "long-number": ("values.Big", {"n": Decimal("1" * 4001)}, ValidationError,
                    "job values.Big: field n: a number 4001 characters long, more than the "
                    "limit of 4000"),
    "nul-in-text": ("tests.Echo", {"key": "a\x00b"}, ValidationError,
                    "job tests.Echo: field key: text with a NUL character (\\u0000) cannot be "
                    "enqueued: PostgreSQL cannot store it"),
    "nul-in-jsonb": ("values.Deep", {"doc": {"a": "x\x00y"}}, ValidationError,
                     "job values.Deep: field doc['a']: text with a NUL character (\\u0000) "
                     "cannot be enqueued: PostgreSQL cannot store it"),
    "not-json": ("tests.Echo", {"key": object()}, ValidationError,
                 "job tests.Echo: field key: cannot be written as JSON: Type is not JSON "
                 "serializable: object"),
    "lone-surrogate": ("tests.Echo", {"key": "a\ud800b"}, ValidationError,
                       "job tests.Echo: field key: cannot be written as JSON: str is not valid "
                       "UTF-8: surrogates not allowed"),
}

#: id: (job, args as JSON text or None, SQLSTATE, exact primary message)
ENQUEUE_SQL: dict[str, tuple[str, str | None, str, str]] = {
    "unknown-job": ("nowhere.Nothing", "{}", "ATL01", "unknown job nowhere.Nothing"),
    "not-an-object": ("tests.Typed", '["name"]', "ATL02",
                      "job tests.Typed: args must be a JSON object, got array"),
    "null-args": ("tests.Echo", None, "ATL02", "job tests.Echo: args must be a JSON object, got "
                  "nothing"),
    "wrong-type": ("tests.Typed", '{"name": "a", "count": "1"}', "ATL02",
                   "job tests.Typed: field count: expected int, got string"),
    "missing": ("tests.Typed", '{"count": 1}', "ATL02",
                "job tests.Typed: field name is required (declared not null)"),
    "unknown-field": ("tests.Typed", '{"name": "a", "nope": 1}', "ATL02",
                      "job tests.Typed: unknown field nope"),
    "varchar-too-long": ("tests.Typed", '{"name": "waytoolongname"}', "ATL02",
                         "job tests.Typed: field name: value of 14 characters is longer than "
                         "varchar(8)"),
    "oversized": ("tests.Echo", orjson.dumps({"key": "b", "value": "x" * (1024 * 1024 + 10)}
                                             ).decode(), "ATL02",
                  "job tests.Echo: args are 1048611 bytes, larger than the limit of 1048576 "
                  "bytes"),
    "too-deep": ("values.Deep", '{"doc": ' + "[" * 65 + "]" * 65 + "}", "ATL02",
                 "job values.Deep: field doc: nested 65 levels deep, more than the limit of 64"),
    "long-number": ("values.Big", '{"n": ' + "1" * 4001 + "}", "ATL02",
                    "job values.Big: field n: a number 4001 characters long, more than the "
                    "limit of 4000"),
    "timestamptz-without-offset": (
        "tests.Typed", '{"name": "a", "at": "2024-01-31T12:00:00"}', "ATL02",
        'job tests.Typed: field at: "2024-01-31T12:00:00" has no time zone offset: a timestamptz '
        "needs Z or an offset such as +02:00 (RFC 3339)"),
    "timestamptz-special-word": (
        "tests.Typed", '{"name": "a", "at": "infinity"}', "ATL02",
        'job tests.Typed: field at: "infinity" is not a valid timestamptz: expected RFC 3339 '
        'with Z or an offset, such as "2024-01-31T12:00:00Z"'),
    "date-special-word": (
        "tests.Typed", '{"name": "a", "day": "2024-01-31 BC"}', "ATL02",
        'job tests.Typed: field day: "2024-01-31 BC" is not a valid date: expected YYYY-MM-DD, '
        'such as "2024-01-31"'),
    "not-json": ("tests.Echo", "{key: 1}", "22P02", "invalid input syntax for type json"),
    "nan": ("values.Big", '{"n": NaN}', "22P02", "invalid input syntax for type json"),
    "nul": ("tests.Echo", '{"key": "a\\u0000b"}', "22P05", "unsupported Unicode escape sequence"),
}


def _count(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT count(*) FROM atlantis.jobs").fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("case", list(ENQUEUE_PY))
def test_enqueue_from_python_is_refused_and_writes_nothing(db_url: str, case: str) -> None:
    job, args, error, text = ENQUEUE_PY[case]
    with psycopg.connect(db_url) as conn:  # inside the caller's open transaction
        conn.execute("SELECT 1")
        with pytest.raises(error) as info:
            atlantis.enqueue(conn, job, args)
        assert str(info.value) == text
        assert _count(conn) == 0  # the transaction is still usable, and holds no row


@pytest.mark.parametrize("case", list(ENQUEUE_SQL))
def test_enqueue_from_sql_is_refused_and_writes_nothing(
        db: psycopg.Connection[Any], case: str) -> None:
    job, args, sqlstate, text = ENQUEUE_SQL[case]
    with pytest.raises(psycopg.Error) as info:
        db.execute("SELECT atlantis.enqueue(%s, %s::jsonb)", (job, args))
    assert (info.value.sqlstate, info.value.diag.message_primary) == (sqlstate, text)
    if sqlstate == "ATL01":
        assert info.value.diag.message_hint == SYNC_HINT
    assert _count(db) == 0


def test_enqueue_many_with_one_bad_row_inserts_none(db: psycopg.Connection[Any]) -> None:
    good = {"key": "fine"}
    with pytest.raises(ValidationError) as info:
        atlantis.enqueue_many(db, "tests.Echo", [good, good, {"key": 1}, good])
    assert str(info.value) == "job tests.Echo: field key: expected text, got number"
    with pytest.raises(psycopg.Error) as refused:
        db.execute("SELECT atlantis.enqueue_many('tests.Echo', %s::jsonb[])",
                   (['{"key": "fine"}', '{"key": 1}'],))
    assert refused.value.diag.message_primary == "job tests.Echo: field key: expected text, got number"
    assert _count(db) == 0


#: tide job enqueue ARGS...: (exit status, last line of stderr)
TIDE: dict[str, tuple[list[str], int, str]] = {
    "unknown-job": (["nope.X", "--args", "{}"], 1, f"tide: unknown job nope.X; {SYNC_HINT}"),
    "not-json": (["tests.Echo", "--args", "{key: 1}"], 1,
                 "tide: --args is not JSON: Expecting property name enclosed in double quotes: "
                 "line 1 column 2 (char 1)"),
    "not-an-object": (["tests.Echo", "--args", "[1]"], 1, "tide: --args must be a JSON object"),
    "nan": (["tests.Echo", "--args", '{"key": NaN}'], 1,
            "tide: --args is not JSON: NaN is not a JSON number"),
    "wrong-type": (["tests.Echo", "--args", '{"key": 1}'], 1,
                   "tide: job tests.Echo: field key: expected text, got number"),
    "timestamptz-without-offset": (
        ["tests.Typed", "--args", '{"name": "a", "at": "2024-01-31 12:00"}'], 1,
        'tide: job tests.Typed: field at: "2024-01-31 12:00" has no time zone offset: a '
        "timestamptz needs Z or an offset such as +02:00 (RFC 3339)"),
    "bad-delay": (["tests.Echo", "--args", '{"key": "x"}', "--delay", "nan"], 2,
                  "tide: Invalid value for --delay: invalid duration 'nan': not a finite number "
                  "(use e.g. 500ms, 30s, 10m, 2h, 1d, 1h30m) (see `tide job enqueue --help`)"),
}


def _run_all(commands: dict[str, list[str]], **kw: Any) -> dict[str, tuple[int, str]]:
    """Run the commands at once; (exit status, last line of stderr) of each."""
    procs = {name: subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True, **kw) for name, argv in commands.items()}
    out = {}
    for name, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=60)
        assert stdout == "", (name, stdout)
        assert "Traceback" not in stderr, (name, stderr)
        out[name] = (proc.returncode, (stderr.strip().splitlines() or [""])[-1])
    return out


def test_enqueue_from_tide_is_one_line_and_writes_nothing(
        db: psycopg.Connection[Any], db_url: str) -> None:
    got = _run_all({name: [str(BIN / "tide"), "--database-url", db_url, "job", "enqueue", *argv]
                    for name, (argv, _, _) in TIDE.items()}, cwd=ROOT)
    assert got == {name: (code, line) for name, (_, code, line) in TIDE.items()}
    assert _count(db) == 0


# ---- configuration ----------------------------------------------------------------------------

BAD_APPS = {
    "boom.py": "raise RuntimeError('boom at import')\n",
    "badatl.py": "import atlantis\nregistry = atlantis.Registry.from_atl('bad.atl')\n",
    "bad.atl": "job Oops in x {\n  retries 1\n  frobnicate 3\n}\n",
}
GOOD = ["--queue", "q", "--app", "tests.apps.basic:registry"]
USAGE = " (see `atlantis-supervise --help`)"

#: id: (arguments after the database URL, exit status, the one line on stderr); /srv/app is
#: where the test's bad apps live.
CONFIG: dict[str, tuple[list[str], int, str]] = {
    "unknown-app": (["--queue", "q", "--app", "no_such_module_xyz:registry"], 2,
                    "atlantis-supervise: --app 'no_such_module_xyz:registry': no module named "
                    "'no_such_module_xyz'"),
    "app-raises-on-import": (["--queue", "q", "--app", "boom:registry"], 2,
                             "atlantis-supervise: --app 'boom:registry': importing it failed: "
                             "RuntimeError: boom at import (/srv/app/boom.py:1)"),
    "app-with-a-bad-atl": (["--queue", "q", "--app", "badatl:registry"], 2,
                           "atlantis-supervise: --app 'badatl:registry': /srv/app/bad.atl:3:3: "
                           "unknown modifier 'frobnicate' (expected one of: args, retries, "
                           "timeout, heartbeat, queue, priority, unique, backoff, stall, "
                           "schedule, tz, overlap, concurrency, rate)"),
    "no-app": (["--queue", "q", "--app", ""], 2, "atlantis-supervise: no application: pass "
               "--app package.module:registry or set ATLANTIS_APP"),
    "no-queue": (["--app", "tests.apps.basic:registry"], 2,
                 "atlantis-supervise: at least one --queue is required"),
    "unknown-option": ([*GOOD, "--bogus"], 2,
                       "atlantis-supervise: No such option '--bogus'." + USAGE),
    "bad-choice": ([*GOOD, "--isolation", "sometimes"], 2,
                   "atlantis-supervise: Invalid value for '--isolation': 'sometimes' is not one "
                   "of 'reuse', 'fresh'." + USAGE),
    "nan-duration": ([*GOOD, "--drain-timeout", "nan"], 2,
                     "atlantis-supervise: --drain-timeout: invalid duration 'nan': not a finite "
                     "number (use e.g. 500ms, 30s, 10m, 2h, 1d, 1h30m)"),
    "bad-duration": ([*GOOD, "--drain-timeout", "soon"], 2,
                     "atlantis-supervise: --drain-timeout: invalid duration 'soon' (use e.g. "
                     "500ms, 30s, 10m, 2h, 1d, 1h30m)"),
    "negative-duration": ([*GOOD, "--kill-grace", "-1s"], 2,
                          "atlantis-supervise: --kill-grace: negative duration '-1s'"),
    "bad-size": ([*GOOD, "--max-memory-per-child", "lots"], 2,
                 "atlantis-supervise: --max-memory-per-child: invalid size 'lots' (use e.g. "
                 "512MB, 2GB)"),
    "bad-number": ([*GOOD, "--max-tasks-per-child", "many"], 2,
                   "atlantis-supervise: --max-tasks-per-child: 'many' is not a whole number"),
    "negative-number": ([*GOOD, "--max-tasks-per-child", "-1"], 2,
                        "atlantis-supervise: --max-tasks-per-child must not be negative"),
    "zero-concurrency": ([*GOOD, "--concurrency", "0"], 2,
                         "atlantis-supervise: --concurrency must be at least 1"),
    "malformed-database-url": ([*GOOD, "--database-url", "postgresql://u:pa%zzss@localhost/db"],
                               2, "atlantis-supervise: --database-url: invalid database URL: "
                               'invalid percent-encoded token: "***"'),
    "unreachable-database": ([*GOOD, "--database-url", "postgresql://u:sekrit@127.0.0.1:1/db",
                              "--startup-timeout", "1s"], 1,
                             "atlantis-supervise: database unreachable for 1s, giving up: "
                             'connection failed: connection to server at "127.0.0.1", port 1 '
                             "failed: Connection refused; Is the server running on that host "
                             "and accepting TCP/IP connections?"),
}


def test_bad_configuration_is_one_line_and_the_right_exit_status(
        db_url: str, tmp_path: Path) -> None:
    for name, text in BAD_APPS.items():
        (tmp_path / name).write_text(text)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}",
           "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("ATLANTIS_APP", None)
    got = _run_all({name: [str(BIN / "atlantis-supervise"), "--database-url", db_url, *argv]
                    for name, (argv, _, _) in CONFIG.items()}, cwd=tmp_path, env=env)
    got = {name: (code, line.replace(str(tmp_path), "/srv/app"))
           for name, (code, line) in got.items()}
    assert got == {name: (code, line) for name, (_, code, line) in CONFIG.items()}
    for _code, line in got.values():
        assert "sekrit" not in line and "zzss" not in line


# ---- handlers ---------------------------------------------------------------------------------

#: contain.Act mode: (final state, error kind, exact last_error)
HANDLERS: dict[str, tuple[str, str | None, str | None]] = {
    "unpicklable": ("dead", "exception", "UnpicklableError: holds a lock"),
    "os-exit": ("dead", "crash", "child exited with code 5"),
    "segv": ("dead", "crash", "killed by SIGSEGV"),
    "recursion": ("dead", "exception", "RecursionError: maximum recursion depth exceeded"),
    "forkbomb": ("dead", "tasks",
                 "task limit (64 processes and threads) exceeded (--max-tasks-per-child)"),
    "slow-threads": ("dead", "tasks",
                     "task limit (64 processes and threads) exceeded (--max-tasks-per-child)"),
    "binary": ("complete", None, None),
    "checkpoint-nan-huge": ("complete", None, None),
}


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


def test_handler_faults_end_their_attempt_only(
        db: psycopg.Connection[Any], supervise: Any) -> None:
    """Each fault ends its own attempt with the kind and text of the table, among others;
    the fork bomb (2,500 processes) is stopped past 64 tasks, tree and all, and so is a tree
    that grows by a thread every 5 ms (counted again only once it may have passed the limit);
    the supervisor stays alive and runs the jobs enqueued after them."""
    sup = supervise("--max-tasks-per-child", "64", queues=("contain",), app=CONTAIN)
    marker = f"bomb-{secrets.token_hex(4)}"
    ids = {mode: atlantis.enqueue(db, "contain.Act",
                                  {"key": marker if mode == "forkbomb" else mode, "mode": mode})
           for mode in HANDLERS}
    for mode, (state, kind, text) in HANDLERS.items():
        row = wait_state(db, ids[mode], "complete", "dead")
        got = (row["state"], row["errors"][-1]["kind"] if row["errors"] else None,
               row["last_error"])
        assert got == (state, kind, text), (mode, row["errors"])
    checkpoint = wait_state(db, ids["checkpoint-nan-huge"], "complete")
    assert checkpoint["progress_pct"] == 0 and checkpoint["progress_msg"] == "y" * 256
    wait_for(lambda: not _survivors(marker), message="no process of the fork bomb left")
    after = atlantis.enqueue_many(db, "contain.Act", [{"key": "after", "mode": "ok"}] * 2)
    for job_id in after:
        wait_state(db, job_id, "complete")
    assert sup.proc.poll() is None
    log = sup.log()
    assert f"job={ids['binary']} attempt=1 \\xff\\xfe binary \\x00 out" in log
    assert "\x00" not in log
    assert "over --max-tasks-per-child; killing its whole tree" in log


def test_the_unit_file_and_the_default_task_limit_agree() -> None:
    from atlantis.supervisor.settings import Settings

    unit = (ROOT / "deploy" / "systemd" / "atlantis-supervise@.service").read_text("utf-8")
    assert "--max-tasks-per-child 512" in unit
    assert Settings(queues=("q",)).max_tasks_per_child == 512


# ---- the document -----------------------------------------------------------------------------

_REFERENCE = re.compile(r"`(tests/[\w/]+\.py)::(\w+)(?:\[([^\]]+)\])?`")


def test_every_page_is_listed_and_holds_a_table() -> None:
    """index.md lists every page of the folder and no other; each page is a titled table (or
    several) of bad input, what the user sees and the test."""
    pages = bad_input_pages()
    listed = toctree(pages.pop("index.md"))
    assert sorted(f"{name}.md" for name in listed) == sorted(pages)
    assert len(pages) >= 12, sorted(pages)
    for name, text in pages.items():
        assert text.startswith("# "), name
        headers = table_headers(text)
        assert headers, f"{name}: no table"
        for header in headers:
            assert len(header) == 3, (name, header)
            assert header[1].startswith("what the user sees") and header[2] == "test", (name, header)
        assert table_rows(text), f"{name}: a table without a row"


def test_the_table_names_only_tests_that_exist() -> None:
    rows = [(name, row) for name, text in bad_input_pages().items() for row in table_rows(text)]
    assert len(rows) >= 60, len(rows)
    sources: dict[str, str] = {}
    functions: dict[str, set[str]] = {}  # each file parsed once, not once per reference
    for page, row in rows:
        assert len(row) == 3, (page, row)
        refs = _REFERENCE.findall(row[2])
        assert refs, f"{page}: a row without a test: {row}"
        for path, name, param in refs:
            if path not in sources:
                sources[path] = (ROOT / path).read_text("utf-8")
                functions[path] = {
                    node.name for node in ast.walk(ast.parse(sources[path]))
                    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)}
            assert name in functions[path], f"{page}: {path}::{name} does not exist"
            if param:
                assert f'"{param}"' in sources[path], \
                    f"{page}: {path}::{name}[{param}]: no such id"


def test_every_case_here_is_named_by_a_row() -> None:
    """Rows that share a message (a missing field, a null one) each keep their own row."""
    named = {ref for text in bad_input_pages().values() for row in table_rows(text)
             for ref in _REFERENCE.findall(row[2])}
    here = "tests/test_bad_input.py"
    cases = ([("test_enqueue_from_python_is_refused_and_writes_nothing", c) for c in ENQUEUE_PY]
             + [("test_enqueue_from_sql_is_refused_and_writes_nothing", c) for c in ENQUEUE_SQL]
             + [(name, "") for name in (
                 "test_enqueue_many_with_one_bad_row_inserts_none",
                 "test_enqueue_from_tide_is_one_line_and_writes_nothing",
                 "test_bad_configuration_is_one_line_and_the_right_exit_status",
                 "test_handler_faults_end_their_attempt_only",
                 "test_a_crash_says_why_the_child_stopped_itself")])
    missing = [f"{name}[{case}]" if case else name for name, case in cases
               if (here, name, case) not in named]
    assert not missing, "no row names:\n" + "\n".join(missing)


def test_the_table_quotes_the_real_messages() -> None:
    text = bad_input_text().replace("\\|", "|")
    quoted = ([t for _, _, _, t in ENQUEUE_PY.values()] + [t for *_, t in ENQUEUE_SQL.values()]
              + [t for *_, t in TIDE.values()] + [t for *_, t in CONFIG.values()]
              + [t for *_, t in HANDLERS.values() if t is not None])
    missing = [t for t in quoted if t not in text]
    assert not missing, "docs/reference/bad-input/ lacks:\n" + "\n".join(missing)


def test_a_crash_says_why_the_child_stopped_itself() -> None:
    """The child's last words (in its lease cell) replace the guess that a SIGKILL means memory."""
    from atlantis.protocol.leasecell import LeaseCell
    from atlantis.supervisor import policy

    cell, fd = LeaseCell.create()
    os.close(fd)
    cell.set_last_words("the child lost its control pipe ([Errno 9] Bad file descriptor)")
    facts = policy.AttemptFacts(1, 1, 1.0, 60.0)
    limits = policy.Limits(max_snooze=1.0, max_backoff=1.0)
    said = policy.decide_exit(facts, limits, -9, said=cell.last_words())
    cell.close()
    assert said.error is not None and said.error["message"] == (
        "killed by SIGKILL: the child lost its control pipe ([Errno 9] Bad file descriptor)")
    silent = policy.decide_exit(facts, limits, -9)
    assert silent.error is not None
    assert silent.error["message"] == "killed by SIGKILL (perhaps out of memory?)"
