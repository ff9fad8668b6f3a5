"""Job arguments as handlers receive them: the row's JSON text decoded against its declaration.

The supervisor never decodes arguments; the child does, here, once per attempt, so that a
row whose args cannot be decoded fails its own attempt and nothing else. What a handler
gets for each declared type:

=============  ==============================================================
``numeric``    :class:`decimal.Decimal`, exactly as stored (30 digits stay 30)
``double``     ``float`` (a JSON integer becomes a float)
``int``        ``int`` (also ``bigint``)
``jsonb``      the ordinary JSON value: dict, list, str, int, float, bool, None
others         what JSON gives: str or bool
``T[]``        a list of the above
=============  ==============================================================

A missing field or a JSON null is ``None``; keys the declaration does not know are passed
through as JSON gives them.

The common case costs one ``orjson.loads``. orjson reads a number with a fraction, and an
integer beyond 64 bits, as a float; where that could lose something (a ``numeric`` or
``int`` field holding such a number, or a long integer that may sit in a ``jsonb`` value)
the text is read again by the standard library, exactly.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import orjson

from atlantis.declarations.model import Field, JobDecl

__all__ = ["ArgsError", "decode_args"]

#: Number types whose values are converted; other declared types are left as decoded.
_NUMBER_TYPES = frozenset({"numeric", "double", "int", "bigint"})

# An integer orjson may read as a float: beyond 64 bits takes at least 19 digits (a negative
# one below -2**63). Runs of digits inside fractions and strings match too; they only cost
# the exact reading.
_LONG_DIGITS = re.compile(r"[0-9]{19}")

# Python refuses int(str) beyond this many digits; Decimal has no such limit.
_INT_DIGITS = 4300

_MAX_MESSAGE = 300


class ArgsError(ValueError):
    """The arguments could not be decoded into what the declaration promises."""


class _InexactError(Exception):
    """orjson's reading of a value cannot be trusted: read the text again, exactly.

    A signal inside this module, never raised out of it.
    """


class _MismatchError(Exception):
    """A value does not fit its declared type; turned into ArgsError naming the field."""


def decode_args(decl: JobDecl, text: str) -> dict[str, Any]:
    """The args of one row, decoded; raises ArgsError (only) naming the job and the field."""
    try:
        return _decode(decl, text)
    except ArgsError:
        raise
    except Exception as exc:  # a row's args must not fail anything but their own attempt
        raise ArgsError(f"job {decl.qualified_name}: args cannot be decoded: {_say(exc)}") from exc


def _decode(decl: JobDecl, text: str) -> dict[str, Any]:
    numbers = [f for f in decl.fields if f.type in _NUMBER_TYPES]
    maybe_long = any(f.type == "jsonb" for f in decl.fields) and _LONG_DIGITS.search(text)
    if not maybe_long:
        try:
            parsed = orjson.loads(text)
        except orjson.JSONDecodeError:
            pass  # perhaps a number orjson cannot hold; the exact reading decides
        else:
            value = _object(decl, parsed)
            try:
                for f in numbers:
                    _convert_field(decl, f, value, _fast)
            except _InexactError:
                pass
            else:
                return value
    reader = _ExactReader()
    try:
        parsed = json.loads(
            text, parse_float=reader.number, parse_int=reader.integer, parse_constant=_constant
        )
    except ValueError as exc:  # json.JSONDecodeError included
        raise ArgsError(f"job {decl.qualified_name}: args are not valid JSON: {_say(exc)}") from exc
    value = _object(decl, parsed)
    declared = {f.name: f for f in numbers}
    for name in value:
        field = declared.get(name)
        if field is not None:
            _convert_field(decl, field, value, _exact)
        elif reader.fractions:
            value[name] = _plain(value[name])
    return value


def _object(decl: JobDecl, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ArgsError(
            f"job {decl.qualified_name}: args are not a JSON object, got {_json_type(value)}"
        )
    return value


def _convert_field(
    decl: JobDecl, f: Field, args: dict[str, Any], convert: Callable[[Field, Any], Any]
) -> None:
    """Replace ``args[f.name]`` by the value its type promises, or raise naming the field."""
    value = args.get(f.name)
    if value is None:
        return
    where = f.name
    try:
        if not f.array:
            args[f.name] = convert(f, value)
            return
        if not isinstance(value, list):
            raise _MismatchError(f"expected an array, got {_json_type(value)}")
        converted = []
        for i, element in enumerate(value):
            where = f"{f.name}[{i}]"
            converted.append(None if element is None else convert(f, element))
        args[f.name] = converted
    except _InexactError:
        raise
    except Exception as exc:
        raise ArgsError(f"job {decl.qualified_name}: field {where}: {_say(exc)}") from exc


def _fast(f: Field, value: Any) -> Any:
    """One number as orjson read it."""
    kind = type(value)
    if kind is int:
        if f.type == "numeric":
            return Decimal(value)
        return float(value) if f.type == "double" else value
    if kind is float:
        if f.type == "double":
            return value
        raise _InexactError  # numeric wants the digits, int an exact integer: read the text
    raise _MismatchError(f"expected {f.type}, got {_json_type(value)}")


def _exact(f: Field, value: Any) -> Any:
    """One number as the exact reading gave it: an int, or a Decimal for a fraction."""
    kind = type(value)
    if kind is not int and kind is not Decimal:
        raise _MismatchError(f"expected {f.type}, got {_json_type(value)}")
    if f.type == "numeric":
        return value if kind is Decimal else Decimal(value)
    if f.type == "double":
        try:
            number = float(value)
        except OverflowError:
            number = float("inf")
        if number in (float("inf"), float("-inf")):
            raise _MismatchError(f"{_short(value)} is out of range for double")
        return number
    if kind is Decimal:
        if value != value.to_integral_value():
            raise _MismatchError(f"expected {f.type}, got {_short(value)}")
        return int(value)
    return value


class _ExactReader:
    """Number parsers for ``json.loads``: fractions as Decimal, integers of any length."""

    def __init__(self) -> None:
        self.fractions = False

    def number(self, text: str) -> Decimal:
        self.fractions = True
        return Decimal(text)

    def integer(self, text: str) -> int:
        if len(text) <= _INT_DIGITS:
            return int(text)
        return int(Decimal(text))  # not limited like int(str)


def _constant(name: str) -> Any:
    # NaN and Infinity are no JSON, and PostgreSQL never writes them.
    raise ValueError(f"{name} is not valid JSON")


def _plain(value: Any) -> Any:
    """A JSON value from the exact reading, with its fractions as floats again."""
    kind = type(value)
    if kind is Decimal:
        return float(value)
    if kind is list:
        return [_plain(v) for v in value]
    if kind is dict:
        return {k: _plain(v) for k, v in value.items()}
    return value


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float | Decimal):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _short(value: Any) -> str:
    text = str(Decimal(value)) if isinstance(value, int) else str(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _say(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    if isinstance(exc, RecursionError):
        text = "nested too deep"
    return text if len(text) <= _MAX_MESSAGE else text[: _MAX_MESSAGE - 3] + "..."
