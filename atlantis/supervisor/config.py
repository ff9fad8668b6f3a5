"""Every setting of the supervisor, its default, and how settings interact."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from atlantis.errors import ConfigurationError


@dataclass(frozen=True)
class SupervisorConfig:
    app: str
    """``package.module:attribute`` naming the :class:`atlantis.Registry`."""
    database_url: str
    queues: tuple[str, ...]
    """Queues to serve; at least one."""
    concurrency: int = field(default_factory=lambda: os.cpu_count() or 1)
    """Children, hence attempts running at once."""
    drain_timeout: float = 30.0
    """On SIGTERM/SIGINT: how long in-flight attempts may finish before they are killed."""
    kill_grace: float = 10.0
    """Between SIGTERM and SIGKILL for an attempt that must stop (timeout, drain, cancel)."""
    isolation: str = "reuse"
    """``reuse``: long-lived children; ``fresh``: a new process for every attempt."""
    max_jobs_per_child: int = 0
    """Replace a reused child after this many attempts; 0 means never."""
    max_memory_per_child: int = 0
    """Kill a child whose resident memory (with its descendants) passes this; 0 means no limit."""
    metrics_port: int | None = None
    """Serve Prometheus metrics on this port (none by default)."""
    metrics_host: str = "127.0.0.1"
    """Address the metrics server binds; 0.0.0.0 to let a remote Prometheus scrape it."""
    log_format: str = "text"
    poll_interval: float = 1.0
    """Fallback poll for work when no NOTIFY arrives (also picks up retries whose time came)."""
    rescue_interval: float = 5.0
    """How often this supervisor looks for rows whose lease expired."""
    progress_interval: float = 0.25
    """Checkpoints reach the database at most this often per attempt (coalesced)."""
    tick: float = 0.05
    """Granularity of timeouts, lease checks and flushes."""

    def validate(self) -> SupervisorConfig:
        if not self.queues:
            raise ConfigurationError("at least one --queue is required")
        if self.concurrency < 1:
            raise ConfigurationError("--concurrency must be at least 1")
        if self.isolation not in ("reuse", "fresh"):
            raise ConfigurationError("--isolation must be reuse or fresh")
        if self.log_format not in ("text", "json"):
            raise ConfigurationError("--log-format must be text or json")
        if self.drain_timeout < 0 or self.kill_grace < 0:
            raise ConfigurationError("--drain-timeout and --kill-grace must not be negative")
        if self.max_jobs_per_child < 0 or self.max_memory_per_child < 0:
            raise ConfigurationError("--max-jobs-per-child and --max-memory-per-child must not be negative")
        return self


def lease_margin(heartbeat: float) -> float:
    """How long before its lease's end an attempt that was not renewed is stopped.

    Renewals are due every heartbeat/3, so a healthy attempt is never near its end; the
    margin leaves time for the kill to land before another worker may claim the row.
    """
    return min(heartbeat * 0.25, 30.0)
