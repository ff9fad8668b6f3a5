"""A `.atl` file as written: what the syntax walk (``parser.py``) hands the checks (``checks.py``).

Every piece keeps the tokens it was read from, so that a refusal can point at the word at
fault. Literal values stay lark subtrees: their positions and source text are all the checks
need from them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NoReturn

import lark

from atlantis.errors import DeclarationError

Tree = lark.Tree[lark.Token]


@dataclass(frozen=True)
class RawType:
    """``TYPE_NAME [(n)] [[]]``."""

    base: lark.Token
    length: lark.Token | None  # the NUMBER inside the parentheses
    array: bool


@dataclass(frozen=True)
class RawOption:
    """``not null`` (value None) or ``default literal``, in the order written."""

    kind: str  # "not_null" or "default"
    head: lark.Token  # the keyword: `not` or `default`
    value: Tree | None


@dataclass(frozen=True)
class RawField:
    name: lark.Token
    type: RawType
    options: tuple[RawOption, ...]


@dataclass(frozen=True)
class RawStep:
    """``step NAME JOB [after STEP, ...] [compensate JOB]`` of a workflow block."""

    name: lark.Token
    job: lark.Token  # as written: `Name` or `namespace.Name`
    after: tuple[lark.Token, ...]
    compensate: lark.Token | None


@dataclass(frozen=True)
class RawStatement:
    """One modifier of a job or workflow block, e.g. ``retries 3`` or ``args { ... }``."""

    modifier: str  # args, retries, timeout, heartbeat, queue, priority, unique, step, ...
    head: lark.Token  # the keyword
    value: lark.Token | None = None  # the single value of retries, timeout, queue, ...; N of
    # concurrency and rate
    fields: tuple[RawField, ...] = ()  # args
    names: tuple[lark.Token, ...] = ()  # unique; the `by` fields of concurrency and rate
    step: RawStep | None = None  # step
    period: lark.Token | None = None  # rate: the DURATION after `/`


@dataclass(frozen=True)
class RawJob:
    """``job Name in namespace { statements }``."""

    keyword: lark.Token
    name: lark.Token
    namespace: lark.Token
    statements: tuple[RawStatement, ...]


@dataclass(frozen=True)
class RawWorkflow:
    """``workflow Name in namespace { statements }``."""

    keyword: lark.Token
    name: lark.Token
    namespace: lark.Token
    statements: tuple[RawStatement, ...]


@dataclass(frozen=True)
class Source:
    """The text being read, for messages of the form ``file:line:column: what is wrong``."""

    text: str
    filename: str

    def fail(self, where: lark.Token | Tree, what: str) -> NoReturn:
        if isinstance(where, lark.Token):
            line, column = position(where)
        else:
            line, column = where.meta.line, where.meta.column
        raise error(self.filename, line, column, what)

    def written(self, where: lark.Token | Tree) -> str:
        """The source text of a token or subtree, quoted for a message."""
        if isinstance(where, lark.Token):
            return quote(str(where))
        return quote(self.text[where.meta.start_pos : where.meta.end_pos])

    def first_at(self, token: lark.Token) -> str:
        return f"(first at {self.filename}:{token.line})"


def error(filename: str, line: int, column: int, what: str) -> DeclarationError:
    return DeclarationError(f"{filename}:{line}:{column}: {what}")


def quote(text: str) -> str:
    if len(text) > 40:
        text = text[:37] + "..."
    return f"'{text}'"


def at(filename: str, token: lark.Token) -> str:
    """``file:line:column`` of a token, kept in a declaration for refusals made later."""
    line, column = position(token)
    return f"{filename}:{line}:{column}"


def position(token: lark.Token) -> tuple[int, int]:
    # Every token lark's lexer makes has a position; only hand-made ones lack it.
    return token.line or 1, token.column or 1


def tokens(tree: Tree) -> list[lark.Token]:
    return [child for child in tree.children if isinstance(child, lark.Token)]


def subtrees(tree: Tree) -> list[Tree]:
    return [child for child in tree.children if isinstance(child, lark.Tree)]
