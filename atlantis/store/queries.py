"""The named statements of ``queries.sql`` (run time) and ``admin.sql`` (operators' tools),
loaded once as typed attributes.

Keeping SQL in these files (and reading it as ``LiteralString``) means no code path glues
SQL from strings; every value reaches PostgreSQL as a parameter.
"""

from __future__ import annotations

import re
from importlib import resources
from typing import LiteralString

_HEADER = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


class Queries:
    enqueue_many: LiteralString
    sync_job_type: LiteralString
    claim: LiteralString
    claim_limited: LiteralString
    claim_isolate: LiteralString
    limit_mark: LiteralString
    limit_sweep: LiteralString
    limit_usage: LiteralString
    limit_hold: LiteralString
    set_queue_limit: LiteralString
    renew: LiteralString
    finish: LiteralString
    rescue: LiteralString
    workflow_sweep: LiteralString
    worker_upsert: LiteralString
    worker_delete: LiteralString
    worker_list: LiteralString
    job_get: LiteralString
    job_list: LiteralString
    listen: LiteralString
    backend_pid: LiteralString
    job_retry: LiteralString
    job_cancel: LiteralString
    workflow_start: LiteralString
    workflow_cancel: LiteralString
    workflow_retry: LiteralString
    workflow_dismiss: LiteralString
    queue_stats: LiteralString
    release_orphans: LiteralString
    queue_known: LiteralString
    attempt_state: LiteralString
    cancel_requests: LiteralString
    queue_flags: LiteralString
    log_insert: LiteralString
    log_trim: LiteralString
    queue_gauges: LiteralString
    schema_version: LiteralString
    job_attempts: LiteralString
    operator_pause: LiteralString
    operator_resume: LiteralString
    operator_prune: LiteralString
    job_log_lines: LiteralString
    job_log_attempt: LiteralString
    job_run_attempts: LiteralString
    queue_served: LiteralString
    job_served: LiteralString
    schedule_now: LiteralString
    schedule_fire: LiteralString
    schedule_latest: LiteralString
    schedule_advance: LiteralString
    schedule_set_enabled: LiteralString
    schedule_list: LiteralString
    retention_prune: LiteralString
    retention_prune_schedule_runs: LiteralString
    sync_workflow_type: LiteralString
    # console.sql (the web console)
    console_jobs_page: LiteralString
    console_max_id: LiteralString
    console_job_ids: LiteralString
    console_ids_in_states: LiteralString
    console_delete_finished: LiteralString
    console_dlq_groups: LiteralString
    console_throughput: LiteralString
    console_estimated_jobs: LiteralString
    console_logs_since: LiteralString
    console_log_tail: LiteralString
    console_log_last_id: LiteralString
    console_audit_insert: LiteralString
    console_audit_list: LiteralString
    console_listen: LiteralString
    # doctor.sql (`tide db doctor`)
    doctor_server_version: LiteralString
    doctor_other_sessions: LiteralString
    doctor_live_supervisors: LiteralString
    doctor_jobs_table: LiteralString
    doctor_jobs_indexes: LiteralString
    doctor_old_transactions: LiteralString
    doctor_expired_leases: LiteralString
    doctor_unserved_queues: LiteralString
    doctor_unserved_jobs: LiteralString
    doctor_unserved_declarations: LiteralString
    doctor_missed_slots: LiteralString
    doctor_duplicate_unique_keys: LiteralString
    # workflows.sql (operators' reads of workflows)
    workflow_get: LiteralString
    workflow_forward_steps: LiteralString
    workflow_compensation_steps: LiteralString
    workflow_list: LiteralString
    workflow_counts: LiteralString
    # steps.sql (handler steps: the child's writes, operators' reads)
    step_records: LiteralString
    step_record: LiteralString
    step_sleep: LiteralString
    step_clear: LiteralString
    step_session_reset: LiteralString
    step_list: LiteralString
    step_summary: LiteralString
    queue_asleep: LiteralString
    # events.sql (issue 35: events sent to jobs, a handler's wait for one)
    event_send: LiteralString
    step_wait_event: LiteralString
    event_sweep: LiteralString
    # children.sql (issue 35: a handler's spawn and join, operators' reads)
    step_spawn: LiteralString
    step_spawn_many: LiteralString
    step_join: LiteralString
    join_sweep: LiteralString
    job_children: LiteralString
    job_children_list: LiteralString
    # reads.sql (issue 36: atlantis.get_job, list_jobs, wait; tide db server)
    api_job_get: LiteralString
    api_job_list: LiteralString
    wait_listen: LiteralString
    wait_unlisten: LiteralString
    wait_state: LiteralString
    server_databases: LiteralString
    server_has_workers: LiteralString
    server_supervisors: LiteralString
    # testing.sql (issue 36: the test kit, atlantis.testing)
    testing_prepare: LiteralString
    testing_budget: LiteralString
    testing_wake: LiteralString
    testing_busy: LiteralString
    testing_ends: LiteralString
    # liveness.sql (issue 36: supervisors' marks of life, silent holders, same-host rescue)
    worker_alive: LiteralString
    worker_gone_candidates: LiteralString
    rescue_gone: LiteralString
    job_holder: LiteralString
    job_list_orphaned: LiteralString
    doctor_silent_holders: LiteralString
    # prune.sql (issue 36: tide db sync --prune)
    prune_workflows: LiteralString
    prune_jobs: LiteralString
    prune_lock_workflows: LiteralString
    prune_lock_jobs: LiteralString
    prune_delete_workflows: LiteralString
    prune_delete_jobs: LiteralString
    worker_order: LiteralString
    worker_resume: LiteralString
    worker_orders: LiteralString
    worker_order_adopt: LiteralString
    worker_order_read: LiteralString
    worker_order_drained: LiteralString
    # scaling.sql (issue 37: the scaling signal, read with no supervisor running)
    queue_signal: LiteralString
    workers_silent: LiteralString

    def __init__(self, *texts: str) -> None:
        found: dict[str, str] = {}
        for text in texts:
            parts = _HEADER.split(text)  # parts[0]: the file's preamble
            for name, body in zip(parts[1::2], parts[2::2], strict=True):
                if name in found:
                    raise ValueError(f"query {name!r} is defined twice")
                found[name] = _compact(body)
        expected = set(type(self).__annotations__)
        if set(found) != expected:
            raise ValueError(
                f"queries.sql and admin.sql define {sorted(set(found) - expected)} unknown and misses "
                f"{sorted(expected - set(found))}"
            )
        for name, body in found.items():
            setattr(self, name, body)


def _compact(body: str) -> str:
    """The statement without its comment lines and indentation.

    Shorter text is cheaper to send, and psycopg caches the conversion of statements only
    up to 4 KiB. No statement here has a string literal spanning lines.
    """
    lines = (line.strip() for line in body.splitlines())
    return "\n".join(line for line in lines if line and not line.startswith("--"))


def _load() -> Queries:
    files = resources.files("atlantis.store")
    names = ("queries.sql", "admin.sql", "schedules.sql", "console.sql", "doctor.sql",
             "workflows.sql", "steps.sql", "events.sql", "children.sql", "reads.sql",
             "testing.sql", "liveness.sql", "prune.sql", "orders.sql", "scaling.sql")
    return Queries(*(files.joinpath(name).read_text("utf-8") for name in names))


Q = _load()
