"""Load the application named by ``--app`` / ``ATLANTIS_APP`` (``package.module:attribute``)."""

from __future__ import annotations

import importlib
import os
import sys
import traceback

from atlantis.errors import AtlantisError, ConfigurationError
from atlantis.registry import Registry

ENV_APP = "ATLANTIS_APP"


def load_app(spec: str | None) -> Registry:
    """Import the module and return its :class:`Registry`; ConfigurationError says why not."""
    spec = spec or os.environ.get(ENV_APP)
    if not spec:
        raise ConfigurationError("no application: pass --app package.module:registry or set ATLANTIS_APP")
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
    where = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    at = f" ({where[0].filename}:{where[0].lineno})" if where else ""
    return f"{type(exc).__name__}: {exc}{at}"
