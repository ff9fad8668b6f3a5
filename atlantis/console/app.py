"""The console's ASGI application: pages, ``/api``, ``/static``, one LISTEN broker."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from starlette.applications import Starlette
from starlette.datastructures import MutableHeaders
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from atlantis.console import api, limits, metrics, pages, schedules, workers, workflows
from atlantis.console.data import Database
from atlantis.console.events import Broker
from atlantis.console.settings import Settings

HERE = Path(__file__).resolve().parent

#: Scripts and styles only from the console itself: a `<script>` that slipped into a page
#: would not run, nor would an inline handler or style attribute.
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'")


class SecurityHeaders:
    """Headers on every response (plain ASGI, so event streams pass through untouched)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        static = str(scope.get("path", "")).startswith("/static/")

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                headers.setdefault("Content-Security-Policy", CSP)
                headers.setdefault("X-Content-Type-Options", "nosniff")
                headers.setdefault("X-Frame-Options", "DENY")
                headers.setdefault("Referrer-Policy", "no-referrer")
                if not static:
                    headers.setdefault("Cache-Control", "no-store")
            await send(message)

        await self.app(scope, receive, send_with_headers)


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
        routes=[Mount("/api", routes=[*workflows.api_routes, *limits.api_routes,
                                      *workers.api_routes, *schedules.api_routes,
                                      *api.routes]),
                Mount("/static", app=StaticFiles(directory=HERE / "static"), name="static"),
                *workflows.page_routes, *limits.page_routes, *workers.page_routes,
                *schedules.page_routes, *metrics.routes, *pages.routes],
        middleware=middleware, lifespan=lifespan)
    app.state.settings = settings
    app.state.db = db
    app.state.broker = broker
    return app
