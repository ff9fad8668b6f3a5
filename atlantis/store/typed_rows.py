"""Rows read into dataclasses by column name, ignoring columns the dataclass does not know.

Statements that select ``*`` from a view (``atlantis.job_rows``) get every column the
*database's* schema has. During a rolling upgrade the schema may be a release ahead of this
package, with a column added to the view (migrations are additive, docs/upgrading.md):
psycopg's ``class_row`` would then fail on the unexpected keyword, so this one leaves it out.
A column the dataclass needs and the row lacks still fails, as it should.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, LiteralString, TypeVar

import psycopg
from psycopg import errors
from psycopg.rows import RowFactory, RowMaker

if TYPE_CHECKING:
    from psycopg._cursor_base import BaseCursor  # what psycopg's own row factories take

T = TypeVar("T")


def known_columns_row(cls: type[T]) -> RowFactory[T]:
    """Like :func:`psycopg.rows.class_row`, for a dataclass, without the columns it lacks."""
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]

    def factory(cursor: BaseCursor[Any, Any]) -> RowMaker[T]:
        if cursor.description is None:
            raise errors.ProgrammingError("the statement returned no rows")
        wanted = [(i, c.name) for i, c in enumerate(cursor.description) if c.name in names]

        def make(values: Sequence[Any]) -> T:
            return cls(**{name: values[i] for i, name in wanted})

        return make

    return factory


def fields_row(cls: type[T]) -> RowFactory[T]:
    """As :func:`psycopg.rows.class_row` (every column a field of the dataclass ``cls``, by
    name; an unknown column fails), with each row built positionally: the columns are
    matched to the fields once a statement, not once a row (a claim reads hundreds of rows a
    second). Fields the statement leaves out keep their defaults."""
    fields = [f.name for f in dataclasses.fields(cls) if f.init]  # type: ignore[arg-type]

    def factory(cursor: BaseCursor[Any, Any]) -> RowMaker[T]:
        if cursor.description is None:
            raise errors.ProgrammingError("the statement returned no rows")
        names = [c.name for c in cursor.description]
        where = {name: i for i, name in enumerate(names)}
        given = [f for f in fields if f in where]
        if len(where) == len(names) == len(given) and given == fields[:len(given)]:
            pick = [where[f] for f in given]  # the leading fields, in the dataclass's order

            def positional(values: Sequence[Any]) -> T:
                return cls(*[values[i] for i in pick])

            return positional

        def by_keyword(values: Sequence[Any]) -> T:  # class_row's way (and its TypeError)
            return cls(**dict(zip(names, values, strict=True)))

        return by_keyword

    return factory


def all_rows(conn: psycopg.Connection[Any], cls: type[T], query: LiteralString,
             params: dict[str, Any] | None = None) -> list[T]:
    """Every row of ``query``, each read into ``cls`` by :func:`known_columns_row`."""
    return conn.cursor(row_factory=known_columns_row(cls)).execute(query, params).fetchall()


def one_row(conn: psycopg.Connection[Any], cls: type[T], query: LiteralString,
            params: dict[str, Any] | None = None) -> T | None:
    """The first row of ``query`` read into ``cls`` (None: no row)."""
    return conn.cursor(row_factory=known_columns_row(cls)).execute(query, params).fetchone()


def as_dict(row: Any) -> dict[str, Any]:
    """A row's fields by name, in column order (shallow: values are not copied)."""
    return {f.name: getattr(row, f.name) for f in dataclasses.fields(row)}
