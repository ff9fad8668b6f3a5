"""Each limit on a row's contents is defined once, in ``atlantis/limits.py``, and the
database enforces the same numbers: asked of the database itself, at each limit and one past
it, through every way in (a row checked alone, a batch checked set-based, Python's enqueue).
"""

from __future__ import annotations

import re
from decimal import Decimal
from importlib import import_module, resources
from typing import Any

import psycopg
import pytest

import atlantis
from atlantis import limits
from atlantis.child import text
from atlantis.declarations import checks

BATCH = 8  # enqueue_many checks a batch of this many rows or more set-based first


def nested(depth: int) -> str:
    """JSON arrays nested ``depth`` levels deep (``[]`` is one)."""
    return "[" * depth + "]" * depth


def sql_check(db: psycopg.Connection[Any], job: str, args: str) -> str | None:
    """What atlantis.check_args says of ``args`` (JSON text): None when it accepts them."""
    try:
        with db.transaction():
            db.execute("SELECT atlantis.check_args(atlantis.job_type(%s), %s::jsonb)",
                       (job, args))
    except psycopg.Error as exc:
        assert exc.sqlstate == "ATL02", exc
        return exc.diag.message_primary
    return None


def sql_batch(db: psycopg.Connection[Any], job: str, args: str) -> str | None:
    """What atlantis.enqueue_many says of a batch of ``args``: None when it enqueues it."""
    try:
        with db.transaction():
            db.execute("SELECT atlantis.enqueue_many(%s, %s::jsonb[])", (job, [args] * BATCH))
    except psycopg.Error as exc:
        assert exc.sqlstate == "ATL02", exc
        return exc.diag.message_primary
    return None


def test_python_names_the_limits_from_their_home() -> None:
    assert (checks.MAX_DEPTH, checks.MAX_NUMBER_CHARS) == (limits.MAX_DEPTH,
                                                           limits.MAX_NUMBER_CHARS)
    assert import_module("atlantis.enqueue").MAX_NUMBER_CHARS == limits.MAX_NUMBER_CHARS
    assert text.MAX_ERROR_CHARS == limits.MAX_ERROR_TEXT


def test_the_database_nests_jsonb_as_deep_as_max_depth(db: psycopg.Connection[Any]) -> None:
    at, past = limits.MAX_DEPTH, limits.MAX_DEPTH + 1
    refused = f"nested {past} levels deep, more than the limit of {limits.MAX_DEPTH}"
    row = db.execute("SELECT atlantis.limit_mismatch('jsonb', %s::jsonb, true),"
                     "       atlantis.limit_mismatch('jsonb', %s::jsonb, true)",
                     (nested(at), nested(past))).fetchone()
    assert row == (None, refused)
    for check in (sql_check, sql_batch):
        assert check(db, "values.Deep", f'{{"doc": {nested(at)}}}') is None
        assert check(db, "values.Deep", f'{{"doc": {nested(past)}}}') == (
            f"job values.Deep: field doc: {refused}")


def test_the_database_takes_numbers_of_max_number_chars(db: psycopg.Connection[Any]) -> None:
    at, past = "9" * limits.MAX_NUMBER_CHARS, "9" * (limits.MAX_NUMBER_CHARS + 1)
    refused = (f"a number {len(past)} characters long, more than the limit of "
               f"{limits.MAX_NUMBER_CHARS}")
    row = db.execute("SELECT atlantis.limit_mismatch('numeric', %s::jsonb, true),"
                     "       atlantis.limit_mismatch('numeric', %s::jsonb, true)",
                     (at, past)).fetchone()
    assert row == (None, refused)
    for check in (sql_check, sql_batch):
        # A numeric field, and a number inside a jsonb value (found by the scan of long args).
        assert check(db, "values.Big", f'{{"n": {at}}}') is None
        assert check(db, "values.Big", f'{{"n": {past}}}') == (
            f"job values.Big: field n: {refused}")
        assert check(db, "values.Deep", f'{{"doc": {{"a": [{at}]}}}}') is None
        assert check(db, "values.Deep", f'{{"doc": {{"a": [{past}]}}}}') == (
            f"job values.Deep: field doc: {refused}")
    # Python's enqueue says the same at the same length.
    atlantis.enqueue(db, "values.Big", {"n": Decimal(at)})
    with pytest.raises(atlantis.ValidationError) as info:
        atlantis.enqueue(db, "values.Big", {"n": Decimal(past)})
    assert str(info.value) == f"job values.Big: field n: {refused}"


def test_the_database_keeps_progress_messages_of_max_progress_msg(
        db: psycopg.Connection[Any]) -> None:
    job_id = atlantis.enqueue(db, "tests.Echo", {"key": "limits"})
    update = "UPDATE atlantis.jobs SET progress_msg = repeat('m', %s) WHERE id = %s"
    db.execute(update, (limits.MAX_PROGRESS_MSG, job_id))
    with pytest.raises(psycopg.errors.CheckViolation, match="jobs_progress_msg_check"):
        db.execute(update, (limits.MAX_PROGRESS_MSG + 1, job_id))
    # The statements that store a checkpoint's message cut it to the same length, through
    # one function (atlantis.progress_text), and none cuts it on its own.
    store = resources.files("atlantis.store")
    texts = {entry.name: entry.read_text("utf-8")
             for entry in [*store.iterdir(), *store.joinpath("live").iterdir()]
             if entry.name.endswith(".sql") and entry.name != "schema.sql"}
    cuts = [int(n) for text in texts.values() for n in re.findall(
        r"progress_text\(msg text\) RETURNS text\s+LANGUAGE sql IMMUTABLE PARALLEL SAFE\s+"
        r"AS \$\$ SELECT left\(msg, (\d+)\) \$\$", text)]
    assert cuts == [limits.MAX_PROGRESS_MSG], cuts
    assert not any(re.search(r"\bleft\(\w+\.msg\b", text) for text in texts.values())
    assert sum(text.count("atlantis.progress_text(") for text in texts.values()) >= 2
