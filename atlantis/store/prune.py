"""``tide db sync --prune``: remove the declarations an app no longer declares.

An app's own declarations are those in the namespaces its declarations (jobs and workflows)
use, the part of a qualified name before its dot: ``atlantis.job_types`` and
``atlantis.workflow_types`` record no app, and a namespace belongs to one app. Of those, the
ones the app does not declare are the candidates; each is removed, or kept for a reason:

* a job declaration with waiting or running rows (``available``, ``running``), a schedule,
  a workflow declaration (any app's) whose steps or compensations use it, or a live
  supervisor (its ``atlantis.workers`` row not expired) whose served jobs list it: an older
  release of a rolling deploy still serving it;
* a workflow declaration with instances not ended (running, compensating, or
  compensation_failed and not dismissed). A job used only by workflow declarations removed
  in the same run is not kept for them.

:func:`plan` only reads. :func:`prune` takes the plan again in one transaction with the
candidates locked (a sync of one of them waits for the commit, then inserts it anew), and
removes what it allows.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import psycopg

from atlantis.store.queries import Q

Conn = psycopg.Connection[Any]


@dataclass(frozen=True)
class Decision:
    """One declaration the app no longer declares: ``kind`` is ``job`` or ``workflow``;
    ``reasons`` is empty when it may go, else each thing that keeps it."""

    kind: str
    name: str
    reasons: tuple[str, ...] = ()

    @property
    def removable(self) -> bool:
        return not self.reasons


def namespaces_of(names: Iterable[str]) -> list[str]:
    """The namespaces of qualified names (``durable`` of ``durable.Import``)."""
    return sorted({name.split(".", 1)[0] for name in names})


def plan(conn: Conn, namespaces: list[str], jobs: list[str],
         workflows: list[str]) -> list[Decision]:
    """The declarations of ``namespaces`` that are not in ``jobs`` or ``workflows`` (the
    app's), workflows first, each with what keeps it."""
    found: list[Decision] = []
    for name, active in conn.execute(
            Q.prune_workflows, {"namespaces": namespaces, "declared": workflows}).fetchall():
        reasons = (f"{active} instance{'s' if active != 1 else ''} not ended "
                   f"(running, compensating or compensation_failed)",) if active else ()
        found.append(Decision("workflow", name, reasons))
    leaving = [d.name for d in found if d.removable]
    params = {"namespaces": namespaces, "declared": jobs, "leaving": leaving}
    for name, schedule, active, users, supervisors in conn.execute(
            Q.prune_jobs, params).fetchall():
        found.append(Decision("job", name, _job_reasons(schedule, active, users, supervisors)))
    return found


def _job_reasons(schedule: str | None, active: int, users: list[str],
                 supervisors: list[str]) -> tuple[str, ...]:
    reasons = []
    if active:
        reasons.append(f"{active} waiting or running row{'s' if active != 1 else ''}")
    if schedule is not None:
        reasons.append(f"a schedule ({schedule!r}): sync a release that declares it without "
                       f"one first")
    if users:
        reasons.append(f"used by workflow {', '.join(users)}")
    if supervisors:
        reasons.append(f"served by live supervisor {', '.join(supervisors)}")
    return tuple(reasons)


def prune(conn: Conn, namespaces: list[str], jobs: list[str],
          workflows: list[str]) -> list[Decision]:
    """Remove what :func:`plan` allows, in one transaction: the candidates are locked first,
    then the plan is taken again under the locks; returns that plan (what was removed and
    what was kept). ``conn`` must not be in a transaction of the caller's."""
    with conn.transaction():
        first = plan(conn, namespaces, jobs, workflows)
        locked = set()
        for kind, lock in (("workflow", Q.prune_lock_workflows), ("job", Q.prune_lock_jobs)):
            names = [d.name for d in first if d.kind == kind]
            locked |= {(kind, row[0]) for row in conn.execute(lock, {"names": names})}
        # Taken again under the locks; one that appeared since the first look was not locked,
        # and is kept for the next run.
        final = [d if (d.kind, d.name) in locked else Decision(d.kind, d.name, ("synced meanwhile",))
                 for d in plan(conn, namespaces, jobs, workflows)]
        for kind, delete in (("workflow", Q.prune_delete_workflows), ("job", Q.prune_delete_jobs)):
            conn.execute(delete, {"names": [d.name for d in final
                                            if d.kind == kind and d.removable]})
    return final
