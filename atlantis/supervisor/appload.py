"""Loading the app again for a reload (SIGHUP), in a fresh interpreter.

The supervisor imported the app once, at start. A reload must see the code as it is now,
and a module that fails to import (a syntax error, a bad ``.atl``) or never finishes
importing must cost the supervisor nothing: so the app is imported by a short-lived
``python -m atlantis.supervisor.appload APP`` with the children's environment, which
writes what the supervisor needs (every declaration, workflows included, and the jobs that
have a handler) as one JSON document on its stdout and exits. Anything the app itself prints while importing goes
to stderr, which is discarded (the children print it again when they import the app).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import sys
from dataclasses import dataclass
from typing import Any

import orjson

from atlantis.declarations.model import Field, JobDecl, Limit, StepDecl, WorkflowDecl

LOAD_TIMEOUT = 60.0
"""The longest an import of the app may take during a reload."""


@dataclass(frozen=True, slots=True)
class LoadedApp:
    decls: list[JobDecl]
    """Every declaration of the app, as ``tide db sync`` would store them."""
    jobs: list[str]
    """The jobs that have a handler, sorted."""
    workflows: list[WorkflowDecl] = dataclasses.field(default_factory=list)
    """Every workflow declaration of the app."""


class AppLoadError(Exception):
    """The app could not be loaded; the message is one line."""


def decl_to_dict(decl: JobDecl) -> dict[str, Any]:
    return dataclasses.asdict(decl)


def decl_from_dict(raw: dict[str, Any]) -> JobDecl:
    values = dict(raw)
    values["fields"] = tuple(Field(**f) for f in raw["fields"])
    values["unique"] = tuple(raw["unique"])
    values["limits"] = tuple(Limit(**{**lim, "by": tuple(lim["by"])})
                             for lim in raw.get("limits", ()))
    return JobDecl(**values)


def workflow_from_dict(raw: dict[str, Any]) -> WorkflowDecl:
    values = dict(raw)
    values["fields"] = tuple(Field(**f) for f in raw["fields"])
    values["steps"] = tuple(StepDecl(**{**s, "after": tuple(s["after"])}) for s in raw["steps"])
    values["unique"] = tuple(raw["unique"])
    return WorkflowDecl(**values)


async def load(app: str, env: dict[str, str], timeout: float = LOAD_TIMEOUT) -> LoadedApp:
    """Import ``app`` in a fresh interpreter; :class:`AppLoadError` (one line) if it fails."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "atlantis.supervisor.appload", app, env=env,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL, start_new_session=True)
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        await _kill(proc)
        raise AppLoadError(f"--app {app!r}: importing it took longer than {timeout:g}s") from None
    except asyncio.CancelledError:
        await _kill(proc)
        raise
    try:
        doc = orjson.loads(out)
    except orjson.JSONDecodeError:
        raise AppLoadError(f"--app {app!r}: the process importing it exited with code "
                         f"{proc.returncode} and said nothing") from None
    if proc.returncode != 0 or "error" in doc:
        raise AppLoadError(str(doc.get("error") or f"exit code {proc.returncode}"))
    try:
        return LoadedApp([decl_from_dict(d) for d in doc["decls"]], sorted(doc["jobs"]),
                         [workflow_from_dict(w) for w in doc.get("workflows", ())])
    except (KeyError, TypeError, ValueError) as exc:
        raise AppLoadError(f"--app {app!r}: unreadable answer from the process importing it: "
                         f"{exc}") from None


async def _kill(proc: asyncio.subprocess.Process) -> None:
    """Kill the importing process and whatever it started (its own session)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    await proc.wait()


def main(argv: list[str] | None = None) -> int:
    """Import the app and write ``{"decls", "jobs"}`` (or ``{"error"}``) to stdout."""
    from atlantis.app import load_app

    args = sys.argv[1:] if argv is None else argv
    out = os.dup(1)
    os.dup2(2, 1)  # what the app prints is not our answer
    try:
        registry = load_app(args[0])
        if not registry.registrations:
            raise AppLoadError(f"--app {args[0]!r}: no handler is registered")
        doc: dict[str, Any] = {"decls": [decl_to_dict(d) for d in registry.decls.values()],
                               "jobs": sorted(registry.registrations),
                               "workflows": [dataclasses.asdict(w)
                                             for w in registry.workflows.values()]}
        code = 0
    except Exception as exc:
        text = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        doc, code = {"error": text or type(exc).__name__}, 1
    with os.fdopen(out, "wb") as f:
        f.write(orjson.dumps(doc))
    return code


if __name__ == "__main__":
    code = main()
    os._exit(code)  # threads the app may have started at import never hold the exit up
