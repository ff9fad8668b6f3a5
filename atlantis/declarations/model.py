"""What a `.atl` file declares, independent of how it was written.

The database holds the same model as JSON (``JobDecl.to_json``); validation of arguments
happens there, so every enqueue path (Python, SQL, CLI) applies one set of rules.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: Argument types a declaration may use; any of them may be made an array with ``[]``.
BASE_TYPES = frozenset(
    {"text", "varchar", "int", "bigint", "boolean", "double", "numeric", "uuid",
     "timestamptz", "date", "jsonb"}
)

DEFAULT_RETRIES = 3
DEFAULT_TIMEOUT = 3600.0
DEFAULT_HEARTBEAT = 300.0
DEFAULT_QUEUE = "default"
DEFAULT_PRIORITY = 0
DEFAULT_BACKOFF = 10.0


@dataclass(frozen=True)
class Field:
    """One argument: ``name type [not null] [default literal]``."""

    name: str
    type: str  # one of BASE_TYPES
    length: int | None = None  # varchar(n)
    array: bool = False
    not_null: bool = False
    has_default: bool = False
    default: Any = None  # a JSON value
    source: str = field(default="", compare=False)  # "file:line:column" of its name

    @property
    def type_name(self) -> str:
        """The type as written: ``varchar(64)``, ``int[]``."""
        base = f"{self.type}({self.length})" if self.length is not None else self.type
        return base + ("[]" if self.array else "")

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "type": self.type,
            "length": self.length,
            "array": self.array,
            "not_null": self.not_null,
            "has_default": self.has_default,
            "default": self.default,
        }


@dataclass(frozen=True)
class JobDecl:
    """One ``job Name in namespace { ... }`` block."""

    name: str  # e.g. "ImportContacts"
    namespace: str  # e.g. "directory"
    fields: tuple[Field, ...] = ()
    retries: int = DEFAULT_RETRIES
    timeout: float = DEFAULT_TIMEOUT  # seconds, wall clock per attempt
    heartbeat: float = DEFAULT_HEARTBEAT  # seconds, lease window
    queue: str = DEFAULT_QUEUE
    priority: int = DEFAULT_PRIORITY
    unique: tuple[str, ...] = ()
    backoff: float = DEFAULT_BACKOFF  # seconds, base of the exponential retry delay
    stall: float | None = None  # seconds without a checkpoint before `stalled`; None: 3 x heartbeat
    schedule: str | None = None  # cron expression: enqueued once per slot, args from defaults
    tz: str | None = None  # IANA time zone the schedule runs in; None: UTC
    source: str = field(default="", compare=False)  # "file:line"

    @property
    def qualified_name(self) -> str:
        return f"{self.namespace}.{self.name}"

    @property
    def max_attempts(self) -> int:
        return self.retries + 1

    def to_json(self) -> dict[str, Any]:
        """The form stored in ``atlantis.job_types.fields`` and friends."""
        return {
            "job": self.qualified_name,
            "queue": self.queue,
            "max_attempts": self.max_attempts,
            "priority": self.priority,
            "timeout": self.timeout,
            "heartbeat": self.heartbeat,
            "backoff": self.backoff,
            "unique_fields": list(self.unique),
            "fields": [f.to_json() for f in self.fields],
            "stall": self.stall,
            "schedule": self.schedule,
            "tz": self.tz,
            "source": self.source,
        }


@dataclass(frozen=True)
class StepDecl:
    """``step NAME JOB [after STEP, ...] [compensate JOB]`` of a workflow."""

    name: str  # e.g. "import"
    job: str  # qualified, e.g. "directory.ImportContacts"
    after: tuple[str, ...] = ()  # names of steps of the same workflow
    compensate: str | None = None  # qualified job name
    source: str = field(default="", compare=False)  # "file:line:column" of its name
    job_at: str = field(default="", compare=False)  # "file:line:column" of its job
    compensate_at: str = field(default="", compare=False)  # ... of its compensate job

    def to_json(self) -> dict[str, Any]:
        return {
            "step": self.name,
            "job": self.job,
            "after": list(self.after),
            "compensate": self.compensate,
        }


@dataclass(frozen=True)
class WorkflowDecl:
    """One ``workflow Name in namespace { ... }`` block."""

    name: str  # e.g. "Onboard"
    namespace: str  # e.g. "onboarding"
    fields: tuple[Field, ...] = ()
    steps: tuple[StepDecl, ...] = ()  # in declaration order
    timeout: float | None = None  # seconds of the forward phase, from its start; None: unbounded
    unique: tuple[str, ...] = ()
    source: str = field(default="", compare=False)  # "file:line"
    name_at: str = field(default="", compare=False)  # "file:line:column" of its name

    @property
    def qualified_name(self) -> str:
        return f"{self.namespace}.{self.name}"

    def to_json(self) -> dict[str, Any]:
        """The form stored in ``atlantis.workflow_types``."""
        return {
            "workflow": self.qualified_name,
            "fields": [f.to_json() for f in self.fields],
            "unique_fields": list(self.unique),
            "timeout": self.timeout,
            "steps": [s.to_json() for s in self.steps],
            "source": self.source,
        }
