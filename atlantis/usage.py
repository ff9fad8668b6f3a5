"""Click usage errors as one line on stderr, exit 2 (``tide`` and ``atlantis-supervise``).

Click prints a usage error as three lines (usage, a hint, the error). Our commands promise
one line for every failure, so scripts and systemd's journal show what went wrong where
they show the command's last line. The root command of a program uses
``cls=OneLineCommand`` (or ``OneLineGroup``); every usage error raised below it, while
parsing or by a command itself (``click.BadParameter``), is shown as
``prog: what is wrong (see `prog sub --help`)``.

It sits below both programs (it needs click alone), so neither imports the other for it.

A program whose root sets ``json_errors`` (``tide``) shows a usage error of a command line
holding ``--json`` as one JSON object on stdout instead, ``{"error": ..., "kind": "usage"}``,
with the same exit status; :func:`json_errors_wanted` tells its commands to do the same.
"""

from __future__ import annotations

import json
from typing import IO, Any

import click
from click.exceptions import NoArgsIsHelpError

#: Where the root context's ``meta`` (shared by every context below it) says that the
#: command line asked for ``--json``.
JSON_ERRORS = "atlantis.json_errors"


def error_json(message: str, kind: str) -> str:
    """An error as one line of JSON: ``{"error": message, "kind": kind}``."""
    return json.dumps({"error": message, "kind": kind}, ensure_ascii=False)


def json_errors_wanted() -> bool:
    """Whether the running command's errors are JSON: its command line holds ``--json`` (or
    a context of it has the flag ``as_json`` set) under a root with ``json_errors``."""
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return False
    if ctx.meta.get(JSON_ERRORS):
        return True
    while ctx is not None:
        if ctx.params.get("as_json") is True:
            return True
        ctx = ctx.parent
    return False


def _asks_json(args: list[str]) -> bool:
    """``--json`` among the options (before a ``--``)."""
    return "--json" in (args[:args.index("--")] if "--" in args else args)


class OneLineUsageError(click.ClickException):
    """A usage error, shown as one line; exit status 2."""

    exit_code = 2

    def __init__(self, prog: str, message: str, as_json: bool = False) -> None:
        super().__init__(message)
        self.prog = prog
        self.as_json = as_json

    def show(self, file: IO[Any] | None = None) -> None:
        if self.as_json:
            click.echo(error_json(self.message, "usage"))
        else:
            click.echo(f"{self.prog}: {self.message}", err=True)


def _one_line(exc: click.UsageError, prog: str | None, as_json: bool) -> OneLineUsageError:
    message = " ".join(exc.format_message().split())
    if exc.ctx is not None:
        message += f" (see `{exc.ctx.command_path} --help`)"
        prog = prog or exc.ctx.find_root().info_name
    return OneLineUsageError(prog or "error", message, as_json)


class OneLineCommand(click.Command):
    """A root command whose usage errors (its own and its subcommands') are one line."""

    #: ``--json`` on the command line makes its errors JSON objects on stdout.
    json_errors = False

    def make_context(self, info_name: str | None, args: list[str],
                     parent: click.Context | None = None, **extra: Any) -> click.Context:
        wants_json = self.json_errors and _asks_json(args)  # before parsing consumes args
        try:
            ctx = super().make_context(info_name, args, parent, **extra)
        except NoArgsIsHelpError:
            raise  # a bare group: its help, as click shows it
        except click.UsageError as exc:
            raise _one_line(exc, info_name, wants_json) from None
        ctx.meta[JSON_ERRORS] = wants_json
        return ctx

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except NoArgsIsHelpError:
            raise
        except click.UsageError as exc:
            raise _one_line(exc, ctx.find_root().info_name,
                            bool(ctx.meta.get(JSON_ERRORS))) from None


class OneLineGroup(OneLineCommand, click.Group):
    """A root group whose usage errors (its own and its subcommands') are one line."""


class JsonErrorsGroup(OneLineGroup):
    """A root group whose usage errors are one line, or one JSON object under ``--json``."""

    json_errors = True
