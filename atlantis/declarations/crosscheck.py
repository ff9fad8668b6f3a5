"""The checks of workflow declarations that need every file read: does each step's job exist,
does it take the workflow's args, is a workflow named like a job.

Kept apart from the parser (:mod:`atlantis.declarations.workflows` reads one file's
workflows), so that a process that loads declarations an earlier one read
(:mod:`atlantis.declarations.decl_cache`) runs them without importing lark.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NoReturn

from atlantis.declarations.model import Field, JobDecl, WorkflowDecl
from atlantis.errors import DeclarationError

__all__ = ["check_workflows", "clash"]


def check_workflows(jobs: Mapping[str, JobDecl], workflows: Iterable[WorkflowDecl]) -> None:
    """Refuse a workflow whose steps name a job not in `jobs` (by qualified name), or one
    that does not take the workflow's args, or a workflow named like a job."""
    for workflow in workflows:
        job = jobs.get(workflow.qualified_name)
        if job is not None:
            _refuse(workflow.name_at or workflow.source, clash(workflow, job))
        fields = {f.name: f for f in workflow.fields}
        for step in workflow.steps:
            runs = [(step.job, step.job_at, "runs")]
            if step.compensate is not None:
                runs.append((step.compensate, step.compensate_at, "is compensated by"))
            for name, where, verb in runs:
                decl = jobs.get(name)
                where = where or step.source or workflow.source
                if decl is None:
                    _refuse(where, f"step '{step.name}' of workflow {workflow.qualified_name} "
                            f"{verb} job {name}, which is not declared{_known(jobs, name)}")
                problem = _args_problem(fields, decl)
                if problem is not None:
                    _refuse(where, f"step '{step.name}' of workflow {workflow.qualified_name} "
                            f"{verb} job {name}, {problem}")


def _args_problem(fields: Mapping[str, Field], job: JobDecl) -> str | None:
    """Why `job` cannot take its args by name from a workflow with `fields`, or None."""
    for f in job.fields:
        needed = f.not_null and not f.has_default
        mine = fields.get(f.name)
        if mine is None:
            if needed:
                return (f"which needs arg '{f.name}' ({f.type_name} not null); the workflow "
                        f"has no arg '{f.name}'")
            continue
        if mine.type_name != f.type_name:
            return (f"which takes arg '{f.name}' as {f.type_name}; the workflow declares it "
                    f"{mine.type_name}")
        if needed and not mine.not_null:
            return (f"which needs arg '{f.name}' not null; the workflow's '{f.name}' may be "
                    "null (declare it not null)")
    return None


def clash(workflow: WorkflowDecl, job: JobDecl) -> str:
    return (f"workflow {workflow.qualified_name} has the name of a job (declared at "
            f"{job.source}); a workflow and a job cannot share a name")


def _known(jobs: Mapping[str, Any], name: str) -> str:
    namespace = name.rpartition(".")[0]
    same = sorted(j for j in jobs if j.rpartition(".")[0] == namespace)
    if len(same) > 8:
        same = [*same[:8], "..."]
    return f" (declared in {namespace}: {', '.join(same)})" if same else ""


def _refuse(where: str, what: str) -> NoReturn:
    raise DeclarationError(f"{where}: {what}")
