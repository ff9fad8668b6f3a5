"""Reading `.atl` files into :class:`JobDecl` values: the meaning.

The syntax walk (``parser.py``) hands over raw blocks that keep their tokens; this module
refuses what the grammar let through (unknown types, repeated jobs, fields and modifiers,
field names Python cannot take as attributes, a schedule whose fields have no defaults,
``tz`` or ``overlap`` without a schedule,
limits by fields the job lacks or cannot key by) and builds the JobDecls. The values themselves (numbers, durations, strings, defaults)
are read by ``literals.py``. Each refusal names the token at fault as
``file:line:column: what is wrong``.
"""

from __future__ import annotations

import keyword
from typing import Any

import lark

from atlantis.declarations.cron import cron_problem, zone_problem
from atlantis.declarations.literals import MAX_DEPTH, MAX_NUMBER_CHARS, Literals
from atlantis.declarations.model import (
    BASE_TYPES,
    DEFAULT_BACKOFF,
    DEFAULT_HEARTBEAT,
    DEFAULT_PRIORITY,
    DEFAULT_QUEUE,
    DEFAULT_RETRIES,
    DEFAULT_TIMEOUT,
    LIMIT_KINDS,
    OVERLAP_MODES,
    Field,
    JobDecl,
    Limit,
)
from atlantis.declarations.raw import (
    RawField,
    RawJob,
    RawStatement,
    RawType,
    Source,
    Tree,
    position,
)
from atlantis.units import INT_RANGES

# MAX_DEPTH and MAX_NUMBER_CHARS (atlantis.limits) stay importable from here for enqueue.py.
__all__ = ["MAX_DEPTH", "MAX_NUMBER_CHARS", "TYPES", "Checker", "check_file"]

#: The argument types as a user writes them, in the order error messages list them.
TYPES = (
    "text", "varchar(n)", "int", "bigint", "boolean", "double", "numeric", "uuid",
    "timestamptz", "date", "jsonb",
)  # fmt: skip

# PostgreSQL's own ceiling for varchar(n).
_MAX_VARCHAR = 10_485_760
_INT32_MAX = INT_RANGES["int"][1]


def check_file(jobs: list[RawJob], source: Source) -> list[JobDecl]:
    """The JobDecls of one file, in file order; DeclarationError for the first fault."""
    return Checker(source).file(jobs)


class Checker:
    """Turns raw blocks into JobDecls, refusing what the grammar let through.

    Workflow blocks (``workflows.py``) use its ``fields``, ``unique`` and ``literals``.
    """

    def __init__(self, source: Source) -> None:
        self.source = source
        self.filename = source.filename
        self.fail = source.fail
        self.written = source.written
        self.first_at = source.first_at
        self.literals = Literals(source)

    # -- structure

    def file(self, jobs: list[RawJob]) -> list[JobDecl]:
        decls: list[JobDecl] = []
        seen: dict[str, JobDecl] = {}
        for job in jobs:
            decl = self.job(job)
            first = seen.get(decl.qualified_name)
            if first is not None:
                self.fail(
                    job.name,
                    f"job {decl.qualified_name} is declared twice (first at {first.source})",
                )
            seen[decl.qualified_name] = decl
            decls.append(decl)
        return decls

    def job(self, job: RawJob) -> JobDecl:
        seen: dict[str, lark.Token] = {}
        values: dict[str, Any] = {}
        unique_tokens: tuple[lark.Token, ...] = ()
        raw_fields: tuple[RawField, ...] = ()
        raw_limits: list[RawStatement] = []
        for statement in job.statements:
            modifier = statement.modifier
            head = statement.head
            if modifier in LIMIT_KINDS:  # a job may declare several
                raw_limits.append(statement)
                continue
            if modifier in seen:
                self.fail(head, f"duplicate modifier '{modifier}' {self.first_at(seen[modifier])}")
            seen[modifier] = head
            if modifier == "args":
                values["fields"] = self.fields(statement)
                raw_fields = statement.fields
            elif modifier == "unique":
                unique_tokens = self.unique(statement)
                values["unique"] = tuple(str(t) for t in unique_tokens)
            else:
                assert statement.value is not None
                values[modifier] = self.modifier(modifier, statement.value)
        declared = {f.name for f in values.get("fields", ())}
        for token in unique_tokens:
            if str(token) not in declared:
                self.fail(token, f"unique field '{token}' is not declared in args")
        if "tz" in seen and "schedule" not in seen:
            self.fail(seen["tz"], "tz needs a schedule in the same job (it is the time zone "
                      "the schedule runs in)")
        if "overlap" in seen and "schedule" not in seen:
            self.fail(seen["overlap"], "overlap needs a schedule in the same job (it says what "
                      "a slot does while an earlier run of the schedule has not ended)")
        if "schedule" in seen:
            self.scheduled_fields(raw_fields, values.get("fields", ()))
            values.setdefault("overlap", OVERLAP_MODES[0])
        limits = self.limits(raw_limits, {f.name: f for f in values.get("fields", ())})
        return JobDecl(
            name=str(job.name),
            namespace=str(job.namespace),
            fields=values.get("fields", ()),
            retries=values.get("retries", DEFAULT_RETRIES),
            timeout=values.get("timeout", DEFAULT_TIMEOUT),
            heartbeat=values.get("heartbeat", DEFAULT_HEARTBEAT),
            queue=values.get("queue", DEFAULT_QUEUE),
            priority=values.get("priority", DEFAULT_PRIORITY),
            unique=values.get("unique", ()),
            backoff=values.get("backoff", DEFAULT_BACKOFF),
            stall=values.get("stall"),
            schedule=values.get("schedule"),
            tz=values.get("tz"),
            overlap=values.get("overlap"),
            source=f"{self.filename}:{job.keyword.line}",
            limits=limits,
        )

    def modifier(self, modifier: str, value: lark.Token) -> Any:
        if modifier == "retries":
            # max_attempts (retries + 1) is stored as an int.
            return self.literals.whole_number(value, "retries", 0, _INT32_MAX - 1)
        if modifier == "priority":
            return self.literals.whole_number(value, "priority", -_INT32_MAX - 1, _INT32_MAX)
        if modifier == "queue":
            queue = self.literals.string(value)
            if not queue:
                self.fail(value, "queue name must not be empty")
            return queue
        if modifier == "schedule":
            expr = self.literals.string(value)
            problem = cron_problem(expr)
            if problem is not None:
                self.fail(value, f"invalid schedule {self.written(value)}: {problem}")
            return expr
        if modifier == "overlap":
            if str(value) not in OVERLAP_MODES:
                self.fail(value, f"invalid overlap {self.written(value)} (expected skip or "
                          "allow)")
            return str(value)
        if modifier == "tz":
            name = self.literals.string(value)
            problem = zone_problem(name)
            if problem is not None:
                self.fail(value, f"invalid tz {self.written(value)}: {problem}")
            return name
        # timeout, heartbeat, stall, backoff: a zero timeout, lease or stall threshold could
        # never be met.
        return self.literals.duration(value, modifier, positive=modifier != "backoff")

    def scheduled_fields(self, raw: tuple[RawField, ...], fields: tuple[Field, ...]) -> None:
        """A schedule enqueues with the defaults: every field needs one, or must allow null."""
        for token, f in zip((r.name for r in raw), fields, strict=True):
            if f.not_null and not f.has_default:
                self.fail(token, f"field '{token}' needs a default or must allow null: the job "
                          "has a schedule, which enqueues it with the defaults")

    def limits(self, raw: list[RawStatement], fields: dict[str, Field]) -> tuple[Limit, ...]:
        """The limits of a job, in the order written: one per kind and set of `by` fields,
        since the two would count in one key."""
        limits: list[Limit] = []
        seen: dict[tuple[str, frozenset[str]], lark.Token] = {}
        for statement in raw:
            limit = self.limit(statement, fields)
            first = seen.setdefault((limit.kind, frozenset(limit.by)), statement.head)
            if first is not statement.head:
                by = f"by {', '.join(limit.by)}" if limit.by else "without by"
                self.fail(statement.head, f"duplicate {limit.kind} limit {by} "
                          f"{self.first_at(first)}: a job may declare one {limit.kind} limit "
                          "per set of by fields")
            limits.append(limit)
        return tuple(limits)

    def limit(self, statement: RawStatement, fields: dict[str, Field]) -> Limit:
        """``concurrency N [by ...]`` or ``rate N/PERIOD [by ...]``."""
        kind = statement.modifier
        assert statement.value is not None
        n = self.literals.whole_number(statement.value, kind, 1, _INT32_MAX)
        period: float | None = None
        if statement.period is not None:
            token = statement.period
            period = self.literals.duration(token, "rate period", positive=False)
            if period < 1:
                self.fail(token, f"rate period must be at least 1s, not {self.written(token)}")
        seen: set[str] = set()
        for token in statement.names:
            name = str(token)
            if name in seen:
                self.fail(token, f"field '{token}' is listed twice in {kind} by")
            seen.add(name)
            f = fields.get(name)
            if f is None:
                self.fail(token, f"{kind} by field '{token}' is not declared in args")
            if f.array or f.type == "jsonb":
                self.fail(token, f"{kind} by field '{token}' is {f.type_name}; array and jsonb "
                          "fields cannot key a limit")
        line, column = position(statement.head)
        return Limit(kind, n, period, tuple(str(t) for t in statement.names),
                     source=f"{self.filename}:{line}:{column}")

    def unique(self, statement: RawStatement) -> tuple[lark.Token, ...]:
        seen: set[str] = set()
        for token in statement.names:
            if str(token) in seen:
                self.fail(token, f"field '{token}' is listed twice in unique")
            seen.add(str(token))
        return statement.names

    def fields(self, statement: RawStatement) -> tuple[Field, ...]:
        fields: list[Field] = []
        seen: dict[str, lark.Token] = {}
        for raw in statement.fields:
            name = raw.name
            if str(name) in seen:
                self.fail(name, f"duplicate field '{name}' {self.first_at(seen[str(name)])}")
            seen[str(name)] = name
            fields.append(self.field(raw))
        return tuple(fields)

    def field(self, raw: RawField) -> Field:
        self.field_name(raw.name)
        base, length, array = self.type(raw.type)
        not_null: lark.Token | None = None
        default: Tree | None = None
        for option in raw.options:
            if option.kind == "not_null":
                if not_null is not None:
                    self.fail(option.head, "'not null' is given twice")
                not_null = option.head
            else:
                if default is not None:
                    self.fail(option.head, "'default' is given twice")
                default = option.value
        value = None
        if default is not None:
            value = self.literals.default(default, base, length, array, not_null is not None)
        line, column = position(raw.name)
        return Field(
            name=str(raw.name),
            type=base,
            length=length,
            array=array,
            not_null=not_null is not None,
            has_default=default is not None,
            default=value,
            source=f"{self.filename}:{line}:{column}",
        )

    def field_name(self, name: lark.Token) -> None:
        """Handlers get each field as an attribute of an args class (built at run time, or
        by `tide gen`), so Python must take the name as one.

        Soft keywords (``match``, ``case``, ``type``, ``_``) are ordinary names there and
        stay allowed; names that only clash with what a generated module refers to are
        refused by `tide gen`, which alone is concerned.
        """
        if keyword.iskeyword(name):
            self.fail(name, f"field name '{name}' is a Python keyword, and handlers get each "
                      "field as an attribute of that name; rename the field")
        if name.startswith("__"):
            self.fail(name, f"field name '{name}' starts with '__', which Python keeps for its "
                      "own attributes (and mangles in a class body); rename the field")

    def type(self, raw: RawType) -> tuple[str, int | None, bool]:
        base = raw.base
        if base not in BASE_TYPES:
            self.fail(base, f"unknown type '{base}' (expected one of: {', '.join(TYPES)})")
        length: int | None = None
        if raw.length is not None:
            if base != "varchar":
                self.fail(raw.length, f"only varchar takes a length, not {base}")
            length = self.literals.whole_number(raw.length, "varchar length", 1, _MAX_VARCHAR)
        if base == "varchar" and length is None:
            self.fail(base, "varchar needs a length, as in varchar(64)")
        return str(base), length, raw.array
