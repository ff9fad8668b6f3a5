"""The store: every SQL statement, the schema migrations, and the database location."""

from atlantis.store.database import connect, redact, resolve_url
from atlantis.store.migrate import migrate, sync
from atlantis.store.queries import Q

__all__ = ["Q", "connect", "migrate", "redact", "resolve_url", "sync"]
