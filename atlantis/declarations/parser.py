"""Reading `.atl` files into :class:`JobDecl` and :class:`WorkflowDecl` values: the syntax.

The grammar (``atl.lark``) fixes the shape of a file; this module runs it, rewords its
refusals, and walks the tree into raw blocks (``raw.py``) that keep every token. Everything
that needs more than one token to judge (does the type exist, does the default fit it, is a
job, field or modifier repeated) is decided by ``checks.py``. Every refusal, syntactic or
not, reads ``file:line:column: what is wrong`` and names the token at fault. Lark's
exceptions never leave this module: they speak of grammar terminals, and a user wrote jobs.
"""

from __future__ import annotations

import codecs
import functools
import importlib.resources
import re
from collections.abc import Iterable
from pathlib import Path

import lark
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken

from atlantis.declarations import parser_cache
from atlantis.declarations.checks import TYPES, check_file
from atlantis.declarations.model import Declarations, JobDecl
from atlantis.declarations.raw import (
    RawField,
    RawJob,
    RawOption,
    RawStatement,
    RawStep,
    RawType,
    RawWorkflow,
    Source,
    Tree,
    error,
    position,
    quote,
    subtrees,
    tokens,
)
from atlantis.declarations.workflows import WORKFLOW_MODIFIERS, check_workflows_of_file
from atlantis.errors import DeclarationError

__all__ = [
    "MODIFIERS", "TYPES", "WORKFLOW_MODIFIERS", "Declarations", "parse_atl", "parse_atl_file",
    "read_atl", "read_atl_bytes",
]  # fmt: skip

#: The statements a job block may hold, in the order error messages list them.
MODIFIERS = ("args", "retries", "timeout", "heartbeat", "queue", "priority", "unique", "backoff",
             "stall", "schedule", "tz", "overlap", "concurrency", "rate")

_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# What a terminal means to someone writing a .atl file; terminals missing here are
# punctuation and are shown as written.
_TERMINALS = {
    "NAME": "a name",
    "TYPE_NAME": "a type",
    "OVERLAP_MODE": "skip or allow",
    "JOB_NAME": "a job name",
    "NUMBER": "a number",
    "DURATION": "a duration such as 30s or 1h30m",
    "STRING": "a string in double quotes",
    "_NL": "end of line",
    "$END": "end of file",
}
_MODIFIER_TERMINALS = frozenset(m.upper() for m in MODIFIERS)
_WORKFLOW_MODIFIER_TERMINALS = frozenset(m.upper() for m in WORKFLOW_MODIFIERS)
_BLOCKS = ("job", "workflow")
_VALUE_TERMINALS = frozenset({"STRING", "NUMBER", "TRUE", "FALSE", "NULL", "LSQB", "LBRACE"})


@functools.cache
def _parser() -> lark.Lark:
    """The LALR parser, made on first use and then kept: never at import time, which every
    process importing atlantis would pay even when it never reads a `.atl` file. Made once
    per user and version, and loaded by the other processes (:mod:`parser_cache`)."""
    grammar = (
        importlib.resources.files("atlantis.declarations")
        .joinpath("atl.lark")
        .read_text(encoding="utf-8")
    )
    return parser_cache.build(grammar, parser="lalr", lexer="contextual",
                              propagate_positions=True)


def read_atl(text: str, filename: str = "<string>") -> Declarations:
    """The jobs and workflows declared in `text`; `filename` is only used in messages.

    A workflow's steps may name jobs of other files: whether those exist, and take the
    workflow's args, is checked once every file is read (:func:`check_workflows`, which
    the Registry runs).
    """
    try:
        tree = _parser().parse(text)
    except UnexpectedInput as exc:
        raise _syntax_error(exc, text, filename) from None
    source = Source(text, filename)
    raw_jobs, raw_workflows = _walk(tree)
    jobs = check_file(raw_jobs, source)
    return Declarations(jobs, check_workflows_of_file(raw_workflows, jobs, source))


def parse_atl(text: str, filename: str = "<string>") -> list[JobDecl]:
    """The jobs declared in `text`, in file order; `filename` is only used in messages."""
    return read_atl(text, filename).jobs


def parse_atl_file(path: str | Path) -> list[JobDecl]:
    """The jobs declared in the UTF-8 file at `path` (OSError when it cannot be read), parsed
    here: :func:`atlantis.declarations.read_atl_file` loads what an earlier process read of
    the same file instead (:mod:`decl_cache`)."""
    return read_atl_bytes(Path(path).read_bytes(), str(path)).jobs


def read_atl_bytes(raw: bytes, filename: str) -> Declarations:
    """The jobs and workflows declared in ``raw``, a `.atl` file's bytes (UTF-8, with or
    without a byte order mark); ``filename`` is only used in messages."""
    if raw.startswith(codecs.BOM_UTF8):
        raw = raw[len(codecs.BOM_UTF8) :]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        before = raw[: exc.start]
        line = before.count(b"\n") + 1
        column = len(before[before.rfind(b"\n") + 1 :].decode("utf-8", "replace")) + 1
        raise DeclarationError(
            f"{filename}:{line}:{column}: not valid UTF-8 (byte 0x{raw[exc.start]:02x})"
        ) from None
    return read_atl(text, filename)


# --------------------------------------------------------------------------- syntax errors


def _syntax_error(exc: UnexpectedInput, text: str, filename: str) -> DeclarationError:
    """Lark's report, reworded in the vocabulary of the language and pointed at a token."""
    if isinstance(exc, UnexpectedCharacters):
        char = text[exc.pos_in_stream or 0]
        if char == '"':
            what = 'unterminated string (a string must end with " on the same line)'
        else:
            what = f"unexpected character {char!r}"
        return error(filename, exc.line, exc.column, what)

    open_bracket = _innermost_open_bracket(exc)
    if isinstance(exc, UnexpectedToken) and exc.token.type != "$END":
        token = exc.token
        expected = _expected(exc)
        stray = _modifier_read_as_by_field(exc)
        if stray is not None:
            what = (f"'{stray}' reads as one more by field here (a comma after a by field "
                    f"continues the list of fields); put '{stray}' on a line of its own")
            return error(filename, *position(stray), what)
        if token in _BLOCKS and open_bracket is not None:
            what = f"unexpected '{token}': {_describe_open(open_bracket)}"
        elif _MODIFIER_TERMINALS.issubset(expected) and _WORD.fullmatch(token):
            what = f"unknown modifier {_show(token)} (expected one of: {', '.join(MODIFIERS)})"
        elif _WORKFLOW_MODIFIER_TERMINALS.issubset(expected) and _WORD.fullmatch(token):
            what = (f"unknown workflow modifier {_show(token)} "
                    f"(expected one of: {', '.join(WORKFLOW_MODIFIERS)})")
        else:
            what = f"unexpected {_show(token)}{_describe_expected(expected)}"
        return error(filename, *position(token), what)

    line = text.count("\n") + 1
    column = len(text) - (text.rfind("\n") + 1) + 1
    if open_bracket is not None:
        what = f"unexpected end of file: {_describe_open(open_bracket)}"
    else:
        what = f"unexpected end of file{_describe_expected(_expected(exc))}"
    return error(filename, line, column, what)


def _expected(exc: UnexpectedInput) -> set[str]:
    """Terminals the parser could have taken where it stopped.

    Asking the interactive parser is exact; the set lark attaches to the exception is a
    superset in states that only reduce (after a line break, for instance).
    """
    parser = getattr(exc, "interactive_parser", None)
    if parser is not None:
        try:
            return set(parser.accepts())
        except UnexpectedInput:
            pass
    return set(getattr(exc, "expected", None) or ())


def _modifier_read_as_by_field(exc: UnexpectedInput) -> lark.Token | None:
    """The modifier keyword the parser took as one more `by` field, as in
    ``concurrency 1 by account_id, rate 10/1s``, or None."""
    parser = getattr(exc, "interactive_parser", None)
    if parser is None:
        return None
    stack = parser.parser_state.value_stack
    last = stack[-1] if stack else None
    if not isinstance(last, lark.Token) or last.type != "NAME" or last not in MODIFIERS:
        return None
    for value in reversed(stack[:-1]):
        if isinstance(value, lark.Token) and value.type == "BY":
            return last
        if not isinstance(value, lark.Token) or value.type not in ("NAME", "COMMA"):
            return None
    return None


def _innermost_open_bracket(exc: UnexpectedInput) -> lark.Token | None:
    """The last `{`, `(` or `[` still unclosed when parsing stopped.

    A closed pair has been reduced into a subtree by then, so any bracket token left on
    the parser's value stack is open.
    """
    parser = getattr(exc, "interactive_parser", None)
    if parser is None:
        return None
    found = None
    for value in parser.parser_state.value_stack:
        if isinstance(value, lark.Token) and value in ("{", "(", "["):
            found = value
    return found


def _describe_open(bracket: lark.Token) -> str:
    return f"'{bracket}' opened at line {bracket.line}, column {bracket.column} is not closed"


def _describe_expected(expected: Iterable[str]) -> str:
    names = set(expected)
    if "JOB" in names:
        # Between blocks, blank lines and the end of the file are allowed too; saying so
        # would only bury the two things that can start here.
        return " (expected 'job' or 'workflow')"
    elif len(names) > 1:
        names.discard("$END")
    words = []
    if _MODIFIER_TERMINALS.issubset(names):
        names -= _MODIFIER_TERMINALS
        words.append("a modifier")
    if _VALUE_TERMINALS.issubset(names):
        names -= _VALUE_TERMINALS
        words.append("a value")
    for name in names:
        if name in _TERMINALS:
            words.append(_TERMINALS[name])
        else:
            words.append(f"'{_spelling(name)}'")
    if not words:
        return ""
    words.sort(key=lambda w: (w.startswith("end of"), w.startswith("'"), w))
    if len(words) == 1:
        return f" (expected {words[0]})"
    return f" (expected one of: {', '.join(words)})"


def _spelling(terminal: str) -> str:
    """How a keyword or punctuation terminal is written in a file."""
    pattern = _parser().get_terminal(terminal).pattern
    if isinstance(pattern, lark.lexer.PatternStr):
        return pattern.value
    return pattern.value.removesuffix(r"\b")


def _show(token: lark.Token) -> str:
    if token.type == "_NL":
        return "end of line"
    return quote(str(token))


# --------------------------------------------------------------------------- the walk


def _walk(tree: Tree) -> tuple[list[RawJob], list[RawWorkflow]]:
    """The parse tree as raw blocks, each kind in file order; refuses nothing."""
    jobs: list[RawJob] = []
    workflows: list[RawWorkflow] = []
    for block in subtrees(tree):
        if block.data == "workflow":
            keyword, name, _in, namespace = tokens(block)
            statements = tuple(_statement(s) for s in subtrees(block))
            workflows.append(RawWorkflow(keyword, name, namespace, statements))
        else:
            jobs.append(_job(block))
    return jobs, workflows


def _job(tree: Tree) -> RawJob:
    keyword, name, _in, namespace = tokens(tree)
    return RawJob(keyword, name, namespace, tuple(_statement(s) for s in subtrees(tree)))


def _statement(tree: Tree) -> RawStatement:
    modifier = str(tree.data)
    words = tokens(tree)
    if modifier == "args":
        return RawStatement(modifier, words[0], fields=tuple(_field(f) for f in subtrees(tree)))
    if modifier == "unique":
        return RawStatement(modifier, words[0], names=tuple(words[1:]))
    if modifier == "step":
        after: tuple[lark.Token, ...] = ()
        compensate: lark.Token | None = None
        for part in subtrees(tree):
            if part.data == "after":
                after = tuple(tokens(part)[1:])
            else:
                compensate = tokens(part)[1]
        step = RawStep(words[1], words[2], after, compensate)
        return RawStatement(modifier, words[0], value=words[1], step=step)
    if modifier in ("concurrency", "rate"):
        by = [tokens(part)[1:] for part in subtrees(tree)]
        period = words[2] if modifier == "rate" else None
        return RawStatement(modifier, words[0], value=words[1],
                            names=tuple(by[0]) if by else (), period=period)
    return RawStatement(modifier, words[0], value=words[1])


def _field(tree: Tree) -> RawField:
    type_tree, *options = subtrees(tree)
    length: lark.Token | None = None
    array = False
    for part in subtrees(type_tree):
        if part.data == "array":
            array = True
        else:
            length = tokens(part)[0]
    return RawField(
        name=tokens(tree)[0],
        type=RawType(tokens(type_tree)[0], length, array),
        options=tuple(
            RawOption(
                str(option.data),
                tokens(option)[0],
                subtrees(option)[0] if option.data == "default" else None,
            )
            for option in options
        ),
    )
