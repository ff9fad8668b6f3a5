"""Reading `workflow` blocks into :class:`WorkflowDecl` values: the meaning.

Two sets of checks. Those one file settles (a repeated step or modifier, an ``after`` that
names no step, a cycle, a bad timeout, a workflow named like a job of the same file) run
as the file is read (:func:`check_workflows_of_file`). Those that need every file (does a
step's job exist, does it take the workflow's args) run once the Registry has them all
(:func:`check_workflows`, in :mod:`crosscheck`, which needs no parser). Each refusal reads ``file:line:column: what is wrong`` and
names the token at fault; the second set finds the position in the declaration.
"""

from __future__ import annotations

import lark

from atlantis.declarations.checks import Checker
from atlantis.declarations.crosscheck import check_workflows, clash
from atlantis.declarations.model import Field, JobDecl, StepDecl, WorkflowDecl
from atlantis.declarations.raw import RawStep, RawWorkflow, Source, at

__all__ = ["WORKFLOW_MODIFIERS", "check_workflows", "check_workflows_of_file"]

#: The statements a workflow block may hold, in the order error messages list them.
WORKFLOW_MODIFIERS = ("args", "step", "timeout", "unique")


def check_workflows_of_file(
    workflows: list[RawWorkflow], jobs: list[JobDecl], source: Source
) -> list[WorkflowDecl]:
    """The WorkflowDecls of one file, in file order; DeclarationError for the first fault."""
    checker = Checker(source)
    job_names = {j.qualified_name: j for j in jobs}
    decls: list[WorkflowDecl] = []
    seen: dict[str, WorkflowDecl] = {}
    for raw in workflows:
        decl = _workflow(raw, checker, source)
        first = seen.get(decl.qualified_name)
        if first is not None:
            source.fail(raw.name, f"workflow {decl.qualified_name} is declared twice "
                        f"(first at {first.source})")
        job = job_names.get(decl.qualified_name)
        if job is not None:
            source.fail(raw.name, clash(decl, job))
        seen[decl.qualified_name] = decl
        decls.append(decl)
    return decls


# --------------------------------------------------------------------------- one workflow


def _workflow(raw: RawWorkflow, checker: Checker, source: Source) -> WorkflowDecl:
    seen: dict[str, lark.Token] = {}
    fields: tuple[Field, ...] = ()
    unique: tuple[lark.Token, ...] = ()
    timeout: float | None = None
    raw_steps: list[RawStep] = []
    for statement in raw.statements:
        modifier = statement.modifier
        if modifier == "step":
            assert statement.step is not None
            raw_steps.append(statement.step)
            continue
        if modifier in seen:
            source.fail(statement.head, f"duplicate modifier '{modifier}' "
                        f"{source.first_at(seen[modifier])}")
        seen[modifier] = statement.head
        if modifier == "args":
            fields = checker.fields(statement)
        elif modifier == "unique":
            unique = checker.unique(statement)
        else:
            assert statement.value is not None
            timeout = checker.literals.duration(statement.value, "timeout", positive=True)
    declared = {f.name for f in fields}
    for token in unique:
        if str(token) not in declared:
            source.fail(token, f"unique field '{token}' is not declared in args")
    qualified = f"{raw.namespace}.{raw.name}"
    if not raw_steps:
        source.fail(raw.name, f"workflow {qualified} has no step (add one: step NAME JOB)")
    steps = _steps(raw_steps, str(raw.namespace), qualified, source)
    return WorkflowDecl(
        name=str(raw.name),
        namespace=str(raw.namespace),
        fields=fields,
        steps=steps,
        timeout=timeout,
        unique=tuple(str(t) for t in unique),
        source=f"{source.filename}:{raw.keyword.line}",
        name_at=at(source.filename, raw.name),
    )


def _steps(
    raw_steps: list[RawStep], namespace: str, workflow: str, source: Source
) -> tuple[StepDecl, ...]:
    by_name: dict[str, RawStep] = {}
    for step in raw_steps:
        first = by_name.get(str(step.name))
        if first is not None:
            source.fail(step.name, f"duplicate step '{step.name}' in workflow {workflow} "
                        f"{source.first_at(first.name)}")
        by_name[str(step.name)] = step
    for step in raw_steps:
        listed: set[str] = set()
        for token in step.after:
            if str(token) not in by_name:
                source.fail(token, f"step '{step.name}' is after '{token}', which is no step "
                            f"of workflow {workflow} (steps: {', '.join(by_name)})")
            if str(token) in listed:
                source.fail(token, f"step '{token}' is listed twice in the after of "
                            f"step '{step.name}'")
            listed.add(str(token))
    _refuse_cycle(raw_steps, by_name, workflow, source)
    filename = source.filename
    return tuple(
        StepDecl(
            name=str(step.name),
            job=_qualified(step.job, namespace),
            after=tuple(str(t) for t in step.after),
            compensate=None if step.compensate is None else _qualified(step.compensate, namespace),
            source=at(filename, step.name),
            job_at=at(filename, step.job),
            compensate_at="" if step.compensate is None else at(filename, step.compensate),
        )
        for step in raw_steps
    )


def _refuse_cycle(
    raw_steps: list[RawStep], by_name: dict[str, RawStep], workflow: str, source: Source
) -> None:
    """Refuse steps that wait for each other in a ring, naming every step in it."""
    done: set[str] = set()
    path: list[tuple[str, lark.Token | None]] = []  # (step, the `after` name leading on)
    on_path: set[str] = set()

    def visit(name: str) -> None:
        on_path.add(name)
        for token in by_name[name].after:
            path.append((name, token))
            if str(token) in on_path:
                start = next(i for i, (n, _) in enumerate(path) if n == str(token))
                ring = [n for n, _ in path[start:]]
                where = path[start][1]
                assert where is not None
                if len(ring) == 1:
                    source.fail(where, f"step '{name}' of workflow {workflow} is after itself")
                source.fail(where, f"the steps {', '.join(sorted(ring))} of workflow "
                            f"{workflow} wait for each other in a cycle "
                            f"({' after '.join([*ring, ring[0]])})")
            if str(token) not in done:
                visit(str(token))
            path.pop()
        on_path.discard(name)
        done.add(name)

    for step in raw_steps:
        if str(step.name) not in done:
            visit(str(step.name))


def _qualified(job: lark.Token, namespace: str) -> str:
    return str(job) if "." in job else f"{namespace}.{job}"
