"""What a `.atl` file declares, independent of how it was written.

The database holds the same model as JSON (``JobDecl.to_json``); validation of arguments
happens there, so every enqueue path (Python, SQL, CLI) applies one set of rules.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from atlantis.units import format_duration

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

#: The kinds of limit a job may declare, in the order messages list them.
LIMIT_KINDS = ("concurrency", "rate")

#: What a scheduled job's ``overlap`` may say, the default first.
OVERLAP_MODES = ("skip", "allow")


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
class Limit:
    """``concurrency N [by FIELD, ...]`` or ``rate N/PERIOD [by FIELD, ...]`` of a job."""

    kind: str  # one of LIMIT_KINDS
    n: int  # at most n running at once (concurrency), or started per period (rate)
    period: float | None = None  # seconds, rate only
    by: tuple[str, ...] = ()  # fields whose values make the key, in the order written
    source: str = field(default="", compare=False)  # "file:line:column" of its keyword

    @property
    def label(self) -> str:
        """As an operator reads it: ``concurrency 1 by account_id``, ``rate 100/1m``."""
        text = f"{self.kind} {self.n}"
        if self.period is not None:
            text += f"/{period_text(self.period)}"
        if self.by:
            text += f" by {', '.join(self.by)}"
        return text

    def to_json(self) -> dict[str, Any]:
        """An element of ``atlantis.job_types.limits``."""
        doc: dict[str, Any] = {"kind": self.kind, "n": self.n}
        if self.period is not None:
            doc["period"] = float(self.period)
        doc["by"] = list(self.by)
        return doc


def period_text(seconds: float) -> str:
    """A rate's period in its largest whole unit: 60 -> ``1m``, 90 -> ``90s``, 86400 -> ``1d``."""
    for unit, size in (("d", 86_400), ("h", 3600), ("m", 60), ("s", 1)):
        count = seconds / size
        if count >= 1 and count == int(count):
            return f"{int(count)}{unit}"
    return format_duration(seconds)  # a fraction of a second: 1.5s -> 1s500ms


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
    # What a slot does while an earlier run of the schedule is waiting or running: "skip"
    # (no job) or "allow" (a job every slot). None: not said (a job without a schedule, or one
    # made in Python), read as "skip".
    overlap: str | None = None
    source: str = field(default="", compare=False)  # "file:line"
    limits: tuple[Limit, ...] = ()  # in declaration order

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
            "overlap": self.overlap,
            "source": self.source,
            "limits": [limit.to_json() for limit in self.limits],
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


@dataclass(frozen=True)
class Declarations:
    """What one `.atl` file declares, each kind in file order."""

    jobs: list[JobDecl]
    workflows: list[WorkflowDecl]
