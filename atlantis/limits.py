"""Limits on what a job's row holds: each defined here once.

The database enforces the same numbers (its functions and checks); ``tests/test_limits.py``
checks that the SQL and these agree.
"""

from __future__ import annotations

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
