"""The markdown tables of the benchmarks, and the ratios they divide out of results."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence

from benchmarks.measure import percentile
from benchmarks.systems import Result, Round


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


Measure = Callable[[Result], "float | None"]
"""What a paired round compares: drain rate, CPU per job, enqueue rate (each round enqueues
its drains' jobs first)."""


def round_ratios(rounds: list[Round], a: str, b: str,
                 measure: Measure = jobs_rate) -> list[float]:
    """Per round: ``a``'s ``measure`` ÷ ``b``'s (rounds where either is missing left out)."""
    got = [quotient(measure(r[a]), measure(r[b])) for r in rounds if a in r and b in r]
    return [x for x in got if x is not None]


def spread(got: list[float]) -> str:
    """The median of some ratios, bold, and their range."""
    if not got:
        return "—"
    return f"**{statistics.median(got):.2f}x** (range {min(got):.2f}–{max(got):.2f}x)"


def paired_table(rounds: list[Round], keys: Sequence[str]) -> str:
    """One row a round: each system's jobs/s, CPU ms/job and enqueue rows/s, and the first
    system's (A's) ratios to each other's; then the medians of those ratios."""
    if not rounds:
        return ""
    letters = "ABCDEFGH"[:len(keys)]
    a, others = keys[0], list(zip(letters[1:], keys[1:], strict=True))
    legend = ", ".join(f"{x} = {k}" for x, k in zip(letters, keys, strict=True))
    measures: list[tuple[str, Measure, str, str]] = [
        ("jobs/s", jobs_rate, ",.0f", "rate"), ("CPU ms/job", cpu_total, ".3f", "CPU"),
        ("enqueue rows/s", enqueue_rate, ",.0f", "enqueue")]
    head = ["round (order)"]
    for label, _, _, short in measures:
        head.append(f"{label} {' / '.join(letters)}")
        head += [f"{short} A ÷ {x}" for x, _ in others]
    rows = [head]
    for i, r in enumerate(rounds, 1):
        order = " ".join(letters[list(keys).index(k)] for k in r)
        row = [f"{i} ({order})"]
        for _, measure, spec, _ in measures:
            row.append(" / ".join(fmt(measure(r[k]), spec, "—") if k in r else "—"
                                  for k in keys))
            row += [fmt_times(quotient(measure(r[a]), measure(r[k]))) if a in r and k in r
                    else "—" for _, k in others]
        rows.append(row)
    medians = ["median"]
    for _, measure, _, _ in measures:
        medians.append("")
        medians += [spread(round_ratios(rounds, a, k, measure)) for _, k in others]
    rows.append(medians)
    return legend + "\n\n" + markdown(rows)


def readme_table(results: list[Result]) -> str:
    """The rows of the performance table in benchmarks/README.md ("## Latest side-by-side"),
    to paste."""
    rows = [["system", "settings", "jobs/s", "CPU ms/job", "pickup p50 / p99 ms (idle)",
             "enqueue rows/s"]]
    for r in results:
        p50, p99 = percentile(r.latencies, 50), percentile(r.latencies, 99)
        rows.append([f"{r.system.name} {r.version}, {r.system.readme_model}",
                     r.system.readme_settings, fmt(r.jobs_per_s, ",.0f", "—"),
                     fmt(cpu_total(r), ".3f", "—"),
                     f"{p50:.1f} / {p99:.1f}" if p50 is not None and p99 is not None else "—",
                     fmt(enqueue_rate(r), ",.0f", "—")])
    return markdown(rows)


def fmt_times(r: float | None) -> str:
    """A ratio as ``1.23x``; a dash when there is none."""
    return "—" if r is None else f"{r:.2f}x"
