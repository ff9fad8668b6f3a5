"""The store is the bottom of atlantis above its value modules, and the only home of SQL.

Read from the source, not run: every module of ``atlantis/store`` imports nothing of
atlantis but the layers below it, and no module outside the store (the supervisor
included: its one door is ``store/supervision.py``) holds SQL text or builds SQL with
``psycopg.sql``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ATLANTIS = Path(__file__).resolve().parent.parent / "atlantis"
#: What the store may import of atlantis: the layers below it, and itself.
BELOW_STORE = ("errors", "units", "limits", "environ", "protocol", "declarations", "store")
#: A string that starts like an SQL statement (a command tag alone, "SELECT" as a cursor's
#: statusmessage says it, is not one).
SQL_TEXT = re.compile(r"^\s*(SELECT(?!$)|INSERT\s+INTO|UPDATE\s+\S+\s+SET|DELETE\s+FROM|LISTEN|"
                      r"UNLISTEN|NOTIFY|WITH\s+\w+\s+AS)\b")


def _imports(tree: ast.AST) -> list[str]:
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "atlantis":  # from atlantis import environ: atlantis.environ
                found += [f"atlantis.{alias.name}" for alias in node.names]
            else:
                found.append(node.module)
    return found


def _modules(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*.py"))


def test_the_store_imports_nothing_above_it() -> None:
    wrong = []
    for path in _modules(ATLANTIS / "store"):
        for name in _imports(ast.parse(path.read_text("utf-8"))):
            parts = name.split(".")
            if parts[0] == "atlantis" and (len(parts) < 2 or parts[1] not in BELOW_STORE):
                wrong.append(f"{path.relative_to(ATLANTIS)} imports {name}")
    assert wrong == []


def test_no_sql_outside_the_store() -> None:
    wrong = []
    for path in _modules(ATLANTIS):
        relative = path.relative_to(ATLANTIS)
        if relative.parts[0] == "store":
            continue
        tree = ast.parse(path.read_text("utf-8"))
        if any(name == "psycopg.sql" for name in _imports(tree)) or any(
                isinstance(node, ast.ImportFrom) and node.module == "psycopg"
                and any(alias.name == "sql" for alias in node.names) for node in ast.walk(tree)):
            wrong.append(f"{relative} imports psycopg.sql")
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and SQL_TEXT.match(node.value):
                wrong.append(f"{relative}:{node.lineno} {node.value[:40]!r}")
            elif isinstance(node, ast.JoinedStr) and node.values and isinstance(
                    node.values[0], ast.Constant) and SQL_TEXT.match(str(node.values[0].value)):
                wrong.append(f"{relative}:{node.lineno} an f-string of SQL")
    assert wrong == []
