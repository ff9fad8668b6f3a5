"""What the console's endpoints share: JSON errors, parameters, who is asking."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from atlantis import environ
from atlantis.console.auth import CSRF_HEADER, Principal, csrf_ok, identify
from atlantis.console.data import Database, dumps
from atlantis.console.events import Broker
from atlantis.console.settings import Settings
from atlantis.store import admin
from atlantis.store import console_queries as store

#: The most jobs one bulk action "by filter" touches.
BULK_LIMIT = 10_000
#: The most jobs a page lists.
PAGE_LIMIT = 500
#: How long an event stream may stay silent before a comment keeps it open.
KEEPALIVE = 15.0
#: The range of ids (bigint) and of attempt numbers (int) in the database.
BIGINT_MAX = 2**63 - 1
INT_MAX = 2**31 - 1


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def json(doc: Any, status: int = 200) -> Response:
    return Response(dumps(doc), status_code=status, media_type="application/json")


def error(status: int, message: str) -> Response:
    return json({"error": message}, status)


async def json_body(request: Request) -> dict[str, Any]:
    """A request's JSON object body ({} when empty); 400 when it is not one."""
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise ApiError(400, "the body is not JSON") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object")
    return body


def settings_of(request: Request) -> Settings:
    value: Settings = request.app.state.settings
    return value


def db_of(request: Request) -> Database:
    value: Database = request.app.state.db
    return value


def broker_of(request: Request) -> Broker:
    value: Broker = request.app.state.broker
    return value


def client_of(request: Request) -> str | None:
    return request.client.host if request.client else None


# -- parameters -----------------------------------------------------------------------------

def parse_args_filter(raw: str | None, hidden: frozenset[str]) -> dict[str, Any] | None:
    """``account_id:acme,region:eu`` or a JSON object: what the args must contain.

    A value that reads as JSON (``5``, ``true``, ``"5"``, ``{...}``) is taken as such,
    anything else as a string. Keys hidden by ``--args-redact`` cannot be filtered on.
    """
    if raw is not None and not isinstance(raw, str):
        raise ApiError(400, "args: expected key:value[,key:value...] or a JSON object")
    raw = text_param(raw, "args").strip()
    if not raw:
        return None
    found: Any
    if raw.startswith("{"):
        try:
            found = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise ApiError(400, "args: not a JSON object") from None
        if not isinstance(found, dict):
            raise ApiError(400, "args: not a JSON object")
    else:
        found = {}
        for part in raw.split(","):
            key, sep, value = part.partition(":")
            key, value = key.strip(), value.strip()
            if not sep or not key:
                raise ApiError(400, "args: expected key:value[,key:value...] or a JSON object")
            try:
                found[key] = orjson.loads(value)
            except orjson.JSONDecodeError:
                found[key] = value
    if hidden and any(k in hidden for k in _keys(found)):
        raise ApiError(400, "args: a redacted key cannot be filtered on")
    return dict(found)


def _keys(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [*value.keys(), *(k for v in value.values() for k in _keys(v))]
    if isinstance(value, list):
        return [k for v in value for k in _keys(v)]
    return []


def int_param(raw: str | None, name: str, *, default: int | None = None,
              low: int | None = None, high: int | None = None,
              maximum: int = BIGINT_MAX) -> int | None:
    """An integer parameter: ``high`` caps it (a limit), ``low`` and ``maximum`` (the
    database column's range) refuse it."""
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ApiError(400, f"{name}: not an integer") from None
    if low is not None and value < low:
        raise ApiError(400, f"{name}: at least {low}")
    if high is not None and value > high:
        value = high
    if not -maximum - 1 <= value <= maximum:
        raise ApiError(400, f"{name}: out of range (at most {maximum})")
    return value


def text_param(value: Any, name: str) -> str:
    """A text parameter: a string PostgreSQL can store (no NUL character)."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ApiError(400, f"{name}: a string")
    if "\x00" in value:
        raise ApiError(400, f"{name}: contains a NUL character (\\u0000), which PostgreSQL "
                            "cannot store")
    return value


def _no_nul(value: Any, name: str) -> None:
    """Refuse a NUL character anywhere in a JSON value (keys included)."""
    if isinstance(value, str):
        text_param(value, name)
    elif isinstance(value, dict):
        for k, v in value.items():
            text_param(k, name)
            _no_nul(v, name)
    elif isinstance(value, list):
        for v in value:
            _no_nul(v, name)


def job_filter(params: Any, hidden: frozenset[str]) -> store.JobFilter:
    state = text_param(params.get("state"), "state") or None
    if state is not None and state not in admin.STATES:
        raise ApiError(400, f"state: one of {', '.join(admin.STATES)}")
    args = parse_args_filter(params.get("args"), hidden)
    _no_nul(args, "args")
    return store.JobFilter(state=state, queue=text_param(params.get("queue"), "queue") or None,
                           job=text_param(params.get("job"), "job") or None, args=args)


def path_job_id(request: Request) -> int:
    raw = request.path_params["job_id"]
    try:
        value = int(raw)
    except ValueError:
        raise ApiError(404, f"no job with id {raw}") from None
    if not -BIGINT_MAX - 1 <= value <= BIGINT_MAX:
        raise ApiError(404, f"no job with id {raw}")
    return value


# -- access -----------------------------------------------------------------------------------

def require_read(request: Request) -> Principal:
    settings = settings_of(request)
    who = identify(request, settings)
    if who.bad_credentials:
        raise ApiError(401, "wrong token")
    if settings.private and not who.authenticated:
        raise ApiError(401, "this console is private: send Authorization: Bearer TOKEN")
    return who


def require_write(request: Request, csrf: str | None = None) -> Principal:
    settings = settings_of(request)
    if settings.token is None:
        raise ApiError(403, f"read-only console: {environ.CONSOLE_TOKEN} is not set")
    who = identify(request, settings)
    if who.bad_credentials:
        raise ApiError(401, "wrong token")
    if not who.authenticated:
        raise ApiError(403, "writes need Authorization: Bearer TOKEN")
    if not csrf_ok(who, csrf if csrf is not None else request.headers.get(CSRF_HEADER)):
        raise ApiError(403, "missing or wrong CSRF token")
    return who


