"""atlantis: durable background jobs on PostgreSQL, each attempt in a supervised child."""

from importlib import metadata as _metadata

from atlantis.context import Compensating, JobContext, checkpoint
from atlantis.enqueue import enqueue, enqueue_async, enqueue_many, enqueue_many_async
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
    WorkflowNotFoundError,
    WorkflowStateError,
)
from atlantis.operations import cancel, cancel_async, retry, retry_async
from atlantis.registry import Registry
from atlantis.workflows import (
    cancel_workflow,
    cancel_workflow_async,
    dismiss_workflow,
    retry_workflow,
    start_workflow,
    start_workflow_async,
)

__all__ = [
    "AtlantisError",
    "Compensating",
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
    "WorkflowNotFoundError",
    "WorkflowStateError",
    "cancel",
    "cancel_async",
    "cancel_workflow",
    "cancel_workflow_async",
    "checkpoint",
    "dismiss_workflow",
    "enqueue",
    "enqueue_async",
    "enqueue_many",
    "enqueue_many_async",
    "retry",
    "retry_async",
    "retry_workflow",
    "start_workflow",
    "start_workflow_async",
]

#: The distribution's version, written once in pyproject.toml and read from the installed
#: package's metadata; a source tree that was never installed says "0+unknown".
try:
    __version__ = _metadata.version("atlantis-jobs")
except _metadata.PackageNotFoundError:  # pragma: no cover - only outside an installation
    __version__ = "0+unknown"
