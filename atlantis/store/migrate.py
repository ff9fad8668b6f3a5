"""Versioned schema migrations, safe when several processes migrate at once.

After the migrations, :func:`migrate` applies the live definitions (``live/*.sql``: every
SQL function and view, :mod:`atlantis.store.functions`) when they changed, then takes the
*role step*: it creates the NOLOGIN roles of :data:`ROLES` when the migrating role may
(superuser or CREATEROLE; otherwise it skips that silently), and grants whichever of them
exist their rights in this database.
Roles are cluster-wide, so creating them tolerates another database's migration creating
them at the same moment; grants are per database (and copied with a template).
``tide db roles --sql`` prints the same statements (:func:`roles_sql`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from importlib import resources
from typing import Any, LiteralString

import psycopg

from atlantis.declarations.model import JobDecl, WorkflowDecl
from atlantis.store import functions
from atlantis.store.doctor import require_server_version
from atlantis.store.queries import Q

_LOCK_KEY = 0x61746C616E746973  # "atlantis"
_FILE = re.compile(r"^(\d{4})_[\w-]+\.sql$")


def migrations() -> list[tuple[int, str, LiteralString]]:
    """(version, name, sql) for every migration shipped with the package, in order."""
    found = []
    for entry in resources.files("atlantis.store").joinpath("migrations").iterdir():
        m = _FILE.match(entry.name)
        if m:
            sql: LiteralString = entry.read_text("utf-8")
            found.append((int(m.group(1)), entry.name, sql))
    found.sort()
    return found


def migrate(conn: psycopg.Connection[Any]) -> list[int]:
    """Apply the migrations this database lacks, then the live definitions when they changed
    (:func:`atlantis.store.functions.refresh`), then the role step; returns the versions
    applied. On a schema ahead of this package (a newer release migrated it) the live
    definitions are left alone: the newer release's stand."""
    applied: list[int] = []
    shipped = migrations()
    require_server_version(conn)
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
        conn.execute("CREATE SCHEMA IF NOT EXISTS atlantis")
        conn.execute(
            "CREATE TABLE IF NOT EXISTS atlantis.schema_migrations ("
            " version int PRIMARY KEY, name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        done = {row[0] for row in conn.execute("SELECT version FROM atlantis.schema_migrations")}
        for version, name, sql in shipped:
            if version in done:
                continue
            conn.execute(sql)
            conn.execute(
                "INSERT INTO atlantis.schema_migrations (version, name) VALUES (%s, %s)",
                (version, name),
            )
            applied.append(version)
        if max(done, default=0) <= shipped[-1][0]:
            functions.refresh(conn, shipped[-1][0])
        _role_step(conn, regrant=bool(applied))
    return applied


# ---- roles --------------------------------------------------------------------------------

#: The roles atlantis creates, NOLOGIN: grant one to a login role (``GRANT atlantis_worker TO
#: app_worker``) or create the login role ``IN ROLE`` it.
ROLES = ("atlantis_enqueuer", "atlantis_worker", "atlantis_operator", "atlantis_reader")

# One DO block per role: roles are cluster-wide, and another database's migration may be
# creating the same one at this moment (it then fails on the unique index once the other
# commits: unique_violation; or, already committed, duplicate_object).
_CREATE_ROLE: LiteralString = """
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = '{role}') THEN
        CREATE ROLE {role} NOLOGIN;
    END IF;
EXCEPTION WHEN duplicate_object OR unique_violation THEN
    NULL;
END
$$;"""

# PUBLIC has no right on anything of the schema (migration 0008 revokes them; again after
# every migration, for the functions it created).
_REVOKE_PUBLIC: LiteralString = """
REVOKE ALL ON SCHEMA atlantis FROM PUBLIC;
REVOKE ALL ON ALL TABLES IN SCHEMA atlantis FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA atlantis FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA atlantis FROM PUBLIC;"""

# What each role may do in this database. The SECURITY DEFINER functions (migration 0008)
# are the only way an enqueuer or an operator writes.
_READ_FUNCTIONS: LiteralString = (
    "atlantis.stalled(atlantis.jobs), atlantis.stall_after(text, interval),"
    " atlantis.queue_counts(bigint), atlantis.oldest_due(text),"
    " atlantis.unique_key(atlantis.job_types, jsonb),"
    " atlantis.canonical_value(text, boolean, jsonb), atlantis.canonical_double(numeric),"
    " atlantis.type_mismatch(text, int, jsonb),"
    " atlantis.workflow_step_states(bigint), atlantis.step_context(bigint),"
    " atlantis.limit_hold(bigint), atlantis.limits_of(bigint), atlantis.limit_usage(text[]),"
    " atlantis.row_limits(atlantis.job_types, text, jsonb),"
    " atlantis.limit_rows(atlantis.job_types, text, jsonb),"
    " atlantis.limit_value(atlantis.job_types, jsonb, text[]),"
    " atlantis.limit_holders(atlantis.job_types, text, text, text[], jsonb, boolean),"
    " atlantis.limit_fields(jsonb),"
    " atlantis.limit_period_text(interval),"
    " atlantis.key_digest(text), atlantis.key_text(text),"
    # the scaling signal (migration 0034) and what it calls
    " atlantis.queue_signal(text), atlantis.signal_queues(), atlantis.signal_estimate(text),"
    " atlantis.signal_waiting(text, bigint),"
    " atlantis.signal_scale(text, bigint, bigint, bigint, bigint, bigint, bigint),"
    " atlantis.signal_room(text, text, jsonb, jsonb, jsonb, bigint),"
    " atlantis.signal_limited(text, bigint, int, bigint),"
    " atlantis.limited_groups(text, int, text, int)"
)
# What a handler's own connection calls for its steps (migration 0026): the handler's role
# (--handler-database-url) is an enqueuer's, or the worker's when none is given.
_STEP_FUNCTIONS: LiteralString = (
    "atlantis.step_fence(bigint, uuid), atlantis.step_records(bigint, uuid),"
    " atlantis.record_step(bigint, uuid, text, text, jsonb, int),"
    " atlantis.step_sleep(bigint, uuid, text, double precision, timestamp with time zone, int),"
    " atlantis.step_wait_event(bigint, uuid, text, text, double precision, int),"
    " atlantis.step_spawn(bigint, uuid, text, int, text, jsonb, timestamp with time zone, int,"
    " text, interval, jsonb),"
    " atlantis.step_spawn_many(bigint, uuid, text, int, text, jsonb[], timestamp with time zone,"
    " int, text, interval, jsonb),"
    " atlantis.step_join(bigint, uuid, text, int, bigint[], boolean)"
)
_GRANTS: dict[str, LiteralString] = {
    # Enqueue and cancel, nothing else: no right on any table.
    "atlantis_enqueuer": """
GRANT USAGE ON SCHEMA atlantis TO atlantis_enqueuer;
GRANT EXECUTE ON FUNCTION
    atlantis.enqueue(text, jsonb, timestamptz, int, text, interval, jsonb),
    atlantis.enqueue_many(text, jsonb[], timestamptz, int, text, interval, jsonb),
    atlantis.cancel(bigint, text),
    atlantis.start_workflow(text, jsonb, jsonb), atlantis.cancel_workflow(bigint, text),
    """ + _STEP_FUNCTIONS + """, atlantis.send_event(bigint, text, jsonb, text)
    TO atlantis_enqueuer;""",
    # atlantis-supervise: claims, leases, results, attempts, logs, its workers row,
    # schedules and retention, and syncing declarations into job_types; no DDL, no
    # settings, no pause/resume/retry.
    "atlantis_worker": """
GRANT USAGE ON SCHEMA atlantis TO atlantis_worker;
GRANT SELECT ON ALL TABLES IN SCHEMA atlantis TO atlantis_worker;
GRANT INSERT, UPDATE, DELETE ON atlantis.jobs, atlantis.attempts, atlantis.logs,
    atlantis.workers, atlantis.schedule_runs, atlantis.limit_starts TO atlantis_worker;
GRANT UPDATE ON atlantis.worker_orders TO atlantis_worker;
GRANT INSERT, UPDATE ON atlantis.job_types TO atlantis_worker;
GRANT USAGE, SELECT ON SEQUENCE atlantis.jobs_id_seq, atlantis.attempts_id_seq,
    atlantis.logs_id_seq TO atlantis_worker;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA atlantis TO atlantis_worker;
REVOKE EXECUTE ON FUNCTION atlantis.retry(bigint, text), atlantis.pause(text, text, text),
    atlantis.resume(text, text), atlantis.delete_finished(bigint[]),
    atlantis.retry_workflow(bigint, text), atlantis.dismiss_workflow(bigint, text),
    atlantis.set_queue_limit(text, int, text), atlantis.clear_steps(bigint),
    atlantis.order_worker(text, text, boolean, text), atlantis.resume_worker(text, text),
    atlantis.schedule_set_enabled(text, boolean, text)
    FROM atlantis_worker;""",
    # tide's changes and the console's writes, through functions, plus what reads need.
    "atlantis_operator": """
GRANT USAGE ON SCHEMA atlantis TO atlantis_operator;
GRANT SELECT ON ALL TABLES IN SCHEMA atlantis TO atlantis_operator;
GRANT EXECUTE ON FUNCTION """ + _READ_FUNCTIONS + """,
    atlantis.cancel(bigint, text), atlantis.retry(bigint, text),
    atlantis.pause(text, text, text), atlantis.resume(text, text),
    atlantis.prune(interval, text[], int), atlantis.delete_finished(bigint[]),
    atlantis.start_workflow(text, jsonb, jsonb), atlantis.cancel_workflow(bigint, text),
    atlantis.retry_workflow(bigint, text), atlantis.dismiss_workflow(bigint, text),
    atlantis.prune_workflows(interval, text[], int), atlantis.set_queue_limit(text, int, text),
    atlantis.clear_steps(bigint), atlantis.send_event(bigint, text, jsonb, text),
    atlantis.order_worker(text, text, boolean, text), atlantis.resume_worker(text, text),
    atlantis.schedule_set_enabled(text, boolean, text)
    TO atlantis_operator;
DO $$
BEGIN
    IF to_regclass('atlantis.console_audit') IS NOT NULL THEN
        GRANT INSERT ON atlantis.console_audit TO atlantis_operator;
        GRANT USAGE ON SEQUENCE atlantis.console_audit_id_seq TO atlantis_operator;
    END IF;
END
$$;""",
    # tide's read commands and a read-only console.
    "atlantis_reader": """
GRANT USAGE ON SCHEMA atlantis TO atlantis_reader;
GRANT SELECT ON ALL TABLES IN SCHEMA atlantis TO atlantis_reader;
GRANT EXECUTE ON FUNCTION """ + _READ_FUNCTIONS + """ TO atlantis_reader;""",
}


def roles_sql() -> str:
    """Every statement of the role step, for a superuser to run in a migrated database."""
    parts = ["-- atlantis roles: cluster-wide, NOLOGIN; safe to run again.",
             *(_CREATE_ROLE.format(role=role).strip() for role in ROLES),
             "-- Rights in the current database (run this part in each atlantis database).",
             _REVOKE_PUBLIC.strip(),
             *(_GRANTS[role].strip() for role in ROLES)]
    return "\n".join(parts) + "\n"


def may_create_roles(conn: psycopg.Connection[Any]) -> bool:
    """Whether the connected role may create roles (superuser or CREATEROLE)."""
    row = conn.execute(
        "SELECT rolsuper OR rolcreaterole FROM pg_catalog.pg_roles WHERE rolname = current_user"
    ).fetchone()
    return bool(row and row[0])


def may_migrate(conn: psycopg.Connection[Any]) -> bool:
    """Whether the connected role may migrate: a superuser, the schema's owner (or a member
    of it), or anyone who may create the schema when there is none yet."""
    with conn.transaction():  # leaves no transaction open on a non-autocommit connection
        row = conn.execute(
            "SELECT r.rolsuper"
            "    OR CASE WHEN n.oid IS NULL"
            "            THEN has_database_privilege(current_database(), 'CREATE')"
            "            ELSE pg_has_role(current_user, n.nspowner, 'USAGE') END"
            "  FROM pg_catalog.pg_roles r"
            "  LEFT JOIN pg_catalog.pg_namespace n ON n.nspname = 'atlantis'"
            " WHERE r.rolname = current_user"
        ).fetchone()
    return bool(row and row[0])


def schema_problem(conn: psycopg.Connection[Any], *, who: str = "atlantis",
                   hint: str = " as its owner") -> str | None:
    """Why this package cannot use the schema as it is (missing, or behind the newest
    migration shipped), on one line; None when it can. A newer schema is fine: migrations
    stay additive for a release. Other errors (no right to read the version) are raised."""
    version = _version(conn)
    latest = migrations()[-1][0]
    if version is None:
        return f"the atlantis schema is missing; run `tide db migrate`{hint}"
    if version < latest:
        return (f"the atlantis schema is at version {version}, this {who} needs {latest}; "
                f"run `tide db migrate`{hint}")
    return None


def schema_ahead(conn: psycopg.Connection[Any], *, who: str = "atlantis") -> str | None:
    """A line saying that the schema is ahead of this package's newest migration (a rolling
    upgrade under way: another host migrated first), or None. Not a problem: migrations stay
    additive for one release (docs/upgrading.md), so this package keeps working."""
    version = _version(conn)
    latest = migrations()[-1][0]
    if version is None or version <= latest:
        return None
    return (f"the atlantis schema is at version {version}, ahead of this {who} ({latest}): "
            "fine while a fleet rolls (migrations stay additive for a release); upgrade this "
            "host next")


def _version(conn: psycopg.Connection[Any]) -> int | None:
    """The newest migration applied; None when there is no schema (or no version in it)."""
    with conn.transaction():  # leaves no transaction open on a non-autocommit connection
        exists = conn.execute(
            "SELECT to_regclass('atlantis.schema_migrations') IS NOT NULL").fetchone()
        if not (exists and exists[0]):
            return None
        row = conn.execute("SELECT max(version) FROM atlantis.schema_migrations").fetchone()
    return row[0] if row else None


def grant_roles(conn: psycopg.Connection[Any], *, create: bool = True) -> list[str]:
    """Create the roles (when ``create`` and the connected role may), then grant every one
    that exists its rights in this database; returns the roles granted. Run it inside a
    transaction holding the migration lock (concurrent GRANTs on one object can fail)."""
    if create and may_create_roles(conn):
        for role in ROLES:
            conn.execute(_CREATE_ROLE.format(role=role))
    existing = _existing_roles(conn)
    conn.execute(_REVOKE_PUBLIC)
    for role in existing:
        conn.execute(_GRANTS[role])
    return existing


def apply_roles(conn: psycopg.Connection[Any]) -> list[str]:
    """:func:`grant_roles` in its own transaction, under the migration lock."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
        return grant_roles(conn)


def _existing_roles(conn: psycopg.Connection[Any]) -> list[str]:
    found = {row[0] for row in conn.execute(
        "SELECT rolname FROM pg_catalog.pg_roles WHERE rolname = ANY(%s)", (list(ROLES),))}
    return [role for role in ROLES if role in found]


def _role_step(conn: psycopg.Connection[Any], *, regrant: bool) -> None:
    """After the migrations: create the roles when we may, and grant them when something
    changed (migrations applied, a role new to this database); else do nothing, so that a
    supervisor's start does not rewrite the catalog every time."""
    if may_create_roles(conn) and len(_existing_roles(conn)) < len(ROLES):
        for role in ROLES:
            conn.execute(_CREATE_ROLE.format(role=role))
    if not _may_grant(conn):
        return
    if not regrant:
        row = conn.execute(
            "SELECT count(*) FROM pg_catalog.pg_roles"
            " WHERE rolname = ANY(%s) AND NOT has_schema_privilege(oid, 'atlantis', 'USAGE')",
            (list(ROLES),),
        ).fetchone()
        regrant = bool(row and row[0])
    if regrant:
        grant_roles(conn, create=False)


def _may_grant(conn: psycopg.Connection[Any]) -> bool:
    """Whether the connected role may grant rights on the schema's objects (owns them, or is
    a superuser); the schema must be at version 8 or later (it has the functions granted)."""
    row = conn.execute(
        "SELECT (r.rolsuper OR pg_has_role(current_user, n.nspowner, 'USAGE'))"
        "   AND EXISTS (SELECT 1 FROM atlantis.schema_migrations WHERE version >= 8)"
        "  FROM pg_catalog.pg_roles r, pg_catalog.pg_namespace n"
        " WHERE r.rolname = current_user AND n.nspname = 'atlantis'"
    ).fetchone()
    return bool(row and row[0])


def sync(conn: psycopg.Connection[Any], decls: list[JobDecl],
         workflows: Iterable[WorkflowDecl] = ()) -> None:
    """Store the declarations in ``atlantis.job_types`` and ``atlantis.workflow_types``;
    enqueues and workflow starts validate against them."""
    from psycopg.types.json import Jsonb

    with conn.transaction():
        for decl in decls:
            d = decl.to_json()
            row = conn.execute(
                Q.sync_job_type,
                {
                    "job": d["job"], "queue": d["queue"], "max_attempts": d["max_attempts"],
                    "priority": d["priority"], "timeout": d["timeout"],
                    "heartbeat": d["heartbeat"], "backoff": d["backoff"],
                    "unique_fields": d["unique_fields"], "fields": Jsonb(d["fields"]),
                    "source": d["source"], "stall": d["stall"], "schedule": d["schedule"],
                    "tz": d["tz"], "limits": Jsonb(d.get("limits", [])),
                    "overlap": d.get("overlap"),
                },
            ).fetchone()
            if row and row[0]:  # its limits changed: its waiting and running rows follow
                conn.execute(Q.limit_mark, {"job": d["job"]})
        for workflow in workflows:
            w = workflow.to_json()
            conn.execute(
                Q.sync_workflow_type,
                {
                    "workflow": w["workflow"], "fields": Jsonb(w["fields"]),
                    "unique_fields": w["unique_fields"], "timeout": w["timeout"],
                    "steps": Jsonb(w["steps"]), "source": w["source"],
                },
            )
