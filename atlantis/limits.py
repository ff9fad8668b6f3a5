"""Limits on what a job's row holds: each defined here once.

The database enforces the same numbers (its functions and checks); ``tests/test_limits.py``
checks that the SQL and these agree.
"""

from __future__ import annotations

import math

#: Error messages and tracebacks are cut to this many characters (a 10 MB message would
#: otherwise be stored twice, in the row's ``errors`` and ``last_error``).
MAX_ERROR_TEXT = 64 * 1024

#: A checkpoint's message is kept to this many characters.
MAX_PROGRESS_MSG = 256

#: A checkpoint's message crosses from the child to the supervisor cut to this many
#: characters (a small frame; the row keeps :data:`MAX_PROGRESS_MSG` of them).
MAX_CHECKPOINT_CHARS = 1024

#: jsonb in args (and a declared default) nests at most this deep.
MAX_DEPTH = 64

#: A number in args (and a declared default) is written in at most this many characters.
MAX_NUMBER_CHARS = 4000

#: A handler's return value is stored as its job's ``result`` if its JSON takes at most this
#: many bytes (64 KiB).
MAX_RESULT_BYTES = 65536


def json_depth(value: object) -> int:
    """How deeply a JSON value nests (the one depth count of Python's checks, for
    :data:`MAX_DEPTH`; the database's is ``atlantis.jsonb_depth``): 0 for a scalar, 1 + the
    deepest member for a list (or tuple) or a dict. Iterative: a value nested thousands
    deep is measured, not a stack overflow."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, list | tuple):
            deepest = max(deepest, level)
            stack.extend((v, level + 1) for v in item)
    return deepest


def too_deep(depth: int) -> str:
    """Why a value nested ``depth`` levels deep is refused, in the words every check uses."""
    return f"nested {depth} levels deep, more than the limit of {MAX_DEPTH}"


def clamp_pct(pct: float | None) -> int:
    """A checkpoint's percentage as a row keeps it, the same as the database's
    ``atlantis.clamp_pct``: NaN (or None) counts as 0, the rest is pulled into 0..100 and
    rounded half to even (as PostgreSQL rounds a float8)."""
    if pct is None or math.isnan(pct):
        return 0
    return round(min(max(pct, 0.0), 100.0))

#: Handler steps (atlantis/steps.py): the most records one job may hold, their bytes in all
#: (each at most MAX_RESULT_BYTES, as a result), and the longest step name.
MAX_STEP_RECORDS = 100_000
MAX_STEP_BYTES = 64 * 1024 * 1024
MAX_STEP_NAME = 200
#: Jobs one ``ctx.spawn_many`` enqueues (atlantis.step_spawn_many says the same).
MAX_SPAWN_MANY = 10_000
#: Jobs one ``ctx.join`` may wait for (atlantis.step_join says the same).
MAX_JOIN_JOBS = 100_000
#: Bytes of JSON results one ``ctx.join`` returns; past them, ``results=False``.
MAX_JOIN_RESULT_BYTES = 16 * 1024 * 1024
