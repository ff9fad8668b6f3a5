"""Children: the rules of ``ctx.spawn`` and ``ctx.join`` (issue 35), shared by the sync and
async step books (:mod:`atlantis.steps`, :mod:`atlantis.steps_async`), which do the I/O.

A spawn enqueues its job in the step's own fenced statement (``atlantis.step_spawn``): the
child exists exactly once, whatever crashes, and a later run gets the recorded id back. A
join (``atlantis.step_join``) returns once every job it lists has ended, or suspends the
run until then: a child's end wakes its parent once, when it was the last one waiting or
running (live/children.sql).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

import orjson

from atlantis.errors import ChildFailed, JobNotFoundError, StepError
from atlantis.limits import MAX_JOIN_JOBS, MAX_SPAWN_MANY

#: When a join wakes if no child's end wakes it first: never (the rescue's sweep also looks).
FOREVER = datetime(9999, 12, 31, tzinfo=UTC)
_NO_JOB = "ATL04"
_TOO_MANY = "ATL23"
_CANCELLING = "ATL24"


def spawn_params(name: str, job: object, args: object, options: Mapping[str, Any]
                 ) -> dict[str, Any]:
    """The checked parameters of spawn ``name``'s enqueue (what ``atlantis.enqueue`` takes)."""
    from atlantis.enqueue import EnqueueOptions, one_params

    if type(job) is not str or not job:
        raise StepError(f"spawn {name!r}: the job to enqueue must be a job's name, not "
                        f"{str(job)[:60]!r}")
    if args is not None and not isinstance(args, Mapping):
        raise StepError(f"spawn {name!r}: a child's args must be a mapping (a dict), not "
                        f"{type(args).__name__}")
    checked: EnqueueOptions = dict(options)  # type: ignore[assignment]
    return one_params(job, args, checked)


def spawn_many_params(name: str, job: object, args_list: object,
                      options: Mapping[str, Any]) -> dict[str, Any]:
    """The checked parameters of ``ctx.spawn_many`` ``name``: at most MAX_SPAWN_MANY."""
    from atlantis.enqueue import EnqueueOptions, many_params

    if type(job) is not str or not job:
        raise StepError(f"spawn {name!r}: the job to enqueue must be a job's name, not "
                        f"{str(job)[:60]!r}")
    if isinstance(args_list, str | bytes | Mapping) or not isinstance(args_list, Iterable):
        raise StepError(f"spawn {name!r}: ctx.spawn_many takes a list of args (dicts), not "
                        f"{type(args_list).__name__}")
    given = list(args_list)
    bad = next((a for a in given if not isinstance(a, Mapping)), None)
    if bad is not None:
        raise StepError(f"spawn {name!r}: a child's args must be a mapping (a dict), not "
                        f"{type(bad).__name__}")
    if len(given) > MAX_SPAWN_MANY:
        raise StepError(f"spawn {name!r}: {len(given)} jobs, more than the {MAX_SPAWN_MANY} "
                        "one spawn_many enqueues (spawn them in several steps)", kind="result")
    checked: EnqueueOptions = dict(options)  # type: ignore[assignment]
    return many_params(job, given, checked)


def spawned(name: str, value: Any) -> int:
    """The job id a spawn's record holds."""
    if "job" not in value:
        raise StepError(f"handler step {name!r} was recorded by ctx.spawn_many and is now run "
                        "by ctx.spawn: give the new step a new name")
    return int(value["job"])


def spawned_many(name: str, value: Any) -> list[int]:
    """The job ids a ``ctx.spawn_many`` record holds."""
    if "jobs" not in value:
        raise StepError(f"handler step {name!r} was recorded by ctx.spawn and is now run by "
                        "ctx.spawn_many: give the new step a new name")
    return [int(i) for i in value["jobs"]]


def job_ids(name: str, ids: object) -> list[int]:
    """The ids a join waits for: an iterable of ints (not a string), at most MAX_JOIN_JOBS."""
    if isinstance(ids, str | bytes) or not isinstance(ids, Iterable):
        raise StepError(f"join {name!r}: give the ids of the jobs to wait for (a list of "
                        f"ints), not {type(ids).__name__}")
    out = list(ids)
    bad = next((i for i in out if type(i) is not int), None)
    if bad is not None:
        raise StepError(f"join {name!r}: job ids are ints, not {bad!r}"[:200])
    if len(out) > MAX_JOIN_JOBS:
        raise StepError(f"join {name!r}: {len(out)} jobs, more than the {MAX_JOIN_JOBS} a "
                        "join may wait for", kind="result")
    return out


def refused(name: str, exc: BaseException) -> BaseException:
    """What a database refusal of a spawn or join becomes in the handler (else ``exc``)."""
    state = getattr(exc, "sqlstate", None)
    if state is None:
        return exc
    from atlantis.enqueue import translate

    message = getattr(getattr(exc, "diag", None), "message_primary", None) or str(exc)
    if state == _NO_JOB:
        return JobNotFoundError(message)
    if state == _TOO_MANY:
        return StepError(message, kind="result")
    if state == _CANCELLING:
        return StepError(message)
    return translate(exc)  # type: ignore[arg-type]


def joined(name: str, rows: list[tuple[Any, ...]], results: bool) -> list[Any] | None:
    """What a join returns: each job's result (``results``) or end state, in the order
    given; None while some have not ended (the run suspends). Raises :class:`ChildFailed`
    when some ended ``dead`` or ``cancelled``."""
    if not rows or rows[0][1] != "ended":
        return None
    ended = rows[1:]
    failed = [(int(r[0]), str(r[1]), r[3]) for r in ended if r[1] != "complete"]
    if failed:
        told = "; ".join(f"job {i} {state}" + (f" ({why[:200]})" if why else "")
                         for i, state, why in failed[:5])
        more = f"; and {len(failed) - 5} more" if len(failed) > 5 else ""
        raise ChildFailed(f"join {name!r}: {len(failed)} of {len(ended)} jobs did not "
                          f"complete: {told}{more}", failed)
    if not results:
        return [r[1] for r in ended]
    return [None if r[2] is None else orjson.loads(r[2]) for r in ended]
