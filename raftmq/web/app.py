"""The ASGI application: the HTTP API under `/api/v1` and the web console at `/`.

The application's lifespan holds one task group for the users' cluster clients
(`raftmq.web.auth.Sessions`), so every client it opens is closed when it stops. The
console (`raftmq.web.console`) contributes its own routes through
`raftmq.web.console.routes(settings)`; the API's are mounted first, so `/api/v1/...`
is always the API's.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import BaseRoute, Mount

from .api import API_PREFIX, api_routes
from .auth import Sessions
from .console import routes as console_routes
from .errors import error_response
from .settings import WebSettings

__all__ = ["build_app"]


def build_app(settings: WebSettings) -> Starlette:
    """The application serving `settings`' cluster (run it with `raftmq.web.server.serve`)."""

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with anyio.create_task_group() as tg:
            sessions = Sessions(settings, tg)
            app.state.sessions = sessions
            tg.start_soon(sessions.sweep)
            try:
                yield
            finally:
                sessions.close_all()
                tg.cancel_scope.cancel()

    def for_api(request: Request) -> bool:
        return request.url.path.startswith(API_PREFIX)

    # the API's clients read JSON errors; the console's pages keep Starlette's plain ones
    async def not_found(request: Request, exc: Exception) -> Response:
        if not for_api(request):
            return PlainTextResponse("Not Found", status_code=404)
        return error_response(404, "NOT_FOUND", f"no such resource: {request.url.path}")

    async def wrong_method(request: Request, exc: Exception) -> Response:
        if not for_api(request):
            return PlainTextResponse("Method Not Allowed", status_code=405)
        return error_response(405, "MALFORMED", f"{request.method} is not allowed on "
                              f"{request.url.path}")

    routes: list[BaseRoute] = [Mount(API_PREFIX, routes=api_routes(settings)),
                               *console_routes(settings)]
    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={404: not_found, 405: wrong_method})
    app.state.settings = settings
    return app
