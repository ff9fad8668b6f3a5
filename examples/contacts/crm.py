"""A fake upstream CRM for the contact-import example: paginated contacts over HTTP.

The handler in :mod:`examples.contacts.app` talks to a real HTTP endpoint, as it would in
production, so that a crash, a kill or a slow page behave exactly as they would against
a real API. This module provides that endpoint without any network dependency:

``GET /accounts/<account_id>/contacts?cursor=<c>&limit=100`` returns::

    {"contacts": [{"id": ..., "name": ..., "email": ...}, ...],
     "next_cursor": "<opaque>" or "",
     "total_estimate": N}

``?page=<n>&limit=100`` (instead of a cursor) returns page ``n`` (from 0) of that size
directly, as many APIs also offer: what lets the fan-out import (:mod:`examples.contacts.
fan_out`) fetch its pages side by side instead of one cursor after the other.

The contacts of an account are a pure function of its id (:func:`expected_contacts`
decides how many, the index decides names and emails), so a test can say in advance what
a complete import must contain. The server records every request it answered, per account
and cursor, so a test can prove that a resumed import did not fetch its first pages again.

Run it on its own with ``python -m examples.contacts.crm --port 8080``: it prints its URL
on stdout and serves until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import hashlib
import json
import signal
import sys
import threading
import time
from collections import Counter
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType, TracebackType
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

#: Without a fixed ``contacts_per_account`` an account has between these many contacts,
#: picked by a hash of its id: different accounts import at visibly different lengths.
MIN_CONTACTS = 200
MAX_CONTACTS = 1500

#: The largest page the server hands out, whatever ``limit`` the client asks for.
DEFAULT_PAGE_SIZE = 100

_FIRST = ("Ada", "Grace", "Alan", "Edsger", "Barbara", "Donald", "Frances", "Ken",
          "Margaret", "Dennis", "Radia", "Leslie", "Katherine", "John", "Sophie", "Niklaus")
_LAST = ("Lovelace", "Hopper", "Turing", "Dijkstra", "Liskov", "Knuth", "Allen", "Thompson",
         "Hamilton", "Ritchie", "Perlman", "Lamport", "Johnson", "Backus", "Wilson", "Wirth")


def expected_contacts(account_id: str, contacts_per_account: int | None = None) -> int:
    """How many contacts the CRM holds for ``account_id``: what a complete import yields.

    With ``contacts_per_account`` set every account has exactly that many; otherwise a
    SHA-256 of the id picks a count in ``[MIN_CONTACTS, MAX_CONTACTS]``, stable across
    processes and runs (unlike ``hash()``, which is salted per interpreter).
    """
    if contacts_per_account is not None:
        return contacts_per_account
    digest = hashlib.sha256(account_id.encode("utf-8")).digest()
    span = MAX_CONTACTS - MIN_CONTACTS + 1
    return MIN_CONTACTS + int.from_bytes(digest[:8], "big") % span


def contact(account_id: str, index: int) -> dict[str, str]:
    """The ``index``-th contact (0-based) of an account, derived from the index alone."""
    first = _FIRST[index % len(_FIRST)]
    last = _LAST[(index // len(_FIRST)) % len(_LAST)]
    domain = "".join(ch for ch in account_id.lower() if ch.isalnum()) or "account"
    return {
        "id": f"c{index:07d}",
        "name": f"{first} {last} #{index}",
        "email": f"{first.lower()}.{last.lower()}.{index}@{domain}.example.com",
    }


def encode_cursor(offset: int) -> str:
    """An opaque cursor: clients must echo it back, never compute one."""
    return base64.urlsafe_b64encode(f"offset:{offset}".encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> int:
    """The offset a cursor stands for; ``""`` is the first page. ValueError if malformed."""
    if not cursor:
        return 0
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError) as exc:
        raise ValueError(f"malformed cursor {cursor!r}") from exc
    prefix, _, number = raw.partition(":")
    if prefix != "offset" or not number.isdigit():
        raise ValueError(f"malformed cursor {cursor!r}")
    return int(number)


class _Server(ThreadingHTTPServer):
    """The HTTP server, pointing back at the :class:`FakeCRM` whose data it serves."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], crm: FakeCRM) -> None:
        super().__init__(address, _RequestHandler)
        self.crm = crm


class _RequestHandler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        parts = urlsplit(self.path)
        segments = parts.path.strip("/").split("/")
        if len(segments) != 3 or segments[0] != "accounts" or segments[2] != "contacts":
            self._reply(HTTPStatus.NOT_FOUND, {"error": f"no route {parts.path}"})
            return
        account_id = unquote(segments[1])
        query = parse_qs(parts.query)
        cursor = query.get("cursor", [""])[0]
        try:
            limit = int(query.get("limit", [str(DEFAULT_PAGE_SIZE)])[0])
            offset = decode_cursor(cursor)
            if "page" in query:
                offset, cursor = self.server.crm.page_offset(query["page"][0], limit)
        except ValueError as exc:
            self._reply(HTTPStatus.BAD_REQUEST, {"error": str(exc)})
            return
        status, body = self.server.crm.serve(account_id, cursor, offset, limit)
        self._reply(status, body)

    def _reply(self, status: HTTPStatus, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        """Stay quiet: one stderr line per page would drown the demo's output."""


class FakeCRM:
    """The fake CRM, served from a background thread of the calling process.

    ``page_delay`` (seconds) is slept before each page is answered, standing in for a slow
    upstream: it makes an import last long enough to watch, or to kill half-way.
    ``fail_first`` answers the first N requests of every account with HTTP 500, to show
    that a failed attempt is retried and resumes where it stopped.

    Use it as a context manager, or call :meth:`start` and :meth:`stop`.
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        page_size: int = DEFAULT_PAGE_SIZE,
        page_delay: float = 0.01,
        contacts_per_account: int | None = None,
        fail_first: int = 0,
    ) -> None:
        if page_size < 1:
            raise ValueError("page_size must be at least 1")
        self.host = host
        self.port = port
        self.page_size = page_size
        self.page_delay = page_delay
        self.contacts_per_account = contacts_per_account
        self.fail_first = fail_first
        self._lock = threading.Lock()
        self._log: list[tuple[str, str, int]] = []
        self._seen: Counter[str] = Counter()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # ---- lifecycle ----------------------------------------------------------------------

    def start(self) -> FakeCRM:
        """Bind (port 0 picks a free one) and serve from a daemon thread; returns self."""
        if self._server is not None:
            raise RuntimeError("FakeCRM is already running")
        self._server = _Server((self.host, self.port), self)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.1},
            name="fake-crm", daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and release the port. Safe to call twice."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> FakeCRM:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """The base URL handlers are given (``CONTACTS_CRM_URL``), without a trailing slash."""
        if self._server is None:
            raise RuntimeError("FakeCRM is not running; call start() first")
        return f"http://{self.host}:{self.port}"

    # ---- data and bookkeeping -----------------------------------------------------------

    def expected_contacts(self, account_id: str) -> int:
        """:func:`expected_contacts` under this server's ``contacts_per_account``."""
        return expected_contacts(account_id, self.contacts_per_account)

    def expected_pages(self, account_id: str, limit: int = DEFAULT_PAGE_SIZE) -> int:
        """How many pages a client asking for ``limit`` per page needs (at least one)."""
        size = max(1, min(limit, self.page_size))
        return max(1, -(-self.expected_contacts(account_id) // size))

    def page_offset(self, page: str, limit: int) -> tuple[int, str]:
        """The offset of page ``page`` (a number from 0) at ``limit`` per page, and the key it
        is logged under: ``page=<n>``. ValueError for a page that is not such a number."""
        if not page.isdigit():
            raise ValueError(f"malformed page {page!r}")
        return int(page) * max(1, min(limit, self.page_size)), f"page={int(page)}"

    def requests(self, account_id: str) -> list[str]:
        """The cursors requested for an account, in the order they arrived (failed ones
        too); a numbered page's request as ``page=<n>``."""
        with self._lock:
            return [cursor for acct, cursor, _ in self._log if acct == account_id]

    def request_count(self, account_id: str, cursor: str) -> int:
        """How many times the page at ``cursor`` (or ``page=<n>``) was answered successfully
        for an account."""
        with self._lock:
            return sum(1 for acct, c, status in self._log
                       if acct == account_id and c == cursor and status == HTTPStatus.OK)

    def serve(
        self, account_id: str, cursor: str, offset: int, limit: int
    ) -> tuple[HTTPStatus, dict[str, Any]]:
        """Answer one page request; called from the server's request threads."""
        with self._lock:
            self._seen[account_id] += 1
            failing = self._seen[account_id] <= self.fail_first
        if self.page_delay > 0:
            time.sleep(self.page_delay)
        total = self.expected_contacts(account_id)
        body: dict[str, Any]
        if failing:
            status, body = HTTPStatus.INTERNAL_SERVER_ERROR, {"error": "injected failure"}
        elif offset > total:
            status, body = HTTPStatus.BAD_REQUEST, {"error": f"cursor past the end ({offset})"}
        else:
            size = max(1, min(limit, self.page_size))
            end = min(offset + size, total)
            status = HTTPStatus.OK
            body = {
                "contacts": [contact(account_id, i) for i in range(offset, end)],
                "next_cursor": encode_cursor(end) if end < total else "",
                "total_estimate": total,
            }
        with self._lock:
            self._log.append((account_id, cursor, int(status)))
        return status, body


def main(argv: list[str] | None = None) -> int:
    """``python -m examples.contacts.crm``: serve until SIGTERM/SIGINT, URL on stdout."""
    parser = argparse.ArgumentParser(prog="python -m examples.contacts.crm", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--page-size", type=int, default=DEFAULT_PAGE_SIZE)
    parser.add_argument("--page-delay", type=float, default=0.01, help="seconds per page")
    parser.add_argument("--contacts-per-account", type=int, default=None,
                        help=f"default: {MIN_CONTACTS}..{MAX_CONTACTS}, by a hash of the id")
    parser.add_argument("--fail-first", type=int, default=0,
                        help="answer the first N requests of each account with HTTP 500")
    opts = parser.parse_args(argv)

    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    crm = FakeCRM(host=opts.host, port=opts.port, page_size=opts.page_size,
                  page_delay=opts.page_delay, contacts_per_account=opts.contacts_per_account,
                  fail_first=opts.fail_first)
    with crm:
        print(crm.url, flush=True)
        while not stop.wait(1.0):
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
