"""The check: the recorded history against the product's promises, and the printed table.

Pure functions over what the run recorded (jobs rows, handler history, effects, what the
driver did and saw), so that the checks themselves are tested on histories made by hand.

The promises, from README.md and docs/architecture.md:

- every job ends ``complete``, ``dead`` (only once its attempts are spent: every job of the
  workload retries, none discards) or ``cancelled`` (only if an operator cancelled it, and
  always if the cancel was accepted: "a requested cancel always ends the job cancelled");
- no row stays ``running`` after its lease: rescue finds it;
- no two executions of one job overlap: a child that hears no renewal kills its own
  process group before the lease ends, "so it is dead before any other worker may claim
  the row". With PostgreSQL's clock for every event, the previous execution's last event
  (tick, effect, end) comes before the next execution's start;
- an idempotent handler's effect is therefore present exactly once for each completed job
  (and at most once for any job);
- no process of the run survives its supervisor (children die with it);
- every supervisor the driver did not kill is alive at the end, and stops cleanly.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

FINAL = ("complete", "dead", "cancelled")
ENDINGS = ("end", "fail", "cancelled")
"""The last event of an execution whose handler returned or raised (chaos/app.py)."""
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


@dataclass(frozen=True)
class Event:
    job_id: int
    attempt: int
    run: str
    pid: int
    event: str
    at: datetime


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
    doomed = sum(1 for j in dead if j.job == "chaos.Doomed")
    return Result("dead only after all its retries, none past them", not bad,
                  f"{len(dead)} dead ({doomed} doomed by design, {len(dead) - doomed} worn out "
                  f"by faults), {len(bad)} wrong",
                  _examples(f"job {j.id} {j.state} after attempt {j.attempt}/{j.max_attempts}"
                            for j in bad))


def check_cancelled(h: History) -> Result:
    states = {j.id: j.state for j in h.jobs}
    cancelled = [i for i, state in states.items() if state == "cancelled"]
    bad = [f"job {i} cancelled, never asked" for i in cancelled if i not in h.cancelled]
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
    complete = [j for j in h.jobs if j.state == "complete"]
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
    dead = [s for s in spared if not s.alive_at_end]
    unclean = [s for s in spared if s.alive_at_end and s.stop_code != 0]
    killed = len(h.supervisors) - len(spared)
    bad = [f"{s.name} died though never killed (exit code {s.exit_code})" for s in dead]
    bad += [f"{s.name} exited {s.stop_code} on SIGTERM" for s in unclean]
    return Result("every supervisor not killed is alive (and stops cleanly)", not bad,
                  f"{len(spared) - len(dead)}/{len(spared)} alive, {killed} killed and replaced",
                  _examples(bad))


def check(h: History) -> list[Result]:
    return [check_final(h), check_dead(h), check_cancelled(h), check_stuck(h),
            check_overlap(h), check_effects(h), check_orphans(h), check_supervisors(h)]


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
