"""Errors a user of atlantis can catch.

Every error derives from :class:`AtlantisError`; the class docstring is the default message.
"""

from __future__ import annotations


class AtlantisError(Exception):
    """atlantis failed."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class ConfigurationError(AtlantisError):
    """The configuration is invalid."""


class DeclarationError(AtlantisError):
    """A .atl declaration is malformed."""


class UnknownJobError(AtlantisError):
    """The database does not know this job; sync the declarations with `tide db sync --app A`."""


class ValidationError(AtlantisError):
    """The job's arguments do not match its declaration."""


class JobNotFoundError(AtlantisError):
    """No job has this id."""


class WorkflowNotFoundError(AtlantisError):
    """No workflow has this id."""


class WorkflowStateError(AtlantisError):
    """The workflow (or the workflow a step belongs to) is in a state that refuses the
    operation: a retry of anything but a ``compensation_failed`` workflow, or ``retry`` of a
    step's row (``tide workflow retry`` reruns its workflow's compensations)."""


class Discard(Exception):  # noqa: N818 - the name is part of the public API
    """Raised by a handler: send the job to the dead-letter queue at once, no retry."""

    def __init__(self, reason: str = "discarded by handler") -> None:
        super().__init__(reason)
        self.reason = reason


class Snooze(Exception):  # noqa: N818 - the name is part of the public API
    """Raised by a handler: run the job again after `seconds`, without spending an attempt."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"snoozed for {seconds}s")
        self.seconds = float(seconds)


class UniqueKeyTakenError(AtlantisError):
    """Another waiting or running job holds this job's unique key; retry once it finishes."""


class StepError(AtlantisError):
    """A handler step (``ctx.run_step``, ``ctx.transaction``, ``ctx.sleep``) could not be run
    or recorded. ``kind`` is the error kind its attempt fails with if the handler lets it
    through: ``result`` for a value that cannot be recorded or a cap passed, ``steps`` for
    the rest (a name used twice in one run, a bad name or duration, a handler database that
    is not the jobs' database, a COMMIT whose outcome is unknown)."""

    def __init__(self, message: str | None = None, kind: str = "steps") -> None:
        super().__init__(message)
        self.kind = kind


class Suspended(BaseException):
    """Raised inside a handler by ``ctx.sleep``: the run ends here, and the job runs again at
    ``wake`` without spending an attempt. Let it propagate: a handler that catches it and
    goes on fails its attempt with error kind ``swallowed``."""

    def __init__(self, wake: str, waits: str) -> None:
        super().__init__(f"suspended until {wake} ({waits})")
        self.wake = wake
        self.waits = waits


class LeaseLost(BaseException):
    """Raised inside a handler by a step whose run no longer holds the job's lease (another
    run may hold it now): the step's transaction was rolled back and the run must stop. Its
    attempt ends with error kind ``lease``."""


class EventTimeout(AtlantisError):  # noqa: N818 - the name is part of the public API
    """``ctx.wait_for_event`` reached its deadline (fixed when the wait was first reached)
    before an event of that name was sent to the job."""


class ChildFailed(AtlantisError):  # noqa: N818 - the name is part of the public API
    """``ctx.join`` found jobs it waited for that ended ``dead`` or ``cancelled``.
    ``failed`` lists them, ``(id, state, last error)``, in the order the join was given."""

    def __init__(self, message: str, failed: list[tuple[int, str, str | None]]) -> None:
        super().__init__(message)
        self.failed = failed


class JobEndedError(AtlantisError):
    """The job has ended (complete, dead or cancelled): an event can no longer reach it."""


class JobFailedError(AtlantisError):
    """The job :func:`atlantis.wait` waited for ended ``dead`` or ``cancelled``: ``job_id``,
    ``state`` and ``last_error`` (its last error's text, None when it has none) say which
    and why."""

    def __init__(self, job_id: int, state: str, last_error: str | None) -> None:
        super().__init__(f"job {job_id} ended {state}: {last_error or 'no error recorded'}")
        self.job_id = job_id
        self.state = state
        self.last_error = last_error


class WaitTimeout(AtlantisError, TimeoutError):  # noqa: N818 - the name is part of the public API
    """:func:`atlantis.wait` gave up: the job had not ended within its ``timeout``. A
    :class:`TimeoutError` too; the job goes on."""
