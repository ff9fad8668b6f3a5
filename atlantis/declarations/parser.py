"""Reading `.atl` files into :class:`JobDecl` values.

The grammar (``atl.lark``) fixes the shape of a file. Everything that needs more than one
token to judge (does the type exist, does the default fit it, is a job, field or modifier
repeated) is decided here, so that every refusal, syntactic or not, reads
``file:line:column: what is wrong`` and names the token at fault. Lark's exceptions never
leave this module: they speak of grammar terminals, and a user wrote jobs.
"""

from __future__ import annotations

import codecs
import functools
import importlib.resources
import json
import math
import re
import uuid
from collections.abc import Iterable
from datetime import date, datetime
from pathlib import Path
from typing import Any, NoReturn

import lark
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken

from atlantis.declarations.model import (
    BASE_TYPES,
    DEFAULT_BACKOFF,
    DEFAULT_HEARTBEAT,
    DEFAULT_PRIORITY,
    DEFAULT_QUEUE,
    DEFAULT_RETRIES,
    DEFAULT_TIMEOUT,
    Field,
    JobDecl,
)
from atlantis.errors import DeclarationError
from atlantis.units import parse_duration

__all__ = ["MODIFIERS", "TYPES", "parse_atl", "parse_atl_file"]

#: The statements a job block may hold, in the order error messages list them.
MODIFIERS = ("args", "retries", "timeout", "heartbeat", "queue", "priority", "unique", "backoff")

#: The argument types as a user writes them, in the order error messages list them.
TYPES = (
    "text", "varchar(n)", "int", "bigint", "boolean", "double", "numeric", "uuid",
    "timestamptz", "date", "jsonb",
)  # fmt: skip

_INT_RANGES = {"int": (-(2**31), 2**31 - 1), "bigint": (-(2**63), 2**63 - 1)}
_STRING_TYPES = frozenset({"text", "varchar", "uuid", "timestamptz", "date"})
# PostgreSQL's own ceiling for varchar(n).
_MAX_VARCHAR = 10_485_760
_INT32_MAX = 2**31 - 1

_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_WHOLE = re.compile(r"-?[0-9]+")
_BARE_NUMBER = re.compile(r"[0-9]+(\.[0-9]+)?")

# What a terminal means to someone writing a .atl file; terminals missing here are
# punctuation and are shown as written.
_TERMINALS = {
    "NAME": "a name",
    "TYPE_NAME": "a type",
    "NUMBER": "a number",
    "DURATION": "a duration such as 30s or 1h30m",
    "STRING": "a string in double quotes",
    "_NL": "end of line",
    "$END": "end of file",
}
_MODIFIER_TERMINALS = frozenset(m.upper() for m in MODIFIERS)
_VALUE_TERMINALS = frozenset({"STRING", "NUMBER", "TRUE", "FALSE", "NULL", "LSQB", "LBRACE"})


@functools.cache
def _parser() -> lark.Lark:
    """The LALR parser, built on first use and then kept.

    Building it takes some 40 ms, which every process importing atlantis would pay at
    import time (workers and `tide` included) even when it never reads a `.atl` file.
    """
    grammar = (
        importlib.resources.files("atlantis.declarations")
        .joinpath("atl.lark")
        .read_text(encoding="utf-8")
    )
    return lark.Lark(grammar, parser="lalr", lexer="contextual", propagate_positions=True)


_Tree = lark.Tree[lark.Token]


def parse_atl(text: str, filename: str = "<string>") -> list[JobDecl]:
    """The jobs declared in `text`, in file order; `filename` is only used in messages."""
    try:
        tree = _parser().parse(text)
    except UnexpectedInput as exc:
        raise _syntax_error(exc, text, filename) from None
    return _Reader(text, filename).file(tree)


def parse_atl_file(path: str | Path) -> list[JobDecl]:
    """The jobs declared in the UTF-8 file at `path` (OSError when it cannot be read)."""
    raw = Path(path).read_bytes()
    if raw.startswith(codecs.BOM_UTF8):
        raw = raw[len(codecs.BOM_UTF8) :]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        before = raw[: exc.start]
        line = before.count(b"\n") + 1
        column = len(before[before.rfind(b"\n") + 1 :].decode("utf-8", "replace")) + 1
        raise DeclarationError(
            f"{path}:{line}:{column}: not valid UTF-8 (byte 0x{raw[exc.start]:02x})"
        ) from None
    return parse_atl(text, str(path))


# --------------------------------------------------------------------------- syntax errors


def _syntax_error(exc: UnexpectedInput, text: str, filename: str) -> DeclarationError:
    """Lark's report, reworded in the vocabulary of the language and pointed at a token."""
    if isinstance(exc, UnexpectedCharacters):
        char = text[exc.pos_in_stream or 0]
        if char == '"':
            what = 'unterminated string (a string must end with " on the same line)'
        else:
            what = f"unexpected character {char!r}"
        return _error(filename, exc.line, exc.column, what)

    open_bracket = _innermost_open_bracket(exc)
    if isinstance(exc, UnexpectedToken) and exc.token.type != "$END":
        token = exc.token
        expected = _expected(exc)
        if token == "job" and open_bracket is not None:
            what = f"unexpected 'job': {_describe_open(open_bracket)}"
        elif _MODIFIER_TERMINALS.issubset(expected) and _WORD.fullmatch(token):
            what = f"unknown modifier {_show(token)} (expected one of: {', '.join(MODIFIERS)})"
        else:
            what = f"unexpected {_show(token)}{_describe_expected(expected)}"
        return _error(filename, *_position(token), what)

    line = text.count("\n") + 1
    column = len(text) - (text.rfind("\n") + 1) + 1
    if open_bracket is not None:
        what = f"unexpected end of file: {_describe_open(open_bracket)}"
    else:
        what = f"unexpected end of file{_describe_expected(_expected(exc))}"
    return _error(filename, line, column, what)


def _expected(exc: UnexpectedInput) -> set[str]:
    """Terminals the parser could have taken where it stopped.

    Asking the interactive parser is exact; the set lark attaches to the exception is a
    superset in states that only reduce (after a line break, for instance).
    """
    parser = getattr(exc, "interactive_parser", None)
    if parser is not None:
        try:
            return set(parser.accepts())
        except UnexpectedInput:
            pass
    return set(getattr(exc, "expected", None) or ())


def _innermost_open_bracket(exc: UnexpectedInput) -> lark.Token | None:
    """The last `{`, `(` or `[` still unclosed when parsing stopped.

    A closed pair has been reduced into a subtree by then, so any bracket token left on
    the parser's value stack is open.
    """
    parser = getattr(exc, "interactive_parser", None)
    if parser is None:
        return None
    found = None
    for value in parser.parser_state.value_stack:
        if isinstance(value, lark.Token) and value in ("{", "(", "["):
            found = value
    return found


def _describe_open(bracket: lark.Token) -> str:
    return f"'{bracket}' opened at line {bracket.line}, column {bracket.column} is not closed"


def _describe_expected(expected: Iterable[str]) -> str:
    names = set(expected)
    if "JOB" in names:
        # Between jobs, blank lines and the end of the file are allowed too; saying so
        # would only bury the one thing that can start here.
        names = {"JOB"}
    elif len(names) > 1:
        names.discard("$END")
    words = []
    if _MODIFIER_TERMINALS.issubset(names):
        names -= _MODIFIER_TERMINALS
        words.append("a modifier")
    if _VALUE_TERMINALS.issubset(names):
        names -= _VALUE_TERMINALS
        words.append("a value")
    for name in names:
        if name in _TERMINALS:
            words.append(_TERMINALS[name])
        else:
            words.append(f"'{_spelling(name)}'")
    if not words:
        return ""
    words.sort(key=lambda w: (w.startswith("end of"), w.startswith("'"), w))
    if len(words) == 1:
        return f" (expected {words[0]})"
    return f" (expected one of: {', '.join(words)})"


def _spelling(terminal: str) -> str:
    """How a keyword or punctuation terminal is written in a file."""
    pattern = _parser().get_terminal(terminal).pattern
    if isinstance(pattern, lark.lexer.PatternStr):
        return pattern.value
    return pattern.value.removesuffix(r"\b")


def _show(token: lark.Token) -> str:
    if token.type == "_NL":
        return "end of line"
    return _quote(str(token))


def _quote(text: str) -> str:
    if len(text) > 40:
        text = text[:37] + "..."
    return f"'{text}'"


def _position(token: lark.Token) -> tuple[int, int]:
    # Every token lark's lexer makes has a position; only hand-made ones lack it.
    return token.line or 1, token.column or 1


def _error(filename: str, line: int, column: int, what: str) -> DeclarationError:
    return DeclarationError(f"{filename}:{line}:{column}: {what}")


# --------------------------------------------------------------------------- meaning


class _Reader:
    """Turns a parse tree into JobDecls, refusing what the grammar let through."""

    def __init__(self, text: str, filename: str) -> None:
        self.text = text
        self.filename = filename

    def fail(self, where: lark.Token | _Tree, what: str) -> NoReturn:
        if isinstance(where, lark.Token):
            line, column = _position(where)
        else:
            line, column = where.meta.line, where.meta.column
        raise _error(self.filename, line, column, what)

    def written(self, where: lark.Token | _Tree) -> str:
        """The source text of a token or subtree, quoted for a message."""
        if isinstance(where, lark.Token):
            return _quote(str(where))
        return _quote(self.text[where.meta.start_pos : where.meta.end_pos])

    def first_at(self, token: lark.Token) -> str:
        return f"(first at {self.filename}:{token.line})"

    # -- structure

    def file(self, tree: _Tree) -> list[JobDecl]:
        decls: list[JobDecl] = []
        seen: dict[str, JobDecl] = {}
        for job in _subtrees(tree):
            decl = self.job(job)
            first = seen.get(decl.qualified_name)
            if first is not None:
                self.fail(
                    _tokens(job)[1],
                    f"job {decl.qualified_name} is declared twice (first at {first.source})",
                )
            seen[decl.qualified_name] = decl
            decls.append(decl)
        return decls

    def job(self, tree: _Tree) -> JobDecl:
        keyword, name, _in, namespace = _tokens(tree)
        seen: dict[str, lark.Token] = {}
        values: dict[str, Any] = {}
        unique_tokens: list[lark.Token] = []
        for statement in _subtrees(tree):
            modifier = statement.data
            head = _tokens(statement)[0]
            if modifier in seen:
                self.fail(head, f"duplicate modifier '{modifier}' {self.first_at(seen[modifier])}")
            seen[modifier] = head
            if modifier == "args":
                values["fields"] = self.fields(statement)
            elif modifier == "unique":
                unique_tokens = self.unique(statement)
                values["unique"] = tuple(str(t) for t in unique_tokens)
            else:
                values[modifier] = self.modifier(modifier, _tokens(statement)[1])
        declared = {f.name for f in values.get("fields", ())}
        for token in unique_tokens:
            if str(token) not in declared:
                self.fail(token, f"unique field '{token}' is not declared in args")
        return JobDecl(
            name=str(name),
            namespace=str(namespace),
            fields=values.get("fields", ()),
            retries=values.get("retries", DEFAULT_RETRIES),
            timeout=values.get("timeout", DEFAULT_TIMEOUT),
            heartbeat=values.get("heartbeat", DEFAULT_HEARTBEAT),
            queue=values.get("queue", DEFAULT_QUEUE),
            priority=values.get("priority", DEFAULT_PRIORITY),
            unique=values.get("unique", ()),
            backoff=values.get("backoff", DEFAULT_BACKOFF),
            source=f"{self.filename}:{keyword.line}",
        )

    def modifier(self, modifier: str, value: lark.Token) -> Any:
        if modifier == "retries":
            # max_attempts (retries + 1) is stored as an int.
            return self.whole_number(value, "retries", 0, _INT32_MAX - 1)
        if modifier == "priority":
            return self.whole_number(value, "priority", -_INT32_MAX - 1, _INT32_MAX)
        if modifier == "queue":
            queue = self.string(value)
            if not queue:
                self.fail(value, "queue name must not be empty")
            return queue
        # timeout, heartbeat, backoff: a zero timeout or lease could never be met.
        return self.duration(value, modifier, positive=modifier != "backoff")

    def unique(self, tree: _Tree) -> list[lark.Token]:
        names = _tokens(tree)[1:]
        seen: set[str] = set()
        for token in names:
            if str(token) in seen:
                self.fail(token, f"field '{token}' is listed twice in unique")
            seen.add(str(token))
        return names

    def fields(self, tree: _Tree) -> tuple[Field, ...]:
        fields: list[Field] = []
        seen: dict[str, lark.Token] = {}
        for node in _subtrees(tree):
            name = _tokens(node)[0]
            if str(name) in seen:
                self.fail(name, f"duplicate field '{name}' {self.first_at(seen[str(name)])}")
            seen[str(name)] = name
            fields.append(self.field(node))
        return tuple(fields)

    def field(self, tree: _Tree) -> Field:
        name = _tokens(tree)[0]
        type_tree, *options = _subtrees(tree)
        base, length, array = self.type(type_tree)
        not_null: lark.Token | None = None
        default: _Tree | None = None
        for option in options:
            head = _tokens(option)[0]
            if option.data == "not_null":
                if not_null is not None:
                    self.fail(head, "'not null' is given twice")
                not_null = head
            else:
                if default is not None:
                    self.fail(head, "'default' is given twice")
                default = _subtrees(option)[0]
        value = None
        if default is not None:
            value = self.default(default, base, length, array, not_null is not None)
        return Field(
            name=str(name),
            type=base,
            length=length,
            array=array,
            not_null=not_null is not None,
            has_default=default is not None,
            default=value,
        )

    def type(self, tree: _Tree) -> tuple[str, int | None, bool]:
        base = _tokens(tree)[0]
        if base not in BASE_TYPES:
            self.fail(base, f"unknown type '{base}' (expected one of: {', '.join(TYPES)})")
        length: int | None = None
        array = False
        for part in _subtrees(tree):
            if part.data == "array":
                array = True
            else:
                size = _tokens(part)[0]
                if base != "varchar":
                    self.fail(size, f"only varchar takes a length, not {base}")
                length = self.whole_number(size, "varchar length", 1, _MAX_VARCHAR)
        if base == "varchar" and length is None:
            self.fail(base, "varchar needs a length, as in varchar(64)")
        return str(base), length, array

    # -- values

    def whole_number(self, token: lark.Token, what: str, low: int, high: int) -> int:
        if not _WHOLE.fullmatch(token):
            self.fail(token, f"{what} must be a whole number, not {self.written(token)}")
        number = int(token)
        if number < low:
            self.fail(token, f"{what} must be at least {low}, not {self.written(token)}")
        if number > high:
            self.fail(token, f"{what} must be at most {high}, not {self.written(token)}")
        return number

    def duration(self, token: lark.Token, what: str, *, positive: bool) -> float:
        # parse_duration reads a bare number as seconds; in a file, `timeout 30` is more
        # likely a forgotten unit than a decision, so it is refused.
        if _BARE_NUMBER.fullmatch(token):
            self.fail(
                token,
                f"duration {self.written(token)} needs a unit: ms, s, m, h or d (as in {token}s)",
            )
        try:
            seconds = parse_duration(str(token))
        except ValueError:
            self.fail(
                token,
                f"invalid duration {self.written(token)} (use e.g. 500ms, 30s, 10m, 2h, 1d, 1h30m)",
            )
        if positive and seconds <= 0:
            self.fail(token, f"{what} must be longer than 0, not {self.written(token)}")
        return seconds

    def string(self, token: lark.Token) -> str:
        try:
            value = json.loads(str(token), strict=False)
        except json.JSONDecodeError as exc:
            line, column = _position(token)
            what = f"invalid string {self.written(token)}: {exc.msg}"
            raise _error(self.filename, line, column + exc.pos, what) from None
        assert isinstance(value, str)
        return value

    def literal(self, tree: _Tree) -> Any:
        """The JSON value a literal denotes."""
        kind = tree.data
        if kind == "string":
            return self.string(_tokens(tree)[0])
        if kind == "number":
            token = _tokens(tree)[0]
            if _WHOLE.fullmatch(token):
                return int(token)
            number = float(token)
            if not math.isfinite(number):
                self.fail(token, f"number {self.written(token)} is out of range")
            return number
        if kind in ("true", "false"):
            return kind == "true"
        if kind == "null":
            return None
        if kind == "array_literal":
            return [self.literal(element) for element in _subtrees(tree)]
        result: dict[str, Any] = {}
        for pair in _subtrees(tree):
            key_token = _tokens(pair)[0]
            key = self.string(key_token)
            if key in result:
                self.fail(key_token, f"duplicate key {self.written(key_token)}")
            result[key] = self.literal(_subtrees(pair)[0])
        return result

    def default(
        self, tree: _Tree, base: str, length: int | None, array: bool, not_null: bool
    ) -> Any:
        value = self.literal(tree)
        if value is None:
            if not_null:
                self.fail(tree, "default null contradicts 'not null'")
            return value
        if not array:
            self.check(tree, value, base, length, "default")
            return value
        if not isinstance(value, list):
            type_name = Field("", base, length, array=True).type_name
            self.fail(
                tree,
                f"default {self.written(tree)} does not fit type {type_name}: expected an array",
            )
        for element_tree, element in zip(_subtrees(tree), value, strict=True):
            if element is None and base != "jsonb":
                self.fail(element_tree, "array elements must not be null")
            self.check(element_tree, element, base, length, "array element")
        return value

    def check(self, tree: _Tree, value: Any, base: str, length: int | None, what: str) -> None:
        """Refuse a default the database would refuse when the job is enqueued."""
        type_name = Field("", base, length).type_name
        shown = self.written(tree)

        def mismatch(expected: str) -> NoReturn:
            self.fail(tree, f"{what} {shown} does not fit type {type_name}: expected {expected}")

        if base in _STRING_TYPES:
            if not isinstance(value, str):
                mismatch("a string")
            if length is not None and len(value) > length:
                self.fail(
                    tree, f"{what} {shown} is longer than {type_name} ({len(value)} characters)"
                )
            try:
                if base == "uuid":
                    uuid.UUID(value)
                elif base == "date":
                    date.fromisoformat(value)
                elif base == "timestamptz":
                    datetime.fromisoformat(value)
            except ValueError:
                mismatch(_STRING_FORMATS[base])
        elif base in _INT_RANGES:
            if isinstance(value, bool) or not isinstance(value, int):
                mismatch("an integer")
            low, high = _INT_RANGES[base]
            if not low <= value <= high:
                self.fail(tree, f"{what} {shown} is out of range for {type_name}")
        elif base == "boolean":
            if not isinstance(value, bool):
                mismatch("true or false")
        elif base in ("double", "numeric"):
            if isinstance(value, bool) or not isinstance(value, int | float):
                mismatch("a number")


_STRING_FORMATS = {
    "uuid": 'a uuid such as "123e4567-e89b-12d3-a456-426614174000"',
    "date": 'a date such as "2024-01-31"',
    "timestamptz": 'an ISO 8601 timestamp such as "2024-01-31T12:00:00Z"',
}


def _tokens(tree: _Tree) -> list[lark.Token]:
    return [child for child in tree.children if isinstance(child, lark.Token)]


def _subtrees(tree: _Tree) -> list[_Tree]:
    return [child for child in tree.children if isinstance(child, lark.Tree)]
