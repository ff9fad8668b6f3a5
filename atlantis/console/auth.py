"""Who is asking: a bearer token (the API), a login cookie (the pages), or nobody.

Without ``ATLANTIS_CONSOLE_TOKEN`` the console is read-only: nobody may write. With it, a
write needs ``Authorization: Bearer SECRET``, or the login cookie plus the CSRF token of
that session (a form field ``csrf`` or the header ``X-CSRF-Token``). The cookie is
``nonce.HMAC(secret, nonce)``: HttpOnly, SameSite=Strict, nothing stored server-side, and
every session ends when the secret changes. The CSRF token is another HMAC of the nonce.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

from starlette.requests import Request

from atlantis.console.settings import Settings, Token

COOKIE = "atlantis_console"
CSRF_HEADER = "x-csrf-token"
CSRF_FIELD = "csrf"


@dataclass(frozen=True, slots=True)
class Principal:
    """The caller: ``via`` is ``bearer``, ``cookie`` or None (anonymous); ``csrf`` is the
    session's CSRF token (cookie sessions only); ``bad_credentials``: a bearer token was
    sent and is wrong."""

    via: str | None
    label: str | None
    csrf: str | None = None
    bad_credentials: bool = False

    @property
    def authenticated(self) -> bool:
        return self.via is not None


ANONYMOUS = Principal(None, None)


def _sign(token: Token, purpose: str, nonce: str) -> str:
    return hmac.new(token.secret.encode(), f"{purpose}:{nonce}".encode(),
                    hashlib.sha256).hexdigest()


def new_session(token: Token) -> str:
    """A fresh cookie value."""
    nonce = secrets.token_urlsafe(18)
    return f"{nonce}.{_sign(token, 'session', nonce)}"


def _same(offered: str, expected: str) -> bool:
    """Constant-time equality of two texts compared as bytes: ``hmac.compare_digest``
    refuses text that is not ASCII, and a cookie or header is whatever a client sent."""
    return hmac.compare_digest(offered.encode("utf-8", "surrogateescape"),
                               expected.encode("utf-8", "surrogateescape"))


def check_secret(token: Token, offered: str) -> bool:
    return _same(offered, token.secret)


def identify(request: Request, settings: Settings) -> Principal:
    token = settings.token
    if token is None:
        return ANONYMOUS
    header = request.headers.get("authorization", "")
    if header:
        scheme, _, value = header.partition(" ")
        if scheme.lower() == "bearer" and check_secret(token, value.strip()):
            return Principal("bearer", token.label)
        return Principal(None, None, bad_credentials=True)
    cookie = request.cookies.get(COOKIE, "")
    nonce, _, sig = cookie.partition(".")
    if nonce and sig and _same(sig, _sign(token, "session", nonce)):
        return Principal("cookie", token.label, csrf=_sign(token, "csrf", nonce))
    return ANONYMOUS


def csrf_ok(principal: Principal, offered: str | None) -> bool:
    """Bearer callers need none; cookie sessions must echo their CSRF token."""
    if principal.via == "bearer":
        return True
    if principal.via == "cookie" and principal.csrf and offered:
        return _same(offered, principal.csrf)
    return False
