"""How ``tide`` shows a job to a person, and the durations and ages every listing uses.

Ages and delays are relative and short ("12s ago", "in 3m"), measured against the
database's clock. Colour is added with :func:`click.style`, and appears only on a
terminal: ``click.echo`` strips it from a pipe. The listings' tables are in ``tables.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import click
import orjson

from atlantis.cli.escape import safe
from atlantis.limits import clamp_pct
from atlantis.presentation import job_estimate, suspension_text
from atlantis.store.admin import AttemptRow, JobRow, parse_worker
from atlantis.store.liveness import Holder
from atlantis.units import format_duration, format_size

BAR_WIDTH = 30
#: A job's result is shown cut to this many characters of its JSON (``--json`` has it whole).
RESULT_CHARS = 400
#: Attempt outcomes that spend no attempt: a snooze, a release (drained), a suspend (a
#: handler's durable sleep); shown without colour.
UNSPENT = ("snooze", "release", "suspend")
#: The colour of each state, on a terminal.
STATE_STYLES = {"available": "cyan", "running": "blue", "complete": "green", "dead": "red",
                "cancelled": "yellow"}


# ---- durations and ages -----------------------------------------------------------------

def short_duration(seconds: float) -> str:
    """A duration a person reads at a glance: at most two units, rounded to the second.

    ``4`` -> ``4s``, ``192`` -> ``3m12s``, ``180`` -> ``3m``, ``7500`` -> ``2h5m``,
    ``93600`` -> ``1d2h``. Below a second: ``0.25`` -> ``250ms``.
    """
    seconds = abs(seconds)
    if seconds < 1:
        return f"{round(seconds * 1000)}ms" if seconds else "0s"
    total = round(seconds)
    units = (("d", 86_400), ("h", 3600), ("m", 60), ("s", 1))
    for i, (name, size) in enumerate(units):
        if total >= size:
            major, rest = divmod(total, size)
            if i + 1 < len(units):
                minor_name, minor_size = units[i + 1]
                minor = rest // minor_size
                if minor:
                    return f"{major}{name}{minor}{minor_name}"
            return f"{major}{name}"
    return "0s"  # pragma: no cover - total >= 1 here


def relative(then: datetime | None, now: datetime) -> str:
    """``then`` seen from ``now``: ``12s ago``, ``in 3m``, ``just now``; ``-`` for None."""
    if then is None:
        return "-"
    seconds = (now - then).total_seconds()
    if abs(seconds) < 1:
        return "just now"
    return f"{short_duration(seconds)} ago" if seconds > 0 else f"in {short_duration(seconds)}"


def since(then: datetime | None, now: datetime) -> str:
    """How long ago ``then`` was, without the ``ago`` (for "waiting 12s"); ``-`` for None."""
    if then is None:
        return "-"
    return short_duration(max((now - then).total_seconds(), 0.0))


def progress_bar(pct: float | None, width: int = BAR_WIDTH) -> str:
    value = clamp_pct(pct)
    filled = round(width * value / 100)
    return "[" + "#" * filled + "-" * (width - filled) + f"] {value:3d}%"


def rate_text(rate: float | None) -> str:
    if rate is None:
        return "-"
    return f"{rate:.2g}%/min" if abs(rate) < 1 else f"{rate:.1f}%/min"


def _stamp(at: datetime) -> str:
    return f"{at.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"


# ---- one job ----------------------------------------------------------------------------

def holder_text(worker: str | None) -> str:
    """``host pid N`` of a worker id ``host:pid:random``."""
    parsed = parse_worker(worker)
    if parsed is None:
        return "-"
    host, pid = parsed
    host = safe(host)
    return host if pid is None else f"{host} pid {pid}"


def status_text(job: JobRow, attempts: Sequence[AttemptRow] = (), *,
                held: str | None = None, steps: dict[str, Any] | None = None,
                holder: Holder | None = None,
                notes: Sequence[tuple[str, str]] = ()) -> str:
    """``tide job status``: what a person asks of a job, one fact a line; ``held``: what
    limit holds it (``atlantis.limit_hold``), shown under its state; ``steps``: its handler
    steps and what it sleeps for (``presentation.read_handler_steps``); ``holder``: a
    running job's holder as the fleet sees it (silent or not); ``notes``: (label, text)
    lines a person should not miss (``no handler``), shown under its state too."""
    now = job.db_now
    lines = [f"job {job.id}  {safe(job.job)}  queue {safe(job.queue)}"]

    def add(label: str, text: str) -> None:
        lines.append(f"  {label:<11}{text}")

    state = click.style(job.state, fg=_fg(job.state), bold=job.running)
    flags = ""
    if job.stalled:
        flags = "  " + click.style("STALLED", fg="red", bold=True)
    run = f"run {job.run}, " if job.run > 1 else ""
    add("state", f"{state}  {run}attempt {job.attempt}/{job.max_attempts}{flags}")
    if held:
        add("held", click.style(safe(held), fg="yellow"))
    for label, note in notes:
        add(label, click.style(safe(note), fg="yellow"))
    if steps is not None and steps.get("suspended_for") and job.state == "available":
        add(*suspension_line(steps["suspended_for"], steps["suspended_until"], now))
    if job.parent_id is not None:
        add("parent", f"job {job.parent_id}  (tide job status {job.parent_id})")
    if steps is not None and steps.get("children"):
        add("children", children_text(steps["children"]))
    if job.workflow_id is not None:
        role = "compensation of step" if job.compensation else "step"
        add("workflow", f"{job.workflow_id}  {role} {safe(job.step or '?')}  "
                        f"(tide workflow status {job.workflow_id})")
    if job.progress_pct is not None or job.progress_msg:
        msg = f"  {safe(job.progress_msg)}" if job.progress_msg else ""
        add("progress", f"{progress_bar(job.progress_pct)}{msg}  ({relative(job.progress_at, now)})")
    else:
        add("progress", f"{progress_bar(None)}  (no checkpoint yet)")
    guess = job_estimate(job)
    if job.running:  # a finished or waiting job has no rate or ETA (issue 36)
        eta = "-"
        if guess.eta_seconds is not None:
            eta = f"{short_duration(guess.eta_seconds)}" if guess.eta_seconds >= 1 else "now"
            eta += f" (about {_stamp(now + timedelta(seconds=guess.eta_seconds))})"
        add("rate", f"{rate_text(guess.rate)}  ETA {eta}")
    if job.running:
        for label, text in _lease_lines(job, holder):
            add(label, text)
    elif job.claimed_by:
        add("worker", f"{holder_text(job.claimed_by)}  ({safe(job.claimed_by)})")
    if job.cancel_requested_at is not None and not job.finished:
        add("cancel", f"requested {relative(job.cancel_requested_at, now)}"
                      f" by {safe(job.cancelled_by or '?')}; the job ends cancelled")
    elif job.state == "cancelled" and job.cancelled_by:
        add("cancel", f"by {safe(job.cancelled_by)}")
    add("created", f"{_stamp(job.created_at)} ({relative(job.created_at, now)})")
    if job.state == "available" and job.run_at.year < 9999:  # 9999: a wait with no deadline
        add("runs at", f"{_stamp(job.run_at)} ({relative(job.run_at, now)})")
    elif job.state == "available":
        add("runs at", "when what it waits for comes")
    if job.started_at is not None:
        add("started", f"{_stamp(job.started_at)} ({relative(job.started_at, now)})")
    if job.finished_at is not None:
        took = ""
        if job.started_at is not None and job.finished_at >= job.started_at:
            took = f", ran {short_duration((job.finished_at - job.started_at).total_seconds())}"
        add("finished", f"{_stamp(job.finished_at)} ({relative(job.finished_at, now)}{took})")
    if job.result is not None:
        add("result", result_text(job.result))
    if job.retried_at is not None:
        add("retried", f"by {safe(job.retried_by or '?')} {relative(job.retried_at, now)}")
    add("limits", f"timeout {format_duration(job.timeout)}, heartbeat "
                  f"{format_duration(job.heartbeat)}, stall {format_duration(job.stall_after)}")
    if steps is not None:
        for i, line in enumerate(step_lines(job.id, steps["handler_steps"], now)):
            add("steps" if i == 0 else "", line)
    timeline = attempt_lines(job, attempts)
    for i, line in enumerate(timeline):
        add("attempts" if i == 0 else "", line)
    if job.last_error:
        # A traceback stays on its lines, each indented under the first.
        add("error", safe(job.last_error, multiline=True).replace("\n", "\n" + " " * 13))
    if job.error_count:
        add("failures", f"{job.error_count} in all (the last {len(job.errors)} kept in errors)")
    return "\n".join(lines)


def _lease_lines(job: JobRow, holder: Holder | None = None) -> list[tuple[str, str]]:
    """A running job's holder (and whether it is silent), lease and last checkpoint:
    (label, text) lines."""
    now = job.db_now
    out = [("holder", f"{holder_text(job.claimed_by)}  ({safe(job.claimed_by)})")]
    if holder is not None and holder.silent:
        out.append(("", click.style(silence_text(holder), fg="red", bold=True)))
    if job.claimed_until is not None:
        left = (job.claimed_until - now).total_seconds()
        expiry = f"expires {relative(job.claimed_until, now)}" if left > 0 else click.style(
            f"expired {relative(job.claimed_until, now)}", fg="red")
        out.append(("lease", f"{expiry}, renewed {relative(job.last_renewal, now)}"))
    quiet = since(job.last_checkpoint, now)
    what = "since the claim (no checkpoint yet)" if job.progress_at is None or (
        job.started_at is not None and job.progress_at < job.started_at) else "ago"
    note = f"{quiet} {what}; stalled after {short_duration(job.stall_after)}"
    out.append(("checkpoint", click.style(note, fg="red") if job.stalled else note))
    return out


def silence_text(holder: Holder) -> str:
    """``holder silent for 42s; lease ends in 6m18s``: a running job whose supervisor was
    not seen for two of its liveness intervals."""
    silent = "holder silent" + (f" for {short_duration(holder.seen_seconds)}"
                                if holder.seen_seconds is not None else " (no worker row)")
    left = holder.lease_left
    if left is None:
        return silent
    if left > 0:
        return f"{silent}; lease ends in {short_duration(left)}"
    return f"{silent}; lease ended {short_duration(left)} ago, the next rescue releases it"


def cancel_running_text(job_id: int, holder: Holder | None) -> str:
    """What ``tide job cancel`` says of a running job: its supervisor stops it, or, when
    that supervisor is silent, that nobody may be there to, and when the job ends."""
    if holder is None or not holder.silent:
        return f"job {job_id} is running; its supervisor is stopping it"
    ends = ("when the next rescue releases it" if holder.lease_left is None
            or holder.lease_left <= 0 else f"in {short_duration(holder.lease_left)}, "
            "when its lease ends (or sooner, if a supervisor on its host finds it gone)")
    return (f"job {job_id} is running, but its {silence_text(holder).split(';')[0]}: the "
            f"cancel is recorded, and the job ends cancelled {ends}")


def children_text(by_state: dict[str, int]) -> str:
    """A job's children by state, waiting first: ``2 running, 5 complete``."""
    order = ("available", "running", "complete", "dead", "cancelled")
    names = {"available": "waiting"}
    parts = [f"{by_state[s]} {names.get(s, s)}" for s in order if by_state.get(s)]
    return ", ".join(parts) + f"  ({sum(by_state.values())} in all)"


def suspension_line(suspended_for: str, until: datetime | None,
                    now: datetime) -> tuple[str, str]:
    """The label and text of what a suspended job waits for: ``asleep`` in handler step
    ``nap`` until its wake time."""
    when = (f" until {_stamp(until)} ({relative(until, now)})"
            if until is not None else "")
    label, what = suspension_text(suspended_for)
    return label, f"{safe(what)}{when}"


def step_lines(job_id: int, summary: dict[str, Any], now: datetime) -> list[str]:
    """A job's handler steps: how many records and their size, then the last few (name,
    kind, age, size), oldest first; nothing for a job that has none."""
    count, last = summary["records"], summary["last"]
    if not count:
        return []
    records = "1 record" if count == 1 else f"{count} records"
    more = (f"; the last {len(last)} below, tide job steps {job_id} lists them all"
            if count > len(last) else f"; tide job steps {job_id} shows their values")
    out = [f"{records}, {format_size(summary['bytes'])}{more}"]
    names = max((len(safe(r["name"])) for r in last), default=0)
    kinds = max((len(safe(r["kind"])) for r in last), default=0)
    for r in last:
        at = r["at"]
        age = relative(at, now) if isinstance(at, datetime) else safe(str(at))
        out.append(f"{safe(r['name']):<{names}}  {safe(r['kind']):<{kinds}}  {age}  "
                   f"{format_size(int(r['bytes']))}")
    return out


def result_text(value: Any, limit: int = RESULT_CHARS) -> str:
    """A job's result as one line of JSON, cut to ``limit`` characters saying how long it is."""
    text = orjson.dumps(value).decode()
    if len(text) > limit:
        text = (f"{text[:limit]}... ({len(text)} characters in all; "
                "tide job status --json shows it whole)")
    return safe(text)


def attempt_lines(job: JobRow, attempts: Sequence[AttemptRow]) -> list[str]:
    """The timeline: one line per ended attempt, then the running one. Once the job has been
    retried, each line names its run too (``run 2 #1``): attempts count from 1 again in each
    run."""
    now = job.db_now
    runs = job.run > 1 or any(a.run > 1 for a in attempts)

    def number(run: int, attempt: int) -> str:
        return f"run {run} #{attempt}" if runs else f"#{attempt}"

    out = []
    for a in attempts:
        ran = "-"
        if a.started_at is not None:
            ran = short_duration((a.finished_at - a.started_at).total_seconds())
        outcome = safe(outcome_text(a.outcome, a.error_kind))
        where = safe(a.host) if a.host else holder_text(a.worker)
        if a.pid is not None:
            where += f" pid {a.pid}"
        if a.child_pid is not None:
            where += f" child {a.child_pid}"
        logs = f"  {a.log_lines} log lines" if a.log_lines else ""
        if a.log_dropped:
            logs += f" ({a.log_dropped} dropped)"
        started = relative(a.started_at, now) if a.started_at else "-"
        out.append(f"{number(a.run, a.attempt)}  started {started}, ran {ran}  "
                   f"{click.style(outcome, fg=_outcome_fg(a.outcome))}  {where}{logs}")
    if job.running:
        out.append(f"{number(job.run, job.attempt)}  started {relative(job.started_at, now)}, running  "
                   f"{holder_text(job.claimed_by)}")
    return out


def outcome_text(outcome: str, error_kind: str | None) -> str:
    """An ended attempt's outcome as the timeline says it: ``failed (timeout)``; a
    suspend (a durable sleep) says that it spent no attempt, as the next one's number
    shows."""
    if outcome == "suspend":
        return "suspend (no attempt spent)"
    return outcome + (f" ({error_kind})" if error_kind and error_kind != outcome else "")


def _fg(state: str) -> str | None:
    return STATE_STYLES.get(state)


def _outcome_fg(outcome: str) -> str | None:
    if outcome == "complete":
        return "green"
    if outcome in UNSPENT:
        return None
    return "red" if outcome != "cancelled" else "yellow"
