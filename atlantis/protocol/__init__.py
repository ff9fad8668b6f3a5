"""What crosses a process boundary between the supervisor, its children and the zygote.

``messages.py`` holds every message as a typed dataclass and the one codec that encodes and
validates them; ``framing.py`` the frame header; ``leasecell.py`` the page the supervisor
shares with each child (its lease's end one way, its last words the other). See
``messages.py`` for the list.
"""

from atlantis.protocol.framing import HEADER, MAX_FRAME, ProtocolError
from atlantis.protocol.messages import EventReader, decode, dumps, encode

__all__ = ["HEADER", "MAX_FRAME", "EventReader", "ProtocolError", "decode", "dumps", "encode"]
