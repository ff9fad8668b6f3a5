"""Every setting of the supervisor, in one place: default, meaning, option, validation.

The click options of ``atlantis-supervise`` are generated from :class:`Settings`, so a
setting cannot exist without its option, its default and its check. Timing constants are
settings too (most of them hidden options): tests shorten them, nothing is hard-coded.
"""

from __future__ import annotations

import dataclasses
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import click

from atlantis import environ
from atlantis.errors import ConfigurationError
from atlantis.units import parse_duration, parse_size

DAY = 86_400.0


def _opt(kind: str, help: str, *, hidden: bool = False, choices: tuple[str, ...] = (),
         option: str | None = None, **kw: Any) -> Any:
    """A settings field: ``kind`` says how its option is parsed (duration, size, int, ...)."""
    meta = {"kind": kind, "help": help, "hidden": hidden, "choices": choices, "option": option}
    return field(metadata=meta, **kw)


@dataclass(frozen=True)
class Settings:
    queues: tuple[str, ...] = _opt("queues", "Queue to serve (repeatable).", default=(),
                                   option="--queue")
    app: str = _opt("str", f"package.module:registry (or {environ.APP}).", default="")
    name: str = _opt(
        "str", "This supervisor's name, kept across its restarts: an operator's drain or "
        "eviction (tide worker drain|evict) is kept for the name until tide worker resume. "
        "Default: HOST:QUEUE,QUEUE... (give each its own when several on one host serve the "
        f"same queues; or {environ.WORKER_NAME}).", default="")
    database_url: str = _opt("str", f"libpq URL; default ${environ.DATABASE_URL} or embedded.",
                             default="")
    handler_database_url: str = _opt(
        "str", f"What children get as {environ.DATABASE_URL} (a less privileged role); when "
        "set, the supervisor's own URL and PG* variables never reach a child "
        f"(or {environ.HANDLER_DATABASE_URL}).", default="")
    listen_database_url: str = _opt(
        "str", "Where to LISTEN for new work, cancels and pauses: a direct connection to "
        "PostgreSQL, when --database-url goes through PgBouncer in transaction mode (or "
        f"{environ.LISTEN_DATABASE_URL}).", default="")
    no_listen: bool = _opt(
        "flag", "Poll only, no LISTEN: new work is found within --poll-interval (1s), cancels "
        "and pauses within about a second.", default=False)
    pooled: bool = _opt(
        "flag", "--database-url goes through a connection pooler in transaction mode: no "
        "prepared statements. Detected by itself for PgBouncer and any pooler that answers "
        "with its own cancel keys.", default=False)
    concurrency: int = _opt("int", "Children, hence attempts at once; default: number of CPUs.",
                            default_factory=lambda: os.cpu_count() or 1)
    drain_timeout: float = _opt("duration", "On SIGTERM/SIGINT: how long in-flight attempts may "
                                "finish before they are stopped.", default=30.0)
    kill_grace: float = _opt("duration", "Between SIGTERM and SIGKILL for an attempt that must stop.",
                             default=10.0)
    isolation: str = _opt("choice", "reuse: long-lived children; fresh: a new process per attempt.",
                          default="reuse", choices=("reuse", "fresh"))
    child_scheduling: str = _opt(
        "choice", "batch: children (and all they start) run under SCHED_BATCH, so that a child "
        "woken by a Run or by its own I/O never preempts the supervisor (it waits for a free "
        "CPU or the next tick); normal: the default policy.", default="batch",
        choices=("batch", "normal"))
    claim_ahead: int | None = _opt(
        "int", "At most this many rows claimed ahead of need, started the moment a child is "
        "free, while attempts are short (typically under half of 1s), and no more than about "
        "100ms of work at the current pace; a row no child took within 1s is given back "
        "(0: off). Default: 16 x --concurrency.", default=None)
    max_jobs_per_child: int = _opt("int", "Recycle a reused child after N attempts (0: never).",
                                   default=0)
    max_memory_per_child: int = _opt("size", "Kill a child whose resident memory passes this, "
                                     "e.g. 512MB, 2GB (0: no limit).", default=0)
    max_tasks_per_child: int = _opt("int", "Kill an attempt whose child runs more than N tasks "
                                    "(processes and threads, the child's own included), such as "
                                    "a fork bomb (0: no limit).", default=512)
    metrics_port: int = _opt("int", "Serve Prometheus metrics on this port (0: off).", default=0)
    metrics_host: str = _opt("str", "Address of the metrics server (0.0.0.0 for remote scraping).",
                             default="127.0.0.1")
    ready_port: int = _opt("int", "Serve GET /ready on this port (0: off): 200 while serving, "
                           "503 while starting, draining or the database is unreachable; and "
                           "GET /live, 200 while the supervisor's loop answers.", default=0)
    ready_host: str = _opt("str", "Address of the /ready server (0.0.0.0 for a Kubernetes "
                           "probe).", default="127.0.0.1")
    log_format: str = _opt("choice", "Log lines as text or JSON.", default="text",
                           choices=("text", "json"))
    cancel_grace: float = _opt("duration", "After a cancel reaches an attempt: how long the "
                               "handler may take to return on its own before SIGTERM.",
                               default=30.0)
    log_retention_bytes: int = _opt("size", "Handler output kept in the database per attempt "
                                    "(the newest lines), e.g. 1MB; 0 keeps none.",
                                    default=1024 * 1024)
    startup_timeout: float = _opt("duration", "How long to wait for an unreachable database at "
                                  "start before exiting 1.", default=60.0)
    # ---- timings (hidden options) ----------------------------------------------------------
    poll_interval: float = _opt("duration", "Fallback poll for work when no NOTIFY arrives.",
                                default=1.0, hidden=True)
    rescue_interval: float = _opt("duration", "How often to look for rows whose lease expired.",
                                  default=5.0, hidden=True)
    progress_interval: float = _opt("duration", "Checkpoints reach the database at most this "
                                    "often per attempt (coalesced).", default=0.25, hidden=True)
    tick: float = _opt("duration", "Granularity of timeouts, lease checks and flushes.",
                       default=0.05, hidden=True)
    memory_interval: float = _opt("duration", "How often children's memory is sampled.",
                                  default=0.25, hidden=True)
    worker_ttl: float = _opt("duration", "A worker row not refreshed for this long is stale.",
                             default=30.0, hidden=True)
    worker_refresh: float = _opt("duration", "How often the worker row is refreshed.",
                                 default=5.0, hidden=True)
    liveness_interval: float = _opt("duration", "How often the supervisor marks its worker "
                                    "row alive, whatever its jobs' heartbeats; not seen for "
                                    "two of these, it is silent.", default=5.0, hidden=True)
    runtime_dir: str = _opt("str", "Where the supervisor's lock file goes (a local folder of "
                            "its user's own): default $XDG_RUNTIME_DIR/atlantis, else "
                            "/tmp/atlantis-UID.", default="", hidden=True)
    listen_ping: float = _opt("duration", "A quiet LISTEN connection re-issues LISTEN this often "
                              "(a half-open one never errors).", default=15.0, hidden=True)
    claim_timeout: float = _opt("duration", "Deadline of one claim.", default=5.0, hidden=True)
    finish_timeout: float = _opt("duration", "Deadline of one batch of results.", default=10.0,
                                 hidden=True)
    flush_timeout: float = _opt("duration", "At the end of a drain: how long unwritten results may "
                                "wait for the database.", default=10.0, hidden=True)
    exit_timeout: float = _opt("duration", "At stop: how long idle children may take to exit.",
                               default=5.0, hidden=True)
    respawn_max: float = _opt("duration", "Longest wait between failed starts of children or of a "
                              "crashed service (exponential backoff).", default=10.0, hidden=True)
    max_snooze: float = _opt("duration", "Longest delay a handler's Snooze may ask for.",
                             default=365 * DAY, hidden=True)
    max_backoff: float = _opt("duration", "Longest retry delay (backoff) of a failed attempt.",
                              default=DAY, hidden=True)
    cancel_poll: float = _opt("duration", "How often cancels are looked for when no NOTIFY "
                              "came (the fallback; independent of the heartbeat).",
                              default=1.0, hidden=True)
    pause_poll: float = _opt("duration", "How often paused queues are looked up when no NOTIFY "
                             "came.", default=2.0, hidden=True)
    log_flush_interval: float = _opt("duration", "How often handler output is written to the "
                                     "database.", default=0.25, hidden=True)
    output_lines_per_second: int = _opt("int", "Handler output lines logged per second and "
                                        "attempt (bursts of 10x); the rest are counted.",
                                        default=200, hidden=True)
    retention: float = _opt("duration", "Delete complete and cancelled jobs (with their attempts "
                            "and logs) this long after they finished (0: keep them).",
                            default=7 * DAY)
    dead_retention: float = _opt("duration", "Delete dead jobs (with their attempts and logs) "
                                 "this long after they finished (0: keep them).",
                                 default=30 * DAY)
    retention_interval: float = _opt("duration", "How often finished jobs are pruned (one "
                                     "supervisor at a time).", default=60.0, hidden=True)
    claim_ahead_window: float = _opt("duration", "Rows claimed ahead cover about this much "
                                     "work at the current pace (at most --claim-ahead).",
                                     default=0.1, hidden=True)
    claim_ahead_hold: float = _opt("duration", "A row claimed ahead that no child took within "
                                   "this is given back; rows are claimed ahead only while "
                                   "attempts typically take under half of it.",
                                   default=1.0, hidden=True)
    finish_linger: float = _opt("duration", "While it claims nothing ahead (it serves limited "
                                "jobs), results wait this long for others to share their "
                                "write; while it does, a few milliseconds at most, and only "
                                "while they come slower than a write takes and faster than "
                                "that (0: never).",
                                default=0.002, hidden=True)
    schedule_interval: float = _opt("duration", "How often schedules are checked for a due slot.",
                                    default=1.0, hidden=True)
    schedule_grace: float = _opt("duration", "A schedule slot already later than this when a "
                                 "round first sees it is skipped (counted as missed), not run late; "
                                 "every later slot runs.",
                                 default=60.0, hidden=True)

    # ---- tuning: hidden, each bounding a cost or a wait --------------------------------------
    # How much at once: children starting, rows a statement writes, trees counted.
    start_at_once: int = _opt("int", "Children starting (an interpreter importing the app, or a "
                              "fork) at one time, at most: hundreds starting at once would "
                              "starve the lease renewals of CPU.",
                              default_factory=lambda: 2 * (os.cpu_count() or 1) + 2, hidden=True)
    finish_batch: int = _opt("int", "Outcomes written by one statement at most.", default=500,
                             hidden=True)
    rescue_batch: int = _opt("int", "Expired leases rescued by one statement at most.",
                             default=1000, hidden=True)
    retention_batch: int = _opt("int", "Jobs deleted per retention transaction.", default=1000,
                                hidden=True)
    task_counts_per_tick: int = _opt(
        "int", "Process trees counted per tick at most (--max-tasks-per-child): beyond, in "
        "turn, so counting costs a bounded few percent of a core.", default=32, hidden=True)
    rss_per_refresh: int = _opt("int", "Children whose memory a refresh of the worker row reads "
                                "at most (those read least recently first).", default=100,
                                hidden=True)
    # Schedules and services: how much a round hands over, how long failures back off.
    schedule_due_max: int = _opt("int", "Slots of one schedule handed to the database per round "
                                 "at most.", default=500, hidden=True)
    schedule_retry_max: float = _opt("duration", "Longest wait before a refused schedule slot is "
                                     "tried again (backoff).", default=60.0, hidden=True)
    healthy_after: float = _opt("duration", "A service loop that ran this long before failing "
                                "restarts its backoff afresh.", default=60.0, hidden=True)
    reload_timeout: float = _opt("duration", "SIGHUP: the longest wait for the declarations to "
                                 "be stored.", default=60.0, hidden=True)
    fork_timeout: float = _opt("duration", "--isolation fresh: a fork the zygote has not reported "
                               "within this is given up.", default=10.0, hidden=True)
    # The database connections: how long to wait, how to retry, how often to say so.
    connect_timeout: float = _opt("duration", "The longest one connection attempt to the database "
                                  "may take (a half-open link never answers).", default=5.0,
                                  hidden=True)
    reconnect_first: float = _opt("duration", "The first wait before reconnecting (backoff with "
                                  "jitter from there).", default=0.05, hidden=True)
    reconnect_max: float = _opt("duration", "The longest wait between two reconnection attempts "
                                "of one connection.", default=1.0, hidden=True)
    outage_report_every: float = _opt("duration", "While the database stays unreachable, the log "
                                      "says so again this often.", default=30.0, hidden=True)
    # The ledger: how long a lost attempt's row is remembered.
    lost_kept_for: float = _opt("duration", "A lost attempt's row is never given back as an "
                                "orphan for this long after the loss (unless rescued or claimed "
                                "again sooner).", default=3600.0, hidden=True)

    def validate(self) -> Settings:
        if not self.queues:
            raise ConfigurationError("at least one --queue is required")
        if self.concurrency < 1:
            raise ConfigurationError("--concurrency must be at least 1")
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.metadata["kind"] in ("int", "size") and value is not None and value < 0:
                raise ConfigurationError(f"{option_name(f)} must not be negative")
        if self.no_listen and self.listen_database_url:
            raise ConfigurationError("--listen-database-url and --no-listen exclude each other")
        if not 0 <= self.metrics_port <= 65535:
            raise ConfigurationError("--metrics-port must be between 0 and 65535")
        if not 0 <= self.ready_port <= 65535:
            raise ConfigurationError("--ready-port must be between 0 and 65535")
        if self.ready_port and self.ready_port == self.metrics_port:
            raise ConfigurationError("--ready-port and --metrics-port must differ")
        for name in ("tick", "poll_interval", "progress_interval", "claim_timeout",
                     "finish_timeout", "worker_refresh", "liveness_interval", "listen_ping",
                     "memory_interval", "cancel_poll", "pause_poll", "log_flush_interval",
                     "claim_ahead_hold",
                     "claim_ahead_window", "fork_timeout", "reload_timeout", "connect_timeout",
                     "reconnect_first", "reconnect_max"):
            if getattr(self, name) <= 0:
                raise ConfigurationError(f"--{name.replace('_', '-')} must be positive")
        return self

    @property
    def worker_name(self) -> str:
        """``--name``, else this host and the queues served: HOST:QUEUE,QUEUE..."""
        return self.name or f"{socket.gethostname()}:{','.join(sorted(set(self.queues)))}"

    @property
    def ahead(self) -> int:
        """How many rows may be claimed ahead of need at most (``--claim-ahead``)."""
        return 16 * self.concurrency if self.claim_ahead is None else self.claim_ahead

    @property
    def child_database_url(self) -> str:
        return self.handler_database_url or self.database_url

    def role_url(self, role: str) -> str:
        """The URL of the supervisor's connection ``role``: ``--listen-database-url`` for the
        LISTEN connection when given, ``--database-url`` for every other."""
        if role == "listen" and self.listen_database_url:
            return self.listen_database_url
        return self.database_url


def option_name(f: dataclasses.Field[Any]) -> str:
    return str(f.metadata["option"] or "--" + f.name.replace("_", "-"))


def _parser(kind: str) -> Callable[[str], Any]:
    return {"duration": parse_duration, "size": parse_size}.get(kind, str)


def options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate a click command with one option per setting (values arrive as text)."""
    for f in reversed(dataclasses.fields(Settings)):
        kind = f.metadata["kind"]
        decl = option_name(f)
        common: dict[str, Any] = {"help": f.metadata["help"], "hidden": f.metadata["hidden"]}
        if kind == "queues":
            command = click.option(decl, f.name, multiple=True, **common)(command)
        elif kind == "flag":
            command = click.option(decl, f.name, is_flag=True, default=None, **common)(command)
        elif kind == "choice":
            command = click.option(decl, f.name, type=click.Choice(f.metadata["choices"]),
                                   default=None, **common)(command)
        else:
            envvar = {"app": environ.APP, "name": environ.WORKER_NAME,
                      "handler_database_url": environ.HANDLER_DATABASE_URL,
                      "listen_database_url": environ.LISTEN_DATABASE_URL}.get(f.name)
            command = click.option(decl, f.name, default=None, envvar=envvar, **common)(command)
    return command


def from_options(values: dict[str, Any], **overrides: Any) -> Settings:
    """Settings from the generated options' raw values; ValueError/ConfigurationError say why not."""
    given: dict[str, Any] = {}
    for f in dataclasses.fields(Settings):
        raw = values.get(f.name)
        if raw is None or raw == ():
            continue
        kind = f.metadata["kind"]
        try:
            if kind == "int":
                if not str(raw).strip().lstrip("+-").isdigit():
                    raise ValueError(f"{raw!r} is not a whole number")
                given[f.name] = int(raw)
            elif kind == "queues":
                given[f.name] = tuple(raw)
            elif kind == "flag":
                given[f.name] = bool(raw)
            else:
                given[f.name] = _parser(kind)(raw)
        except ValueError as exc:
            raise ConfigurationError(f"{option_name(f)}: {exc}") from None
    given.update(overrides)
    return Settings(**given).validate()
