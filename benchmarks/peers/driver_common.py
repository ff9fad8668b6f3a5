"""What every peer driver shares: its command line and how it prints what it measured.

Imported by the drivers as a plain module (their folder is first on ``sys.path``); it needs
only the standard library, and psycopg for :func:`print_pg_latencies`.
"""

from __future__ import annotations

import argparse
import json
import time


def parse(target: str, **extra: int) -> argparse.Namespace:
    """``enqueue|work|latencies --<target> X [--jobs N] [--spacing S]`` plus int options."""
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["enqueue", "work", "latencies"])
    parser.add_argument(f"--{target}", required=True)
    parser.add_argument("--jobs", type=int, default=0)
    parser.add_argument("--spacing", type=float, default=0.0)
    for name, default in extra.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=default)
    return parser.parse_args()


def print_seconds(started: float) -> None:
    """The enqueue's own time, for the harness (its last line of stdout)."""
    print(json.dumps({"seconds": time.perf_counter() - started}))


def print_latencies(values: list[float]) -> None:
    print(json.dumps(values))


def print_pg_latencies(dsn: str, sql: str) -> None:
    """The first column of ``sql``'s rows (pickup latencies in ms), as JSON."""
    import psycopg

    with psycopg.connect(dsn) as conn:
        rows = conn.execute(sql).fetchall()
    print_latencies([float(r[0]) for r in rows])
