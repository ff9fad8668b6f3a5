"""Load the application named by ``--app`` / ``ATLANTIS_APP`` (``package.module:attribute``)."""

from __future__ import annotations

import importlib
import os
import sys
import traceback

from atlantis import environ
from atlantis.errors import AtlantisError, ConfigurationError
from atlantis.registry import Registry


def load_app(spec: str | None) -> Registry:
    """Import the module and return its :class:`Registry`; ConfigurationError says why not."""
    spec = spec or os.environ.get(environ.APP)
    if not spec:
        raise ConfigurationError(
            f"no application: pass --app package.module:registry or set {environ.APP}")
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigurationError(f"--app {spec!r}: expected package.module:attribute")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise ConfigurationError(f"--app {spec!r}: no module named {exc.name!r}") from exc
        raise ConfigurationError(f"--app {spec!r}: importing it failed: {_one_line(exc)}") from exc
    except AtlantisError as exc:
        raise ConfigurationError(f"--app {spec!r}: {exc}") from exc
    except Exception as exc:
        raise ConfigurationError(f"--app {spec!r}: importing it failed: {_one_line(exc)}") from exc
    try:
        registry = getattr(module, attr)
    except AttributeError:
        raise ConfigurationError(f"--app {spec!r}: module {module_name} has no attribute {attr!r}") from None
    if not isinstance(registry, Registry):
        raise ConfigurationError(
            f"--app {spec!r}: {attr} is a {type(registry).__name__}, not an atlantis.Registry"
        )
    return registry


def _one_line(exc: BaseException) -> str:
    """``Type: message (file:line)`` on one line, pointing into the app's code.

    Frames of the import machinery (``<frozen importlib._bootstrap>``) say nothing to the
    user; a SyntaxError has no frame of its own and carries its place instead. Newlines in
    the message are folded so that a command's error stays one line.
    """
    if isinstance(exc, SyntaxError) and exc.filename:
        text, at = f"{type(exc).__name__}: {exc.msg}", f" ({exc.filename}:{exc.lineno})"
    else:
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith("<")]
        at = f" ({frames[-1].filename}:{frames[-1].lineno})" if frames else ""
        text = f"{type(exc).__name__}: {exc}"
    return " ".join(line.strip() for line in text.splitlines() if line.strip()) + at
