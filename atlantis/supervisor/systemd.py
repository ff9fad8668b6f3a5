"""sd_notify: readiness, status, watchdog and stopping, when run under systemd."""

from __future__ import annotations

import os
import socket

_VARIABLES = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")
_taken: dict[str, str] | None = None


def _environment() -> dict[str, str]:
    """systemd's variables, removed from ``os.environ`` on first use and kept here.

    They address the supervisor alone: a child (or a handler's subprocess) that inherited
    them could report READY or STOPPING for the whole service, or send watchdog pings of
    its own. Every Notifier of this process (start-up, main loop) still sees them.
    """
    global _taken
    if _taken is None:
        _taken = {k: v for k in _VARIABLES if (v := os.environ.pop(k, None)) is not None}
    return _taken


class Notifier:
    def __init__(self) -> None:
        env = _environment()
        addr = env.get("NOTIFY_SOCKET")
        self._addr: str | None = None
        self._sock: socket.socket | None = None
        if addr:
            self._addr = "\0" + addr[1:] if addr.startswith("@") else addr
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        usec = env.get("WATCHDOG_USEC")
        pid = env.get("WATCHDOG_PID")
        self.watchdog_interval: float | None = None
        if usec and usec.isdigit() and (not pid or pid == str(os.getpid())):
            self.watchdog_interval = int(usec) / 1_000_000 / 2

    def notify(self, *lines: str) -> None:
        if self._sock is None or self._addr is None:
            return
        try:
            self._sock.sendto("\n".join(lines).encode(), self._addr)
        except OSError:
            pass

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
