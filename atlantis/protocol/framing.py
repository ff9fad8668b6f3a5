"""The frame: a 4-byte big-endian length, then the message body (see ``messages.py``);
and :func:`clean`, what any text that crosses a boundary goes through.

Messages travel on file descriptors of their own (never stdout/stderr), so nothing a
handler prints can corrupt them. This module imports nothing of atlantis: the lease cell
(and with it the lease keeper) needs it without the messages' codec.
"""

from __future__ import annotations

import struct

HEADER = struct.Struct(">I")
MAX_FRAME = 64 * 1024 * 1024
"""The largest frame on a control pipe (a Run carries args of up to the enqueue limit);
frames from children are held to ``messages.MAX_EVENT_FRAME``."""


class ProtocolError(Exception):
    """The stream is not a sequence of valid frames; the peer is discarded."""


def clean(text: str) -> str:
    """``text`` fit for any reader: lone surrogates escaped, NUL removed.

    JSON encoders refuse surrogates, and PostgreSQL's text and jsonb refuse NUL.
    """
    if "\x00" in text:
        text = text.replace("\x00", "")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text
