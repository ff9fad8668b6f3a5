"""How ``tide`` shows jobs, queues and supervisors to a person.

Ages and delays are relative and short ("12s ago", "in 3m"), measured against the
database's clock. Colour is added with :func:`click.style` and rich styles, and appears only
on a terminal: ``click.echo`` strips it from a pipe, and tables printed to a pipe are
rendered without colour and without width limits (no cut cells, no trailing spaces).
"""

from __future__ import annotations

import io
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import click
from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

from atlantis.cli.escape import safe
from atlantis.presentation import job_estimate
from atlantis.store.admin import AttemptRow, JobRow, parse_worker
from atlantis.store.fleet import QueueStats, WorkerRow
from atlantis.units import format_duration, format_size

BAR_WIDTH = 30
SMALL_BAR = 10
#: The colour of each state, on a terminal.
STATE_STYLES = {"available": "cyan", "running": "blue", "complete": "green", "dead": "red",
                "cancelled": "yellow"}
STALLED_STYLE = "bold red"


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
    value = 0 if pct is None else max(0, min(100, round(pct)))
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


def status_text(job: JobRow, attempts: Sequence[AttemptRow] = ()) -> str:
    """``tide job status``: what a person asks of a job, one fact a line."""
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
    if job.progress_pct is not None or job.progress_msg:
        msg = f"  {safe(job.progress_msg)}" if job.progress_msg else ""
        add("progress", f"{progress_bar(job.progress_pct)}{msg}  ({relative(job.progress_at, now)})")
    else:
        add("progress", f"{progress_bar(None)}  (no checkpoint yet)")
    guess = job_estimate(job)
    if guess.rate is not None or job.running:
        eta = "-"
        if guess.eta_seconds is not None:
            eta = f"{short_duration(guess.eta_seconds)}" if guess.eta_seconds >= 1 else "now"
            eta += f" (about {_stamp(now + timedelta(seconds=guess.eta_seconds))})"
        add("rate", f"{rate_text(guess.rate)}  ETA {eta}" if job.running else rate_text(guess.rate))
    if job.running:
        add("holder", f"{holder_text(job.claimed_by)}  ({safe(job.claimed_by)})")
        if job.claimed_until is not None:
            left = (job.claimed_until - now).total_seconds()
            expiry = f"expires {relative(job.claimed_until, now)}" if left > 0 else click.style(
                f"expired {relative(job.claimed_until, now)}", fg="red")
            add("lease", f"{expiry}, renewed {relative(job.last_renewal, now)}")
        quiet = since(job.last_checkpoint, now)
        what = "since the claim (no checkpoint yet)" if job.progress_at is None or (
            job.started_at is not None and job.progress_at < job.started_at) else "ago"
        note = f"{quiet} {what}; stalled after {short_duration(job.stall_after)}"
        add("checkpoint", click.style(note, fg="red") if job.stalled else note)
    elif job.claimed_by:
        add("worker", f"{holder_text(job.claimed_by)}  ({safe(job.claimed_by)})")
    if job.cancel_requested_at is not None and not job.finished:
        add("cancel", f"requested {relative(job.cancel_requested_at, now)}"
                      f" by {safe(job.cancelled_by or '?')}; the job ends cancelled")
    elif job.state == "cancelled" and job.cancelled_by:
        add("cancel", f"by {safe(job.cancelled_by)}")
    add("created", f"{_stamp(job.created_at)} ({relative(job.created_at, now)})")
    if job.state == "available":
        add("runs at", f"{_stamp(job.run_at)} ({relative(job.run_at, now)})")
    if job.started_at is not None:
        add("started", f"{_stamp(job.started_at)} ({relative(job.started_at, now)})")
    if job.finished_at is not None:
        took = ""
        if job.started_at is not None and job.finished_at >= job.started_at:
            took = f", ran {short_duration((job.finished_at - job.started_at).total_seconds())}"
        add("finished", f"{_stamp(job.finished_at)} ({relative(job.finished_at, now)}{took})")
    if job.retried_at is not None:
        add("retried", f"by {safe(job.retried_by or '?')} {relative(job.retried_at, now)}")
    add("limits", f"timeout {format_duration(job.timeout)}, heartbeat "
                  f"{format_duration(job.heartbeat)}, stall {format_duration(job.stall_after)}")
    timeline = attempt_lines(job, attempts)
    for i, line in enumerate(timeline):
        add("attempts" if i == 0 else "", line)
    if job.last_error:
        # A traceback stays on its lines, each indented under the first.
        add("error", safe(job.last_error, multiline=True).replace("\n", "\n" + " " * 13))
    if job.error_count:
        add("failures", f"{job.error_count} in all (the last {len(job.errors)} kept in errors)")
    return "\n".join(lines)


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
        outcome = safe(a.outcome + (f" ({a.error_kind})" if a.error_kind
                                    and a.error_kind != a.outcome else ""))
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


def _fg(state: str) -> str | None:
    return STATE_STYLES.get(state)


def _outcome_fg(outcome: str) -> str | None:
    if outcome == "complete":
        return "green"
    if outcome in ("snooze", "release"):
        return None
    return "red" if outcome != "cancelled" else "yellow"


# ---- tables -----------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Column:
    """A table column: a header a person reads; ``flexible`` columns (free text) are the ones
    cut with an ellipsis when a terminal is too narrow; ``right`` aligns numbers."""

    header: str
    flexible: bool = False
    right: bool = False


Cell = str | Text


def print_table(columns: Sequence[Column], rows: Sequence[Sequence[Cell]]) -> None:
    """A table on stdout: with colour on a terminal, free-text columns cut to fit its width
    (never the others); whole and plain in a pipe."""
    # Text, never str: rich would read "[...]" as markup and ":name:" as an emoji. Every
    # cell is one line: newlines and other controls are shown escaped (see safe()).
    cells = [[Text(safe(c)) if isinstance(c, str) else c for c in row] for row in rows]
    tty = sys.stdout.isatty()
    naturals = [max([cell_len(col.header)] + [row[i].cell_len for row in cells])
                for i, col in enumerate(columns)]
    widths = list(naturals)
    gaps = 2 * (len(columns) - 1)
    if tty:
        # The free-text columns share what the others leave of the terminal's width.
        flexible = [i for i, col in enumerate(columns) if col.flexible]
        fixed = sum(w for i, w in enumerate(naturals) if i not in flexible) + gaps
        room = shutil.get_terminal_size().columns - fixed
        for n, i in enumerate(sorted(flexible, key=lambda i: naturals[i])):
            share = max(room // (len(flexible) - n), min(naturals[i], 12))
            widths[i] = min(naturals[i], share)
            room -= widths[i]
    table = Table(box=None, pad_edge=False, show_edge=False, header_style="bold" if tty else "")
    for col, width in zip(columns, widths, strict=True):
        table.add_column(col.header, no_wrap=True, justify="right" if col.right else "left",
                         overflow="ellipsis", width=width)
    for row in cells:
        table.add_row(*row)
    if tty:
        # Never narrower than the table: a terminal too narrow for it wraps lines instead
        # of rich dropping whole columns.
        Console(width=sum(widths) + gaps, markup=False, emoji=False, highlight=False).print(table)
        return
    buffer = io.StringIO()
    Console(file=buffer, width=sum(widths) + gaps + 1, color_system=None, markup=False,
            emoji=False, highlight=False).print(table)
    click.echo("\n".join(line.rstrip() for line in buffer.getvalue().splitlines()))


def styled(text: str, style: str | None) -> Text:
    return Text(safe(text), style=style or "")


def job_table(jobs: Sequence[JobRow]) -> None:
    columns = [Column("ID", right=True), Column("JOB"), Column("QUEUE"), Column("STATE"),
               Column("ATTEMPT", right=True), Column("PROGRESS"), Column("ETA", right=True),
               Column("WHEN"), Column("MESSAGE", flexible=True), Column("LAST ERROR", flexible=True)]
    rows: list[list[Cell]] = []
    for job in jobs:
        now = job.db_now
        state = styled(job.state + (" STALLED" if job.stalled else ""),
                       STALLED_STYLE if job.stalled else _fg(job.state))
        bar = progress_bar(job.progress_pct, SMALL_BAR) if job.progress_pct is not None else ""
        guess = job_estimate(job)
        eta = short_duration(guess.eta_seconds) if guess.eta_seconds is not None else ""
        rows.append([str(job.id), job.job, job.queue, state, f"{job.attempt}/{job.max_attempts}",
                     bar, eta, when(job, now), job.progress_msg or "", job.last_error or ""])
    print_table(columns, rows)


def when(job: JobRow, now: datetime) -> str:
    """The latest thing that happened to a job, relatively: due, started, finished."""
    if job.finished_at is not None:
        return f"{job.state} {relative(job.finished_at, now)}"
    if job.running:
        return f"started {relative(job.started_at, now)}"
    if job.run_at > now:
        return f"due {relative(job.run_at, now)}"
    return f"waiting {since(job.run_at, now)}"


def dlq_table(jobs: Sequence[JobRow]) -> None:
    columns = [Column("ID", right=True), Column("JOB"), Column("QUEUE"),
               Column("ATTEMPTS", right=True), Column("DIED"), Column("FAILURES", right=True),
               Column("LAST ERROR", flexible=True)]
    rows: list[list[Cell]] = [
        [str(j.id), j.job, j.queue, f"{j.attempt}/{j.max_attempts}",
         relative(j.finished_at, j.db_now), str(j.error_count), styled(j.last_error or "", "red")]
        for j in jobs
    ]
    print_table(columns, rows)


def queue_table(queues: Sequence[QueueStats]) -> None:
    columns = [Column("QUEUE"), Column("WAITING", right=True), Column("OLDEST", right=True),
               Column("LATER", right=True), Column("RUNNING", right=True),
               Column("STALLED", right=True), Column("DONE/MIN", right=True),
               Column("DONE/HOUR", right=True), Column("COMPLETE", right=True),
               Column("DEAD", right=True), Column("CANCELLED", right=True),
               Column("SUPERVISORS", right=True), Column("STATUS", flexible=True)]
    rows: list[list[Cell]] = []
    for q in queues:
        notes: list[tuple[str, str | None]] = []
        if q.paused:
            why = f": {q.paused_reason}" if q.paused_reason else ""
            notes.append((f"paused{why} (by {q.paused_by or '?'})", "yellow"))
        if q.unserved and not q.supervisors:
            notes.append(("no live supervisor serves it", STALLED_STYLE))
        if q.unserved_jobs and q.supervisors:
            notes.append((f"no live supervisor handles {', '.join(q.unserved_jobs)}",
                           STALLED_STYLE))
        if not q.declared:
            notes.append(("no declaration names it", None))
        status = Text("; ").join(styled(t, s) for t, s in notes) if notes else Text("ok")
        oldest = short_duration(q.oldest_waiting_seconds) if q.oldest_waiting_seconds else ""
        stalled = styled(str(q.stalled), STALLED_STYLE if q.stalled else None)
        later = max(0, q.available - q.due)
        rows.append([q.queue, _count(q, "due"), oldest,
                     f"≈{later}" if {"due", "available"} & set(q.approximate) else str(later),
                     _count(q, "running"), stalled, str(q.completed_last_minute),
                     str(q.completed_last_hour), _count(q, "complete"),
                     styled(_count(q, "dead"), "red" if q.dead else None),
                     _count(q, "cancelled"), str(q.supervisors), status])
    print_table(columns, rows)


def _count(q: QueueStats, state: str) -> str:
    """A queue's count of ``state``; an estimate (above fleet.COUNT_CAP) reads "≈12345"."""
    count = int(getattr(q, state))
    return f"≈{count}" if state in q.approximate else str(count)


def worker_table(workers: Sequence[WorkerRow]) -> None:
    columns = [Column("HOST"), Column("PID", right=True), Column("QUEUES"), Column("STATUS"),
               Column("IN FLIGHT", right=True), Column("MEMORY", right=True), Column("UP"),
               Column("SEEN"), Column("JOBS", flexible=True), Column("ID")]
    rows: list[list[Cell]] = []
    for w in workers:
        jobs = []
        for j in w.jobs:
            if not isinstance(j, dict):
                continue
            text = f"#{j.get('job_id')}/{j.get('attempt')}"
            if j.get("child_pid"):
                text += f" pid {j['child_pid']}"
            if j.get("rss"):
                text += f" {format_size(int(j['rss']))}"
            jobs.append(text)
        status = styled(w.status, "yellow" if w.status != "running" else None)
        rows.append([w.host, str(w.pid), ",".join(w.queues), status,
                     f"{w.in_flight}/{w.concurrency}", format_size(w.memory) if w.memory else "",
                     since(w.started_at, w.db_now), relative(w.seen_at, w.db_now),
                     ", ".join(jobs), w.id])
    print_table(columns, rows)
