"""The console's settings: where the database is, the token, what is private or hidden."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from atlantis import environ

#: The label recorded in the audit table for a token given without one (``secret``).
DEFAULT_LABEL = "token"
#: What a redacted arg shows instead of its value.
REDACTED = "[redacted]"


@dataclass(frozen=True, slots=True)
class Token:
    """``ATLANTIS_CONSOLE_TOKEN``: ``label:secret`` or a bare ``secret``."""

    label: str
    secret: str

    @classmethod
    def parse(cls, raw: str | None) -> Token | None:
        raw = (raw or "").strip()
        if not raw:
            return None
        label, sep, secret = raw.partition(":")
        if sep and label and secret:
            return cls(label, secret)
        return cls(DEFAULT_LABEL, raw)

    def __repr__(self) -> str:  # never print the secret
        return f"Token(label={self.label!r})"


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything a console process is configured with.

    ``allowed_hosts``: the ``Host`` headers accepted (None: any). A console bound to a
    loopback address accepts only loopback names, so a page elsewhere cannot reach it
    through DNS rebinding. ``poll_interval``: how often the rows of open job pages are read
    again even without a NOTIFY (the fallback); ``log_interval``: how often new log lines
    of open job pages are read (one statement for all of them); ``debounce``: the shortest
    time between two refreshes sent to list pages.
    """

    database_url: str
    token: Token | None = None
    private: bool = False
    redact: frozenset[str] = field(default_factory=frozenset)
    allowed_hosts: tuple[str, ...] | None = None
    poll_interval: float = 2.0
    log_interval: float = 1.0
    debounce: float = 0.25

    @classmethod
    def from_env(cls, database_url: str, **kwargs: object) -> Settings:
        return cls(database_url, token=Token.parse(os.environ.get(environ.CONSOLE_TOKEN)),
                   **kwargs)  # type: ignore[arg-type]


LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1", "[::1]")


def loopback(host: str) -> bool:
    return host in LOOPBACK_NAMES or host.startswith("127.")


def loopback_hosts(bound: str) -> tuple[str, ...]:
    """The ``Host`` headers a console bound to the loopback address ``bound`` accepts: the
    loopback names and ``bound`` itself (``127.0.0.2`` is reached as ``127.0.0.2``). Names
    that any DNS could point here are still refused, against DNS rebinding."""
    extra = (bound, f"[{bound}]") if ":" in bound else (bound,)
    return LOOPBACK_NAMES + tuple(h for h in extra if h not in LOOPBACK_NAMES)
