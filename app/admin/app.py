"""`orderly admin`: the admin API and the console on their own port (I/O shell; DESIGN.md §3.1).

Never on the webhook port. People sign in through OpenID Connect (app/admin/signin.py, oidc.py) into
server-side sessions (sessions.py) with a role; the shared ``ORDERLY_ADMIN_TOKEN`` is break-glass.
app/admin/guard.py enforces it on every route: without a credential ``/api/*`` answers 401 JSON and
a page redirects to ``/login``; a role too low gets 403 (app/admin/auth.py says which role a route needs). Reads
go through app/admin/queries.py (the search: resource_search.py), actions through app/admin/actions.py
(each one audited), the same functions the operator commands call. The API is app/admin/api.py's, the console's pages
app/admin/console.py's. Its /metrics is served apart, on ``ORDERLY_METRICS_HOST:ORDERLY_METRICS_PORT``
like every process's (DESIGN.md §7), so the admin port answers nothing without a credential but
sign-in and health. Each admin process purges ended and expired sessions every few minutes.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiohttp import web

from app.admin import api, console, sessions, signin, tokens
from app.admin.context import ADMIN, Admin
from app.admin.guard import guard
from app.metrics import every, serve_metrics
from app.process_setup import dump_tasks_on_usr1
from app.settings import Settings

log = logging.getLogger("orderly.admin")
PURGE_INTERVAL_S = 300.0  # sign-ins purge too: between them the table holds at most this long's ended sessions


async def purge_sessions(admin: Admin) -> None:
    async with admin.db() as conn:
        purged = await sessions.purge(conn, *signin.limits(admin))
    if purged:
        log.info("purged %d ended or expired console sessions", purged)


def create_app(settings: Settings) -> web.Application:
    app = web.Application(middlewares=[guard], client_max_size=64 * 1024)
    admin = Admin(settings)
    app[ADMIN] = admin
    api.add_routes(app)
    console.add_routes(app)
    signin.add_routes(app)
    tokens.add_routes(app)

    async def lifecycle(app: web.Application) -> Any:
        dump_tasks_on_usr1()
        await admin.start()
        metrics = (await serve_metrics(admin.metrics.registry, settings.metrics_port, settings.metrics_host)
                   if settings.metrics_port else None)
        purging = asyncio.create_task(every(PURGE_INTERVAL_S, lambda: purge_sessions(admin), "session purge"))
        yield
        purging.cancel()
        await asyncio.gather(purging, return_exceptions=True)
        if metrics is not None:
            await metrics.cleanup()
        await admin.stop()

    app.cleanup_ctx.append(lifecycle)
    return app


def run(settings: Settings) -> None:
    app = create_app(settings)
    log.info("admin API and console on http://%s:%d (/metrics: %s)", settings.admin_host, settings.admin_port,
             f"http://{settings.metrics_host}:{settings.metrics_port}/metrics" if settings.metrics_port else "off")
    web.run_app(app, host=settings.admin_host, port=settings.admin_port, access_log=None, print=None,
                handle_signals=True)
