"""A handler's return value as its job's ``result``: what may be stored, one rule for both sides.

The child encodes the value with orjson (:func:`encode`); the supervisor checks the text it
receives once more (:func:`check`), since a handler may forge the frame. A result is stored
if it is JSON, at most :data:`~atlantis.limits.MAX_RESULT_BYTES` bytes of it, nested at
most :data:`~atlantis.limits.MAX_DEPTH` levels deep (as args are: every reader can parse
it, Python's json module included), and holds no NUL character (``\\u0000``, which
PostgreSQL's jsonb refuses): so that no result can make the finish statement, or a reader
of the row, fail. What becomes of one that is not (the step ends ``dead`` with kind
``result`` inside a workflow; null and a warning outside) is the caller's to decide.

orjson writes NaN and the infinities, which JSON cannot carry, as null without a word:
:func:`non_finite` says where a value held them, so that they are never changed silently
(inside a workflow the step ends ``dead`` with kind ``result``; outside one the result is
stored with null in their place, and the supervisor logs a warning naming the job:
:func:`atlantis.supervisor.policy.completed` decides).
"""

from __future__ import annotations

import dataclasses
import math
import re

import orjson

from atlantis.limits import MAX_DEPTH, MAX_RESULT_BYTES, json_depth, too_deep

# A ``\u0000`` escape in JSON text: preceded by an even number of backslashes (an odd one
# would make it the text ``\u0000``, an escaped backslash then ``u0000``, which jsonb takes).
_NUL = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")


def encode(value: object) -> tuple[str | None, str | None]:
    """``(json_text, None)``, or ``(None, why)`` if ``value`` cannot be stored as a result.

    None gives ``(None, None)``: a handler that returns nothing stores no result.
    """
    if value is None:
        return None, None
    try:
        data = orjson.dumps(value)
    except Exception as exc:  # orjson: TypeError (JSONEncodeError) naming what it refused
        return None, f"it is not JSON-serializable ({_text(exc)})"
    why = _problem(data)
    return (None, why) if why is not None else (data.decode(), None)


#: How many places :func:`non_finite` names at most.
NAMED_AT_MOST = 5


def non_finite(value: object, text: str | None) -> str | None:
    """Where ``value`` (which :func:`encode` wrote as ``text``) holds NaN or an infinity,
    each written as null (``"NaN at ['ratio'], inf at ['max']"``), or None when it holds
    none. Only a value whose text has a null is looked at."""
    if text is None or "null" not in text:
        return None
    found: list[str] = []
    more = 0
    stack: list[tuple[object, str]] = [(value, "")]
    while stack:
        item, where = stack.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                if len(found) < NAMED_AT_MOST:
                    found.append(f"{item!r} at {where or 'the top'}")
                else:
                    more += 1
            continue
        if isinstance(item, dict):
            members = [(v, f"{where}[{k!r}]") for k, v in item.items()]
        elif isinstance(item, list | tuple):
            members = [(v, f"{where}[{i}]") for i, v in enumerate(item)]
        elif dataclasses.is_dataclass(item) and not isinstance(item, type):
            members = [(getattr(item, f.name), f"{where}.{f.name}")
                       for f in dataclasses.fields(item)]
        else:
            continue
        stack.extend(reversed(members))
    if not found:
        return None
    return ", ".join(found) + (f" and {more} more" if more else "")


def check(text: str) -> tuple[str | None, str | None]:
    """``(json_text, None)`` to store for the result text ``text`` a child sent, or
    ``(None, why)`` if it cannot be stored.

    The text stored is the value as orjson writes it again: every number then reads in
    PostgreSQL's jsonb (``1e-20000`` is JSON, and orjson reads it as 0.0, but jsonb refuses
    it: "value overflows numeric format").
    """
    data = text.encode("utf-8", "surrogatepass")  # a lone surrogate: refused as not JSON
    if len(data) > MAX_RESULT_BYTES:
        return None, _too_large(len(data))
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        return None, f"it is not valid JSON ({_text(exc)})"
    depth = json_depth(value)  # first: orjson writes at most 254 levels
    if depth > MAX_DEPTH:
        return None, _too_deep(depth)
    try:
        data = orjson.dumps(value)
    except orjson.JSONEncodeError as exc:  # pragma: no cover - what orjson read, it writes
        return None, f"it could not be written again as JSON ({_text(exc)})"
    why = _problem(data, value)
    return (None, why) if why is not None else (data.decode(), None)


def _problem(data: bytes, value: object = None) -> str | None:
    if len(data) > MAX_RESULT_BYTES:
        return _too_large(len(data))
    if _NUL.search(data):
        return "it holds a NUL character (\\u0000), which PostgreSQL cannot store"
    # Only JSON with more brackets than the limit can nest deeper: then look (parsed, as
    # orjson reads it at most 1024 deep).
    if data.count(b"[") + data.count(b"{") > MAX_DEPTH:
        depth = json_depth(orjson.loads(data) if value is None else value)
        if depth > MAX_DEPTH:
            return _too_deep(depth)
    return None


def _too_deep(depth: int) -> str:
    return f"it is {too_deep(depth)}"


def _too_large(size: int) -> str:
    return (f"its JSON is {size} bytes, more than the limit of {MAX_RESULT_BYTES} bytes "
            "(64 KiB)")


def _text(exc: Exception) -> str:
    try:
        return str(exc)[:200]
    except Exception:
        return type(exc).__name__
