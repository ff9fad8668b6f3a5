"""How ``tide`` shows jobs to a person."""

from __future__ import annotations

from datetime import datetime

from atlantis.store.admin import JobRow
from atlantis.units import format_duration

BAR_WIDTH = 30


def progress_bar(pct: int | None, width: int = BAR_WIDTH) -> str:
    value = 0 if pct is None else max(0, min(100, pct))
    filled = round(width * value / 100)
    return "[" + "#" * filled + "-" * (width - filled) + f"] {value:3d}%"


def age(then: datetime | None, now: datetime) -> str:
    if then is None:
        return "-"
    seconds = (now - then).total_seconds()
    if seconds < 0:
        return "in " + format_duration(round(-seconds))
    return format_duration(round(seconds)) + " ago" if seconds >= 1 else "just now"


def status_text(job: JobRow) -> str:
    now = job.db_now
    lines = [
        f"job {job.id}  {job.job}  queue={job.queue}",
        f"  state     {job.state}  attempt {job.attempt}/{job.max_attempts}",
    ]
    if job.progress_pct is not None or job.progress_msg:
        msg = job.progress_msg or ""
        lines.append(f"  progress  {progress_bar(job.progress_pct)}  {msg}"
                     f"  ({age(job.progress_at, now)})")
    else:
        lines.append(f"  progress  {progress_bar(None)}  (no checkpoint yet)")
    if job.state == "running" and job.claimed_until is not None:
        left = (job.claimed_until - now).total_seconds()
        expiry = f"expires in {format_duration(max(round(left), 0))}" if left > 0 else "expired"
        lines.append(f"  lease     {job.claimed_by}  {expiry}")
    elif job.claimed_by:
        lines.append(f"  worker    {job.claimed_by}")
    lines.append(f"  created   {job.created_at:%Y-%m-%d %H:%M:%S%z} ({age(job.created_at, now)})")
    if job.state == "available":
        lines.append(f"  runs at   {job.run_at:%Y-%m-%d %H:%M:%S%z} ({age(job.run_at, now)})")
    if job.started_at is not None:
        lines.append(f"  started   {job.started_at:%Y-%m-%d %H:%M:%S%z} ({age(job.started_at, now)})")
    if job.finished_at is not None:
        took = ""
        if job.started_at is not None:
            took = f", ran {format_duration(round((job.finished_at - job.started_at).total_seconds(), 3))}"
        lines.append(f"  finished  {job.finished_at:%Y-%m-%d %H:%M:%S%z} ({age(job.finished_at, now)}{took})")
    lines.append(f"  limits    timeout {format_duration(job.timeout)}, heartbeat {format_duration(job.heartbeat)}")
    if job.last_error:
        lines.append(f"  error     {job.last_error}")
    return "\n".join(lines)
