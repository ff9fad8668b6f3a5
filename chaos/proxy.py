"""A TCP proxy in front of PostgreSQL that a test or the chaos run can cut, restore or freeze.

The embedded server listens on a unix socket only; the proxy listens on 127.0.0.1 and
forwards every connection to that socket, so a supervisor given the proxy's URL loses its
connections when the test (or the chaos driver) says so, while the server itself keeps
running:

- :meth:`Proxy.stop` resets every connection (RST, no goodbye) and refuses new ones, as a
  crashed server or a dropped link would; :meth:`Proxy.start` listens again on the same port.
- :meth:`Proxy.freeze` keeps every socket open but forwards nothing, in either direction,
  on old and new connections alike: a half-open link, which only the client's own timeouts
  can notice. :meth:`Proxy.thaw` lets the held bytes through again.

Threads, not asyncio: the tests and the chaos driver are synchronous and the proxy must
run while they block.
"""

from __future__ import annotations

import socket
import struct
import threading
from types import TracebackType

_CHUNK = 65536


class _Pair:
    """One client connection and its upstream twin, pumped by two threads."""

    def __init__(self, proxy: Proxy, down: socket.socket, up: socket.socket) -> None:
        self.proxy = proxy
        self.socks = (down, up)
        self.lock = threading.Lock()
        self.dead = False
        self.pumps = 2
        self.threads = [
            threading.Thread(target=self._pump, args=(down, up), daemon=True, name="proxy-up"),
            threading.Thread(target=self._pump, args=(up, down), daemon=True, name="proxy-down"),
        ]
        for t in self.threads:
            t.start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(_CHUNK)
                if not data:
                    break
                # Frozen: hold the bytes (the kernel keeps acknowledging the sender, as a
                # half-open link does) until thawed or cut.
                while not self.proxy.flowing.wait(0.05):
                    if self.dead:
                        return
                if self.dead:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            self.end(abrupt=False)
            with self.lock:
                self.pumps -= 1
                last = self.pumps == 0
            if last:  # close only once no thread can still be blocked on these sockets
                for s in self.socks:
                    s.close()

    def end(self, *, abrupt: bool) -> None:
        """Stop both directions; ``abrupt`` makes the final close send RST instead of FIN."""
        with self.lock:
            if self.dead and not abrupt:
                return
            self.dead = True
        for s in self.socks:
            try:
                if abrupt:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    s.shutdown(socket.SHUT_RD)  # wakes a pump blocked in recv, sends nothing
                else:
                    s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed by the other pump

    def join(self, timeout: float) -> None:
        for t in self.threads:
            t.join(timeout)


class Proxy:
    """Forward 127.0.0.1:``port`` to the unix socket ``upstream``; see the module docstring."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.port = 0
        self.flowing = threading.Event()
        self.flowing.set()
        self._pairs: set[_Pair] = set()
        self._pairs_lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._acceptor: threading.Thread | None = None
        self._accepting = False
        self.accepted = 0

    def __enter__(self) -> Proxy:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._listener is not None

    def start(self) -> None:
        """Listen (again) on the same port; connections made from now on are forwarded."""
        if self._listener is not None:
            return
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        listener.settimeout(0.05)  # so that the accept thread notices stop() promptly
        self.port = listener.getsockname()[1]
        self._listener = listener
        self._accepting = True
        self._acceptor = threading.Thread(target=self._accept_loop, args=(listener,), daemon=True,
                                          name="proxy-accept")
        self._acceptor.start()

    def stop(self) -> None:
        """Refuse new connections and reset every open one."""
        listener, self._listener = self._listener, None
        self._accepting = False
        if self._acceptor is not None:
            self._acceptor.join(5)
            self._acceptor = None
        if listener is not None:
            listener.close()
        with self._pairs_lock:
            pairs, self._pairs = self._pairs, set()
        for pair in pairs:
            pair.end(abrupt=True)
        for pair in pairs:
            pair.join(5)

    def freeze(self) -> None:
        """Forward nothing, but keep every socket open and keep accepting: a half-open link."""
        self.flowing.clear()

    def thaw(self) -> None:
        self.flowing.set()

    def url(self, db_url: str) -> str:
        """``db_url`` (a database on the upstream server) as reached through this proxy."""
        import psycopg

        return psycopg.conninfo.make_conninfo(db_url, host="127.0.0.1", port=str(self.port))

    def _accept_loop(self, listener: socket.socket) -> None:
        while self._accepting:
            try:
                down, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            down.settimeout(None)
            up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                up.connect(self.upstream)
            except OSError:  # the server is down: the client sees its connection reset
                up.close()
                down.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                down.close()
                continue
            self.accepted += 1
            pair = _Pair(self, down, up)
            with self._pairs_lock:
                self._pairs = {p for p in self._pairs if not p.dead}
                self._pairs.add(pair)


def upstream_socket(db_url: str) -> str:
    """The unix socket path of the server ``db_url`` points at (the embedded one has no TCP)."""
    import psycopg

    params = psycopg.conninfo.conninfo_to_dict(db_url)
    return f"{params['host']}/.s.PGSQL.{params.get('port') or 5432}"
