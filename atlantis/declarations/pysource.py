"""Python source text for the module `tide gen` writes (``codegen.py``): values, calls,
annotations and docstrings, laid out as ruff format would lay them out."""

from __future__ import annotations

from typing import Any

from atlantis.declarations.model import Field

LINE_LENGTH = 100

PYTHON_TYPES = {
    "text": "str",
    "varchar": "str",
    "uuid": "str",
    "timestamptz": "str",
    "date": "str",
    "int": "int",
    "bigint": "int",
    "boolean": "bool",
    "double": "float",
    "numeric": "decimal.Decimal",
    "jsonb": "Any",
}


def is_mixed_case(name: str) -> bool:
    """What pep8-naming calls mixedCase: accountId, but not account_id or JOB_ID."""
    return name.lower() != name and name.removeprefix("_")[:1].islower()


def annotation_of(f: Field) -> str:
    python = PYTHON_TYPES[f.type]
    if f.array:
        python = f"list[{python}]"
    if not f.not_null and python != "Any":
        python += " | None"
    return python


def is_mutable(value: Any) -> bool:
    return isinstance(value, list | dict)


def call(indent: str, function: str, arguments: list[str]) -> list[str]:
    """A call laid out as ruff format would: on one line if it fits, else the arguments
    on one line of their own if they fit, else one argument a line."""
    joined = ", ".join(arguments)
    if len(f"{indent}{function}({joined})") <= LINE_LENGTH:
        return [f"{indent}{function}({joined})"]
    if len(f"{indent}    {joined}") <= LINE_LENGTH:
        return [f"{indent}{function}(", f"{indent}    {joined}", f"{indent})"]
    return [f"{indent}{function}(", *(f"{indent}    {a}," for a in arguments), f"{indent})"]


def assignment(indent: str, target: str, value: str) -> list[str]:
    """`target = value`, with the value parenthesised on a line of its own when only that
    makes it fit, as ruff format would."""
    line = f"{indent}{target} = {value}"
    if len(line) <= LINE_LENGTH or len(f"{indent}    {value}") > LINE_LENGTH:
        return [line]
    return [f"{indent}{target} = (", f"{indent}    {value}", f"{indent})"]


def docstring(text: str, indent: str) -> str:
    text = text.replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
    if text.endswith('"'):
        text = text[:-1] + '\\"'
    return f'{indent}"""{text}"""'


def default_value(f: Field) -> str:
    """The declared default of `f` as the Python value a handler would get for it."""
    return python_value(f.default, f.type)


def python_value(value: Any, number_type: str = "jsonb") -> str:
    """A JSON value as a Python literal; numbers as a field of `number_type` holds them
    (``numeric``: ``decimal.Decimal("1.5")``, ``double``: a float)."""
    if value is None or isinstance(value, bool):
        return repr(value)
    if isinstance(value, int | float):
        if number_type == "numeric":
            return f'decimal.Decimal("{value!r}")'
        if number_type == "double":
            return repr(float(value))
        return repr(value)
    if isinstance(value, str):
        return python_string(value)
    if isinstance(value, list):
        return "[" + ", ".join(python_value(v, number_type) for v in value) + "]"
    if isinstance(value, dict):
        items = (f"{python_string(k)}: {python_value(v)}" for k, v in value.items())
        return "{" + ", ".join(items) + "}"
    raise TypeError(f"not a JSON value: {value!r}")


def python_string(text: str) -> str:
    """A string literal quoted the way ruff format prefers (double, unless that escapes more)."""
    quote = "'" if text.count('"') > text.count("'") else '"'
    out = []
    for char in text:
        if char in ("\\", quote):
            out.append("\\" + char)
        elif char == "\n":
            out.append("\\n")
        elif char == "\t":
            out.append("\\t")
        elif char == "\r":
            out.append("\\r")
        elif char.isprintable():
            out.append(char)
        elif ord(char) < 0x100:
            out.append(f"\\x{ord(char):02x}")
        elif ord(char) < 0x10000:
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(f"\\U{ord(char):08x}")
    return quote + "".join(out) + quote
