"""Arguments end to end: what enqueue accepts and stores, and what a handler receives.

``numeric`` is ``decimal.Decimal`` everywhere: sent digit for digit by enqueue, decoded
exactly by ``decode_args`` (which the child runs once per attempt, and which may raise
nothing but ArgsError). Enqueue refuses, in SQL, what no reader could decode: jsonb nested
more than 64 levels, numbers longer than 4000 characters.
"""

from __future__ import annotations

import asyncio
import math
from decimal import Decimal
from typing import Any

import orjson
import psycopg
import pytest

import atlantis
from atlantis.declarations import JobDecl, parse_atl
from atlantis.declarations.values import ArgsError, decode_args
from atlantis.errors import ValidationError
from atlantis.limits import json_depth as depth
from tests.apps.values import registry, type_name

BIG = registry.decls["values.Big"]
DEEP = registry.decls["values.Deep"]
THIRTY = "123456789012345678901234567890"
TINY = "0.1000000000000000000000000001"


def nested(levels: int, inner: Any = None) -> Any:
    """A list `levels` deep around `inner` (an empty list when inner is None)."""
    value: Any = [] if inner is None else [inner]
    for _ in range(levels - 1):
        value = [value]
    return value


def decl(fields: str) -> JobDecl:
    (job,) = parse_atl(f"job J in ns {{ args {{ {fields} }} }}", "jobs.atl")
    return job


def stored(conn: psycopg.Connection[Any], job_id: int) -> str:
    row = conn.execute("SELECT args::text FROM atlantis.jobs WHERE id = %s", (job_id,)).fetchone()
    assert row is not None
    return str(row[0])


def count(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT count(*) FROM atlantis.jobs").fetchone()
    assert row is not None
    return int(row[0])


def sql_refusal(conn: psycopg.Connection[Any], job: str, args: str) -> str:
    with pytest.raises(psycopg.Error) as info:
        conn.execute("SELECT atlantis.enqueue(%s, %s::jsonb)", (job, args))
    assert info.value.sqlstate == "ATL02"
    return str(info.value.diag.message_primary)


# --------------------------------------------------------------------------- decode_args


@pytest.mark.parametrize("digits", [THIRTY, TINY, "-" + THIRTY, "2.50", "0", "1", "-0.0001"])
def test_numeric_arrives_as_the_exact_decimal(digits: str) -> None:
    args = decode_args(BIG, f'{{"key": "k", "n": {digits}}}')
    assert type(args["n"]) is Decimal
    assert str(args["n"]) == digits  # every digit, the scale included
    assert args == {"key": "k", "n": Decimal(digits)}


def test_numeric_array_elements_are_decimals_and_nulls_stay() -> None:
    args = decode_args(BIG, f'{{"n": 1, "ns": [{THIRTY}, {TINY}, 7, null]}}')
    assert args["ns"] == [Decimal(THIRTY), Decimal(TINY), Decimal(7), None]
    assert [type(v) for v in args["ns"]] == [Decimal, Decimal, Decimal, type(None)]
    assert type(args["n"]) is Decimal


def test_double_is_a_float_even_from_a_json_integer() -> None:
    args = decode_args(BIG, f'{{"n": 1, "d": 3, "ds": [1, 2.5, {THIRTY}, null]}}')
    assert args["d"] == 3.0 and type(args["d"]) is float
    assert args["ds"] == [1.0, 2.5, float(THIRTY), None]
    assert [type(v) for v in args["ds"][:3]] == [float, float, float]
    # Without a numeric field the fast path decodes; the types are the same.
    only_doubles = decl("d double, ds double[]")
    assert decode_args(only_doubles, '{"d": 3, "ds": [1]}') == {"d": 3.0, "ds": [1.0]}
    assert type(decode_args(only_doubles, '{"d": 3}')["d"]) is float


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"i": 5}', 5),
        ('{"i": 9223372036854775807}', 2**63 - 1),
        ('{"i": -9223372036854775808}', -(2**63)),
        ('{"i": 9223372036854775807.0}', 2**63 - 1),  # PostgreSQL keeps the ".0"
        ('{"i": 1.000}', 1),
    ],
)
def test_bigint_is_an_exact_int(text: str, expected: int) -> None:
    for job in (BIG, decl("i bigint")):  # with and without a numeric field
        args = decode_args(job, text)
        assert args["i"] == expected and type(args["i"]) is int


def test_jsonb_keeps_ordinary_json_values() -> None:
    doc = f'{{"f": 1.5, "i": 7, "big": {THIRTY}, "s": "x", "l": [0.25, null, true], "o": {{}}}}'
    expected = {"f": 1.5, "i": 7, "big": int(THIRTY), "s": "x", "l": [0.25, None, True], "o": {}}
    args = decode_args(DEEP, f'{{"key": "k", "doc": {doc}, "docs": [{doc}, 2.5]}}')
    assert args == {"key": "k", "doc": expected, "docs": [expected, 2.5]}
    assert type(args["doc"]["f"]) is float and type(args["doc"]["big"]) is int
    # Beside a numeric field (the exact reading), jsonb fractions are still floats.
    mixed = decl("n numeric, doc jsonb")
    args = decode_args(mixed, f'{{"n": {TINY}, "doc": {doc}}}')
    assert args == {"n": Decimal(TINY), "doc": expected}
    assert type(args["doc"]["f"]) is float and type(args["doc"]["l"][0]) is float


def test_other_types_decode_as_json_gives_them() -> None:
    job = decl("t text, b boolean, u uuid, a timestamptz, xs text[], n numeric")
    text = '{"t": "x", "b": true, "u": "123e4567-e89b-12d3-a456-426614174000", "xs": ["a"]}'
    assert decode_args(job, text) == orjson.loads(text)
    # Keys the declaration does not know pass through.
    assert decode_args(job, '{"t": "x", "other": 1.5}') == {"t": "x", "other": 1.5}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "job values.Big: args are not valid JSON: "),
        ("{", "job values.Big: args are not valid JSON: "),
        ('{"n": 1', "job values.Big: args are not valid JSON: "),
        ("nope", "job values.Big: args are not valid JSON: "),
        ('{"n": NaN}', "job values.Big: args are not valid JSON: NaN is not valid JSON"),
        ("[1]", "job values.Big: args are not a JSON object, got array"),
        ("null", "job values.Big: args are not a JSON object, got null"),
        ('{"n": "1.5"}', "job values.Big: field n: expected numeric, got string"),
        ('{"n": true}', "job values.Big: field n: expected numeric, got boolean"),
        ('{"n": 1, "ns": {"a": 1}}', "job values.Big: field ns: expected an array, got object"),
        ('{"n": 1, "ns": [1, [2]]}', "job values.Big: field ns[1]: expected numeric, got array"),
        ('{"n": 1, "d": "x"}', "job values.Big: field d: expected double, got string"),
        ('{"n": 1, "d": 1' + "0" * 400 + "}", "job values.Big: field d: 1000000000000"),
        ('{"n": 1, "i": 1.5}', "job values.Big: field i: expected bigint, got 1.5"),
        ('{"n": 1, "i": false}', "job values.Big: field i: expected bigint, got boolean"),
    ],
)
def test_what_cannot_be_decoded_is_an_args_error_naming_job_and_field(
    text: str, message: str
) -> None:
    with pytest.raises(ArgsError) as info:
        decode_args(BIG, text)
    assert str(info.value).startswith(message), str(info.value)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    "text",
    [
        '{"doc": ' + "[" * 5000 + "]" * 5000 + "}",  # past every decoder's depth
        '{"doc": ' + "[" * 1100 + "]" * 1100 + "}",  # past orjson's
        '{"doc": ' + "1" * 5000 + "}",  # past int()'s digits
        '{"doc": 1e99999}',
        '{"doc": "\\ud800"}',
        '{"docs": 5}',
        '{"key": 1, "doc": {"a": 1}, "docs": [{"b": -' + "9" * 30 + "}]}",
        "\x00",
        '{"doc": 1}' + "x" * 10,
    ],
)
def test_decode_args_raises_nothing_but_args_error(text: str) -> None:
    for job in (DEEP, BIG, decl("doc jsonb, n numeric"), decl("doc jsonb, i int")):
        try:
            decode_args(job, text)
        except ArgsError as exc:
            assert str(exc).startswith(f"job {job.qualified_name}: ")


def test_a_huge_integer_in_jsonb_is_kept_whole() -> None:
    args = decode_args(DEEP, '{"doc": [' + "7" * 5000 + "]}")
    assert args["doc"][0] == int("7" * 1000) * 10**4000 + int("7" * 4000)


def test_fast_path_matches_orjson_without_numeric_fields() -> None:
    text = '{"key": "k", "doc": {"a": [1, 2.5, "x", null]}, "docs": null}'
    assert decode_args(DEEP, text) == orjson.loads(text)


# --------------------------------------------------------------------------- enqueue


def test_decimal_from_python_is_stored_and_decoded_exactly(db: psycopg.Connection[Any]) -> None:
    job_id = atlantis.enqueue(
        db, "values.Big", {"n": Decimal(THIRTY), "ns": [Decimal(TINY), Decimal("2.50"), 3]}
    )
    row = db.execute(
        "SELECT args->>'n', args->'ns'->>0, args->'ns'->>1 FROM atlantis.jobs WHERE id = %s",
        (job_id,),
    ).fetchone()
    assert row == (THIRTY, TINY, "2.50")
    args = decode_args(BIG, stored(db, job_id))
    assert args["n"] == Decimal(THIRTY) and str(args["n"]) == THIRTY
    assert args["ns"] == [Decimal(TINY), Decimal("2.50"), Decimal(3)]
    assert args["key"] == "big"


def test_enqueue_many_and_async_send_decimals_exactly(db_url: str) -> None:
    with psycopg.connect(db_url) as conn:
        ids = atlantis.enqueue_many(
            conn, "values.Big", [{"n": Decimal(THIRTY)}, {"n": Decimal(TINY)}, {"n": 10**30}]
        )
        conn.commit()
        amounts = [decode_args(BIG, stored(conn, i))["n"] for i in ids]
    assert amounts == [Decimal(THIRTY), Decimal(TINY), Decimal(10**30)]

    async def go() -> list[str]:
        async with await psycopg.AsyncConnection.connect(db_url) as conn:
            one = await atlantis.enqueue_async(conn, "values.Big", {"n": Decimal("-" + TINY)})
            many = await atlantis.enqueue_many_async(conn, "values.Big", [{"n": Decimal(THIRTY)}])
            await conn.commit()
            found = []
            for job_id in (one, *many):
                cur = await conn.execute(
                    "SELECT args->>'n' FROM atlantis.jobs WHERE id = %s", (job_id,)
                )
                row = await cur.fetchone()
                assert row is not None
                found.append(str(row[0]))
            return found

    assert asyncio.run(go()) == ["-" + TINY, THIRTY]


def test_decimals_inside_jsonb_are_sent_exactly(db: psycopg.Connection[Any]) -> None:
    job_id = atlantis.enqueue(db, "values.Deep", {"doc": {"price": Decimal(TINY)}})
    row = db.execute(
        "SELECT args->'doc'->>'price' FROM atlantis.jobs WHERE id = %s", (job_id,)
    ).fetchone()
    assert row == (TINY,)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"n": Decimal("NaN")}, "field n: Decimal('NaN') cannot be enqueued"),
        ({"n": Decimal("sNaN")}, "field n: Decimal('sNaN') cannot be enqueued"),
        ({"n": Decimal("Infinity")}, "field n: Decimal('Infinity') cannot be enqueued"),
        ({"n": 1, "ns": [Decimal("-Infinity")]}, "field ns: Decimal('-Infinity') cannot be"),
        ({"n": 1, "d": math.nan}, "field d: float('nan') cannot be enqueued"),
        ({"n": 1, "ds": [1.0, math.inf]}, "field ds[1]: float('inf') cannot be enqueued"),
        ({"n": Decimal("1E+20000")}, "field n: a number 20001 characters long, more than the"),
    ],
)
def test_what_json_cannot_carry_is_refused_in_python(
    db: psycopg.Connection[Any], args: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValidationError) as info:
        atlantis.enqueue(db, "values.Big", args)
    assert str(info.value).startswith(f"job values.Big: {message}"), str(info.value)
    assert count(db) == 0


def test_non_finite_floats_in_jsonb_are_refused(db: psycopg.Connection[Any]) -> None:
    with pytest.raises(ValidationError, match=r"field doc\['a'\]\[0\]: float\('-inf'\)"):
        atlantis.enqueue(db, "values.Deep", {"doc": {"a": [-math.inf]}})
    # A null that was written as null is fine.
    atlantis.enqueue(db, "values.Deep", {"doc": {"a": None}})


# --------------------------------------------------------------------------- limits


DEEP_64 = orjson.dumps(nested(64)).decode()
DEEP_65 = orjson.dumps(nested(65)).decode()
DEPTH_ERROR = "job values.Deep: field {}: nested 65 levels deep, more than the limit of 64"


def test_jsonb_nested_64_levels_is_accepted_by_python_and_sql(
    db: psycopg.Connection[Any],
) -> None:
    first = atlantis.enqueue(db, "values.Deep", {"doc": nested(64), "docs": [nested(64)]})
    row = db.execute("SELECT atlantis.enqueue('values.Deep', %s::jsonb)",
                     (f'{{"doc": {DEEP_64}, "docs": [{DEEP_64}, 1]}}',)).fetchone()
    assert row is not None
    for job_id in (first, row[0]):
        args = decode_args(DEEP, stored(db, job_id))
        assert depth(args["doc"]) == 64 and depth(args["docs"][0]) == 64


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ({"doc": nested(65)}, "doc"),
        ({"doc": {"a": nested(64)}}, "doc"),
        ({"doc": nested(64, {"a": 1})}, "doc"),
        ({"docs": [1, nested(65)]}, "docs[1]"),
    ],
)
def test_jsonb_nested_65_levels_is_refused_by_python(
    db: psycopg.Connection[Any], doc: dict[str, Any], field: str
) -> None:
    with pytest.raises(ValidationError) as info:
        atlantis.enqueue(db, "values.Deep", doc)
    assert str(info.value) == DEPTH_ERROR.format(field)
    assert count(db) == 0


def test_jsonb_nested_65_levels_is_refused_by_sql(db: psycopg.Connection[Any]) -> None:
    assert sql_refusal(db, "values.Deep", f'{{"doc": {DEEP_65}}}') == DEPTH_ERROR.format("doc")
    docs = f'{{"docs": [{DEEP_64}, {DEEP_65}]}}'
    assert sql_refusal(db, "values.Deep", docs) == DEPTH_ERROR.format("docs[1]")
    deeper = "[" * 300 + "]" * 300
    assert sql_refusal(db, "values.Deep", f'{{"doc": {deeper}}}') == (
        "job values.Deep: field doc: nested 300 levels deep, more than the limit of 64"
    )
    assert count(db) == 0


def test_jsonb_deeper_than_orjson_writes_gets_the_same_message(
    db: psycopg.Connection[Any],
) -> None:
    with pytest.raises(ValidationError) as info:
        atlantis.enqueue(db, "values.Deep", {"doc": nested(1000)})
    assert str(info.value) == (
        "job values.Deep: field doc: nested 1000 levels deep, more than the limit of 64"
    )


NUMBER_ERROR = "a number 4001 characters long, more than the limit of 4000"


@pytest.mark.parametrize(
    ("job", "args", "field"),
    [
        ("values.Big", {"n": Decimal("9" * 4001)}, "n"),
        ("values.Big", {"n": int("9" * 4001)}, "n"),
        ("values.Big", {"n": Decimal("-" + "9" * 4000)}, "n"),
        ("values.Big", {"n": Decimal("0." + "0" * 3998 + "1")}, "n"),
        ("values.Big", {"n": 1, "ns": [1, Decimal("1E+4000")]}, "ns[1]"),
        ("values.Big", {"n": 1, "i": int("9" * 4001)}, "i"),
        ("values.Big", {"n": 1, "d": int("9" * 4001)}, "d"),
        ("values.Deep", {"doc": {"a": [1, int("9" * 4001)]}}, "doc"),
        ("values.Deep", {"doc": Decimal("9" * 4001)}, "doc"),
        ("values.Deep", {"docs": [{}, {"x": Decimal("1." + "0" * 3999)}]}, "docs[1]"),
    ],
)
def test_a_number_of_4001_characters_is_refused_by_python(
    db: psycopg.Connection[Any], job: str, args: dict[str, Any], field: str
) -> None:
    with pytest.raises(ValidationError) as info:
        atlantis.enqueue(db, job, args)
    assert str(info.value) == f"job {job}: field {field}: {NUMBER_ERROR}"
    assert count(db) == 0


def test_a_number_of_4001_characters_is_refused_by_sql(db: psycopg.Connection[Any]) -> None:
    long = "9" * 4001
    assert sql_refusal(db, "values.Big", f'{{"n": {long}}}') == (
        f"job values.Big: field n: {NUMBER_ERROR}"
    )
    assert sql_refusal(db, "values.Big", f'{{"n": 1, "ns": [{long}]}}') == (
        f"job values.Big: field ns[0]: {NUMBER_ERROR}"
    )
    assert sql_refusal(db, "values.Deep", f'{{"doc": {{"a": [[{long}]]}}}}') == (
        f"job values.Deep: field doc: {NUMBER_ERROR}"
    )
    assert sql_refusal(db, "values.Deep", f'{{"doc": 0.{"0" * 3998}1}}') == (
        f"job values.Deep: field doc: {NUMBER_ERROR}"
    )
    assert count(db) == 0


def test_a_number_of_4000_characters_is_accepted(db: psycopg.Connection[Any]) -> None:
    longest = "9" * 4000
    first = atlantis.enqueue(db, "values.Big", {"n": Decimal(longest)})
    second = atlantis.enqueue(db, "values.Deep", {"doc": [int(longest)]})
    row = db.execute("SELECT atlantis.enqueue('values.Big', %s::jsonb)",
                     (f'{{"n": {longest}}}',)).fetchone()
    assert row is not None
    assert decode_args(BIG, stored(db, first))["n"] == Decimal(longest)
    assert decode_args(DEEP, stored(db, second))["doc"] == [int(longest)]
    assert decode_args(BIG, stored(db, row[0]))["n"] == Decimal(longest)


def test_a_double_out_of_range_is_refused_by_sql(db: psycopg.Connection[Any]) -> None:
    assert sql_refusal(db, "values.Big", '{"n": 1, "d": 1e309}') == (
        "job values.Big: field d: 1000000000000000000000000000000000000... is out of range"
        " for double"
    )
    atlantis.enqueue(db, "values.Big", {"n": 1, "d": 1.7976931348623157e308})


def test_args_of_big_jobs_are_still_checked_for_long_numbers_in_jsonb(
    db: psycopg.Connection[Any],
) -> None:
    """Past 4000 bytes of args the numbers inside jsonb are walked; below, they need not be."""
    padding = "x" * 5000
    args = {"key": padding, "doc": {"a": [Decimal("1." + "0" * 3999)]}}
    with pytest.raises(ValidationError, match="field doc: a number 4001 characters long"):
        atlantis.enqueue(db, "values.Deep", args)
    job_id = atlantis.enqueue(db, "values.Deep", {"key": padding, "doc": {"a": [1.5]}})
    assert decode_args(DEEP, stored(db, job_id))["doc"] == {"a": [1.5]}


# --------------------------------------------------------------------------- the test app


def test_values_app_helpers_describe_what_a_handler_got() -> None:
    args = decode_args(BIG, f'{{"key": "k", "n": {THIRTY}, "ns": [1, null], "d": 2, "i": 3}}')
    assert repr(args["n"]) == f"Decimal('{THIRTY}')"
    assert [type_name(args[k]) for k in ("n", "ns", "d", "i")] == [
        "Decimal", "list[Decimal|NoneType]", "float", "int",
    ]  # fmt: skip
    assert type_name(None) == "NoneType"
    assert (depth(1), depth([]), depth({"a": [1]}), depth(nested(64))) == (0, 1, 2, 64)


# ---- the set-based check of a batch (migration 0011) -----------------------------------------

def _deep(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


TYPED_VALID: list[Any] = [
    {"name": "a"},
    {"name": "abcdefgh", "count": 5, "big": 9007199254740993, "ratio": 1.5, "amount": 12.25},
    {"name": "x", "flag": True, "id": "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
     "at": "2026-01-01T00:00:00Z", "day": "2026-01-02", "extra": {"a": [1, {"b": None}]},
     "tags": ["a", None, "b"]},
    {"name": "x", "count": None, "tags": None, "extra": None},
    {"name": "x", "count": 2147483647, "big": -9223372036854775808, "ratio": 1e308},
    {"name": "x", "count": 3.0, "extra": _deep(63), "tags": []},
]
TYPED_INVALID: list[Any] = [
    {}, {"name": None}, {"name": "123456789"}, {"name": 5}, {"name": "x", "count": 1.5},
    {"name": "x", "count": 2147483648}, {"name": "x", "count": "1"}, {"name": "x", "ratio": "1"},
    {"name": "x", "flag": 1}, {"name": "x", "id": "nope"}, {"name": "x", "at": "soon"},
    {"name": "x", "day": "2026-13-01"}, {"name": "x", "tags": "a"}, {"name": "x", "tags": [1]},
    {"name": "x", "other": 1}, [1], 5, "s", None, {"name": "x", "extra": _deep(70)},
    {"name": "x", "big": 9223372036854775808},
]


def _check_args(db: psycopg.Connection[Any], job: str, args: Any) -> Any:
    """What atlantis.check_args, the row-by-row check, makes of ``args``: its result or its
    error message."""
    try:
        with db.transaction():
            row = db.execute("SELECT atlantis.check_args(atlantis.job_type(%s), %s::jsonb)",
                             (job, orjson.dumps(args).decode())).fetchone()
    except psycopg.DatabaseError as exc:
        assert exc.diag.sqlstate == "ATL02", exc
        return ("error", str(exc.diag.message_primary))
    assert row is not None
    return row[0]


def _fast(db: psycopg.Connection[Any], job: str, batch: list[Any]) -> list[Any] | None:
    row = db.execute("SELECT atlantis.fast_checked_args(atlantis.job_type(%s), %s::jsonb[])",
                     (job, [orjson.dumps(a).decode() for a in batch])).fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


@pytest.mark.parametrize("args", TYPED_VALID + TYPED_INVALID)
def test_the_batch_check_accepts_exactly_what_the_row_check_accepts(
    db: psycopg.Connection[Any], args: Any
) -> None:
    expected = _check_args(db, "tests.Typed", args)
    fast = _fast(db, "tests.Typed", [args] * 8)
    if isinstance(expected, tuple):
        assert fast is None  # refused: the row check then names the field
    else:
        assert fast == [expected] * 8  # defaults filled in the same way


def test_one_bad_row_in_a_batch_gets_the_row_checks_error_and_nothing_is_written(
    db: psycopg.Connection[Any]
) -> None:
    cases: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
        ("tests.Echo", {"key": "k"}, {"key": "k", "other": 1}),
        ("tests.Typed", {"name": "n"}, {"name": "n", "count": "2"})]
    for job, good, bad in cases:
        before = db.execute("SELECT count(*) FROM atlantis.jobs").fetchone()
        rows = [{**good, **({"key": f"k{i}"} if "key" in good else {"name": f"n{i}"})}
                for i in range(20)]
        rows[13] = bad
        message = _check_args(db, job, bad)[1]
        with pytest.raises(ValidationError) as caught:
            atlantis.enqueue_many(db, job, rows)
        assert message in str(caught.value)
        assert db.execute("SELECT count(*) FROM atlantis.jobs").fetchone() == before
        ids = atlantis.enqueue_many(db, job, rows[:13] + rows[14:])
        stored = [r[0] for r in db.execute(
            "SELECT args FROM atlantis.jobs WHERE id = ANY(%s) ORDER BY id", (ids,))]
        assert stored == [_check_args(db, job, r) for r in rows[:13] + rows[14:]]
