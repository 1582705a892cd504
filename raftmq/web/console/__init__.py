"""The web console: a person's view of the cluster, and the few actions an operator
takes from it.

Server-rendered pages (Jinja2) at `/`, `/topics`, `/groups`, `/messages`,
`/transactions`, `/users` and `/chaos`; each page's numbers also as JSON under
`/console/...`, which the page polls to refresh its rates and lag plots (uPlot, vendored
under `static/vendor`); actions POSTed to `/actions/...`, each confirmed first and
audited. Every request acts on the cluster as its user (`login.admin_for`).
`raftmq.web.app` mounts `routes(settings)` beside the HTTP API.
"""

from __future__ import annotations

from starlette.routing import BaseRoute, Mount
from starlette.staticfiles import StaticFiles

from raftmq.web.settings import WebSettings

from .actions import action_routes
from .pages import page_routes
from .render import HERE

__all__ = ["routes"]


def routes(settings: WebSettings) -> list[BaseRoute]:
    """The console's routes, for a Starlette application serving `settings`' cluster."""
    return [*page_routes(settings), *action_routes(settings),
            Mount("/static", StaticFiles(directory=HERE / "static"), name="static")]
