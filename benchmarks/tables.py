"""The markdown tables of the benchmarks, and the ratios they divide out of results."""

from __future__ import annotations

import statistics
from collections.abc import Callable

from benchmarks.measure import percentile
from benchmarks.systems import Result


def fmt(value: float | None, spec: str, empty: str = "") -> str:
    return empty if value is None else format(value, spec)


def markdown(rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(row) + " |" for row in rows]
    lines.insert(1, "| " + " | ".join("---" for _ in rows[0]) + " |")
    return "\n".join(lines)


def table(results: list[Result]) -> str:
    rows = [["system", "model", "settings", "jobs/s", "drain s", "start→done s",
             "CPU ms/job worker", "children", "store", "total", "pickup p50 / p99 ms (idle)",
             "worker RSS MB", "enqueue rows/s", "note"]]
    for r in results:
        cpu = r.cpu_ms()
        parts = [cpu.worker, cpu.children, cpu.store,
                 cpu.worker + cpu.children + cpu.store] if cpu else [None] * 4
        p50, p99 = percentile(r.latencies, 50), percentile(r.latencies, 99)
        rows.append([
            f"{r.system.name} {r.version}", r.system.model, r.system.settings,
            fmt(r.jobs_per_s, ",.0f", "—"), fmt(r.drain_s, ".2f"), fmt(r.wall_s, ".2f"),
            *[fmt(part, ".3f") for part in parts],
            f"{p50:.1f} / {p99:.1f}" if p50 is not None and p99 is not None else "",
            fmt(r.rss.peak_mb() if r.rss else None, ".0f"),
            fmt(r.jobs / r.enqueue_s if r.enqueue_s else None, ",.0f"), r.note])
    return markdown(rows)


def ratios(results: list[Result]) -> str:
    """jobs/s of each atlantis row divided by each peer row's."""
    ours = [r for r in results if r.system.peer is None and r.jobs_per_s]
    peers = [r for r in results if r.system.peer is not None and r.jobs_per_s]
    if not ours or not peers:
        return ""
    rows = [["atlantis ÷", *[f"{p.system.key}" for p in peers]]]
    for r in ours:
        rows.append([r.system.key, *[f"{(r.jobs_per_s or 0) / (p.jobs_per_s or 1):.2f}x"
                                     for p in peers]])
    return markdown(rows)


def fmt_rate(result: Result) -> str:
    if result.jobs_per_s is None:
        return result.note or "no result"
    return f"{result.jobs_per_s:,.0f} jobs/s ({result.drain_s:.2f}s drain)"


def jobs_rate(result: Result) -> float | None:
    return result.jobs_per_s


def cpu_total(result: Result) -> float | None:
    """CPU ms per job of the worker, its children and the store together."""
    c = result.cpu_ms()
    return None if c is None else c.worker + c.children + c.store


def enqueue_rate(result: Result) -> float | None:
    return result.jobs / result.enqueue_s if result.enqueue_s else None


def quotient(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


#: What a paired round compares: drain rate, CPU per job, enqueue rate (each round


#: enqueues its drain's jobs first).
Measure = Callable[[Result], "float | None"]


def pair_ratios(pairs: list[tuple[Result, Result]], measure: Measure = jobs_rate) -> list[float]:
    """Per round: A's ``measure`` ÷ B's (rounds where either is missing left out)."""
    got = [quotient(measure(x), measure(y)) for x, y in pairs]
    return [r for r in got if r is not None]


def paired_table(pairs: list[tuple[Result, Result]]) -> str:
    if not pairs:
        return ""
    a, b = pairs[0][0].system.key, pairs[0][1].system.key
    rows = [["round", f"{a} jobs/s", f"{b} jobs/s", f"{a} ÷ {b}", "CPU ms/job A / B (ratio)",
             "enqueue rows/s A / B (ratio)"]]
    for i, (x, y) in enumerate(pairs, 1):
        r = quotient(x.jobs_per_s, y.jobs_per_s)
        ca, cb = cpu_total(x), cpu_total(y)
        ea, eb = enqueue_rate(x), enqueue_rate(y)
        rows.append([f"{i} ({'A B' if i % 2 else 'B A'})", fmt(x.jobs_per_s, ",.0f", "—"),
                     fmt(y.jobs_per_s, ",.0f", "—"), fmt_times(r),
                     f"{fmt(ca, '.3f', '—')} / {fmt(cb, '.3f', '—')} ({fmt_times(quotient(ca, cb))})",
                     f"{fmt(ea, ',.0f', '—')} / {fmt(eb, ',.0f', '—')} ({fmt_times(quotient(ea, eb))})"])
    medians = ["median", "", ""]
    for got in (pair_ratios(pairs, m) for m in (jobs_rate, cpu_total, enqueue_rate)):
        medians.append(f"**{statistics.median(got):.2f}x** (range {min(got):.2f}–{max(got):.2f}x)"
                       if got else "—")
    rows.append(medians)
    return markdown(rows)


def fmt_times(r: float | None) -> str:
    """A ratio as ``1.23x``; a dash when there is none."""
    return "—" if r is None else f"{r:.2f}x"
