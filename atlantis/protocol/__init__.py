"""The framed messages between the supervisor and its children.

Each message is one orjson document behind a 4-byte big-endian length, on file descriptors
of their own (never stdout/stderr), so nothing a handler prints can corrupt it.

supervisor -> child (control pipe)
  {"t": "run", "job_id", "job", "queue", "attempt", "max_attempts", "args", "deadline",
   "lease_end", "lease_margin", "database_url"}
  {"t": "lease", "job_id", "lease_end"}     lease renewed; lease_end is CLOCK_MONOTONIC
  {"t": "cancel", "job_id"}                 ctx.cancelled becomes true
child -> supervisor (events pipe)
  {"t": "ready", "pid", "tree"}             the app imported; waiting for work. ``tree`` is
                                            the ATLANTIS_TREE mark its descendants inherit,
                                            so escaped ones can be found and killed
  {"t": "fatal", "error"}                   the app could not be loaded; the child exits
  {"t": "checkpoint", "job_id", "pct", "msg"}
  {"t": "done", "job_id", "outcome", "error", "delay", "leftovers"}
"""

from atlantis.protocol.framing import (
    MAX_FRAME,
    FrameReader,
    ProtocolError,
    encode,
    read_frame,
    write_frame,
)

__all__ = ["MAX_FRAME", "FrameReader", "ProtocolError", "encode", "read_frame", "write_frame"]
