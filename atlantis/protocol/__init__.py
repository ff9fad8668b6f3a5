"""What crosses a process boundary between the supervisor, its children and the zygote.

``messages.py`` holds every message as a typed dataclass and the one codec that encodes and
validates them; ``framing.py`` the frame header; ``leasecell.py`` the page the supervisor
shares with each child (its lease's end one way, its last words the other). See
``messages.py`` for the list.

The names below are imported on first use (PEP 562): the lease keeper, which reads only
the lease cell, never loads the messages' codec (some 20 ms of its start).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from atlantis.protocol.framing import HEADER, MAX_FRAME, ProtocolError

if TYPE_CHECKING:
    from atlantis.protocol.messages import EventReader, decode, dumps, encode

__all__ = ["HEADER", "MAX_FRAME", "EventReader", "ProtocolError", "decode", "dumps", "encode"]


def __getattr__(name: str) -> Any:
    if name in ("EventReader", "decode", "dumps", "encode"):
        from atlantis.protocol import messages

        return getattr(messages, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
