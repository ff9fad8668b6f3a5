"""The console's ASGI application: pages, ``/api``, ``/static``, one LISTEN broker."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles

from atlantis.console import api, pages
from atlantis.console.data import Database
from atlantis.console.events import Broker
from atlantis.console.settings import Settings

HERE = Path(__file__).resolve().parent

#: Scripts and styles only from the console itself: a `<script>` that slipped into a page
#: would not run, nor would an inline handler or style attribute.
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'")


class SecurityHeaders(BaseHTTPMiddleware):
    async def dispatch(self, request: Request,
                       call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        response = await call_next(request)
        response.headers.setdefault("Content-Security-Policy", CSP)
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        response.headers.setdefault("X-Frame-Options", "DENY")
        response.headers.setdefault("Referrer-Policy", "no-referrer")
        if not request.url.path.startswith("/static/"):
            response.headers.setdefault("Cache-Control", "no-store")
        return response


def create_app(settings: Settings) -> Starlette:
    db = Database(settings.database_url)
    broker = Broker(settings.database_url, db, redact=settings.redact,
                    poll_interval=settings.poll_interval, log_interval=settings.log_interval,
                    debounce=settings.debounce)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        db.open()
        await broker.start()
        try:
            yield
        finally:
            await broker.stop()
            db.close()

    middleware = [Middleware(SecurityHeaders)]
    if settings.allowed_hosts is not None:
        middleware.insert(0, Middleware(TrustedHostMiddleware,
                                        allowed_hosts=list(settings.allowed_hosts)))
    app = Starlette(
        routes=[Mount("/api", routes=api.routes),
                Mount("/static", app=StaticFiles(directory=HERE / "static"), name="static"),
                *pages.routes],
        middleware=middleware, lifespan=lifespan)
    app.state.settings = settings
    app.state.db = db
    app.state.broker = broker
    return app
