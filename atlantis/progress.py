"""How fast a running job progresses, and when it should finish: pure functions.

The supervisor keeps samples of each attempt's checkpoints in ``jobs.progress_history``
(``[{"at": ISO 8601, "pct": n}]``, at most one a second, the last 200). The rate is the
least-squares slope of percent over time across the most recent samples, so that one late
or early checkpoint moves it little; the ETA extends that line from the newest checkpoint
to 100 %. Both are estimates for a person to read (``tide job status``, the console), never
inputs to a decision.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

#: How many of the newest samples the rate is computed over.
WINDOW = 30


@dataclass(frozen=True, slots=True)
class Sample:
    """One checkpoint: when, and how far (0..100)."""

    at: datetime
    pct: float


@dataclass(frozen=True, slots=True)
class Estimate:
    """``rate`` in percent per minute (None: not enough samples to tell), ``eta_seconds``
    from ``now`` until 100 % at that rate (None: unknown, not progressing, or not running)."""

    rate: float | None
    eta_seconds: float | None


def samples(history: Iterable[Mapping[str, Any]]) -> list[Sample]:
    """The samples of a ``progress_history`` value, oldest first; malformed entries are
    skipped (the column is data another program wrote)."""
    out: list[Sample] = []
    for entry in history:
        try:
            at = entry["at"]
            at = at if isinstance(at, datetime) else datetime.fromisoformat(str(at))
            pct = float(entry["pct"])
        except (KeyError, TypeError, ValueError):
            continue
        if at.tzinfo is None or not math.isfinite(pct):
            continue
        out.append(Sample(at, pct))
    out.sort(key=lambda s: s.at)
    return out


def rate_per_minute(points: Sequence[Sample], window: int = WINDOW) -> float | None:
    """Least-squares slope, in percent per minute, of the newest ``window`` samples.

    None with fewer than two samples, or when they all share one instant.
    """
    recent = list(points[-window:]) if window > 0 else []
    if len(recent) < 2:
        return None
    origin = recent[0].at
    xs = [(s.at - origin).total_seconds() for s in recent]
    ys = [s.pct for s in recent]
    mean_x = sum(xs) / len(xs)
    mean_y = sum(ys) / len(ys)
    sxx = sum((x - mean_x) ** 2 for x in xs)
    if sxx <= 0:
        return None
    sxy = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True))
    return sxy / sxx * 60.0


def eta_seconds(last: Sample | None, rate: float | None, now: datetime) -> float | None:
    """Seconds from ``now`` until 100 %, extending ``rate`` from the ``last`` checkpoint.

    0 once at 100 %; None when the rate is unknown or not positive. Never negative: a job
    that is later than its own line would have it is due now.
    """
    if last is None:
        return None
    if last.pct >= 100:
        return 0.0
    if rate is None or rate <= 0:
        return None
    finish = last.at + timedelta(minutes=(100.0 - last.pct) / rate)
    return max((finish - now).total_seconds(), 0.0)


def estimate(history: Iterable[Mapping[str, Any]], *, pct: float | None, at: datetime | None,
             now: datetime, running: bool, since: datetime | None = None) -> Estimate:
    """Rate and ETA of a job from its history and its latest checkpoint (``pct`` at ``at``,
    which may be newer than the last sample: samples are taken at most once a second).

    Both are given only while the job runs, and from the current run only: samples and a
    checkpoint older than ``since`` (when the running attempt started) are an earlier run's,
    so a resumed job's rate does not span the time it slept.
    """
    if not running:
        return Estimate(None, None)
    points = [p for p in samples(history) if since is None or p.at >= since]
    if pct is not None and at is not None and (since is None or at >= since) and (
            not points or at > points[-1].at):
        points.append(Sample(at, float(pct)))
    rate = rate_per_minute(points)
    return Estimate(rate, eta_seconds(points[-1] if points else None, rate, now))
