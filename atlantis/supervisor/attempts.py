"""An attempt in flight: what the supervisor knows of one claimed row."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from atlantis.supervisor.children import Child


@dataclass(eq=False)
class Attempt:
    job_id: int
    attempt: int
    job: str
    queue: str
    args: dict[str, Any]
    max_attempts: int
    timeout: float
    heartbeat: float
    deadline: str
    """ISO timestamp from PostgreSQL's clock: claim time + timeout."""
    lease_end: float
    """CLOCK_MONOTONIC time by which the lease surely ends unless renewed."""
    renewed_at: float
    child: Child | None = None
    started: float = 0.0
    progress: tuple[float, str] | None = None
    progress_dirty: bool = False
    progress_since: float = 0.0
    stop_reason: str | None = None
    """Why the supervisor is stopping it: timeout, drain, memory, cancel, lease."""
    term_sent_at: float | None = None
    killed: bool = False
    lost: bool = False
    """The lease is gone: nothing more may be written for this attempt."""
    cancel_sent: bool = False
    finished: bool = False

    @property
    def key(self) -> tuple[int, int]:
        return (self.job_id, self.attempt)

    def tag(self) -> str:
        return f"job={self.job_id} attempt={self.attempt}"
