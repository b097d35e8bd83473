"""Signing in and out of the console: OpenID Connect, the break-glass token, sign-out (I/O shell; DESIGN.md §3.1).

``/login`` offers the issuer's sign-in (and the break-glass form when ``ORDERLY_ADMIN_TOKEN`` is
set). ``/auth/start`` keeps the sign-in's state, nonce and PKCE verifier server-side, binds the
browser to it with a short-lived cookie and sends the browser to the issuer; ``/auth/callback``
takes the state once, exchanges the code, checks the ID token, maps the person's groups to a role
and opens a server-side session. ``/logout`` ends it and, when the issuer's discovery document names
an ``end_session_endpoint``, sends the browser there with the session's ID token as
``id_token_hint`` to end the person's session at the issuer too, back to ``/login`` afterwards
(RP-Initiated Logout). Every sign-in, failed sign-in and sign-out is audited with the person and the
source address.
"""

from __future__ import annotations

import hmac
import logging
import time

from aiohttp import web
from yarl import URL

from app.admin import auth, queries, sessions
from app.admin.console import render
from app.admin.context import ADMIN, IDENTITY, Admin
from app.admin.http import form, redirect, safe_next
from app.admin.oidc import SignInError, person

log = logging.getLogger("orderly.admin")
BINDING_COOKIE = "orderly_sign_in"  # SameSite=Lax: it must come back on the issuer's redirect


def limits(admin: Admin) -> tuple[int, int]:
    """The sessions' idle and absolute limits (seconds): past them a session is purged."""
    return admin.settings.admin_session_idle_s, admin.settings.admin_session_max_s


def _page(request: web.Request, status: int = 200, error: str | None = None, target: str = "/") -> web.Response:
    admin = request.app[ADMIN]
    return render(request, "login.html", status=status, next=target, error=error,
                  oidc=admin.issuer is not None, break_glass=bool(admin.token))


async def login_page(request: web.Request) -> web.Response:
    return _page(request, target=safe_next(request.query.get("next")))


def _open(request: web.Request, admin: Admin, identity: sessions.Identity, target: str) -> web.Response:
    response = redirect(target)
    assert identity.session is not None
    response.set_cookie(auth.SESSION_COOKIE, identity.session, max_age=admin.settings.admin_session_max_s,
                        httponly=True, samesite="Strict", secure=admin.secure(request), path="/")
    return response


async def login(request: web.Request) -> web.StreamResponse:
    """The break-glass token at the console: an admin session, audited as ``break-glass``."""
    admin = request.app[ADMIN]
    posted = await form(request)
    who, now = admin.source(request), time.monotonic()
    target = safe_next(str(posted.get("next", "/")))
    if not admin.token:
        return _page(request, 404, "break-glass sign-in is off (ORDERLY_ADMIN_TOKEN is not set)", target)
    if auth.token_ok(admin.token, str(posted.get("token", ""))):  # a right token is never throttled
        async with admin.db() as conn:
            identity = await sessions.create(conn, auth.BREAK_GLASS, "admin", auth.BREAK_GLASS, who,
                                             limits=limits(admin))
            await queries.audit(conn, f"{auth.BREAK_GLASS}@{who}", "console.login", "console",
                                "signed in with the break-glass token")
        return _open(request, admin, identity, target)
    admin.metrics.login_failures.labels("console").inc()
    async with admin.db() as conn:
        await queries.audit(conn, f"?@{who}", "console.login", "console", "refused: wrong token")
    if not admin.throttle.allowed(who, now):
        return _page(request, 429, "too many wrong tokens from this address; wait a minute", target)
    admin.throttle.failed(who, now)
    return _page(request, 401, "wrong token", target)


async def start(request: web.Request) -> web.StreamResponse:
    admin = request.app[ADMIN]
    if admin.issuer is None:
        return _page(request, 404, "OpenID Connect sign-in is not configured (ORDERLY_ADMIN_OIDC_ISSUER)")
    target = safe_next(request.query.get("next"))
    try:
        started = await admin.issuer.start()
    except SignInError as exc:
        return _page(request, 502, f"sign-in is unavailable: {exc}", target)
    async with admin.db() as conn:
        await sessions.put_sign_in(conn, started.state, started.nonce, started.verifier, target)
    response = redirect(started.url)
    response.set_cookie(BINDING_COOKIE, auth.digest(started.state), max_age=600, httponly=True, samesite="Lax",
                        secure=admin.secure(request), path="/auth/")
    return response


async def callback(request: web.Request) -> web.StreamResponse:
    admin = request.app[ADMIN]
    who = admin.source(request)
    state, code = request.query.get("state", ""), request.query.get("code", "")
    try:
        if admin.issuer is None:
            raise SignInError("OpenID Connect sign-in is not configured")
        if "error" in request.query:
            raise SignInError(f"the issuer refused: {request.query.get('error', '')[:100]}")
        binding = request.cookies.get(BINDING_COOKIE, "")
        if not state or not code or not hmac.compare_digest(binding.encode(), auth.digest(state).encode()):
            raise SignInError("this sign-in was not started in this browser, or it was already used")
        async with admin.db() as conn:
            pending = await sessions.take_sign_in(conn, state)
        if pending is None:
            raise SignInError("this sign-in is unknown, expired (10 minutes) or already used")
        nonce, verifier, target = pending
        id_token = await admin.issuer.exchange(code, verifier)
        claims = await admin.issuer.verify(id_token, nonce)
    except SignInError as exc:
        async with admin.db() as conn:
            await queries.audit(conn, f"?@{who}", "console.login", "oidc", f"refused: {exc}")
        admin.metrics.login_failures.labels("console").inc()
        return _page(request, 401, f"sign-in failed: {exc}")
    name = person(claims)
    role = auth.role_of(claims.get(admin.settings.admin_roles_claim), admin.role_map)
    async with admin.db() as conn:
        if role is None:
            await queries.audit(conn, f"{name}@{who}", "console.login", "oidc",
                                f"refused: no role for the groups in {admin.settings.admin_roles_claim!r}")
            return _page(request, 403, f"{name} is signed in at the issuer but has no role here: "
                                       "ask an admin to add you to a group ORDERLY_ADMIN_ROLE_MAP names")
        identity = await sessions.create(conn, name, role, "oidc", who, id_token, limits(admin))
        await queries.audit(conn, f"{name}@{who}", "console.login", "oidc", f"signed in as {role}")
    response = _open(request, admin, identity, target)
    response.del_cookie(BINDING_COOKIE, path="/auth/")
    return response


async def logout(request: web.Request) -> web.StreamResponse:
    """Ends the session server-side (a copy of the cookie is refused from then on), then at the
    issuer when it offers that."""
    admin = request.app[ADMIN]
    identity = request.get(IDENTITY)
    target = "/login"
    if identity is not None and identity.session is not None:  # a bearer token has no session to end
        async with admin.db() as conn:
            ended = await sessions.end(conn, identity.session)
            await queries.audit(conn, admin.actor(request), "console.logout", "console", "signed out")
        if ended is not None and ended.id_token is not None and admin.issuer is not None:
            back = str(URL(admin.issuer.redirect_url).with_path("/login").with_query(None))
            target = await admin.issuer.end_session_url(ended.id_token, back) or target
    response = redirect(target)
    response.del_cookie(auth.SESSION_COOKIE, path="/")
    return response


def add_routes(app: web.Application) -> None:
    r = app.router
    r.add_get("/login", login_page)
    r.add_post("/login", login)
    r.add_get("/auth/start", start)
    r.add_get("/auth/callback", callback)
    r.add_post("/logout", logout)
