"""Handlers that record, in ``test_events``, the Python values their arguments arrived as.

``values.Big`` records ``repr(args.n)`` first (e.g. ``Decimal('123456789012345678901234567890')``),
then ``types n=Decimal ns=list[Decimal] d=float ds=list[float] i=int`` (``NoneType`` for a
field left out). ``values.Deep`` records ``doc=<type> depth=<nesting>`` and the same for
``docs``. The key is the ``key`` argument (default ``big`` and ``deep``).
"""

from __future__ import annotations

from typing import Any

import atlantis
from atlantis.limits import json_depth
from tests.apps.basic import record

registry = atlantis.Registry.from_atl("values.atl")


def type_name(value: Any) -> str:
    """``Decimal``, ``list[Decimal]``, ``list[Decimal|NoneType]``, ``dict``, ``NoneType``."""
    if isinstance(value, list) and value:
        names = sorted({type(v).__name__ for v in value})
        return f"list[{'|'.join(names)}]"
    return type(value).__name__


@registry.handler("values.Noop")
def noop(ctx: atlantis.JobContext, args: Any) -> None:
    return None


@registry.handler("values.Big")
def big(ctx: atlantis.JobContext, args: Any) -> None:
    record(ctx, args.key, repr(args.n))
    fields = {"n": args.n, "ns": args.ns, "d": args.d, "ds": args.ds, "i": args.i}
    record(ctx, args.key, "types " + " ".join(f"{k}={type_name(v)}" for k, v in fields.items()))


@registry.handler("values.Deep")
def deep(ctx: atlantis.JobContext, args: Any) -> None:
    record(ctx, args.key, f"doc={type_name(args.doc)} depth={json_depth(args.doc)}")
    record(ctx, args.key, f"docs={type_name(args.docs)} depth={json_depth(args.docs)}")



@registry.handler("values.Keyed")
def keyed(ctx: atlantis.JobContext, args: Any) -> None:
    record(ctx, args.key, f"ran {args.at}")
