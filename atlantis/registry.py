"""The application: job and workflow declarations plus the Python handler for each job."""

from __future__ import annotations

import dataclasses
import inspect
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

from atlantis.declarations.crosscheck import check_workflows
from atlantis.declarations.decl_cache import read_atl_file
from atlantis.declarations.model import JobDecl, WorkflowDecl
from atlantis.errors import ConfigurationError, DeclarationError

Handler = Callable[..., Any]
H = TypeVar("H", bound=Handler)


def args_class(decl: JobDecl) -> type:
    """A frozen dataclass with one attribute per declared field, built at run time.

    The `.atl` checker refuses field names Python cannot take as attributes; a declaration
    made in Python, which it never saw, is refused here, naming where it was declared.
    """
    fields = [(f.name, Any, dataclasses.field(default=None)) for f in decl.fields]
    cls_name = f"{decl.name}Args"
    try:
        return dataclasses.make_dataclass(cls_name, fields, frozen=True, kw_only=True)
    except (TypeError, ValueError) as exc:
        where = f"{decl.source}: " if decl.source else ""
        raise DeclarationError(
            f"{where}job {decl.qualified_name}: its fields cannot be attributes of an args "
            f"class: {exc}"
        ) from None


def check_signature(job: str, fn: Handler) -> None:
    """Refuse, when the app loads, a handler that cannot be called as ``fn(ctx, args)``.

    Defaults and ``*args`` are fine; a third required argument, a required keyword-only
    argument or fewer than two positional places are not. A callable whose signature Python
    cannot read (some builtins) is let through: its first run says what is wrong.
    """
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    try:
        sig.bind(None, None)
    except TypeError as exc:
        name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)
        module = getattr(fn, "__module__", None)
        where = f"{module}.{name}" if module else name
        raise ConfigurationError(
            f"the handler of job {job}, {where}{sig}, cannot take (ctx, args): {exc}"
        ) from None


@dataclasses.dataclass
class Registration:
    decl: JobDecl
    handler: Handler
    args_type: type


class Registry:
    """Declarations (from `.atl` files) and the handler registered for each job.

    ``ATLANTIS_APP=package.module:registry`` names one of these to the supervisor and to
    ``tide``. A workflow's steps are checked against the jobs once they are all known: by
    :meth:`from_atl` after every file is read, by :meth:`add` for what it adds.
    """

    def __init__(self, decls: Iterable[JobDecl] = (),
                 workflows: Iterable[WorkflowDecl] = ()) -> None:
        self.decls: dict[str, JobDecl] = {}
        self.workflows: dict[str, WorkflowDecl] = {}
        self.registrations: dict[str, Registration] = {}
        self.add(decls, workflows)

    @classmethod
    def from_atl(cls, *paths: str | Path) -> Registry:
        """Read `.atl` files; a relative path is looked up beside the calling module first."""
        caller = sys._getframe(1).f_code.co_filename
        base = Path(caller).resolve().parent if caller and not caller.startswith("<") else None
        decls: list[JobDecl] = []
        workflows: list[WorkflowDecl] = []
        for raw in paths:
            path = Path(raw)
            if not path.is_absolute() and base is not None and (base / path).exists():
                path = base / path
            try:
                found = read_atl_file(path)
            except OSError as exc:
                raise ConfigurationError(f"cannot read {raw}: {exc.strerror or exc}") from exc
            decls.extend(found.jobs)
            workflows.extend(found.workflows)
        return cls(decls, workflows)

    def add(self, decls: Iterable[JobDecl], workflows: Iterable[WorkflowDecl] = ()) -> None:
        """Add jobs, then workflows, whose steps must name jobs known by then; nothing is
        added when something is refused."""
        jobs = dict(self.decls)
        for decl in decls:
            if decl.qualified_name in jobs:
                raise DeclarationError(
                    f"{decl.source}: job {decl.qualified_name} is declared twice "
                    f"(first at {jobs[decl.qualified_name].source})"
                )
            other = self.workflows.get(decl.qualified_name)
            if other is not None:
                raise DeclarationError(
                    f"{decl.source}: job {decl.qualified_name} has the name of a workflow "
                    f"(declared at {other.source}); a workflow and a job cannot share a name"
                )
            jobs[decl.qualified_name] = decl
        flows = dict(self.workflows)
        for workflow in workflows:
            first = flows.get(workflow.qualified_name)
            if first is not None:
                raise DeclarationError(
                    f"{workflow.name_at or workflow.source}: workflow "
                    f"{workflow.qualified_name} is declared twice (first at {first.source})"
                )
            flows[workflow.qualified_name] = workflow
        check_workflows(jobs, [flows[name] for name in flows if name not in self.workflows])
        self.decls.update(jobs)
        self.workflows.update(flows)

    def handler(self, job: str, *, args_type: type | None = None) -> Callable[[H], H]:
        """Decorator: ``@registry.handler("directory.ImportContacts")``."""

        def decorate(fn: H) -> H:
            self.register(job, fn, args_type=args_type)
            return fn

        return decorate

    def register(self, job: str, fn: Handler, *, args_type: type | None = None) -> None:
        decl = self.decls.get(job)
        if decl is None:
            known = ", ".join(sorted(self.decls)) or "none"
            raise ConfigurationError(f"no declaration for job {job!r} (declared: {known})")
        if job in self.registrations:
            raise ConfigurationError(f"job {job!r} already has a handler")
        check_signature(job, fn)
        self.registrations[job] = Registration(decl, fn, args_type or args_class(decl))

    def queues(self) -> set[str]:
        return {d.queue for d in self.decls.values()}
