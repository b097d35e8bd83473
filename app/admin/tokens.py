"""Personal API tokens: created by a signed-in admin for themselves, stored hashed (I/O shell; DESIGN.md §3.1).

A token is ``oat_`` and 256 random bits, shown once; ``admin_tokens`` keeps its SHA-256, its name,
its owner, a role at most the owner's, an expiry at most 90 days away, its last use and its
revocation. A request with ``Authorization: Bearer oat_…`` acts as the owner with the token's role.
The API (``/api/tokens``) and the console's page (``/tokens``, templates/tokens.html: the list with
last use, a form that shows a new token once, a revoke button per token; every form CSRF-protected
by app/admin/guard.py) do the same things through the same functions, admins only.
"""

from __future__ import annotations

import secrets
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

import orjson
from aiohttp import web

from app.admin import auth, queries
from app.admin.console import render
from app.admin.context import ADMIN, IDENTITY
from app.admin.http import Refused, form, json_response, problem, redirect
from app.admin.sessions import Identity
from projections.bulk import Conn

PREFIX = "oat_"
MOST_DAYS = 90

CREATE = """
INSERT INTO admin_tokens (name, owner, role, hash, expires_at)
VALUES ($1, $2, $3, $4, now() + make_interval(days => $5))
RETURNING id, name, owner, role, created_at, expires_at
"""
LIST = """
SELECT id, name, owner, role, created_at, expires_at, last_used_at, revoked_at FROM admin_tokens
 WHERE owner = $1 ORDER BY id DESC
"""
REVOKE = ("UPDATE admin_tokens SET revoked_at = now() WHERE id = $1 AND owner = $2 AND revoked_at IS NULL "
          "RETURNING name")
USE = """
UPDATE admin_tokens SET last_used_at = now()
 WHERE hash = $1 AND revoked_at IS NULL AND expires_at > now()
RETURNING owner, role, name
"""


async def identify(conn: Conn, given: str) -> Identity | None:
    """The owner and role of a live personal token (its use recorded), or None."""
    if not given.startswith(PREFIX) or len(given) > 100:
        return None
    row = await conn.fetchrow(USE, auth.digest(given))
    return Identity(row["owner"], row["role"], f"token:{row['name']}") if row is not None else None


def _row(record: Any) -> dict[str, Any]:
    return {k: v.isoformat() if isinstance(v, datetime) else v for k, v in dict(record).items()}


def _person(request: web.Request) -> Identity:
    """The caller, when a person signed in through the issuer (tokens are a person's); Refused else."""
    identity: Identity = request[IDENTITY]
    if identity.via != "oidc":
        raise Refused(403, "a personal token is created by a person signed in through the issuer")
    return identity


async def _make(request: web.Request, posted: Any) -> tuple[Any, str]:
    """A new token of the caller's, from ``posted`` (name, role at most the caller's, expires_days):
    its row and the token itself; Refused when the request cannot have one."""
    identity = _person(request)
    name, role, days = str(posted.get("name", "")).strip(), str(posted.get("role", "")), posted.get("expires_days", 30)
    if not name or len(name) > 100 or "\x00" in name:
        raise Refused(400, "name: 1 to 100 characters")
    if role not in auth.ROLES or auth.rank(role) > auth.rank(identity.role):
        raise Refused(400, f"role: one of {', '.join(auth.ROLES[:auth.rank(identity.role) + 1])} (at most your own)")
    if not isinstance(days, int) or isinstance(days, bool) or not 1 <= days <= MOST_DAYS:
        raise Refused(400, f"expires_days: an integer from 1 to {MOST_DAYS}")
    admin = request.app[ADMIN]
    token = PREFIX + secrets.token_urlsafe(32)
    async with admin.db() as conn:
        made = await conn.fetchrow(CREATE, name, identity.person, role, auth.digest(token), days)
        await queries.audit(conn, admin.actor(request), "token.create", f"{made['id']} {name}",
                            f"{role} until {made['expires_at'].isoformat()}")
    return made, token


async def create(request: web.Request) -> web.Response:
    _person(request)  # before the body is read: break-glass is refused whatever it sends
    if request.content_type == "application/json":
        try:
            posted = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            posted = None
        if not isinstance(posted, dict):
            raise Refused(400, "the body must be a JSON object (name, role, expires_days)")
    else:
        posted = dict(await form(request))
    made, token = await _make(request, posted)
    return json_response({**_row(made), "token": token}, 201)


async def listing(request: web.Request) -> web.Response:
    async with request.app[ADMIN].db() as conn:
        rows = await conn.fetch(LIST, request[IDENTITY].person)
    return json_response({"items": [_row(r) for r in rows]})


async def _revoke(request: web.Request) -> tuple[str, str | None]:
    """Revoke the caller's token named in the path: (its id as given, its name or None when unknown)."""
    raw = request.match_info["token_id"]
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 18:
        return raw[:20], None
    admin = request.app[ADMIN]
    async with admin.db() as conn:
        name = await conn.fetchval(REVOKE, int(raw), request[IDENTITY].person)
        await queries.audit(conn, admin.actor(request), "token.revoke", raw, "revoked" if name else "refused: unknown")
    return raw, name


async def revoke(request: web.Request) -> web.Response:
    raw, name = await _revoke(request)
    return json_response({"id": int(raw), "revoked": True}) if name else problem(404, "no such token of yours")


# --- the console's page ------------------------------------------------------------------------

async def _page(request: web.Request, status: int = 200, made: Any = None, token: str | None = None,
                error: str | None = None) -> web.Response:
    identity: Identity = request[IDENTITY]
    async with request.app[ADMIN].db() as conn:
        rows = await conn.fetch(LIST, identity.person)
    return render(request, "tokens.html", status=status, items=[dict(r) for r in rows], made=made, token=token,
                  error=error, roles=auth.ROLES[:auth.rank(identity.role) + 1], most_days=MOST_DAYS,
                  can_create=identity.via == "oidc")


async def page(request: web.Request) -> web.Response:
    return await _page(request)


async def page_create(request: web.Request) -> web.Response:
    """The new token is in this answer only (never in a URL or a redirect): shown once."""
    try:
        _person(request)
    except Refused as exc:
        return await _page(request, exc.status, error=exc.error)
    posted = dict(await form(request))
    days = str(posted.get("expires_days", "30")).strip()
    posted["expires_days"] = int(days) if days.isascii() and days.isdigit() and len(days) < 4 else days
    try:
        made, token = await _make(request, posted)
    except Refused as exc:
        return await _page(request, exc.status, error=exc.error)
    return await _page(request, 201, made=made, token=token)


async def page_revoke(request: web.Request) -> web.StreamResponse:
    raw, name = await _revoke(request)
    kind, text = ("done", f"token {raw} ({name}) revoked") if name else ("refused", f"no token {raw} of yours")
    mac = auth.flash_mac(request.app[ADMIN].flash_key, f"{kind}:{text}")
    return redirect(f"/tokens?{urlencode({kind: text, 'm': mac})}")


def add_routes(app: web.Application) -> None:
    r = app.router
    r.add_post("/api/tokens", create)
    r.add_get("/api/tokens", listing)
    r.add_delete("/api/tokens/{token_id}", revoke)
    r.add_get("/tokens", page)
    r.add_post("/tokens", page_create)
    r.add_post("/tokens/{token_id}/revoke", page_revoke)
