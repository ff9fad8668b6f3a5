"""Every message that crosses a process boundary, typed, and the one codec for them.

A message is a frozen dataclass; on the wire it is one orjson object whose ``t`` names
its type. :func:`decode` checks a frame completely on arrival (known type, every field
present with its type, numbers finite, strings bounded) and raises
:class:`~atlantis.protocol.framing.ProtocolError` otherwise: the supervisor then kills the
sender and fails its attempt with kind ``protocol``: nothing downstream sees a bad message.

supervisor -> child (control pipe)
  Run        an attempt to run; ``args`` is the row's JSON text, untouched (the child
             decodes it against the declaration; the supervisor never does); ``lease_end``
             is CLOCK_MONOTONIC. Renewals go through the lease cell, not the pipe
             (:mod:`atlantis.protocol.leasecell`); ``workflow`` a step's context (JSON
             text, untouched); ``trace`` the attempt span's W3C traceparent (None: untraced)
  Cancel     ctx.cancelled becomes true (an operator cancelled the job)
  Stopping   ctx.stopping becomes true (the supervisor drains; not a cancel)
child -> supervisor (events pipe)
  Ready      the app is imported; ``tree`` is the ATLANTIS_TREE mark its descendants carry,
             ``jobs`` the jobs it has a handler for (the supervisor hands it only those)
  Fatal      the app could not be loaded; the child exits
  Checkpoint progress; ``pct`` None stands for NaN
  Done       the attempt's result: only ``complete``, ``failed``, ``discard``, ``snooze``,
             ``suspend`` (a durable sleep: ``wake`` and ``waits``; ``steps`` records written);
             ``retire`` says why the child will run no other attempt; ``result`` the
             handler's return value as JSON text; ``spans`` the handler's spans (JSON text);
             ``nulled`` where that value held NaN or an infinity (written as null);
             ``preload`` what a zygote's worker imported that its zygote did not hold
child -> supervisor (lease cell, read once the child is gone)
  last words why the child (or the lease keeper) stopped its attempt: shared memory
supervisor <-> zygote (SOCK_SEQPACKET, one message a packet)
  Fork / Preload / Forked / Exited (each says what it means); ZygoteReady (the app is imported, it
  forks on request), ZygoteFatal (the app failed to import; it exits), Unsafe (it has threads
  after import: forking it is unsafe, fresh interpreters instead)
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Union, get_args, get_origin

import orjson

from atlantis.protocol.framing import HEADER, ProtocolError

MAX_EVENT_FRAME = 1024 * 1024
"""Child-to-supervisor frames larger than this are a protocol violation."""
MAX_TEXT = 256 * 1024
"""No string field of a child's message may be longer (error texts are clipped to 64 KiB)."""
MAX_LEFTOVERS = 100

Outcome = Literal["complete", "failed", "discard", "snooze", "suspend"]
ErrorKind = Literal["exception", "exit", "terminated", "discarded", "args", "result", "steps", "lease", "swallowed"]
"""The error kinds a child may report; the supervisor adds its own (timeout, crash, ...)."""
Preloadable = Literal["asyncio", "psutil", "psycopg"]
"""What a zygote loads once a worker needed it (:mod:`atlantis.child.preload`)."""


@dataclass(frozen=True, slots=True)
class ChildError:
    kind: ErrorKind
    message: str
    traceback: str | None = None


# ---- supervisor -> child ---------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Run:
    job_id: int
    job: str
    queue: str
    attempt: int
    max_attempts: int
    args: str
    deadline: str
    lease_end: float
    lease_margin: float
    database_url: str | None = field(default=None, repr=False)
    workflow: str | None = None
    """A workflow step's context (``atlantis.step_context``'s JSON text); None outside."""
    trace: str | None = None
    run_id: str | None = None  # the claim's run id: the handler's step writes are fenced on it
    t: Literal["run"] = "run"


@dataclass(frozen=True, slots=True)
class Cancel:
    """An operator cancelled the job: ``ctx.cancelled`` becomes true."""
    job_id: int
    t: Literal["cancel"] = "cancel"


@dataclass(frozen=True, slots=True)
class Stopping:
    """The supervisor drains: ``ctx.stopping`` becomes true (not a cancel)."""
    job_id: int
    t: Literal["stopping"] = "stopping"


# ---- child -> supervisor ---------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Ready:
    pid: int
    tree: str
    jobs: str | None = None
    """The jobs the child has a handler for, one name a line (None: not said)."""
    t: Literal["ready"] = "ready"


@dataclass(frozen=True, slots=True)
class Fatal:
    error: str
    t: Literal["fatal"] = "fatal"


@dataclass(frozen=True, slots=True)
class Checkpoint:
    job_id: int
    pct: float | None
    msg: str
    t: Literal["checkpoint"] = "checkpoint"


@dataclass(frozen=True, slots=True)
class Done:
    job_id: int
    outcome: Outcome
    error: ChildError | None = None
    delay: float = 0.0
    leftovers: list[str] = field(default_factory=list)
    retire: str | None = None
    """Why this child runs no other attempt (a state it cannot put back: child/state.py)."""
    result: str | None = None
    """A ``complete`` handler's return value as JSON text (:mod:`results`); None: none."""
    spans: str | None = None
    nulled: str | None = None
    """Where the value held NaN or infinities (``result`` has null): results.non_finite."""
    wake: str | None = None  # ``suspend``: when the job runs again (ISO 8601, the database's)
    waits: str | None = None  # ``suspend``: what it waits for (``sleep:<step>``)
    steps: int = 0  # the handler step records this run wrote
    preload: list[Preloadable] | None = None
    """A zygote's worker: what it imported during the attempt, for the zygote to load."""
    t: Literal["done"] = "done"


# ---- supervisor <-> zygote -------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Fork:
    """Supervisor to zygote: fork a worker onto the descriptors sent with this packet."""
    token: int
    t: Literal["fork"] = "fork"


@dataclass(frozen=True, slots=True)
class Preload:
    """Supervisor to zygote: load these for every later worker (no descriptors)."""
    modules: list[Preloadable]
    t: Literal["preload"] = "preload"


@dataclass(frozen=True, slots=True)
class Forked:
    """The zygote forked the worker asked for by ``token``."""
    token: int
    pid: int
    t: Literal["forked"] = "forked"


@dataclass(frozen=True, slots=True)
class Exited:
    """A worker the zygote forked exited (the zygote reaps them)."""
    pid: int
    code: int
    t: Literal["exit"] = "exit"


@dataclass(frozen=True, slots=True)
class ZygoteReady:
    pid: int
    t: Literal["zready"] = "zready"


@dataclass(frozen=True, slots=True)
class ZygoteFatal:
    error: str
    t: Literal["zfatal"] = "zfatal"


@dataclass(frozen=True, slots=True)
class Unsafe:
    reason: str
    t: Literal["unsafe"] = "unsafe"


ToChild = Run | Cancel | Stopping
FromChild = Ready | Fatal | Checkpoint | Done
ToZygote = Fork | Preload
FromZygote = Forked | Exited | ZygoteReady | ZygoteFatal | Unsafe
Message = ToChild | FromChild | ToZygote | FromZygote

_UNBOUNDED = frozenset({"run.args", "run.workflow"})
"""Strings not held to MAX_TEXT: a job's args (validated at enqueue, up to their own limit)
and a step's context (its predecessors' results, each at most ``MAX_RESULT_BYTES``)."""

_TYPES: dict[str, type[Any]] = {
    str(cls.__dataclass_fields__["t"].default): cls
    for cls in (Run, Cancel, Stopping, Ready, Fatal, Checkpoint, Done, Fork, Preload, Forked, Exited,
                ZygoteReady, ZygoteFatal, Unsafe)
}
_HINTS: dict[type[Any], dict[str, Any]] = {
    cls: typing.get_type_hints(cls) for cls in (*_TYPES.values(), ChildError)
}
_REQUIRED: dict[type[Any], frozenset[str]] = {cls: frozenset(
    f.name for f in dataclasses.fields(cls)
    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
    for cls in _HINTS}


def dumps(msg: Message) -> bytes:
    """The message's JSON body (orjson serializes the dataclasses natively).

    Strings the caller did not :func:`clean` may make it raise ``orjson.JSONEncodeError``.
    """
    return orjson.dumps(msg)


def encode(msg: Message) -> bytes:
    """One frame: length header and body."""
    body = dumps(msg)
    return HEADER.pack(len(body)) + body


def clip(text: str, head: int, tail: int = 0) -> str:
    """``text`` cut to about ``head + tail`` characters, saying how much was dropped."""
    if len(text) <= head + tail:
        return text
    note = f" ... [truncated: {len(text)} characters in all] ... "
    return text[:head] + note + (text[-tail:] if tail else "")


def decode(body: bytes, *, expect: tuple[type[Any], ...] | None = None) -> Message:
    """Parse and validate one frame body; ProtocolError says what is wrong with it."""
    try:
        raw = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ProtocolError(f"undecodable frame: {exc}") from exc
    return from_dict(raw, expect=expect)


def from_dict(raw: object, *, expect: tuple[type[Any], ...] | None = None) -> Message:
    if not isinstance(raw, dict):
        raise ProtocolError("frame is not an object")
    kind = raw.get("t")
    cls = _TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ProtocolError(f"unknown message type {str(kind)[:40]!r}")
    if expect is not None and cls not in expect:
        raise ProtocolError(f"unexpected message {kind!r}")
    msg: Message = _BUILDERS[cls](raw)
    return msg


# Validation is compiled once per message type and field from the dataclasses' type hints
# (a closure per field): looking the hints up for every frame cost more than the rest of
# a frame's handling.
_Checker = Callable[[Any], Any]


def _builder(cls: type[Any], where: str) -> _Checker:
    checks = {name: _compile(tp, f"{where}.{name}") for name, tp in _HINTS[cls].items()}
    required = _REQUIRED[cls]

    def build(raw: dict[str, Any]) -> Any:
        values: dict[str, Any] = {}
        for name, value in raw.items():
            check = checks.get(name)
            if check is None:
                raise ProtocolError(f"{where}: unknown field {name[:40]!r}")
            values[name] = check(value)
        missing = required - values.keys()
        if missing:
            raise ProtocolError(f"{where}: missing {', '.join(sorted(missing))}")
        return cls(**values)

    return build


def _compile(tp: Any, where: str) -> _Checker:
    """A function that returns ``value`` if it is of type ``tp``, else raises ProtocolError."""
    origin = get_origin(tp)
    if origin is Literal:
        allowed = get_args(tp)

        def literal(value: Any) -> Any:
            if value not in allowed:
                raise ProtocolError(f"{where}: {str(value)[:40]!r} is not one of {allowed}")
            return value
        return literal
    if origin in (Union, types.UnionType):
        nullable = type(None) in get_args(tp)
        options = [_compile(o, where) for o in get_args(tp) if o is not type(None)]

        def union(value: Any) -> Any:
            if value is None:
                if nullable:
                    return None
                raise ProtocolError(f"{where}: must not be null")
            errors = []
            for option in options:
                try:
                    return option(value)
                except ProtocolError as exc:
                    errors.append(str(exc))
            raise ProtocolError(errors[0] if errors else f"{where}: bad value")
        return union
    if origin is list:
        (item_type,) = get_args(tp)
        item = _compile(item_type, where)

        def items(value: Any) -> Any:
            if not isinstance(value, list) or len(value) > MAX_LEFTOVERS:
                raise ProtocolError(f"{where}: expected a list of at most {MAX_LEFTOVERS} items")
            return [item(v) for v in value]
        return items
    if tp is ChildError:
        build = _builder(ChildError, where)

        def child_error(value: Any) -> Any:
            if not isinstance(value, dict):
                raise ProtocolError(f"{where}: expected an object")
            return build(value)
        return child_error
    if tp is bool:
        def boolean(value: Any) -> Any:
            if not isinstance(value, bool):
                raise ProtocolError(f"{where}: expected a boolean")
            return value
        return boolean
    if tp is int:
        def integer(value: Any) -> Any:
            if not isinstance(value, int) or isinstance(value, bool):
                raise ProtocolError(f"{where}: expected an integer")
            return value
        return integer
    if tp is float:
        def number(value: Any) -> Any:
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise ProtocolError(f"{where}: expected a finite number")
            return float(value)
        return number
    if tp is str:
        limit = math.inf if where in _UNBOUNDED else MAX_TEXT

        def text(value: Any) -> Any:
            if not isinstance(value, str) or len(value) > limit:
                raise ProtocolError(f"{where}: expected a string of at most {MAX_TEXT} characters")
            return value
        return text
    raise TypeError(f"{where}: unsupported type {tp}")  # pragma: no cover - a bug here


_BUILDERS: dict[type[Any], _Checker] = {cls: _builder(cls, kind) for kind, cls in _TYPES.items()}


class EventReader:
    """Incremental decoder of a child's events pipe: feed bytes, get validated messages.

    Frames are capped at :data:`MAX_EVENT_FRAME`; anything else wrong raises
    ProtocolError, after which the stream is useless (the child is killed).
    """

    def __init__(self, max_frame: int = MAX_EVENT_FRAME,
                 expect: tuple[type[Any], ...] = (Ready, Fatal, Checkpoint, Done)) -> None:
        self._buf = bytearray()
        self._max = max_frame
        self._expect = expect

    def feed(self, data: bytes) -> list[Message]:
        self._buf += data
        out: list[Message] = []
        while len(self._buf) >= HEADER.size:
            (size,) = HEADER.unpack_from(self._buf)
            if size > self._max:
                raise ProtocolError(f"frame of {size} bytes exceeds the limit of {self._max}")
            end = HEADER.size + size
            if len(self._buf) < end:
                break
            body = bytes(self._buf[HEADER.size:end])
            del self._buf[:end]
            out.append(decode(body, expect=self._expect))
        return out
