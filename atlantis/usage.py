"""Click usage errors as one line on stderr, exit 2 (``tide`` and ``atlantis-supervise``).

Click prints a usage error as three lines (usage, a hint, the error). Our commands promise
one line for every failure, so scripts and systemd's journal show what went wrong where
they show the command's last line. The root command of a program uses
``cls=OneLineCommand`` (or ``OneLineGroup``); every usage error raised below it, while
parsing or by a command itself (``click.BadParameter``), is shown as
``prog: what is wrong (see `prog sub --help`)``.

It sits below both programs (it needs click alone), so neither imports the other for it.
"""

from __future__ import annotations

from typing import IO, Any

import click
from click.exceptions import NoArgsIsHelpError


class OneLineUsageError(click.ClickException):
    """A usage error, shown as one line; exit status 2."""

    exit_code = 2

    def __init__(self, prog: str, message: str) -> None:
        super().__init__(message)
        self.prog = prog

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"{self.prog}: {self.message}", err=True)


def _one_line(exc: click.UsageError, prog: str | None) -> OneLineUsageError:
    message = " ".join(exc.format_message().split())
    if exc.ctx is not None:
        message += f" (see `{exc.ctx.command_path} --help`)"
        prog = prog or exc.ctx.find_root().info_name
    return OneLineUsageError(prog or "error", message)


class OneLineCommand(click.Command):
    """A root command whose usage errors (its own and its subcommands') are one line."""

    def make_context(self, info_name: str | None, args: list[str],
                     parent: click.Context | None = None, **extra: Any) -> click.Context:
        try:
            return super().make_context(info_name, args, parent, **extra)
        except NoArgsIsHelpError:
            raise  # a bare group: its help, as click shows it
        except click.UsageError as exc:
            raise _one_line(exc, info_name) from None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except NoArgsIsHelpError:
            raise
        except click.UsageError as exc:
            raise _one_line(exc, ctx.find_root().info_name) from None


class OneLineGroup(OneLineCommand, click.Group):
    """A root group whose usage errors (its own and its subcommands') are one line."""
