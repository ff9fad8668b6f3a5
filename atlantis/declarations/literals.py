"""Values as a `.atl` file writes them: what each denotes, and whether it fits its place.

A modifier's whole number, duration or string, and a field's default (a JSON-like literal)
are read here and refused, naming the token at fault, when the database would refuse them
at enqueue time: a default that does not fit its type, a number out of range or written too
long, jsonb nested too deep, a string PostgreSQL cannot store. ``checks.py`` asks.
"""

from __future__ import annotations

import json
import math
import re
from decimal import Decimal
from typing import Any, NoReturn

import lark

from atlantis.declarations.formats import (
    NO_OFFSET_REASON,
    date_problem,
    timestamptz_problem,
    uuid_problem,
)
from atlantis.declarations.model import Field
from atlantis.declarations.raw import Source, Tree, error, position, subtrees, tokens
from atlantis.limits import MAX_DEPTH, MAX_NUMBER_CHARS, too_deep
from atlantis.units import INT_RANGES, MAX_TEXT, DurationTooLongError, parse_duration

__all__ = ["MAX_DEPTH", "MAX_NUMBER_CHARS", "Literals"]

#: Past this depth a literal is refused before it is read (reading it would exhaust the
#: stack); up to it, the depth check of a default names the limit (``MAX_DEPTH``).
_READABLE_DEPTH = 200

_STRING_TYPES = frozenset({"text", "varchar", "uuid", "timestamptz", "date"})
_MAX_DOUBLE = Decimal("1.7976931348623157e308")

_WHOLE = re.compile(r"-?[0-9]+")
_SURROGATE_PAIR = re.compile(r"\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}")
_BARE_NUMBER = re.compile(r"[0-9]+(\.[0-9]+)?")

_STRING_FORMATS = {
    "uuid": 'a uuid such as "123e4567-e89b-12d3-a456-426614174000"',
    "date": 'a date such as "2024-01-31"',
    "timestamptz": 'an RFC 3339 timestamp with Z or an offset, such as "2024-01-31T12:00:00Z"',
}
# The database's rules for these types (atlantis.declarations.formats; store/live/types.sql).
_STRING_PROBLEMS = {"uuid": uuid_problem, "date": date_problem,
                    "timestamptz": timestamptz_problem}


class Literals:
    """Reads the values of one file; each refusal is ``file:line:column: what is wrong``."""

    def __init__(self, source: Source) -> None:
        self.filename = source.filename
        self.fail = source.fail
        self.written = source.written

    def whole_number(self, token: lark.Token, what: str, low: int, high: int) -> int:
        if not _WHOLE.fullmatch(token):
            self.fail(token, f"{what} must be a whole number, not {self.written(token)}")
        # Past 30 digits the number is out of every range asked for here, and int() would
        # refuse one of thousands of digits.
        digits = token.lstrip("-").lstrip("0")
        if len(digits) > 30:
            number = -(10**30) if token.startswith("-") else 10**30
        else:
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
        except DurationTooLongError:
            self.fail(token, f"{what} {self.written(token)} is too long (at most {MAX_TEXT})")
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
            line, column = position(token)
            what = f"invalid string {self.written(token)}: {exc.msg}"
            raise error(self.filename, line, column + exc.pos, what) from None
        assert isinstance(value, str)
        if "\x00" not in value and value.isascii():
            return value
        for index, char in enumerate(value):
            if char == "\x00":
                what = "a NUL character (\\u0000), which PostgreSQL cannot store"
            elif "\ud800" <= char <= "\udfff":
                what = f"a lone surrogate (\\u{ord(char):04x}), which is not valid Unicode"
            else:
                continue
            line, column = position(token)
            where = column + _source_offset(str(token), index)
            raise error(self.filename, line, where, f"string {self.written(token)} holds {what}")
        return value

    def literal(self, tree: Tree) -> Any:
        """The JSON value a literal denotes."""
        kind = tree.data
        if kind == "string":
            return self.string(tokens(tree)[0])
        if kind == "number":
            token = tokens(tree)[0]
            if len(token) > MAX_NUMBER_CHARS:
                self.fail(
                    token,
                    f"number {self.written(token)} is {len(token)} characters long, more than "
                    f"the limit of {MAX_NUMBER_CHARS}",
                )
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
            return [self.literal(element) for element in subtrees(tree)]
        result: dict[str, Any] = {}
        for pair in subtrees(tree):
            key_token = tokens(pair)[0]
            key = self.string(key_token)
            if key in result:
                self.fail(key_token, f"duplicate key {self.written(key_token)}")
            result[key] = self.literal(subtrees(pair)[0])
        return result

    def default(
        self, tree: Tree, base: str, length: int | None, array: bool, not_null: bool
    ) -> Any:
        # Far past any limit, a literal is refused before reading it would exhaust the
        # stack; closer ones get the message of the check below that refuses them.
        depth = _depth(tree)
        if depth > _READABLE_DEPTH:
            self.fail(tree, _too_deep("default", depth))
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
        for element_tree, element in zip(subtrees(tree), value, strict=True):
            if element is None and base != "jsonb":
                self.fail(element_tree, "array elements must not be null")
            self.check(element_tree, element, base, length, "array element")
        return value

    def check(self, tree: Tree, value: Any, base: str, length: int | None, what: str) -> None:
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
            problem = _STRING_PROBLEMS[base](value) if base in _STRING_PROBLEMS else None
            if problem == NO_OFFSET_REASON:
                self.fail(tree, f"{what} {shown} {NO_OFFSET_REASON}")
            if problem is not None:
                mismatch(_STRING_FORMATS[base])
        elif base in INT_RANGES:
            if isinstance(value, bool) or not isinstance(value, int):
                mismatch("an integer")
            low, high = INT_RANGES[base]
            if not low <= value <= high:
                self.fail(tree, f"{what} {shown} is out of range for {type_name}")
        elif base == "boolean":
            if not isinstance(value, bool):
                mismatch("true or false")
        elif base in ("double", "numeric"):
            if isinstance(value, bool) or not isinstance(value, int | float):
                mismatch("a number")
            self.check_number(tree, value, base, what)
        elif base == "jsonb":
            depth = _depth(tree)
            if depth > MAX_DEPTH:
                self.fail(tree, _too_deep(what, depth))

    def check_number(self, tree: Tree, value: int | float, base: str, what: str) -> None:
        """A double default must be a double; a numeric one must keep all its digits."""
        shown = self.written(tree)
        if base == "double" and isinstance(value, int) and abs(Decimal(value)) > _MAX_DOUBLE:
            self.fail(tree, f"{what} {shown} is out of range for double")
        if base == "numeric" and isinstance(value, float):
            # A default is stored as a JSON value: a fraction or exponent becomes a float,
            # which must still be the number written.
            written = Decimal(str(tokens(tree)[0]))
            if Decimal(repr(value)) != written:
                self.fail(
                    tree,
                    f"{what} {shown} cannot be stored exactly (a numeric default with a "
                    "fraction or an exponent keeps at most 15 significant digits)",
                )


def _source_offset(quoted: str, index: int) -> int:
    """Where, in a string literal as written, the character `index` of its value starts."""
    i = 1  # past the opening quote
    for _ in range(index):
        if quoted[i] != "\\":
            i += 1
        elif quoted[i + 1] != "u":
            i += 2
        elif _SURROGATE_PAIR.match(quoted, i):
            i += 12  # one character written as two escapes
        else:
            i += 6
    return i


def _depth(tree: Tree) -> int:
    """How deeply a literal nests: 0 for a scalar, 1 + its deepest member for [...] or {...}.

    Iterative: a literal nested thousands deep must be refused, not overflow the stack.
    """
    deepest = 0
    stack = [(tree, 0)]
    while stack:
        node, level = stack.pop()
        if node.data == "array_literal":
            deepest = max(deepest, level + 1)
            stack.extend((element, level + 1) for element in subtrees(node))
        elif node.data == "object_literal":
            deepest = max(deepest, level + 1)
            stack.extend((subtrees(pair)[0], level + 1) for pair in subtrees(node))
    return deepest


def _too_deep(what: str, depth: int) -> str:
    return f"{what} {too_deep(depth)}"
