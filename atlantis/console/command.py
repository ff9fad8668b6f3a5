"""``tide console``: the web console (the optional extra ``atlantis-jobs[console]``).

It lives with the console, the lower layer: ``tide`` (:mod:`atlantis.cli`) adds the command
with ``main.add_command(console)``, and it also runs on its own as
``python -m atlantis.console``; nothing of the console imports the CLI. Without the extra installed it says how to install it and
exits 2. It binds to 127.0.0.1 unless told otherwise, is read-only unless
``ATLANTIS_CONSOLE_TOKEN`` is set, and with ``--private`` asks for the token before showing
anything. ``--port 0`` picks a free port; the address is printed on stderr either way.
"""

from __future__ import annotations

import os
import socket
import sys

import click

from atlantis import environ


def _missing_extra() -> str | None:
    """The name of a console dependency that is not installed, or None."""
    for module in ("starlette", "jinja2", "uvicorn"):
        try:
            __import__(module)
        except ImportError:
            return module
    return None


@click.command("console")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on. Anything but loopback exposes the console to the "
                   f"network: set {environ.CONSOLE_TOKEN} and consider --private.")
@click.option("--port", default=8321, show_default=True, type=click.IntRange(0, 65535),
              help="Port to listen on (0: any free port).")
@click.option("--private", is_flag=True,
              help="Require the token for reads too (args and logs may hold personal data).")
@click.option("--args-redact", "redact", multiple=True, metavar="KEY",
              help="Hide this args field (at any depth) everywhere; repeatable.")
@click.option("--database-url", "database_url", default=None,
              help=f"libpq URL; default tide's --database-url, ${environ.DATABASE_URL} or "
                   "embedded.")
@click.pass_context
def console(ctx: click.Context, host: str, port: int, private: bool, redact: tuple[str, ...],
            database_url: str | None) -> None:
    """Serve the web console: live progress, logs, dead letters, queues, workers."""
    missing = _missing_extra()
    if missing is not None:
        click.echo(f"tide: console: {missing} is not installed; the console needs its extra: "
                   "pip install 'atlantis-jobs[console]'", err=True)
        sys.exit(2)
    import uvicorn

    from atlantis.console.app import create_app
    from atlantis.console.settings import Settings, loopback, loopback_hosts
    from atlantis.store.database import (
        DatabaseUrlError,
        announce,
        check_url,
        resolve_url,
    )
    from atlantis.store.database import (
        redact as redact_url,
    )

    root = ctx.find_root().obj if ctx.find_root().obj else {}
    explicit = database_url or root.get("database_url") or os.environ.get(environ.DATABASE_URL)
    try:
        url = resolve_url(explicit)
    except Exception as exc:
        click.echo(f"tide: cannot start the embedded PostgreSQL: {exc}", err=True)
        sys.exit(1)
    try:
        check_url(url)
    except DatabaseUrlError as exc:
        click.echo(f"tide: {exc}", err=True)
        sys.exit(2)
    announce(url, embedded=not explicit)
    settings = Settings.from_env(
        url, private=private, redact=frozenset(redact),
        allowed_hosts=loopback_hosts(host) if loopback(host) else None)
    if private and settings.token is None:
        click.echo(f"tide: console: --private needs {environ.CONSOLE_TOKEN} (label:secret)",
                   err=True)
        sys.exit(2)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        click.echo(f"tide: console: cannot listen on {host}:{port}: {exc.strerror}", err=True)
        sys.exit(1)
    sock.listen(128)
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if family == socket.AF_INET6 else host
    mode = ("private, " if private else "") + (
        "writes with the token" if settings.token
        else f"read-only ({environ.CONSOLE_TOKEN} not set)")
    click.echo(f"atlantis console on http://{shown}:{bound}/ ({mode}; database "
               f"{redact_url(url)})", err=True)
    if not loopback(host):
        click.echo(f"tide: console: warning: listening on {host}, beyond this machine", err=True)
    config = uvicorn.Config(create_app(settings), log_level="warning", access_log=False,
                            lifespan="on", timeout_graceful_shutdown=2)
    server = uvicorn.Server(config)
    server.run(sockets=[sock])
