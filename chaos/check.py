"""The check: the recorded history against the product's promises, and the printed table.

Pure functions over what the run recorded (jobs rows, handler history, effects, what the
driver did and saw), so that the checks themselves are tested on histories made by hand.

The promises, from README.md and docs/architecture.md:

- every job ends ``complete``, ``dead`` (only once its attempts are spent: every job of the
  workload retries, none discards) or ``cancelled`` (only if an operator cancelled it, and
  always if the cancel was accepted: "a requested cancel always ends the job cancelled");
- no row stays ``running`` after its lease: rescue finds it;
- no two executions of one job overlap: a child that hears no renewal kills its own
  process group before the lease ends, and the lease keeper kills it even when its Python
  cannot run (``chaos.Crunch``: C calls that hold the GIL), "so it is dead before any other
  worker may claim the row". With PostgreSQL's clock for every event, the previous
  execution's last event (tick, effect, end, or a time recorded before or after a C call by
  any of its processes: ``chaos.Crunch``'s double-forked grandchild records under its
  handler's execution) comes before the next execution's start;
- an idempotent handler's effect is therefore present exactly once for each completed job
  (and at most once for any job);
- no process of the run survives its supervisor (children die with it);
- every supervisor the driver did not kill is alive at the end, and stops cleanly.

And for workflows (issue 20), whose steps and compensations record their effect under
``ctx.idempotency_key`` (``wid:step``, ``wid:step:compensate``):

- every completed step's (and compensation's) effect is there exactly once under its key;
- every step that started (a child began its handler: the handler's own ``start`` event,
  or ``atlantis.workflow_step_states``'s ``started``) in a ``failed`` or ``cancelled``
  workflow has its compensation's effect once under its key, and no compensation ran for
  a step that never started;
- no workflow is left ``running`` or ``compensating``; ``compensation_failed`` only after
  a compensation ended ``dead``;
- a workflow's state agrees with its rows: ``complete`` has every step complete and no
  compensation (never one whose step outlasts its timeout); a failure names a dead step;
  ``cancelled`` only if a cancel was asked, and
  always if one was accepted while it ran; a step's row is cancelled only in a workflow
  that stopped, a compensation's never;
- every step saw its predecessors' results and its idempotency key, every compensation its
  step's result and ``ctx.compensating`` (the handler records ``bad-context`` otherwise).

And for limits (issue 21), on ``chaos.Limited`` (``concurrency 2 by account``,
``concurrency 3``): the limit was never exceeded, as seen two ways. The database's: the
driver samples, in one statement (one snapshot), how many of its rows are ``running`` per
account, all through the run; the guarantee is about exactly those rows. The handlers':
no more executions than the limit overlap, per account and in all, by PostgreSQL's clock.
An execution lies within its row's time in ``running`` (it starts after the claim and a
child whose lease is lost kills itself before the row may be rescued), so its interval,
from its ``start`` to its last event, can only be shorter than the row's: an execution cut
short ends at its last recorded event, and a violation seen there is a true one.

And for durable handlers (issue 34, ``chaos.Durable``): every transaction step's effect
exactly once, no step body run again after its record, each durable job finished with its
steps recorded and its sleep kept (:mod:`chaos.durable`). And for durable waits (issue 35,
``chaos.Waiter``, ``chaos.Fan``): every event consumed once, every join saw all its
children, no child spawned twice (:mod:`chaos.waits`); a cancel asked of a job is asked of
its children too (it cascades to them).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from chaos import durable, waits

FINAL = ("complete", "dead", "cancelled")
WORKFLOW_STATES = ("complete", "failed", "cancelled", "compensation_failed")
"""The states a workflow ends in; ``running`` and ``compensating`` must not be left."""
ENDINGS = ("end", "fail", "cancelled", "suspend")
"""The last event of an execution whose handler returned or raised, or whose run ended at a
durable sleep (chaos/app.py)."""
EXAMPLES = 5


@dataclass(frozen=True)
class JobRow:
    id: int
    job: str
    state: str
    attempt: int
    max_attempts: int
    lease_expired: bool
    """``running`` with ``claimed_until`` in the past when the row was read."""
    workflow_id: int | None = None
    step: str | None = None
    compensation: bool = False
    doomed: bool = False
    """A step the workload makes fail every attempt (its ``doom`` arg names it)."""
    parent_id: int | None = None
    """The job that spawned it (``ctx.spawn``)."""


@dataclass(frozen=True)
class WorkflowRow:
    id: int
    state: str
    cause: str | None = None
    """``failed``, ``cancelled`` or ``timeout`` once it stopped; None while it runs or
    after it completed."""
    failed_step: str | None = None
    slow: bool = False
    """One step outlasts the workflow's timeout: it must not end ``complete``."""


@dataclass(frozen=True)
class StepRow:
    """One step of one workflow's graph (``atlantis.workflow_step_states``)."""

    workflow_id: int
    step: str
    compensate: str | None
    job_id: int | None
    comp_job_id: int | None
    started: bool
    """The database's word: a child began the step's handler at least once."""


@dataclass(frozen=True)
class Event:
    job_id: int
    attempt: int
    run: str
    pid: int
    event: str
    at: datetime


@dataclass(frozen=True)
class LimitSample:
    """Rows of ``chaos.Limited`` running at one instant (one statement's snapshot)."""

    at: datetime
    running: dict[str, int]
    """Account -> rows running."""


@dataclass(frozen=True)
class SupervisorFate:
    name: str
    killed: bool
    """The driver killed it with SIGKILL (and started another in its place)."""
    alive_at_end: bool
    stop_code: int | None = None
    """Its exit code after the final SIGTERM (None if it was not alive to receive it)."""
    exit_code: int | None = None
    """How it ended, as ``subprocess`` says (-N: killed by signal N)."""
    told_to_exit: bool = False
    """``tide worker drain --exit`` was asked of it: it may have exited by itself, with 0."""


@dataclass
class History:
    jobs: list[JobRow]
    events: list[Event]
    effects: dict[int, int]
    """Job id -> number of effect rows."""
    cancelled: set[int]
    """Jobs the driver asked to cancel."""
    cancel_accepted: set[int] = field(default_factory=set)
    """Jobs whose cancel ``tide`` accepted (exit 0): they must end cancelled."""
    orphans: list[str] = field(default_factory=list)
    """Processes of the run that survived their supervisor (described)."""
    supervisors: list[SupervisorFate] = field(default_factory=list)
    workflows: list[WorkflowRow] = field(default_factory=list)
    steps: list[StepRow] = field(default_factory=list)
    keyed: dict[str, int] = field(default_factory=dict)
    """Idempotency key of a workflow's step or compensation -> number of effect rows."""
    workflow_cancelled: set[int] = field(default_factory=set)
    """Workflows the driver asked to cancel (directly or through a step's row)."""
    workflow_cancel_running: set[int] = field(default_factory=set)
    """Workflows whose cancel went through while they were ``running``: they must end
    ``cancelled``."""
    limited: dict[int, str] = field(default_factory=dict)
    """Job id of each ``chaos.Limited`` row -> its account."""
    samples: list[LimitSample] = field(default_factory=list)
    per_account: int = 2
    """``concurrency N by account`` of ``chaos.Limited``."""
    in_all: int = 3
    """Its ``concurrency N``."""
    durable: durable.DurableHistory = field(default_factory=durable.DurableHistory)
    """``chaos.Durable``'s plans, step records and transaction steps' effects."""
    waits: waits.WaitHistory = field(default_factory=waits.WaitHistory)
    """The waiters' events and waits, the fan-outs' spawns and joins (issue 35)."""


@dataclass(frozen=True)
class Result:
    name: str
    ok: bool
    detail: str
    examples: tuple[str, ...] = ()


@dataclass(frozen=True)
class Execution:
    job_id: int
    attempt: int
    run: str
    pid: int
    start: datetime
    last: datetime
    last_event: str


def executions(events: Iterable[Event]) -> dict[int, list[Execution]]:
    """Each job's executions (one per ``run`` token), ordered by start."""
    runs: dict[str, list[Event]] = defaultdict(list)
    for e in events:
        runs[e.run].append(e)
    by_job: dict[int, list[Execution]] = defaultdict(list)
    for run, evs in runs.items():
        first = min(evs, key=lambda e: e.at)
        last = max(evs, key=lambda e: e.at)
        start = min((e.at for e in evs if e.event == "start"), default=first.at)
        by_job[first.job_id].append(Execution(first.job_id, first.attempt, run, first.pid,
                                              start, last.at, last.event))
    for runs_of_job in by_job.values():
        runs_of_job.sort(key=lambda x: (x.start, x.last))
    return by_job


def _examples(items: Iterable[str]) -> tuple[str, ...]:
    return tuple(list(items)[:EXAMPLES])


def check_final(h: History) -> Result:
    states = Counter(j.state for j in h.jobs)
    bad = [j for j in h.jobs if j.state not in FINAL]
    detail = ", ".join(f"{states[s]} {s}" for s in FINAL)
    if bad:
        detail += f"; {len(bad)} not finished"
    return Result("every job complete, dead or cancelled", not bad, detail,
                  _examples(f"job {j.id} {j.state} attempt {j.attempt}/{j.max_attempts}"
                            for j in bad))


def check_dead(h: History) -> Result:
    dead = [j for j in h.jobs if j.state == "dead"]
    early = [j for j in dead if j.attempt != j.max_attempts]
    over = [j for j in h.jobs if j.attempt > j.max_attempts]
    bad = early + [j for j in over if j not in early]
    doomed = sum(1 for j in dead if j.doomed or j.job == "chaos.Doomed")
    return Result("dead only after all its retries, none past them", not bad,
                  f"{len(dead)} dead ({doomed} doomed by design, {len(dead) - doomed} worn out "
                  f"by faults), {len(bad)} wrong",
                  _examples(f"job {j.id} {j.state} after attempt {j.attempt}/{j.max_attempts}"
                            for j in bad))


def asked(h: History) -> set[int]:
    """The jobs a cancel was asked of, directly or through a job they descend from (a
    cancel cascades to a job's children)."""
    children: dict[int, list[int]] = defaultdict(list)
    for j in h.jobs:
        if j.parent_id is not None:
            children[j.parent_id].append(j.id)
    found, todo = set(h.cancelled), list(h.cancelled)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def check_cancelled(h: History) -> Result:
    """Jobs outside workflows: a workflow's rows are cancelled with their workflow
    (:func:`check_workflow_states`)."""
    states = {j.id: j.state for j in h.jobs if j.workflow_id is None}
    cancelled = [i for i, state in states.items() if state == "cancelled"]
    wanted = asked(h)
    bad = [f"job {i} cancelled, never asked (nor of a parent)" for i in cancelled
           if i not in wanted]
    bad += [f"job {i} {states.get(i)}, though its cancel was accepted"
            for i in sorted(h.cancel_accepted) if states.get(i) != "cancelled"]
    return Result("cancelled if and only if a cancel was accepted", not bad,
                  f"{len(h.cancelled)} cancels asked, {len(h.cancel_accepted)} accepted, "
                  f"{len(cancelled)} jobs cancelled", _examples(bad))


def check_stuck(h: History) -> Result:
    bad = [j for j in h.jobs if j.state == "running" and j.lease_expired]
    return Result("none stuck running after its lease", not bad,
                  f"{len(bad)} stuck",
                  _examples(f"job {j.id} running attempt {j.attempt}, lease expired" for j in bad))


def check_overlap(h: History) -> Result:
    by_job = executions(h.events)
    bad: list[str] = []
    reruns = 0
    for job_id, runs in sorted(by_job.items()):
        reruns += len(runs) - 1
        latest: Execution | None = None
        for x in runs:
            if latest is not None and x.start <= latest.last:
                bad.append(f"job {job_id}: attempt {latest.attempt} (pid {latest.pid}) "
                           f"{latest.last_event} at {latest.last.isoformat()} is not before "
                           f"attempt {x.attempt} (pid {x.pid}) start at {x.start.isoformat()}")
            if latest is None or x.last > latest.last:
                latest = x
    total = sum(len(r) for r in by_job.values())
    cut_short = sum(1 for r in by_job.values() for x in r if x.last_event not in ENDINGS)
    return Result("no two attempts of one job overlap", not bad,
                  f"{total} executions of {len(by_job)} jobs, {reruns} re-executions, "
                  f"{cut_short} cut short, {len(bad)} overlaps", _examples(bad))


def check_effects(h: History) -> Result:
    """Jobs outside workflows (keyed by job id); a workflow's: :func:`check_step_effects`."""
    complete = [j for j in h.jobs if j.state == "complete" and j.workflow_id is None]
    missing = [j.id for j in complete if h.effects.get(j.id, 0) == 0]
    doubled = sorted(i for i, n in h.effects.items() if n > 1)
    bad = [f"job {i}: complete, no effect" for i in missing]
    bad += [f"job {i}: {h.effects[i]} effects" for i in doubled]
    once = sum(1 for j in complete if h.effects.get(j.id, 0) == 1)
    return Result("each completed job's effect present exactly once", not bad,
                  f"{once}/{len(complete)} exactly once, {len(missing)} missing, "
                  f"{len(doubled)} doubled", _examples(bad))


def check_orphans(h: History) -> Result:
    return Result("no orphan process survives", not h.orphans, f"{len(h.orphans)} orphans",
                  _examples(h.orphans))


def check_supervisors(h: History) -> Result:
    spared = [s for s in h.supervisors if not s.killed]
    exited = [s for s in spared if s.told_to_exit and not s.alive_at_end]
    dead = [s for s in spared if not s.alive_at_end and s not in exited]
    unclean = [s for s in spared if s.alive_at_end and s.stop_code != 0]
    killed = len(h.supervisors) - len(spared)
    bad = [f"{s.name} died though never killed (exit code {s.exit_code})" for s in dead]
    bad += [f"{s.name} exited {s.exit_code} once drained (--exit)" for s in exited
            if s.exit_code != 0]
    bad += [f"{s.name} exited {s.stop_code} on SIGTERM" for s in unclean]
    return Result("every supervisor not killed is alive (and stops cleanly)", not bad,
                  f"{len(spared) - len(dead) - len(exited)}/{len(spared)} alive, {killed} killed "
                  f"and replaced, {len(exited)} exited once drained",
                  _examples(bad))


def key(row: JobRow) -> str:
    """The idempotency key a workflow's row records its effect under (``ctx.idempotency_key``)."""
    return f"{row.workflow_id}:{row.step}" + (":compensate" if row.compensation else "")


def started_steps(h: History) -> set[tuple[int, str]]:
    """(workflow, step) of every step that started: its handler recorded a start, or the
    database says a child began it (a child killed before its first write)."""
    began = {e.job_id for e in h.events if e.event == "start"}
    return {(s.workflow_id, s.step) for s in h.steps
            if s.started or (s.job_id is not None and s.job_id in began)}


def check_step_effects(h: History) -> Result:
    done = [j for j in h.jobs if j.workflow_id is not None and j.state == "complete"]
    missing = [key(j) for j in done if h.keyed.get(key(j), 0) == 0]
    doubled = sorted(k for k, n in h.keyed.items() if n > 1)
    bad = [f"{k}: complete, no effect" for k in missing]
    bad += [f"{k}: {h.keyed[k]} effects" for k in doubled]
    once = sum(1 for j in done if h.keyed.get(key(j), 0) == 1)
    undos = sum(1 for j in done if j.compensation)
    return Result("each completed step's effect once under its key", not bad,
                  f"{once}/{len(done)} exactly once ({len(done) - undos} steps, {undos} "
                  f"compensations), {len(missing)} missing, {len(doubled)} doubled",
                  _examples(bad))


def check_compensated(h: History) -> Result:
    ended = {w.id: w for w in h.workflows if w.state in ("failed", "cancelled")}
    started = started_steps(h)
    due = [s for s in h.steps if s.workflow_id in ended and s.compensate is not None
           and (s.workflow_id, s.step) in started]
    bad: list[str] = []
    for s in due:
        n = h.keyed.get(f"{s.workflow_id}:{s.step}:compensate", 0)
        if n != 1:
            bad.append(f"workflow {s.workflow_id} {ended[s.workflow_id].state}: step {s.step} "
                       f"started, its compensation's effect recorded {n} times")
    for j in h.jobs:
        if j.compensation and (j.workflow_id, j.step) not in started:
            bad.append(f"workflow {j.workflow_id}: step {j.step} never started, yet compensated "
                       f"(job {j.id} {j.state})")
    return Result("every started step of a failed or cancelled workflow compensated once",
                  not bad, f"{len(ended)} failed or cancelled workflows, {len(due)} started "
                  f"steps to undo, {len(bad)} wrong", _examples(bad))


def check_workflows_finished(h: History) -> Result:
    states = Counter(w.state for w in h.workflows)
    undo_dead = {j.workflow_id for j in h.jobs if j.compensation and j.state == "dead"}
    bad = [f"workflow {w.id} {w.state}" for w in h.workflows if w.state not in WORKFLOW_STATES]
    bad += [f"workflow {w.id} compensation_failed, yet no compensation is dead"
            for w in h.workflows if w.state == "compensation_failed" and w.id not in undo_dead]
    timeouts = sum(1 for w in h.workflows if w.cause == "timeout")
    detail = ", ".join(f"{states[s]} {s}" for s in WORKFLOW_STATES) + f" ({timeouts} timed out)"
    unfinished = sum(1 for w in h.workflows if w.state not in WORKFLOW_STATES)
    if unfinished:
        detail += f"; {unfinished} not finished"
    return Result("no workflow left running or compensating", not bad, detail, _examples(bad))


def check_workflow_states(h: History) -> Result:
    workflows = {w.id: w for w in h.workflows}
    rows: dict[int, list[JobRow]] = defaultdict(list)
    for j in h.jobs:
        if j.workflow_id is not None:
            rows[j.workflow_id].append(j)
    graph: dict[int, list[StepRow]] = defaultdict(list)
    for s in h.steps:
        graph[s.workflow_id].append(s)
    bad: list[str] = []
    for w in h.workflows:
        forward = {j.step: j for j in rows[w.id] if not j.compensation}
        if w.state == "complete":
            behind = [s.step for s in graph[w.id]
                      if s.step not in forward or forward[s.step].state != "complete"]
            if behind or not graph[w.id]:
                bad.append(f"workflow {w.id} complete, step(s) {behind} not")
            if any(j.compensation for j in rows[w.id]):
                bad.append(f"workflow {w.id} complete, with a compensation")
        failed = forward.get(w.failed_step) if w.failed_step is not None else None
        if w.cause == "failed" and (failed is None or failed.state != "dead"):
            bad.append(f"workflow {w.id} failed at step {w.failed_step}, whose row is "
                       f"{failed.state if failed else 'missing'}")
        if w.slow and w.state == "complete":
            bad.append(f"workflow {w.id} complete, though a step outlasts its timeout")
        if w.cause == "cancelled" and w.id not in h.workflow_cancelled:
            bad.append(f"workflow {w.id} cancelled, never asked")
    for wid in sorted(h.workflow_cancel_running):
        got = workflows.get(wid)
        if got is None or got.cause != "cancelled":
            bad.append(f"workflow {wid} {got.state if got else 'missing'}, though cancelled "
                       "while it ran")
    for j in h.jobs:
        if j.workflow_id is None or j.state != "cancelled":
            continue
        owner = workflows.get(j.workflow_id)
        if j.compensation:
            bad.append(f"job {j.id}, the compensation of {key(j)}, cancelled")
        elif owner is None or owner.cause is None:
            bad.append(f"job {j.id} (step {key(j)}) cancelled in a workflow "
                       f"{owner.state if owner else 'missing'}")
    return Result("each workflow's state agrees with its rows", not bad,
                  f"{len(h.workflow_cancelled)} cancels asked, "
                  f"{len(h.workflow_cancel_running)} while running, "
                  f"{sum(1 for w in h.workflows if w.cause == 'cancelled')} workflows "
                  f"cancelled; {len(bad)} wrong", _examples(bad))


def check_contexts(h: History) -> Result:
    ours = {j.id for j in h.jobs if j.workflow_id is not None}
    seen = sum(1 for e in h.events if e.event == "start" and e.job_id in ours)
    bad = sorted({e.job_id for e in h.events if e.event == "bad-context"})
    return Result("each step saw its key, its predecessors' results", not bad,
                  f"{seen} executions of workflow rows, {len(bad)} saw a wrong context",
                  _examples(f"job {i}: a wrong ctx.results, idempotency_key or compensating"
                            for i in bad))


def _at(t: datetime) -> str:
    return t.isoformat(timespec="microseconds")


def limit_overlaps(h: History) -> tuple[list[str], dict[str, int], int]:
    """Violations seen in the handlers' intervals of ``chaos.Limited``: (messages, peak
    per account, peak in all). A sweep over starts and ends; at equal instants an end
    comes first (the intervals are taken as half-open)."""
    marks: list[tuple[datetime, int, str, str, str]] = []  # (at, +1/-1, account, run, job#attempt)
    for job_id, runs in executions(e for e in h.events if e.job_id in h.limited).items():
        account = h.limited[job_id]
        for x in runs:
            if x.last <= x.start:
                continue  # killed as it began: only its start recorded, it overlaps nothing
            marks += [(x.start, 1, account, x.run, f"{job_id}#{x.attempt}"),
                      (x.last, -1, account, x.run, f"{job_id}#{x.attempt}")]
    marks.sort(key=lambda m: (m[0], m[1]))
    running: dict[str, dict[str, str]] = defaultdict(dict)  # account -> run -> job#attempt
    everyone: dict[str, tuple[str, str]] = {}  # run -> (job#attempt, account)
    peak: Counter[str] = Counter()
    peak_all = 0
    bad: list[str] = []
    for at_, step, account, run, name in marks:
        if step < 0:
            running[account].pop(run, None)
            everyone.pop(run, None)
            continue
        running[account][run] = name
        everyone[run] = (name, account)
        peak[account] = max(peak[account], len(running[account]))
        peak_all = max(peak_all, len(everyone))
        if len(running[account]) > h.per_account:
            jobs = ", ".join(running[account].values())
            bad.append(f"account {account}: {len(running[account])} executions at once at "
                       f"{_at(at_)} (limit {h.per_account}): jobs {jobs}")
        if len(everyone) > h.in_all:
            jobs = ", ".join(f"{n} ({acc})" for n, acc in everyone.values())
            bad.append(f"{len(everyone)} executions at once in all at {_at(at_)} "
                       f"(limit {h.in_all}): jobs {jobs}")
    return bad, dict(peak), peak_all


def limit_samples(h: History) -> tuple[list[str], int, int]:
    """Violations in the sampled counts of running rows: (messages, peak per account, peak
    in all)."""
    bad: list[str] = []
    peak = peak_all = 0
    for s in h.samples:
        total = sum(s.running.values())
        peak_all = max(peak_all, total)
        for account, n in sorted(s.running.items()):
            peak = max(peak, n)
            if n > h.per_account:
                bad.append(f"account {account}: {n} rows running at {_at(s.at)} "
                           f"(limit {h.per_account})")
        if total > h.in_all:
            bad.append(f"{total} rows running in all at {_at(s.at)} (limit {h.in_all}): "
                       + ", ".join(f"{a} {n}" for a, n in sorted(s.running.items())))
    return bad, peak, peak_all


def check_limits(h: History) -> Result:
    seen, peak, peak_all = limit_overlaps(h)
    sampled, s_peak, s_peak_all = limit_samples(h)
    n_exec = sum(len(r) for r in executions(e for e in h.events
                                            if e.job_id in h.limited).values())
    detail = (f"limits {h.per_account} by account, {h.in_all} in all; "
              f"{len(h.samples)} samples of running rows: peak {s_peak} per account, "
              f"{s_peak_all} in all, {len(sampled)} over; {n_exec} executions of "
              f"{len(h.limited)} jobs over {len(set(h.limited.values()))} accounts: peak "
              f"{max(peak.values(), default=0)} per account, {peak_all} in all, "
              f"{len(seen)} over")
    return Result("the limit was never exceeded", not (seen or sampled), detail,
                  _examples([*sampled[:EXAMPLES - 2], *seen]))


def check(h: History) -> list[Result]:
    return [check_final(h), check_dead(h), check_cancelled(h), check_stuck(h),
            check_overlap(h), check_effects(h), check_orphans(h), check_supervisors(h),
            check_workflows_finished(h), check_workflow_states(h), check_step_effects(h),
            check_compensated(h), check_contexts(h), check_limits(h), *durable.checks(h),
            *waits.checks(h)]


def table(faults: list[tuple[str, int, str]], results: list[Result]) -> str:
    """The printed report: fault counts, then each check with pass/fail and counts."""
    width = max(len(n) for n, _, _ in faults) if faults else 10
    width = max(width, *(len(r.name) for r in results))
    lines = [f"{'fault injected':<{width}}  {'count':>5}  ", "-" * (width + 30)]
    for name, count, note in faults:
        lines.append(f"{name:<{width}}  {count:>5}  {note}".rstrip())
    lines += ["", f"{'check':<{width}}  {'result':>6}  counts", "-" * (width + 30)]
    for r in results:
        lines.append(f"{r.name:<{width}}  {'pass' if r.ok else 'FAIL':>6}  {r.detail}")
        lines += [f"{'':<{width}}          {example}" for example in r.examples]
    return "\n".join(lines)
