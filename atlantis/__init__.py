"""atlantis: durable background jobs on PostgreSQL, each attempt in a supervised child."""

# Each public name is imported on first use (PEP 562), not with the package: a process that
# needs one part of atlantis (the lease keeper, a child, the supervisor's check of the app)
# does not pay for the rest, and ``import atlantis`` costs nothing until a name is used.
from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    __version__: str
    from atlantis.context import AsyncJobContext, Compensating, JobContext, checkpoint
    from atlantis.enqueue import enqueue, enqueue_async, enqueue_many, enqueue_many_async
    from atlantis.errors import (
        AtlantisError,
        ChildFailed,
        ConfigurationError,
        DeclarationError,
        Discard,
        EventTimeout,
        JobEndedError,
        JobFailedError,
        JobNotFoundError,
        LeaseLost,
        Snooze,
        StepError,
        Suspended,
        UniqueKeyTakenError,
        UnknownJobError,
        ValidationError,
        WaitTimeout,
        WorkflowNotFoundError,
        WorkflowStateError,
    )
    from atlantis.jobs import (
        Job,
        get_job,
        get_job_async,
        list_jobs,
        list_jobs_async,
        wait,
        wait_async,
    )
    from atlantis.operations import (
        cancel,
        cancel_async,
        retry,
        retry_async,
        send_event,
        send_event_async,
    )
    from atlantis.registry import Registry
    from atlantis.store.database import database_url
    from atlantis.workflows import (
        cancel_workflow,
        cancel_workflow_async,
        dismiss_workflow,
        retry_workflow,
        start_workflow,
        start_workflow_async,
    )

#: Where each public name lives.
_HOMES: dict[str, str] = {
    "AsyncJobContext": "atlantis.context",
    "Compensating": "atlantis.context",
    "JobContext": "atlantis.context",
    "checkpoint": "atlantis.context",
    "enqueue": "atlantis.enqueue",
    "enqueue_async": "atlantis.enqueue",
    "enqueue_many": "atlantis.enqueue",
    "enqueue_many_async": "atlantis.enqueue",
    "AtlantisError": "atlantis.errors",
    "ConfigurationError": "atlantis.errors",
    "DeclarationError": "atlantis.errors",
    "Discard": "atlantis.errors",
    "ChildFailed": "atlantis.errors",
    "EventTimeout": "atlantis.errors",
    "JobEndedError": "atlantis.errors",
    "JobFailedError": "atlantis.errors",
    "WaitTimeout": "atlantis.errors",
    "Job": "atlantis.jobs",
    "get_job": "atlantis.jobs",
    "get_job_async": "atlantis.jobs",
    "list_jobs": "atlantis.jobs",
    "list_jobs_async": "atlantis.jobs",
    "wait": "atlantis.jobs",
    "wait_async": "atlantis.jobs",
    "JobNotFoundError": "atlantis.errors",
    "LeaseLost": "atlantis.errors",
    "Snooze": "atlantis.errors",
    "StepError": "atlantis.errors",
    "Suspended": "atlantis.errors",
    "UniqueKeyTakenError": "atlantis.errors",
    "UnknownJobError": "atlantis.errors",
    "ValidationError": "atlantis.errors",
    "WorkflowNotFoundError": "atlantis.errors",
    "WorkflowStateError": "atlantis.errors",
    "cancel": "atlantis.operations",
    "cancel_async": "atlantis.operations",
    "retry": "atlantis.operations",
    "retry_async": "atlantis.operations",
    "send_event": "atlantis.operations",
    "send_event_async": "atlantis.operations",
    "Registry": "atlantis.registry",
    "database_url": "atlantis.store.database",
    "cancel_workflow": "atlantis.workflows",
    "cancel_workflow_async": "atlantis.workflows",
    "dismiss_workflow": "atlantis.workflows",
    "retry_workflow": "atlantis.workflows",
    "start_workflow": "atlantis.workflows",
    "start_workflow_async": "atlantis.workflows",
}

__all__ = [
    "AsyncJobContext",
    "AtlantisError",
    "Compensating",
    "ConfigurationError",
    "DeclarationError",
    "Discard",
    "ChildFailed",
    "EventTimeout",
    "JobContext",
    "Job",
    "JobEndedError",
    "JobFailedError",
    "JobNotFoundError",
    "LeaseLost",
    "Registry",
    "Snooze",
    "StepError",
    "Suspended",
    "UniqueKeyTakenError",
    "UnknownJobError",
    "ValidationError",
    "WaitTimeout",
    "WorkflowNotFoundError",
    "WorkflowStateError",
    "cancel",
    "cancel_async",
    "cancel_workflow",
    "cancel_workflow_async",
    "checkpoint",
    "database_url",
    "dismiss_workflow",
    "enqueue",
    "enqueue_async",
    "enqueue_many",
    "enqueue_many_async",
    "get_job",
    "get_job_async",
    "list_jobs",
    "list_jobs_async",
    "retry",
    "retry_async",
    "retry_workflow",
    "send_event",
    "send_event_async",
    "start_workflow",
    "start_workflow_async",
    "wait",
    "wait_async",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is not None:
        value = getattr(importlib.import_module(home), name)
    elif name == "__version__":
        value = _version()
    elif not name.startswith("_"):
        # A submodule, as ``atlantis.operations.set_queue_limit`` after ``import atlantis``.
        try:
            value = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES, "__version__"})


def _version() -> str:
    """The distribution's version, written once in pyproject.toml and read from the installed
    package's metadata; a source tree that was never installed says "0+unknown"."""
    from importlib import metadata

    try:
        return metadata.version("atlantis-jobs")
    except metadata.PackageNotFoundError:  # pragma: no cover - only outside an installation
        return "0+unknown"


class _Package(types.ModuleType):
    """``atlantis.enqueue`` is a function and a module: the import of the module (from
    anywhere) must not replace the function, the name users call."""

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, types.ModuleType) and name in _HOMES:
            return  # the module stays in sys.modules; the name stays the function
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
