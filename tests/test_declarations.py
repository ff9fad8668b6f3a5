"""The `.atl` language (CONTRACT.md section 3): what parses, into what, and every refusal.

Error messages are compared whole: their `file:line:column` prefix is what editors jump
to, and the quoted token is what tells the user which word is wrong.
"""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

import lark
import pytest

from atlantis.declarations import Field, JobDecl, parse_atl, parse_atl_file
from atlantis.declarations.model import (
    DEFAULT_BACKOFF,
    DEFAULT_HEARTBEAT,
    DEFAULT_PRIORITY,
    DEFAULT_QUEUE,
    DEFAULT_RETRIES,
    DEFAULT_TIMEOUT,
)
from atlantis.errors import DeclarationError

SEED = """\
job ImportContacts in directory {
  args { account_id varchar(64) not null }
  retries   3
  timeout   2h
  heartbeat 10m
  queue     "contacts"
}
"""

MODIFIER_LIST = (
    "args, retries, timeout, heartbeat, queue, priority, unique, backoff, stall, schedule, tz, "
    "overlap, concurrency, rate"
)
TYPE_LIST = (
    "text, varchar(n), int, bigint, boolean, double, numeric, uuid, timestamptz, date, jsonb"
)


def one_job(text: str) -> JobDecl:
    (decl,) = parse_atl(text, "jobs.atl")
    return decl


def one_field(declaration: str) -> Field:
    (field,) = one_job(f"job J in ns {{\n  args {{ {declaration} }}\n}}\n").fields
    return field


def error(text: str) -> str:
    with pytest.raises(DeclarationError) as info:
        parse_atl(text, "jobs.atl")
    return str(info.value)


# --------------------------------------------------------------------------- parsing


def test_seed_block_parses_verbatim() -> None:
    decl = one_job(SEED)
    assert decl == JobDecl(
        name="ImportContacts",
        namespace="directory",
        fields=(Field("account_id", "varchar", length=64, not_null=True),),
        retries=3,
        timeout=7200.0,
        heartbeat=600.0,
        queue="contacts",
    )
    assert decl.source == "jobs.atl:1"
    assert decl.qualified_name == "directory.ImportContacts"
    assert decl.max_attempts == 4


def test_several_jobs_and_every_comment_style() -> None:
    text = """\
# hash comment
-- dash comment
// slash comment

job First in alpha {   # after a brace
  retries 1            -- after a value
  // a comment line inside a block
  args {
    # inside args
    a int              // after a field
  }
}
-- between jobs
job Second in beta { }
job Third in alpha {
}
"""
    decls = parse_atl(text, "jobs.atl")
    assert [d.qualified_name for d in decls] == ["alpha.First", "beta.Second", "alpha.Third"]
    assert [d.source for d in decls] == ["jobs.atl:5", "jobs.atl:14", "jobs.atl:15"]
    assert decls[0].retries == 1
    assert decls[0].fields == (Field("a", "int"),)


def test_empty_file_and_comment_only_file_declare_nothing() -> None:
    assert parse_atl("") == []
    assert parse_atl("\n\n  # nothing here\n-- nor here") == []


@pytest.mark.parametrize(
    "args",
    [
        "args { a int, b text not null, c boolean }",
        "args {\n  a int\n  b text not null\n  c boolean\n}",
        "args {\n  a int,\n  b text not null,\n  c boolean,\n}",
        "args { a int, b text not null\n  c boolean, }",
        "args {\n\n  a int\n\n  , b text not null\n  c boolean\n\n}",
        "args\n{\n  a int, b text not null, c boolean\n}",
    ],
)
def test_fields_are_separated_by_commas_or_newlines(args: str) -> None:
    decl = one_job(f"job J in ns {{\n  {args}\n}}\n")
    assert decl.fields == (
        Field("a", "int"),
        Field("b", "text", not_null=True),
        Field("c", "boolean"),
    )


@pytest.mark.parametrize("args", ["args {}", "args { }", "args {\n}", "args {\n\n  # none\n}"])
def test_an_empty_args_block_is_allowed(args: str) -> None:
    assert one_job(f"job J in ns {{\n  {args}\n}}\n").fields == ()


def test_modifiers_may_share_a_line_when_separated_by_commas() -> None:
    decl = one_job('job J in ns { args { a int }, retries 5, queue "q", }')
    assert (decl.fields, decl.retries, decl.queue) == ((Field("a", "int"),), 5, "q")


def test_brace_on_its_own_line_and_crlf_line_endings() -> None:
    text = "job J in ns\r\n{\r\n  args { a int }\r\n  timeout 1m\r\n}\r\n"
    decl = one_job(text)
    assert (decl.fields, decl.timeout) == ((Field("a", "int"),), 60.0)


@pytest.mark.parametrize(
    ("written", "type_", "length", "array", "type_name"),
    [
        ("text", "text", None, False, "text"),
        ("varchar(64)", "varchar", 64, False, "varchar(64)"),
        ("int", "int", None, False, "int"),
        ("bigint", "bigint", None, False, "bigint"),
        ("boolean", "boolean", None, False, "boolean"),
        ("double", "double", None, False, "double"),
        ("numeric", "numeric", None, False, "numeric"),
        ("uuid", "uuid", None, False, "uuid"),
        ("timestamptz", "timestamptz", None, False, "timestamptz"),
        ("date", "date", None, False, "date"),
        ("jsonb", "jsonb", None, False, "jsonb"),
        ("text[]", "text", None, True, "text[]"),
        ("varchar(10)[]", "varchar", 10, True, "varchar(10)[]"),
        ("int[]", "int", None, True, "int[]"),
        ("bigint [ ]", "bigint", None, True, "bigint[]"),
        ("jsonb[]", "jsonb", None, True, "jsonb[]"),
        ("varchar ( 5 )", "varchar", 5, False, "varchar(5)"),
    ],
)
def test_every_type(
    written: str, type_: str, length: int | None, array: bool, type_name: str
) -> None:
    field = one_field(f"x {written}")
    assert (field.type, field.length, field.array) == (type_, length, array)
    assert field.type_name == type_name
    assert (field.not_null, field.has_default, field.default) == (False, False, None)


@pytest.mark.parametrize(
    ("declaration", "default"),
    [
        ('x text default "hello"', "hello"),
        (r'x text default "tab\tquote\"slash\\ \u00e9 \ud83d\ude00"', 'tab\tquote"slash\\ é 😀'),
        ('x text default ""', ""),
        ('x varchar(5) default "abcde"', "abcde"),
        ("x int default 42", 42),
        ("x int default -7", -7),
        ("x bigint default 9000000000", 9_000_000_000),
        ("x double default 1.5", 1.5),
        ("x double default -0.25", -0.25),
        ("x double default 2", 2),
        ("x numeric default 10", 10),
        ("x numeric default -1.5e3", -1500.0),
        ("x boolean default true", True),
        ("x boolean default false", False),
        ("x int default null", None),
        (
            'x uuid default "123e4567-e89b-12d3-a456-426614174000"',
            "123e4567-e89b-12d3-a456-426614174000",
        ),
        ('x date default "2024-01-31"', "2024-01-31"),
        ('x timestamptz default "2024-01-31T12:00:00+00:00"', "2024-01-31T12:00:00+00:00"),
        ("x int[] default [1, 2]", [1, 2]),
        ("x int[] default []", []),
        ('x text[] default ["a",\n "b",]', ["a", "b"]),
        ("x double[] default [1, 2.5]", [1, 2.5]),
        ('x jsonb default {"a": [1, null, true], "b": {}}', {"a": [1, None, True], "b": {}}),
        ("x jsonb default [1, null]", [1, None]),
        ('x jsonb default "just a string"', "just a string"),
        ("x jsonb[] default [{}, null]", [{}, None]),
    ],
)
def test_defaults_are_stored_as_json_values(declaration: str, default: Any) -> None:
    field = one_field(declaration)
    assert field.has_default
    assert field.default == default
    assert type(field.default) is type(default)


@pytest.mark.parametrize(
    "declaration",
    ["x int not null default 5", "x int default 5 not null", "x int default 5\n  y int"],
)
def test_not_null_and_default_come_in_either_order(declaration: str) -> None:
    decl = one_job(f"job J in ns {{\n  args {{ {declaration} }}\n}}\n")
    field = decl.fields[0]
    assert (field.has_default, field.default) == (True, 5)
    assert field.not_null == ("not null" in declaration)


def test_a_job_without_modifiers_gets_the_documented_defaults() -> None:
    decl = one_job("job J in ns { }")
    assert (decl.retries, decl.timeout, decl.heartbeat) == (3, 3600.0, 300.0)
    assert (decl.queue, decl.priority, decl.backoff, decl.unique) == ("default", 0, 10.0, ())
    assert (DEFAULT_RETRIES, DEFAULT_TIMEOUT, DEFAULT_HEARTBEAT) == (3, 3600.0, 300.0)
    assert (DEFAULT_QUEUE, DEFAULT_PRIORITY, DEFAULT_BACKOFF) == ("default", 0, 10.0)
    assert decl.fields == ()


def test_every_modifier() -> None:
    decl = one_job(
        """\
job Sync in crm {
  unique (account_id, region)
  args {
    account_id varchar(64) not null
    region text default "eu"
  }
  retries 0
  timeout 1h30m
  heartbeat 500ms
  queue "crm-sync"
  priority -5
  backoff 1d
}
"""
    )
    assert decl.unique == ("account_id", "region")
    assert decl.retries == 0 and decl.max_attempts == 1
    assert decl.timeout == 5400.0
    assert decl.heartbeat == 0.5
    assert decl.queue == "crm-sync"
    assert decl.priority == -5
    assert decl.backoff == 86400.0


@pytest.mark.parametrize(
    ("written", "seconds"),
    [("500ms", 0.5), ("30s", 30.0), ("10m", 600.0), ("2h", 7200.0), ("1d", 86400.0),
     ("1h30m", 5400.0), ("1m30s", 90.0), ("1.5h", 5400.0)],
)  # fmt: skip
def test_durations(written: str, seconds: float) -> None:
    assert one_job(f"job J in ns {{ timeout {written} }}").timeout == seconds


def test_backoff_may_be_zero() -> None:
    assert one_job("job J in ns { backoff 0s }").backoff == 0.0


def test_keywords_are_only_keywords_where_expected() -> None:
    decl = one_job(
        """\
job job in in {
  args { args int, default text, unique boolean, null int, retries int, job int }
  unique (args, default)
}
"""
    )
    assert decl.qualified_name == "in.job"
    assert [f.name for f in decl.fields] == ["args", "default", "unique", "null", "retries", "job"]
    assert decl.unique == ("args", "default")


def test_parse_atl_file_reads_utf8_and_names_the_path(tmp_path: Path) -> None:
    path = tmp_path / "jobs.atl"
    path.write_bytes(b"\xef\xbb\xbf" + 'job J in ns { queue "caf\u00e9" }\n'.encode())
    (decl,) = parse_atl_file(path)
    assert decl.queue == "café"
    assert decl.source == f"{path}:1"
    (decl,) = parse_atl_file(str(path))
    assert decl.source == f"{path}:1"


def test_parse_atl_file_names_the_path_in_errors(tmp_path: Path) -> None:
    path = tmp_path / "jobs.atl"
    path.write_text("job J in ns {\n  retry 3\n}\n", encoding="utf-8")
    with pytest.raises(DeclarationError, match=re.escape(f"{path}:2:3: unknown modifier 'retry'")):
        parse_atl_file(path)


def test_parse_atl_file_lets_oserror_through(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        parse_atl_file(tmp_path / "missing.atl")


def test_parse_atl_file_refuses_invalid_utf8(tmp_path: Path) -> None:
    path = tmp_path / "jobs.atl"
    path.write_bytes(b'job J in ns {\n  queue "caf\xe9"\n}\n')
    with pytest.raises(DeclarationError) as info:
        parse_atl_file(path)
    assert str(info.value) == f"{path}:2:13: not valid UTF-8 (byte 0xe9)"


# --------------------------------------------------------------------------- refusals

BAD_FILES = [
    pytest.param(
        "job ImportContacts in directory {\n    args { account_id text }\n    retry 3\n}\n",
        f"jobs.atl:3:5: unknown modifier 'retry' (expected one of: {MODIFIER_LIST})",
        id="unknown-modifier",
    ),
    pytest.param(
        "job J in ns {\n  timeouts 3s\n}\n",
        f"jobs.atl:2:3: unknown modifier 'timeouts' (expected one of: {MODIFIER_LIST})",
        id="keyword-prefix-is-not-a-keyword",
    ),
    pytest.param(
        "job J in ns {\n  args { account_id strng }\n}\n",
        f"jobs.atl:2:21: unknown type 'strng' (expected one of: {TYPE_LIST})",
        id="unknown-type",
    ),
    pytest.param(
        "job J in ns {\n  args { a Text }\n}\n",
        f"jobs.atl:2:12: unknown type 'Text' (expected one of: {TYPE_LIST})",
        id="types-are-lower-case",
    ),
    pytest.param(
        SEED + "}\n",
        "jobs.atl:8:1: unexpected '}' (expected 'job' or 'workflow')",
        id="stray-closing-brace",
    ),
    pytest.param(
        SEED.removesuffix("}\n"),
        "jobs.atl:7:1: unexpected end of file: '{' opened at line 1, column 33 is not closed",
        id="unterminated-job",
    ),
    pytest.param(
        "job J in ns {\n  args { a int\n",
        "jobs.atl:3:1: unexpected end of file: '{' opened at line 2, column 8 is not closed",
        id="unterminated-args",
    ),
    pytest.param(
        "job J in ns {\n  args { a int }\njob K in ns {\n}\n",
        "jobs.atl:3:1: unexpected 'job': '{' opened at line 1, column 13 is not closed",
        id="job-inside-unclosed-job",
    ),
    pytest.param(
        "job J in ns",
        "jobs.atl:1:12: unexpected end of file (expected one of: '{', end of line)",
        id="eof-before-block",
    ),
    pytest.param(
        SEED + "\n" + SEED,
        "jobs.atl:9:5: job directory.ImportContacts is declared twice (first at jobs.atl:1)",
        id="duplicate-job",
    ),
    pytest.param(
        "job J in ns {\n  args {\n    a int\n    b text\n    a text\n  }\n}\n",
        "jobs.atl:5:5: duplicate field 'a' (first at jobs.atl:3)",
        id="duplicate-field",
    ),
    pytest.param(
        "job J in ns {\n  timeout 1h\n  retries 2\n  timeout 2h\n}\n",
        "jobs.atl:4:3: duplicate modifier 'timeout' (first at jobs.atl:2)",
        id="duplicate-modifier",
    ),
    pytest.param(
        "job J in ns {\n  args { a int }\n  args { b int }\n}\n",
        "jobs.atl:3:3: duplicate modifier 'args' (first at jobs.atl:2)",
        id="duplicate-args",
    ),
    pytest.param(
        "job J in ns {\n  args { a int not null not null }\n}\n",
        "jobs.atl:2:25: 'not null' is given twice",
        id="duplicate-not-null",
    ),
    pytest.param(
        "job J in ns {\n  args { a int default 1 default 2 }\n}\n",
        "jobs.atl:2:26: 'default' is given twice",
        id="duplicate-default",
    ),
    pytest.param(
        'job J in ns {\n  args { a int default "x" }\n}\n',
        "jobs.atl:2:24: default '\"x\"' does not fit type int: expected an integer",
        id="int-default-string",
    ),
    pytest.param(
        "job J in ns {\n  args { a int default 1.5 }\n}\n",
        "jobs.atl:2:24: default '1.5' does not fit type int: expected an integer",
        id="int-default-decimal",
    ),
    pytest.param(
        "job J in ns {\n  args { a int default 2147483648 }\n}\n",
        "jobs.atl:2:24: default '2147483648' is out of range for int",
        id="int-default-out-of-range",
    ),
    pytest.param(
        'job J in ns {\n  args { a double default "1.5" }\n}\n',
        "jobs.atl:2:27: default '\"1.5\"' does not fit type double: expected a number",
        id="double-default-string",
    ),
    pytest.param(
        "job J in ns {\n  args { a text default 5 }\n}\n",
        "jobs.atl:2:25: default '5' does not fit type text: expected a string",
        id="text-default-number",
    ),
    pytest.param(
        "job J in ns {\n  args { a boolean default 1 }\n}\n",
        "jobs.atl:2:28: default '1' does not fit type boolean: expected true or false",
        id="boolean-default-number",
    ),
    pytest.param(
        'job J in ns {\n  args { a varchar(3) default "abcd" }\n}\n',
        "jobs.atl:2:31: default '\"abcd\"' is longer than varchar(3) (4 characters)",
        id="varchar-default-too-long",
    ),
    pytest.param(
        'job J in ns {\n  args { a uuid default "not-a-uuid" }\n}\n',
        "jobs.atl:2:25: default '\"not-a-uuid\"' does not fit type uuid: expected a uuid such as "
        '"123e4567-e89b-12d3-a456-426614174000"',
        id="uuid-default",
    ),
    pytest.param(
        'job J in ns {\n  args { a date default "31/01/2024" }\n}\n',
        "jobs.atl:2:25: default '\"31/01/2024\"' does not fit type date: expected a date such as "
        '"2024-01-31"',
        id="date-default",
    ),
    pytest.param(
        "job J in ns {\n  args { a int not null default null }\n}\n",
        "jobs.atl:2:33: default null contradicts 'not null'",
        id="not-null-default-null",
    ),
    pytest.param(
        "job J in ns {\n  args { a int[] default 1 }\n}\n",
        "jobs.atl:2:26: default '1' does not fit type int[]: expected an array",
        id="array-default-scalar",
    ),
    pytest.param(
        'job J in ns {\n  args { a int[] default [1, "x"] }\n}\n',
        "jobs.atl:2:30: array element '\"x\"' does not fit type int: expected an integer",
        id="array-default-bad-element",
    ),
    pytest.param(
        "job J in ns {\n  args { a int[] default [1, null] }\n}\n",
        "jobs.atl:2:30: array elements must not be null",
        id="array-default-null-element",
    ),
    pytest.param(
        'job J in ns {\n  args { a varchar(2)[] default ["ab", "abc"] }\n}\n',
        "jobs.atl:2:40: array element '\"abc\"' is longer than varchar(2) (3 characters)",
        id="array-default-long-element",
    ),
    pytest.param(
        'job J in ns {\n  args { a jsonb default {"k": 1, "k": 2} }\n}\n',
        "jobs.atl:2:35: duplicate key '\"k\"'",
        id="object-duplicate-key",
    ),
    pytest.param(
        "job J in ns {\n  args { a double default 1e999 }\n}\n",
        "jobs.atl:2:27: number '1e999' is out of range",
        id="number-out-of-range",
    ),
    pytest.param(
        "job J in ns {\n  args { a varchar }\n}\n",
        "jobs.atl:2:12: varchar needs a length, as in varchar(64)",
        id="varchar-without-length",
    ),
    pytest.param(
        "job J in ns {\n  args { a varchar(0) }\n}\n",
        "jobs.atl:2:20: varchar length must be at least 1, not '0'",
        id="varchar-zero-length",
    ),
    pytest.param(
        "job J in ns {\n  args { a int(5) }\n}\n",
        "jobs.atl:2:16: only varchar takes a length, not int",
        id="length-on-int",
    ),
    pytest.param(
        "job J in ns {\n  args { a int[][] }\n}\n",
        "jobs.atl:2:17: unexpected '[' (expected one of: ',', ';', 'default', 'not', '}', "
        "end of line)",
        id="nested-array-type",
    ),
    pytest.param(
        "job J in ns {\n  args { a int not nul }\n}\n",
        "jobs.atl:2:20: unexpected 'nul' (expected 'null')",
        id="not-nul",
    ),
    pytest.param(
        "job J in ns {\n  args { a }\n}\n",
        "jobs.atl:2:12: unexpected '}' (expected a type)",
        id="missing-type",
    ),
    pytest.param(
        "job J in ns {\n  args { a int default }\n}\n",
        "jobs.atl:2:24: unexpected '}' (expected a value)",
        id="missing-default-value",
    ),
    pytest.param(
        "job J in ns {\n  args { a int b int }\n}\n",
        "jobs.atl:2:16: unexpected 'b' (expected one of: "
        "'(', ',', ';', '[', 'default', 'not', '}', end of line)",
        id="fields-need-a-separator",
    ),
    pytest.param(
        "job J in ns {\n  retries 3 timeout 1h\n}\n",
        "jobs.atl:2:13: unexpected 'timeout' (expected one of: ',', ';', '}', end of line)",
        id="modifiers-need-a-separator",
    ),
    pytest.param(
        "job J in ns {\n  timeout\n}\n",
        "jobs.atl:2:10: unexpected end of line (expected a duration such as 30s or 1h30m)",
        id="missing-duration",
    ),
    pytest.param(
        "job J in ns {\n  timeout 30\n}\n",
        "jobs.atl:2:11: duration '30' needs a unit: ms, s, m, h or d (as in 30s)",
        id="duration-without-unit",
    ),
    pytest.param(
        "job J in ns {\n  heartbeat 2x\n}\n",
        "jobs.atl:2:13: invalid duration '2x' (use e.g. 500ms, 30s, 10m, 2h, 1d, 1h30m)",
        id="invalid-duration",
    ),
    pytest.param(
        "job J in ns {\n  timeout 0s\n}\n",
        "jobs.atl:2:11: timeout must be longer than 0, not '0s'",
        id="zero-timeout",
    ),
    pytest.param(
        "job J in ns {\n  heartbeat 0ms\n}\n",
        "jobs.atl:2:13: heartbeat must be longer than 0, not '0ms'",
        id="zero-heartbeat",
    ),
    pytest.param(
        "job J in ns {\n  retries -1\n}\n",
        "jobs.atl:2:11: retries must be at least 0, not '-1'",
        id="negative-retries",
    ),
    pytest.param(
        "job J in ns {\n  retries 2.5\n}\n",
        "jobs.atl:2:11: retries must be a whole number, not '2.5'",
        id="fractional-retries",
    ),
    pytest.param(
        "job J in ns {\n  retries many\n}\n",
        "jobs.atl:2:11: unexpected 'many' (expected a number)",
        id="retries-not-a-number",
    ),
    pytest.param(
        "job J in ns {\n  priority 1e3\n}\n",
        "jobs.atl:2:12: priority must be a whole number, not '1e3'",
        id="priority-not-whole",
    ),
    pytest.param(
        "job J in ns {\n  queue contacts\n}\n",
        "jobs.atl:2:9: unexpected 'contacts' (expected a string in double quotes)",
        id="queue-not-quoted",
    ),
    pytest.param(
        'job J in ns {\n  queue ""\n}\n',
        "jobs.atl:2:9: queue name must not be empty",
        id="empty-queue",
    ),
    pytest.param(
        'job J in ns {\n  queue "contacts\n}\n',
        'jobs.atl:2:9: unterminated string (a string must end with " on the same line)',
        id="unterminated-string",
    ),
    pytest.param(
        'job J in ns {\n  queue "a\\qb"\n}\n',
        "jobs.atl:2:11: invalid string '\"a\\qb\"': Invalid \\escape",
        id="invalid-escape",
    ),
    pytest.param(
        "job J in ns {\n  args { a int }\n  unique (a, b)\n}\n",
        "jobs.atl:3:14: unique field 'b' is not declared in args",
        id="unique-unknown-field",
    ),
    pytest.param(
        "job J in ns {\n  unique (a)\n}\n",
        "jobs.atl:2:11: unique field 'a' is not declared in args",
        id="unique-without-args",
    ),
    pytest.param(
        "job J in ns {\n  args { a int }\n  unique (a, a)\n}\n",
        "jobs.atl:3:14: field 'a' is listed twice in unique",
        id="unique-repeated-field",
    ),
    pytest.param(
        "job J in ns {\n  unique ()\n}\n",
        "jobs.atl:2:11: unexpected ')' (expected one of: a name, end of line)",
        id="unique-empty",
    ),
    pytest.param(
        "job J ns {\n}\n",
        "jobs.atl:1:7: unexpected 'ns' (expected 'in')",
        id="missing-in",
    ),
    pytest.param(
        "jobs J in ns {\n}\n",
        "jobs.atl:1:1: unexpected 'jobs' (expected 'job' or 'workflow')",
        id="misspelt-job",
    ),
    pytest.param(
        "job 1J in ns {\n}\n",
        "jobs.atl:1:5: unexpected '1' (expected a name)",
        id="name-starting-with-digit",
    ),
    pytest.param(
        "job J in ns {\n  args { a int @ }\n}\n",
        "jobs.atl:2:16: unexpected character '@'",
        id="unexpected-character",
    ),
]


@pytest.mark.parametrize(("text", "message"), BAD_FILES)
def test_refusals_name_file_line_column_and_token(text: str, message: str) -> None:
    assert error(text) == message


def test_refusals_are_declaration_errors_without_lark_attached() -> None:
    with pytest.raises(DeclarationError) as info:
        parse_atl("job J in ns {\n  retry 3\n}\n")
    assert str(info.value).startswith("<string>:2:3: ")
    assert info.value.__cause__ is None
    assert info.value.__suppress_context__


def test_no_lark_exception_escapes_for_damaged_files() -> None:
    """Damage a valid file at random (fixed seed) and truncate it everywhere: every outcome
    is either a parse or a DeclarationError in the documented form."""
    source = (
        SEED
        + """
job Other in ns {
  args { a int[] default [1, 2], b jsonb default {"k": [true, null]}, c numeric default -1.5 }
  unique (a, c)
  priority -2, backoff 1h30m
}
"""
    )
    pieces = [*'{}()[],:"\n #-/\\az09.', "job", "args", "int", "not", "null", "default", "é"]
    shape = re.compile(r"jobs\.atl:[1-9][0-9]*:[1-9][0-9]*: \S")
    rng = random.Random(20240131)
    texts = [source[:end] for end in range(len(source) + 1)]
    for _ in range(1500):
        chars = list(source)
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(len(chars))
            if rng.random() < 0.5:
                del chars[at]
            else:
                chars.insert(at, rng.choice(pieces))
        texts.append("".join(chars))
    for text in texts:
        try:
            parse_atl(text, "jobs.atl")
        except DeclarationError as exc:
            assert shape.match(str(exc)), (text, str(exc))
        except lark.exceptions.LarkError as exc:  # pragma: no cover - the failure itself
            pytest.fail(f"lark error escaped for {text!r}: {exc}")


# --------------------------------------------------------------------------- limits
# A default must be something the database accepts in args (migration 0003) and something
# a handler can receive: jsonb nested at most 64 levels, numbers of at most 4000
# characters, numeric defaults kept exactly, doubles in range.


def nest(levels: int, inner: str = "1") -> str:
    return "[" * levels + inner + "]" * levels


def in_args(field: str) -> str:
    return f"job J in ns {{\n  args {{ {field} }}\n}}\n"


LIMIT_REFUSALS = [
    pytest.param(
        in_args(f"x jsonb default {nest(65)}"),
        "jobs.atl:2:26: default nested 65 levels deep, more than the limit of 64",
        id="jsonb-65-levels",
    ),
    pytest.param(
        in_args(f'x jsonb default {{"a": {nest(64)}}}'),
        "jobs.atl:2:26: default nested 65 levels deep, more than the limit of 64",
        id="jsonb-65-levels-in-object",
    ),
    pytest.param(
        in_args(f"x jsonb[] default [1, {nest(65)}]"),
        "jobs.atl:2:32: array element nested 65 levels deep, more than the limit of 64",
        id="jsonb-array-element-65-levels",
    ),
    pytest.param(
        in_args(f"x jsonb default {nest(5000)}"),
        "jobs.atl:2:26: default nested 5000 levels deep, more than the limit of 64",
        id="jsonb-5000-levels",
    ),
    pytest.param(
        in_args(f"x int[] default {nest(3000)}"),
        "jobs.atl:2:26: default nested 3000 levels deep, more than the limit of 64",
        id="int-array-3000-levels",
    ),
    pytest.param(
        in_args(f"x numeric default {'9' * 4001}"),
        f"jobs.atl:2:28: number '{'9' * 37}...' is 4001 characters long, more than the limit "
        "of 4000",
        id="number-4001-characters",
    ),
    pytest.param(
        in_args(f"x jsonb default {{\"a\": -{'9' * 4000}}}"),
        f"jobs.atl:2:32: number '-{'9' * 36}...' is 4001 characters long, more than the "
        "limit of 4000",
        id="number-4001-characters-in-jsonb",
    ),
    pytest.param(
        f"job J in ns {{\n  retries {'9' * 5000}\n}}\n",
        f"jobs.atl:2:11: retries must be at most 2147483646, not '{'9' * 37}...'",
        id="retries-5000-digits",
    ),
    pytest.param(
        f"job J in ns {{\n  priority -{'9' * 5000}\n}}\n",
        f"jobs.atl:2:12: priority must be at least -2147483648, not '-{'9' * 36}...'",
        id="priority-5000-digits",
    ),
    pytest.param(
        in_args("x numeric default 0.1000000000000000000000000001"),
        "jobs.atl:2:28: default '0.1000000000000000000000000001' cannot be stored exactly "
        "(a numeric default with a fraction or an exponent keeps at most 15 significant digits)",
        id="numeric-default-inexact",
    ),
    pytest.param(
        in_args("x numeric[] default [0.5, 1.00000000000000000001]"),
        "jobs.atl:2:36: array element '1.00000000000000000001' cannot be stored exactly "
        "(a numeric default with a fraction or an exponent keeps at most 15 significant digits)",
        id="numeric-array-element-inexact",
    ),
    pytest.param(
        in_args(f"x double default 1{'0' * 309}"),
        f"jobs.atl:2:27: default '1{'0' * 36}...' is out of range for double",
        id="double-default-out-of-range",
    ),
]


@pytest.mark.parametrize(("text", "message"), LIMIT_REFUSALS)
def test_defaults_past_the_limits_are_refused(text: str, message: str) -> None:
    assert error(text) == message


@pytest.mark.parametrize(
    ("declaration", "default"),
    [
        (f"x jsonb default {nest(64)}", eval(nest(64))),
        (f"x jsonb[] default [{nest(64)}]", [eval(nest(64))]),
        (f"x numeric default {'9' * 4000}", int("9" * 4000)),
        ("x numeric default 123456789012345678901234567890", 123456789012345678901234567890),
        ("x numeric default 0.1", 0.1),
        ("x numeric default 1e30", 1e30),
        ("x numeric default 123456789012345.6", 123456789012345.6),
        (f"x double default 1{'0' * 308}", 10**308),
        ("x double default 0.1000000000000000000000000001", 0.1),
    ],
)
def test_defaults_within_the_limits_are_kept(declaration: str, default: Any) -> None:
    field = one_field(declaration)
    assert field.default == default and type(field.default) is type(default)


# --------------------------------------------------------------------------- stall, schedule, tz

SCHEDULED = """\
job Nightly in reports {
  args { day date, region text not null default "eu", force boolean default false }
  schedule "30 2 * * *"
  tz       "Europe/Paris"
  stall    15m
}
"""


def test_stall_schedule_and_tz() -> None:
    decl = one_job(SCHEDULED)
    assert (decl.schedule, decl.tz, decl.stall) == ("30 2 * * *", "Europe/Paris", 900.0)
    doc = decl.to_json()
    assert (doc["schedule"], doc["tz"], doc["stall"]) == ("30 2 * * *", "Europe/Paris", 900.0)


def test_stall_schedule_and_tz_are_absent_by_default() -> None:
    decl = one_job("job J in ns { }")
    assert (decl.stall, decl.schedule, decl.tz) == (None, None, None)
    doc = decl.to_json()
    assert (doc["stall"], doc["schedule"], doc["tz"]) == (None, None, None)


@pytest.mark.parametrize(
    "expression",
    ["0 3 * * *", "*/15 * * * *", "0 9-17 * * mon-fri", "0 0 1 jan,jul *", "0 0 L * *",
     "5 4 * * sun", "0 0 29 2 *", "*/2 * * * * *", "30 0 3 * * *"],
)  # fmt: skip
def test_schedules_five_fields_or_six_with_seconds_first(expression: str) -> None:
    assert one_job(f'job J in ns {{ schedule "{expression}" }}').schedule == expression


def test_schedule_without_tz_runs_in_utc_and_tz_may_come_first() -> None:
    assert one_job('job J in ns { schedule "0 3 * * *" }').tz is None
    decl = one_job('job J in ns {\n  tz "UTC"\n  schedule "0 3 * * *"\n}\n')
    assert (decl.tz, decl.schedule) == ("UTC", "0 3 * * *")


def test_a_scheduled_job_may_have_nullable_fields_and_fields_with_defaults() -> None:
    decl = one_job(SCHEDULED)
    assert [f.name for f in decl.fields] == ["day", "region", "force"]


def test_new_modifiers_are_keywords_only_where_expected() -> None:
    decl = one_job("job J in ns {\n  args { stall int, schedule text, tz text }\n}\n")
    assert [f.name for f in decl.fields] == ["stall", "schedule", "tz"]


SCHEDULE_REFUSALS = [
    pytest.param(
        'job J in ns {\n  schedule "0 25 * * *"\n}\n',
        "jobs.atl:2:12: invalid schedule '\"0 25 * * *\"': field 2 (hour) '25' is not valid",
        id="schedule-hour-out-of-range",
    ),
    pytest.param(
        'job J in ns {\n  schedule "* * * *"\n}\n',
        "jobs.atl:2:12: invalid schedule '\"* * * *\"': 4 fields, expected 5 (minute hour "
        "day-of-month month day-of-week) or 6 with seconds first",
        id="schedule-four-fields",
    ),
    pytest.param(
        'job J in ns {\n  schedule "0 0 * * * * *"\n}\n',
        "jobs.atl:2:12: invalid schedule '\"0 0 * * * * *\"': 7 fields, expected 5 (minute "
        "hour day-of-month month day-of-week) or 6 with seconds first",
        id="schedule-seven-fields",
    ),
    pytest.param(
        'job J in ns {\n  schedule "@daily"\n}\n',
        "jobs.atl:2:12: invalid schedule '\"@daily\"': 1 field, expected 5 (minute hour "
        "day-of-month month day-of-week) or 6 with seconds first",
        id="schedule-alias",
    ),
    pytest.param(
        'job J in ns {\n  schedule ""\n}\n',
        "jobs.atl:2:12: invalid schedule '\"\"': 0 fields, expected 5 (minute hour "
        "day-of-month month day-of-week) or 6 with seconds first",
        id="schedule-empty",
    ),
    pytest.param(
        'job J in ns {\n  schedule "0 3 * * funday"\n}\n',
        "jobs.atl:2:12: invalid schedule '\"0 3 * * funday\"': field 5 (day-of-week) 'funday' "
        "is not valid",
        id="schedule-bad-weekday",
    ),
    pytest.param(
        'job J in ns {\n  schedule "61 */2 * * * *"\n}\n',
        "jobs.atl:2:12: invalid schedule '\"61 */2 * * * *\"': field 1 (second) '61' is not "
        "valid",
        id="schedule-bad-second",
    ),
    pytest.param(
        'job J in ns {\n  schedule "H * * * *"\n}\n',
        "jobs.atl:2:12: invalid schedule '\"H * * * *\"': field 1 (minute) 'H' is not valid",
        id="schedule-hashed",
    ),
    pytest.param(
        'job J in ns {\n  schedule "0 0 31 2 *"\n}\n',
        "jobs.atl:2:12: invalid schedule '\"0 0 31 2 *\"': it never matches a date",
        id="schedule-never",
    ),
    pytest.param(
        "job J in ns {\n  schedule 0 3 * * *\n}\n",
        "jobs.atl:2:12: unexpected '0' (expected a string in double quotes)",
        id="schedule-unquoted",
    ),
    pytest.param(
        'job J in ns {\n  schedule "0 3 * * *"\n  tz "Europe/Pariss"\n}\n',
        "jobs.atl:3:6: invalid tz '\"Europe/Pariss\"': not a known time zone (use an IANA name "
        "such as \"Europe/Paris\" or \"UTC\")",
        id="tz-unknown",
    ),
    pytest.param(
        'job J in ns {\n  schedule "0 3 * * *"\n  tz "../../etc/passwd"\n}\n',
        "jobs.atl:3:6: invalid tz '\"../../etc/passwd\"': not a known time zone (use an IANA "
        "name such as \"Europe/Paris\" or \"UTC\")",
        id="tz-path",
    ),
    pytest.param(
        'job J in ns {\n  schedule "0 3 * * *"\n  tz ""\n}\n',
        "jobs.atl:3:6: invalid tz '\"\"': not a known time zone (use an IANA name such as "
        "\"Europe/Paris\" or \"UTC\")",
        id="tz-empty",
    ),
    pytest.param(
        'job J in ns {\n  tz "Europe/Paris"\n}\n',
        "jobs.atl:2:3: tz needs a schedule in the same job (it is the time zone the schedule "
        "runs in)",
        id="tz-without-schedule",
    ),
    pytest.param(
        'job J in ns {\n  schedule "0 3 * * *"\n  schedule "0 4 * * *"\n}\n',
        "jobs.atl:3:3: duplicate modifier 'schedule' (first at jobs.atl:2)",
        id="schedule-twice",
    ),
    pytest.param(
        'job J in ns {\n  schedule "0 3 * * *", tz "UTC", tz "UTC"\n}\n',
        "jobs.atl:2:35: duplicate modifier 'tz' (first at jobs.atl:2)",
        id="tz-twice",
    ),
    pytest.param(
        "job J in ns {\n  args { a int, b text not null }\n  schedule \"0 3 * * *\"\n}\n",
        "jobs.atl:2:17: field 'b' needs a default or must allow null: the job has a schedule, "
        "which enqueues it with the defaults",
        id="scheduled-field-without-default",
    ),
    pytest.param(
        "job J in ns {\n  schedule \"0 3 * * *\"\n  args {\n    a int not null\n  }\n}\n",
        "jobs.atl:4:5: field 'a' needs a default or must allow null: the job has a schedule, "
        "which enqueues it with the defaults",
        id="scheduled-field-args-after-schedule",
    ),
    pytest.param(
        "job J in ns {\n  stall 0s\n}\n",
        "jobs.atl:2:9: stall must be longer than 0, not '0s'",
        id="stall-zero",
    ),
    pytest.param(
        "job J in ns {\n  stall 15\n}\n",
        "jobs.atl:2:9: duration '15' needs a unit: ms, s, m, h or d (as in 15s)",
        id="stall-without-unit",
    ),
    pytest.param(
        "job J in ns {\n  stall soon\n}\n",
        "jobs.atl:2:9: unexpected 'soon' (expected a duration such as 30s or 1h30m)",
        id="stall-not-a-duration",
    ),
]


@pytest.mark.parametrize(("text", "message"), SCHEDULE_REFUSALS)
def test_schedule_tz_and_stall_refusals(text: str, message: str) -> None:
    assert error(text) == message
