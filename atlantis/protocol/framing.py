"""The frame: a 4-byte big-endian length, then the message body (see ``messages.py``).

Messages travel on file descriptors of their own (never stdout/stderr), so nothing a
handler prints can corrupt them.
"""

from __future__ import annotations

import struct

HEADER = struct.Struct(">I")
MAX_FRAME = 64 * 1024 * 1024
"""The largest frame on a control pipe (a Run carries args of up to the enqueue limit);
frames from children are held to ``messages.MAX_EVENT_FRAME``."""


class ProtocolError(Exception):
    """The stream is not a sequence of valid frames; the peer is discarded."""
