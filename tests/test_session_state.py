"""No session state anywhere: what PgBouncer in transaction mode cannot carry.

Behind a pooler each transaction may run on another server connection, so whatever a
statement leaves on the *session* either leaks to another client (an advisory lock held
forever, a ``SET`` changing someone else's statements) or is lost. Every SQL text atlantis
has is read here: the store's ``*.sql`` files (named queries, functions, migrations, each
function body and string literal as well) and the string constants of every Python module
under ``atlantis/`` (docstrings aside). Refused:

- a session-level advisory lock (``pg_advisory_lock``, ``pg_try_advisory_lock``, their
  ``_shared`` forms and the unlocks): only the ``_xact_`` ones, released at the end of the
  transaction;
- a ``SET`` or ``RESET`` statement, except ``SET LOCAL``, ``SET TRANSACTION`` and
  ``SET CONSTRAINTS`` (transaction-scoped); ``UPDATE ... SET``, ``ALTER ... SET`` and the
  ``SET`` clause of a function's definition (``SECURITY DEFINER SET search_path = ...``:
  applied for the call only) are not statements and pass;
- ``set_config(name, value, is_local)`` unless ``is_local`` is literally ``true``;
- ``LISTEN`` anywhere but the named queries the LISTEN connections run (which go over a
  direct connection: ``--listen-database-url``), ``PREPARE``, a cursor ``WITH HOLD``, and a
  temporary table that outlives its transaction (no ``ON COMMIT DROP``);
- a startup ``options`` parameter on a connection (``-c name=value``), which PgBouncer
  refuses unless told to ignore it.

SQL keywords in Python strings are matched in upper case (the house style writes SQL so),
which keeps English prose such as "Set the ..." out of it; a string passed straight to
``execute`` (or the supervisor's ``fetch``) is a statement, read in any case.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "atlantis"
SQL_FILES = sorted((PACKAGE / "store").glob("*.sql")) + sorted(
    (PACKAGE / "store" / "live").glob("*.sql")) + sorted(
    (PACKAGE / "store" / "migrations").glob("*.sql"))

#: Named queries that LISTEN: run only on the LISTEN connections (the supervisor's, which
#: ``--listen-database-url`` points past a pooler or ``--no-listen`` turns off, and the
#: console's), never on a pooled one; and ``atlantis.wait``'s, on its caller's connection
#: only when that is no pooler's (it finds out first, and polls behind one).
LISTEN_QUERIES = {"listen", "console_listen", "wait_listen", "wait_unlisten"}

#: Named queries whose purpose is to reset a session: ``step_session_reset`` clears what an
#: attempt's handler left on its child's step connection before the child's next attempt
#: (RESET ALL, UNLISTEN *, pg_advisory_unlock_all, ...). It leaves no state behind; through
#: a pooler it resets whichever server connection it runs on, as PgBouncer's own reset does.
RESET_QUERIES = {"step_session_reset"}

#: Tokens after which a word starts a statement (SQL, and PL/pgSQL bodies).
_STARTERS = {";", "BEGIN", "THEN", "ELSE", "LOOP", "DO"}
#: ``SET`` followed by these is transaction-scoped.
_TX_SET = {"LOCAL", "TRANSACTION", "CONSTRAINTS"}
_HEADER = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)
_SPECIAL = re.compile(r"--|/\*|'|\$")
_DOLLAR = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)?\$")
_TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|\S")
_SESSION_LOCK = re.compile(r"\bpg_(?:try_)?advisory_(?:lock|unlock)(?:_shared|_all)?\b",
                           re.IGNORECASE)


@dataclass(frozen=True)
class Finding:
    where: str
    what: str

    def __str__(self) -> str:
        return f"{self.where}: {self.what}"


def _split(text: str) -> tuple[str, list[str]]:
    """``text`` without comments, with each string literal and dollar-quoted body replaced
    by a placeholder token; and those literals and bodies, to be read on their own."""
    out: list[str] = []
    inner: list[str] = []
    i, n = 0, len(text)
    while i < n:
        special = _SPECIAL.search(text, i)
        if special is None:
            out.append(text[i:])
            break
        out.append(text[i:special.start()])
        i = special.start()
        if text.startswith("--", i):
            end = text.find("\n", i)
            i = n if end < 0 else end
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            i = n if end < 0 else end + 2
            out.append(" ")
        elif text[i] == "'":
            j = i + 1
            escapes = i > 0 and text[i - 1] in "eE" and (i < 2 or not text[i - 2].isalnum())
            while j < n:
                if escapes and text[j] == "\\":
                    j += 2
                    continue
                if text[j] == "'":
                    if text.startswith("''", j):
                        j += 2
                        continue
                    break
                j += 1
            inner.append(text[i + 1:j])
            out.append(" _literal_ ")
            i = j + 1
        elif (m := _DOLLAR.match(text, i)) and (i == 0 or not text[i - 1].isalnum()):
            end = text.find(m.group(0), m.end())
            end = n if end < 0 else end
            inner.append(text[m.end():end])
            out.append(" _body_ ")
            i = end + len(m.group(0))
        else:
            out.append(text[i])
            i += 1
    return "".join(out), inner


def _args(tokens: list[str], open_at: int) -> list[str]:
    """The top-level arguments of the call whose ``(`` is ``tokens[open_at]``."""
    depth = 0
    args: list[str] = []
    current: list[str] = []
    for tok in tokens[open_at:]:
        if tok == "(":
            depth += 1
            if depth == 1:
                continue
        elif tok == ")":
            depth -= 1
            if depth == 0:
                break
        if depth == 1 and tok == ",":
            args.append(" ".join(current))
            current = []
        else:
            current.append(tok)
    args.append(" ".join(current))
    return args


def scan(text: str, where: str, *, query: str = "", case_sensitive: bool = False
         ) -> Iterator[Finding]:
    """Every piece of session state ``text`` (SQL, perhaps with PL/pgSQL bodies) sets."""
    code, inner = _split(text)
    for m in _SESSION_LOCK.finditer(code):
        yield Finding(where, f"session-level advisory lock {m.group(0)}")
    tokens = _TOKEN.findall(code)

    def word(k: int) -> str:
        if not 0 <= k < len(tokens):
            return ""
        tok: str = tokens[k]
        return tok if case_sensitive else tok.upper()

    for k in range(len(tokens)):
        w = word(k)
        starts = k == 0 or word(k - 1) in _STARTERS
        nxt = word(k + 1)
        if starts and w == "SET" and nxt not in _TX_SET:
            yield Finding(where, f"session SET {tokens[k + 1] if k + 1 < len(tokens) else ''}")
        elif starts and w == "RESET":
            yield Finding(where, "RESET (session state)")
        elif starts and w in ("LISTEN", "UNLISTEN") and query not in LISTEN_QUERIES:
            yield Finding(where, f"{w} outside the LISTEN connections' queries")
        elif starts and w in ("PREPARE", "DEALLOCATE"):
            yield Finding(where, f"{w} (a session's prepared statement)")
        elif w == "HOLD" and word(k - 1) == "WITH":
            yield Finding(where, "a cursor WITH HOLD")
        elif w in ("TEMP", "TEMPORARY") and word(k + 1) == "TABLE" and word(k - 1) == "CREATE":
            rest = " ".join(word(j) for j in range(k, min(len(tokens), k + 400)))
            statement = rest.split(";", 1)[0]
            if "ON COMMIT DROP" not in statement:
                yield Finding(where, "a temporary table kept past its transaction")
        elif tokens[k].lower() == "set_config" and word(k + 1) == "(":
            args = _args(tokens, k + 1)
            if len(args) != 3 or args[2].strip().lower() != "true":
                yield Finding(where, f"set_config({', '.join(args)}) is not transaction-local")
    for piece in inner:
        yield from scan(piece, where, query=query, case_sensitive=case_sensitive)


def _sql_sections(path: Path) -> Iterator[tuple[str, str]]:
    """(query name, text) of each ``-- name:`` section of a .sql file ("" before the first)."""
    text = path.read_text("utf-8")
    names = list(_HEADER.finditer(text))
    yield "", text[:names[0].start()] if names else text
    ends = [m.start() for m in names[1:]] + [len(text)] if names else []
    for m, end in zip(names, ends, strict=True):
        yield m.group(1), text[m.end():end]


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


#: What a text must contain to be worth reading at all (most Python strings do not).
_CANDIDATE = re.compile(r"SET|LISTEN|PREPARE|DEALLOCATE|HOLD|TEMP|set_config|advisory",
                        re.IGNORECASE)


#: Methods whose first argument is a statement: read in any case.
_RUNNERS = {"execute", "executemany", "fetch", "fetch_rows", "fetch_one", "fetch_one_async"}


def _text(node: ast.expr) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(str(v.value) if isinstance(v, ast.Constant) else " _value_ "
                       for v in node.values)
    return None


def _python_strings(tree: ast.AST) -> Iterator[tuple[int, str, bool]]:
    """(line, text, whether it is a statement run as such) of every string but docstrings."""
    skip = _docstrings(tree)
    statements = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in _RUNNERS and node.args):
            statements.add(id(node.args[0]))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant | ast.JoinedStr) and id(node) not in skip:
            text = _text(node)
            if text is not None:
                yield node.lineno, text, id(node) in statements


def _connection_options(tree: ast.AST, rel: Path) -> Iterator[Finding]:
    """A startup ``options`` parameter given to a connection or a pool."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if "connect" in name.lower() or name.endswith("Pool"):
                if any(kw.arg == "options" for kw in node.keywords):
                    yield Finding(f"{rel}:{node.lineno}", f"options= given to {name}()")
        elif isinstance(node, ast.Dict):
            for key in node.keys:
                if isinstance(key, ast.Constant) and key.value == "options":
                    yield Finding(f"{rel}:{node.lineno}", "an 'options' key (connection kwargs?)")
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and re.search(r"\boptions\s*=\s*'?\s*-c", node.value)):
            yield Finding(f"{rel}:{node.lineno}", "options=-c ... in a conninfo")


def findings() -> list[Finding]:
    found: list[Finding] = []
    for path in SQL_FILES:
        rel = path.relative_to(ROOT)
        for name, text in _sql_sections(path):
            if name in RESET_QUERIES:
                continue
            found += scan(text, f"{rel}{f' ({name})' if name else ''}", query=name)
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT)
        tree = ast.parse(path.read_text("utf-8"))
        for line, text, statement in _python_strings(tree):
            if _CANDIDATE.search(text):
                found += scan(text, f"{rel}:{line}", case_sensitive=not statement)
        found += _connection_options(tree, rel)
    return found


def test_no_session_state_in_any_sql() -> None:
    found = findings()
    assert not found, "session state, which PgBouncer in transaction mode cannot carry:\n" + \
        "\n".join(map(str, found))


def test_the_sql_was_read() -> None:
    """The scan reaches what it must: the store's files, function bodies, Python SQL."""
    assert len(SQL_FILES) > 20
    texts = [s for p in SQL_FILES for _, s in _sql_sections(p)]
    assert any("pg_try_advisory_xact_lock" in t for t in texts)
    assert any("SET LOCAL" in t or "set_config" in t for t in texts)


@pytest.mark.parametrize("sql", [
    "SELECT pg_advisory_lock(1)",
    "SELECT pg_try_advisory_lock(hashtext('x'))",
    "SELECT pg_advisory_unlock_all()",
    "SELECT pg_advisory_lock_shared(1, 2)",
    "SET statement_timeout = 0",
    "SELECT 1; set search_path TO x",
    "SET SESSION lock_timeout = '1s'",
    "SET ROLE atlantis_worker",
    "RESET ALL",
    "SELECT set_config('a', 'b', false)",
    "SELECT set_config('a', 'b', %(local)s)",
    "LISTEN atlantis_jobs",
    "PREPARE q AS SELECT 1",
    "DECLARE c CURSOR WITH HOLD FOR SELECT 1",
    "CREATE TEMP TABLE t (a int)",
    "CREATE FUNCTION f() RETURNS void LANGUAGE plpgsql AS $$\nBEGIN\n"
    "  SET work_mem = '1GB';\nEND $$",
    "DO $x$ BEGIN PERFORM pg_advisory_lock(7); END $x$",
    "CREATE FUNCTION f() RETURNS void LANGUAGE plpgsql AS $$ BEGIN\n"
    "  EXECUTE 'SET work_mem = 1'; END $$",
])
def test_the_scan_finds_session_state(sql: str) -> None:
    assert list(scan(sql, "example")), sql


@pytest.mark.parametrize("sql", [
    "UPDATE atlantis.jobs SET state = 'x' WHERE id = 1",
    "INSERT INTO t VALUES (1) ON CONFLICT (id) DO UPDATE SET a = excluded.a",
    "SET LOCAL lock_timeout = '1s'",
    "BEGIN; SET TRANSACTION ISOLATION LEVEL SERIALIZABLE; COMMIT",
    "SET CONSTRAINTS ALL DEFERRED",
    "SELECT set_config('atlantis.x', 'y', true)",
    "SELECT pg_advisory_xact_lock(1); SELECT pg_try_advisory_xact_lock(2, 3)",
    "CREATE FUNCTION f() RETURNS int LANGUAGE sql\nSECURITY DEFINER SET search_path = "
    "pg_catalog, atlantis\nAS $$ SELECT 1 $$",
    "CREATE FUNCTION f() RETURNS int LANGUAGE plpgsql AS $$ BEGIN RETURN 1; END $$\n"
    "SET plan_cache_mode = force_generic_plan",
    "ALTER FUNCTION f() SET search_path = pg_catalog",
    "ALTER TABLE t ALTER COLUMN a SET DEFAULT 0",
    "CREATE TEMP TABLE t (a int) ON COMMIT DROP",
    "SELECT 1  -- SET y = 2 in a comment",
    "UPDATE t SET a = 1 /* SET b */ ",
])
def test_the_scan_spares_transaction_scoped_state(sql: str) -> None:
    assert not list(scan(sql, "example")), sql


def test_listen_only_in_the_listen_queries() -> None:
    assert not list(scan("LISTEN atlantis_jobs; LISTEN atlantis_control", "q", query="listen"))
    assert list(scan("LISTEN atlantis_jobs", "q", query="claim"))


def test_python_strings_are_matched_in_upper_case() -> None:
    assert list(scan("SET statement_timeout = 0", "x.py:1", case_sensitive=True))
    assert not list(scan("Set the limit of a queue", "x.py:1", case_sensitive=True))


def test_statements_run_from_python_are_read_in_any_case() -> None:
    tree = ast.parse('conn.execute("set statement_timeout = 0")\nlog("Set the limit")\n')
    found = [t for _, t, statement in _python_strings(tree) if statement]
    assert found == ["set statement_timeout = 0"]
    assert list(scan(found[0], "x.py:1", case_sensitive=False))


def test_the_reset_queries_are_named_queries_that_reset() -> None:
    """The exemption covers only statements that undo session state, by name."""
    sections = {name: text for path in SQL_FILES for name, text in _sql_sections(path)}
    for name in RESET_QUERIES:
        body = sections[name]
        assert "RESET ALL" in body and list(scan(body, name, query=name))
