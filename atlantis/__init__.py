"""atlantis: durable background jobs on PostgreSQL, each attempt in a supervised child."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from atlantis.context import JobContext, checkpoint
from atlantis.errors import (
    AtlantisError,
    ConfigurationError,
    DeclarationError,
    Discard,
    JobNotFoundError,
    Snooze,
    UniqueKeyTakenError,
    UnknownJobError,
    ValidationError,
)
from atlantis.registry import Registry

if TYPE_CHECKING:
    from atlantis.enqueue import enqueue, enqueue_async, enqueue_many, enqueue_many_async
    from atlantis.operations import cancel, cancel_async, retry, retry_async

# The database functions load psycopg on first use: a child (and the zygote every fresh
# attempt is forked from) whose handlers never touch the database stays ~20 MB smaller,
# and a fork costs in proportion to the memory mapped.
_LAZY = {
    "enqueue": "atlantis.enqueue", "enqueue_async": "atlantis.enqueue",
    "enqueue_many": "atlantis.enqueue", "enqueue_many_async": "atlantis.enqueue",
    "cancel": "atlantis.operations", "cancel_async": "atlantis.operations",
    "retry": "atlantis.operations", "retry_async": "atlantis.operations",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'atlantis' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value

__all__ = [
    "AtlantisError",
    "ConfigurationError",
    "DeclarationError",
    "Discard",
    "JobContext",
    "JobNotFoundError",
    "Registry",
    "Snooze",
    "UniqueKeyTakenError",
    "UnknownJobError",
    "ValidationError",
    "cancel",
    "cancel_async",
    "checkpoint",
    "enqueue",
    "enqueue_async",
    "enqueue_many",
    "enqueue_many_async",
    "retry",
    "retry_async",
]

__version__ = "0.1.0"
