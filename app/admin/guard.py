"""The middleware every admin request passes: authentication, CSRF, security headers, metrics, errors (I/O shell)."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from urllib.parse import quote

import asyncpg
from aiohttp import web

from app.admin import auth, queries, sessions, tokens
from app.admin.context import ADMIN, IDENTITY, Admin
from app.admin.http import Refused, form, problem, redirect
from app.admin.sessions import Identity
from app.readiness import UNREACHABLE

log = logging.getLogger("orderly.admin")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# Sign-in, health, readiness and the console's static files: everything else asks for a credential. /metrics
# is not on this port at all (ORDERLY_METRICS_HOST:ORDERLY_METRICS_PORT, app/admin/app.py). The API
# document is a viewer's like every other route (DESIGN.md §3.1), and refuses like the API (401, not
# a redirect).
PUBLIC = {"/login", "/auth/start", "/auth/callback", "/static/console.css", "/static/console.js", "/healthz", "/readyz"}
API_DOCUMENT = "/openapi.json"
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
                               "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}


@web.middleware
async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Authentication, CSRF, security headers, metrics, and never a traceback to the client."""
    admin = request.app[ADMIN]
    route = request.match_info.route.resource.canonical if request.match_info.route.resource else "unmatched"
    try:
        response = await _authorised(request, handler, admin)
    except web.HTTPException as exc:
        response = _answer(request, exc)
    except Refused as exc:
        response = (problem(exc.status, exc.error) if request.path.startswith("/api/")
                    else web.Response(status=exc.status, text=exc.error))
    except asyncpg.DataError as exc:  # a value PostgreSQL cannot take (out of range): the input's fault
        text = f"a value PostgreSQL cannot take: {type(exc).__name__}"
        response = problem(400, text) if request.path.startswith("/api/") else web.Response(status=400, text=text)
    except asyncpg.InvalidCachedStatementError as exc:  # in a transaction, asyncpg does not prepare it again
        log.warning("admin request %s %s: a statement prepared before a schema change (a migration) failed; "
                    "its transaction was rolled back: %r", request.method, request.path, exc)
        text = ("the database's schema changed under a prepared statement (a migration): the request stopped and "
                "its transaction was rolled back; try again")
        response = problem(503, text) if request.path.startswith("/api/") else web.Response(status=503, text=text)
    except UNREACHABLE as exc:  # asyncpg's InternalClientError too: a rollback on a connection reset mid-query
        log.warning("admin request %s %s: PostgreSQL unavailable: %r", request.method, request.path, exc)
        text = f"PostgreSQL unavailable: {type(exc).__name__}"
        response = problem(503, text) if request.path.startswith("/api/") else web.Response(status=503, text=text)
    except Exception:
        log.exception("admin request %s %s failed", request.method, request.path)
        response = (problem(500, "internal error; see the admin process's log") if request.path.startswith("/api/")
                    else web.Response(status=500, text="internal error; see the admin process's log"))
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)
    admin.metrics.requests.labels(route, str(response.status)).inc()
    return response


async def _authorised(request: web.Request, handler: Handler, admin: Admin) -> web.StreamResponse:
    if request.path in PUBLIC:
        return await handler(request)
    api = request.path.startswith("/api/") or request.path == API_DOCUMENT
    identity = await _identify(request, admin)
    if isinstance(identity, web.Response):
        return identity
    if identity is None:
        if api:
            admin.metrics.login_failures.labels("api").inc()
            return problem(401, "sign in first: Authorization: Bearer <token>, or a console session")
        if request.method != "GET":
            return web.Response(status=401, text="sign in first")
        return redirect(f"/login?next={quote(request.path_qs, safe='')}")
    request[IDENTITY] = identity
    if identity.via == auth.BREAK_GLASS:  # every use of the shared token is audited
        async with admin.db() as conn:
            await queries.audit(conn, admin.actor(request), "break-glass", f"{request.method} {request.path}"[:500],
                                "used")
    needed = auth.required_role(request.method, request.path)
    if auth.rank(identity.role) < auth.rank(needed):
        text = f"{identity.person} is {identity.role}; this needs {needed}"
        async with admin.db() as conn:  # a refused attempt is audited like a refused action
            await queries.audit(conn, admin.actor(request), "forbidden", f"{request.method} {request.path}"[:500],
                                f"refused: {identity.role}, needs {needed}")
        return problem(403, text) if api else web.Response(status=403, text=text)
    if identity.session is not None and request.method == "POST":  # a bearer token cannot be forged by a page
        given = request.headers.get("X-CSRF-Token")
        if given is None and request.content_type == "application/x-www-form-urlencoded":
            given = str((await form(request)).get("csrf", ""))
        if not auth.csrf_ok(identity.csrf or "", given):
            return (problem(403, "missing or wrong CSRF token") if api
                    else web.Response(status=403, text="missing or wrong CSRF token: reload the page"))
    return await handler(request)


async def _identify(request: web.Request, admin: Admin) -> Identity | web.Response | None:
    """Who asks: a bearer token (break-glass), else a live console session; a 429 for an address
    that sent too many wrong tokens (never for a right one)."""
    given = auth.bearer(request.headers.get("Authorization"))
    if given is not None:
        if auth.token_ok(admin.token, given):
            return Identity(auth.BREAK_GLASS, "admin", auth.BREAK_GLASS)
        if given.startswith(tokens.PREFIX):
            async with admin.db() as conn:
                personal = await tokens.identify(conn, given)
            if personal is not None:
                return personal
        who, now = admin.source(request), time.monotonic()
        if not admin.throttle.allowed(who, now):
            return problem(429, "too many wrong tokens from this address; wait a minute")
        admin.throttle.failed(who, now)
        return None
    cookie = request.cookies.get(auth.SESSION_COOKIE)
    if not cookie or len(cookie) > 100:
        return None
    async with admin.db() as conn:
        return await sessions.find(conn, cookie, admin.settings.admin_session_idle_s,
                                   admin.settings.admin_session_max_s)


def _answer(request: web.Request, exc: web.HTTPException) -> web.Response:
    """What the router raised (404, 405) or a handler raised as an aiohttp exception, as a plain
    response: a problem document under /api/, the exception's own text elsewhere."""
    if request.path.startswith("/api/") and exc.status >= 400:
        response = problem(exc.status, exc.reason)
    else:
        response = web.Response(status=exc.status, reason=exc.reason, text=exc.text)
    for name in ("Allow", "Location"):
        if name in exc.headers:
            response.headers[name] = exc.headers[name]
    return response
