"""Length-prefixed orjson frames: the one place that frames messages."""

from __future__ import annotations

import os
import struct
from typing import Any

import orjson

HEADER = struct.Struct(">I")
#: Larger frames mean a corrupt stream; a checkpoint or result is far smaller.
MAX_FRAME = 64 * 1024 * 1024

Message = dict[str, Any]


class ProtocolError(Exception):
    """The stream is not a sequence of frames; the peer is discarded."""


def encode(msg: Message) -> bytes:
    body = orjson.dumps(msg)
    return HEADER.pack(len(body)) + body


def write_frame(fd: int, msg: Message) -> None:
    """Write one whole frame to a blocking descriptor."""
    data = memoryview(encode(msg))
    while data:
        n = os.write(fd, data)
        data = data[n:]


def _read_exact(fd: int, n: int) -> bytes | None:
    chunks = []
    while n:
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def read_frame(fd: int) -> Message | None:
    """Read one frame from a blocking descriptor; None at end of stream (or mid-frame EOF)."""
    header = _read_exact(fd, HEADER.size)
    if header is None:
        return None
    (size,) = HEADER.unpack(header)
    if size > MAX_FRAME:
        raise ProtocolError(f"frame of {size} bytes exceeds {MAX_FRAME}")
    body = _read_exact(fd, size)
    if body is None:
        return None
    return _decode(body)


def _decode(body: bytes) -> Message:
    try:
        msg = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ProtocolError(f"undecodable frame: {exc}") from exc
    if not isinstance(msg, dict) or "t" not in msg:
        raise ProtocolError("frame is not a message")
    return msg


class FrameReader:
    """Incremental decoder for a non-blocking stream: feed bytes, get whole messages.

    Bytes left over when the stream ends are a partial frame from a dying peer and are
    dropped (``partial`` says so).
    """

    def __init__(self) -> None:
        self._buf = bytearray()

    @property
    def partial(self) -> bool:
        return bool(self._buf)

    def feed(self, data: bytes) -> list[Message]:
        self._buf += data
        out: list[Message] = []
        while len(self._buf) >= HEADER.size:
            (size,) = HEADER.unpack_from(self._buf)
            if size > MAX_FRAME:
                raise ProtocolError(f"frame of {size} bytes exceeds {MAX_FRAME}")
            end = HEADER.size + size
            if len(self._buf) < end:
                break
            body = bytes(self._buf[HEADER.size:end])
            del self._buf[:end]
            out.append(_decode(body))
        return out
