"""`orderly admin`: the admin API and the console on their own port (I/O shell; DESIGN.md §3.1).

Never on the webhook port. People sign in through OpenID Connect (app/admin/signin.py, oidc.py) into
server-side sessions (sessions.py) with a role; the shared ``ORDERLY_ADMIN_TOKEN`` is break-glass.
app/admin/guard.py enforces it on every route: without a credential ``/api/*`` answers 401 JSON and
a page redirects to ``/login``; a role too low gets 403 (app/admin/auth.py says which role a route needs). Reads
go through app/admin/queries.py, actions through app/admin/actions.py (each one audited), the same
functions the operator commands call. The API is app/admin/api.py's, the console's pages
app/admin/console.py's.
"""

from __future__ import annotations

import logging
from typing import Any

from aiohttp import web

from app.admin import api, console, signin, tokens
from app.admin.context import ADMIN, Admin
from app.admin.guard import guard
from app.settings import Settings

log = logging.getLogger("orderly.admin")


def create_app(settings: Settings) -> web.Application:
    app = web.Application(middlewares=[guard], client_max_size=64 * 1024)
    admin = Admin(settings)
    app[ADMIN] = admin
    api.add_routes(app)
    console.add_routes(app)
    signin.add_routes(app)
    tokens.add_routes(app)

    async def lifecycle(app: web.Application) -> Any:
        await admin.start()
        yield
        await admin.stop()

    app.cleanup_ctx.append(lifecycle)
    return app


def run(settings: Settings) -> None:
    app = create_app(settings)
    log.info("admin API and console on http://%s:%d", settings.admin_host, settings.admin_port)
    web.run_app(app, host=settings.admin_host, port=settings.admin_port, access_log=None, print=None,
                handle_signals=True)
