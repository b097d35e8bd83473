"""Console sessions and sign-ins under way, server-side in PostgreSQL (I/O shell; DESIGN.md §3.1).

A session cookie holds 256 random bits; the table holds their SHA-256 with the person, the role,
a CSRF token and the times that end it: unused for ``ORDERLY_ADMIN_SESSION_IDLE_S`` (15 min) or
older than ``ORDERLY_ADMIN_SESSION_MAX_S`` (12 h), or signed out. Every admin process sees the
same sessions, and a restart ends none. Ended and expired rows are deleted (:func:`purge`) at every
sign-in and every few minutes by each admin process, so the table holds the live sessions only.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from app.admin.auth import Role, digest
from projections.bulk import Conn


@dataclass(frozen=True)
class Identity:
    """Who is asking, and through what: ``oidc`` (a session), ``break-glass`` (the shared token)."""

    person: str
    role: Role
    via: str
    session: str | None = None  # the session cookie, when signed in at the console
    csrf: str | None = None


CREATE = ("INSERT INTO admin_sessions (id_hash, person, role, via, csrf, source, id_token) "
          "VALUES ($1, $2, $3, $4, $5, $6, $7)")
# One statement finds a live session and marks it used, so two requests cannot both extend one
# that has just expired.
TOUCH = """
UPDATE admin_sessions SET last_seen_at = now()
 WHERE id_hash = $1 AND ended_at IS NULL
   AND last_seen_at > now() - make_interval(secs => $2)
   AND created_at > now() - make_interval(secs => $3)
RETURNING person, role, via, csrf
"""
END = ("UPDATE admin_sessions SET ended_at = now() WHERE id_hash = $1 AND ended_at IS NULL "
       "RETURNING person, id_token")
# A session TOUCH would no longer find: signed out, unused too long, or too old.
PURGE = """
DELETE FROM admin_sessions
 WHERE ended_at IS NOT NULL
    OR last_seen_at <= now() - make_interval(secs => $1)
    OR created_at <= now() - make_interval(secs => $2)
"""
PUT_SIGN_IN = "INSERT INTO admin_sign_ins (state, nonce, verifier, next) VALUES ($1, $2, $3, $4)"
# A state is taken once, and only within ten minutes of the sign-in's start.
TAKE_SIGN_IN = """
DELETE FROM admin_sign_ins WHERE state = $1 RETURNING nonce, verifier, next,
       created_at > now() - interval '10 minutes' AS fresh
"""
FORGET_OLD_SIGN_INS = "DELETE FROM admin_sign_ins WHERE created_at < now() - interval '1 hour'"
SERVER_KEY = """
WITH made AS (INSERT INTO admin_server_keys (purpose, key) VALUES ($1, $2) ON CONFLICT DO NOTHING RETURNING key)
SELECT key FROM made UNION ALL SELECT key FROM admin_server_keys WHERE purpose = $1 LIMIT 1
"""


async def create(conn: Conn, person: str, role: Role, via: str, source: str, id_token: str | None = None,
                 limits: tuple[int, int] | None = None) -> Identity:
    """A new session; returns it with its cookie value (shown to the browser only). ``id_token``:
    the issuer's, kept for signing out there. With ``limits`` (idle, max seconds) the sessions they
    ended are purged first."""
    if limits is not None:
        await purge(conn, *limits)
    cookie, csrf = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
    await conn.execute(CREATE, digest(cookie), person, role, via, csrf, source, id_token)
    return Identity(person, role, via, cookie, csrf)


async def purge(conn: Conn, idle_s: int, max_s: int) -> int:
    """Delete the sessions that can no longer be used; how many were deleted."""
    status = await conn.execute(PURGE, float(idle_s), float(max_s))
    return int(status.rsplit(" ", 1)[-1])


async def find(conn: Conn, cookie: str, idle_s: int, max_s: int) -> Identity | None:
    row = await conn.fetchrow(TOUCH, digest(cookie), float(idle_s), float(max_s))
    if row is None:
        return None
    return Identity(row["person"], row["role"], row["via"], cookie, row["csrf"])


@dataclass(frozen=True)
class Ended:
    person: str
    id_token: str | None  # for the issuer's end_session_endpoint (None: break-glass, or signed in before it was kept)


async def end(conn: Conn, cookie: str) -> Ended | None:
    """End a live session: who it was, or None when it was not live."""
    row = await conn.fetchrow(END, digest(cookie))
    return None if row is None else Ended(row["person"], row["id_token"])


async def put_sign_in(conn: Conn, state: str, nonce: str, verifier: str, target: str) -> None:
    await conn.execute(FORGET_OLD_SIGN_INS)
    await conn.execute(PUT_SIGN_IN, digest(state), nonce, verifier, target)


async def take_sign_in(conn: Conn, state: str) -> tuple[str, str, str] | None:
    """(nonce, verifier, next) of a sign-in started here within ten minutes, once."""
    row = await conn.fetchrow(TAKE_SIGN_IN, digest(state))
    if row is None or not row["fresh"]:
        return None
    return row["nonce"], row["verifier"], row["next"]


async def server_key(conn: Conn, purpose: str = "flash") -> bytes:
    """The random key of ``purpose``, made by the first admin process to ask."""
    return bytes(await conn.fetchval(SERVER_KEY, purpose, secrets.token_bytes(32)))
