"""Readiness: ``GET /ready`` on a port of its own (``--ready-port``), for a Kubernetes
readiness probe or a load balancer, and ``GET /live`` for a liveness probe.

``/ready`` answers 200 while the supervisor serves: every service started, no drain begun,
the database reachable; 503 otherwise (starting, draining, the database unreachable), with
the reason as the body, so that a rollout waits for the new pod and a draining one is taken
out of its Service. What "ready" means is decided in one place, :func:`ready`: the hook to
extend when a new state should take a supervisor out of rotation.

``/live`` answers 200 whenever the supervisor's event loop does: what systemd's watchdog
checks (``WatchdogSec``), for a probe that restarts a wedged supervisor. Never point a
liveness probe at ``/ready``: a drain or a database outage is no reason to restart.

The service starts first and stops last, so the port answers 503 through the rest of the
start and through the whole drain, and closes just before the process exits. The server is
a small HTTP/1.1 responder on the supervisor's own loop: one request per connection, read
within :data:`READ_TIMEOUT`, nothing blocking.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket

from atlantis.supervisor.runtime import Runtime
from atlantis.supervisor.service import Service

#: A probe sends its request at once: a connection that has not within this is closed.
READ_TIMEOUT = 5.0
#: The longest request line or header line read (a probe's are a few dozen bytes).
MAX_LINE = 8192
#: The most header lines read before the request is refused.
MAX_HEADERS = 100

_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            503: "Service Unavailable"}


class ReadinessUnavailable(Exception):  # noqa: N818 - a configuration problem, not a bug
    """``--ready-port``/``--ready-host`` cannot be listened on: a usage error (exit 2)."""


def ready(rt: Runtime) -> tuple[bool, str]:
    """Whether a supervisor whose services have all started takes work now, and why not.

    The one rule behind ``/ready``: a drain begun (SIGTERM, SIGINT), an operator's drain
    or eviction in force (``tide worker drain|evict``, until resumed), or the database
    unreachable makes it not ready. Extend it here, not in the server."""
    if rt.draining:
        return False, "draining"
    if rt.held is not None:
        return False, f"held by an operator's {rt.held} (tide worker resume)"
    if rt.health.down_since is not None:
        return False, "database unreachable"
    return True, "ready"


class Readiness(Service):
    name = "readiness"

    def __init__(self, rt: Runtime) -> None:
        super().__init__(rt)
        self.serving = False
        """Set by the supervisor once every service has started; until then, "starting"."""
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()

    def state(self) -> tuple[bool, str]:
        """What ``/ready`` answers now."""
        if not self.serving:
            return False, "starting"
        return ready(self.rt)

    async def start(self) -> None:
        """Listen on ``--ready-host:--ready-port`` (nothing when the port is 0);
        :class:`ReadinessUnavailable` (one line) if it cannot."""
        s = self.rt.settings
        if not s.ready_port:
            return
        try:
            self._server = await asyncio.start_server(self._answer, s.ready_host, s.ready_port,
                                                      limit=MAX_LINE)
        except socket.gaierror as exc:
            raise ReadinessUnavailable(
                f"--ready-host {s.ready_host}: cannot resolve it: {exc.strerror or exc}"
            ) from None
        except (OSError, OverflowError) as exc:  # asyncio words an errno of its own
            errno = exc.errno if isinstance(exc, OSError) else None
            why = os.strerror(errno) if errno else str(exc)
            raise ReadinessUnavailable(
                f"--ready-port {s.ready_port}: cannot listen on {s.ready_host}:{s.ready_port}: "
                f"{why}") from None

    async def stop(self) -> None:
        """Stop listening and drop any connection still open: the process exits next."""
        if self._server is not None:
            self._server.close()
            for writer in list(self._open):
                writer.close()
            await self._server.wait_closed()
            self._server = None
        await super().stop()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._open.add(writer)
        try:
            try:
                request = await asyncio.wait_for(_read_head(reader), READ_TIMEOUT)
            except (TimeoutError, ValueError, ConnectionError, asyncio.IncompleteReadError,
                    asyncio.LimitOverrunError):
                request = None
            writer.write(self._response(request))
            await asyncio.wait_for(writer.drain(), READ_TIMEOUT)
        except (TimeoutError, ConnectionError):
            pass  # the prober left: nothing to tell it
        finally:
            self._open.discard(writer)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    def _response(self, request: tuple[str, str] | None) -> bytes:
        """The whole response to ``(method, path)`` (None: a request that could not be read)."""
        if request is None:
            return _http(400, "bad request")
        method, path = request
        if path not in ("/ready", "/live"):
            return _http(404, "not found: GET /ready or /live")
        if method not in ("GET", "HEAD"):
            return _http(405, "method not allowed: GET or HEAD")
        if path == "/live":
            return _http(200, "alive", head=method == "HEAD")
        ok, why = self.state()
        return _http(200 if ok else 503, why, head=method == "HEAD")


async def _read_head(reader: asyncio.StreamReader) -> tuple[str, str]:
    """The method and path of the request (its query string dropped); the headers are read
    and ignored. ValueError for anything that is not an HTTP request line."""
    line = (await reader.readuntil(b"\n")).decode("latin-1")
    parts = line.split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        raise ValueError("not an HTTP request line")
    for _ in range(MAX_HEADERS):
        if not (await reader.readuntil(b"\n")).strip():
            return parts[0], parts[1].split("?", 1)[0]
    raise ValueError("too many header lines")


def _http(status: int, body: str, *, head: bool = False) -> bytes:
    """An HTTP/1.1 response that closes the connection; a HEAD's has no body."""
    data = f"{body}\n".encode()
    lines = [f"HTTP/1.1 {status} {_REASONS[status]}", "Content-Type: text/plain; charset=utf-8",
             f"Content-Length: {len(data)}", "Cache-Control: no-store", "Connection: close"]
    if status == 405:
        lines.append("Allow: GET, HEAD")
    return "\r\n".join(lines).encode() + b"\r\n\r\n" + (b"" if head else data)
