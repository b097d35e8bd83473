"""The admin port answers nothing without a credential but sign-in and health, its /metrics is on a
bind of its own, ended or expired console sessions are purged, and the console's tokens page lists,
makes (shown once) and revokes personal tokens (integration: real PostgreSQL, no Kafka; sessions
made in the table stand for people signed in through the issuer, which tests/e2e/test_oidc.py drives
through Keycloak; DESIGN.md §3.1, §7; issue #45).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import asyncpg
from aiohttp import web

from app.admin import auth, sessions
from app.admin.app import create_app
from app.settings import Settings
from app.stack.postgres import PostgresServer
from app.stack.process import spare_port
from tests.support import make_settings

# What the admin port serves to anyone (app/admin/guard.PUBLIC): sign-in, health, readiness and the
# console's static files. /openapi.json is a viewer's: it answers 401 like the API.
OPEN = {"/login", "/auth/start", "/auth/callback", "/healthz", "/readyz"}


@asynccontextmanager
async def served(settings: Settings) -> AsyncIterator[tuple[str, web.Application]]:
    port = spare_port()
    app = create_app(settings)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}", app
    finally:
        await runner.cleanup()


async def test_only_sign_in_and_health_answer_without_a_credential_and_metrics_has_a_bind_of_its_own(
        postgres: PostgresServer, namespace: str, db: asyncpg.Connection) -> None:
    metrics_port = spare_port()
    settings = make_settings("127.0.0.1:1", postgres.dsn, namespace, metrics_port=metrics_port)
    async with served(settings) as (url, app), aiohttp.ClientSession() as http:
        paths = {r.resource.canonical for r in app.router.routes() if r.resource is not None and r.method == "GET"}
        assert "/metrics" not in paths
        for path in sorted(paths | {"/metrics"}):
            concrete = path.replace("{", "x").replace("}", "")  # a made-up id wherever the route takes one
            async with http.get(f"{url}{concrete}", allow_redirects=False) as resp:
                if path in OPEN or path.startswith("/static/"):
                    continue  # answered whatever they answer, to anyone
                body = await resp.text()
                assert resp.status in (401, 303), (path, resp.status)
                assert "orderly_admin" not in body, path
                if resp.status == 303:
                    assert resp.headers["Location"].startswith("/login?next="), path
        async with http.get(f"http://127.0.0.1:{metrics_port}/metrics") as resp:
            text = await resp.text()
            assert resp.status == 200 and 'orderly_admin_requests_total{route="/healthz"' in text
            assert 'process="admin"' in text
    async with served(settings.with_overrides(metrics_port=0)) as (url, _), aiohttp.ClientSession() as http:
        async with http.get(f"{url}/healthz") as resp:
            assert resp.status == 200  # no metrics bind asked for: none, and the admin serves on
        async with http.get(f"{url}/metrics", allow_redirects=False) as resp:
            assert resp.status == 303


async def _people(db: asyncpg.Connection) -> list[str]:
    return sorted(await db.fetchval("SELECT coalesce(array_agg(person), '{}') FROM admin_sessions"))


async def _four_sessions(db: asyncpg.Connection) -> None:
    """live, signed out, idle past the limit, past the absolute limit though just used."""
    for person in ("live", "ended", "idle", "old"):
        made = await sessions.create(db, person, "viewer", "oidc", "127.0.0.1", "an.id.token")
        assert made.session is not None
        if person == "ended":
            ended = await sessions.end(db, made.session)
            assert ended == sessions.Ended("ended", "an.id.token")
            assert await sessions.end(db, made.session) is None  # once
    await db.execute("UPDATE admin_sessions SET last_seen_at = now() - interval '2 hours' WHERE person = 'idle'")
    await db.execute("UPDATE admin_sessions SET created_at = now() - interval '2 days' WHERE person = 'old'")
    assert {"ended", "idle", "live", "old"} <= set(await _people(db))


async def test_ended_and_expired_sessions_are_purged_and_a_live_one_kept(db: asyncpg.Connection) -> None:
    await _four_sessions(db)
    assert await sessions.purge(db, 900, 43200) == 3
    assert await _people(db) == ["live"]
    assert await sessions.purge(db, 900, 43200) == 0
    # the limits are the settings': a session idle 2 hours is live when 3 hours are allowed
    await db.execute("UPDATE admin_sessions SET last_seen_at = now() - interval '2 hours'")
    assert await sessions.purge(db, 3 * 3600, 43200) == 0
    assert await sessions.purge(db, 3600, 43200) == 1


async def test_a_sign_in_purges_and_so_does_the_admin_on_its_schedule(
        postgres: PostgresServer, namespace: str, db: asyncpg.Connection) -> None:
    await _four_sessions(db)
    await sessions.create(db, "next", "admin", "break-glass", "127.0.0.1", limits=(900, 43200))
    assert await _people(db) == ["live", "next"]
    await _four_sessions(db)
    assert len(await _people(db)) == 6
    settings = make_settings("127.0.0.1:1", postgres.dsn, namespace)
    async with served(settings):
        for _ in range(50):  # the first purge runs as the admin starts
            if await _people(db) == ["live", "live", "next"]:
                break
            await asyncio.sleep(0.1)
        assert await _people(db) == ["live", "live", "next"]


def _session_headers(cookie: str) -> dict[str, str]:
    return {"Cookie": f"{auth.SESSION_COOKIE}={cookie}"}


async def test_the_tokens_page_lists_makes_once_and_revokes_with_csrf_for_admins_only(
        postgres: PostgresServer, namespace: str, db: asyncpg.Connection) -> None:
    ada = await sessions.create(db, "ada", "admin", "oidc", "127.0.0.1")
    otto = await sessions.create(db, "otto", "operator", "oidc", "127.0.0.1")
    glass = await sessions.create(db, auth.BREAK_GLASS, "admin", auth.BREAK_GLASS, "127.0.0.1")
    assert ada.session and ada.csrf and otto.session and glass.session and glass.csrf
    settings = make_settings("127.0.0.1:1", postgres.dsn, namespace)
    async with served(settings) as (url, _), aiohttp.ClientSession() as http:
        as_ada = _session_headers(ada.session)
        async with http.get(f"{url}/tokens", headers=as_ada) as resp:
            page = await resp.text()
            assert resp.status == 200 and "no token yet" in page and 'href="/tokens"' in page
            assert [o for o in ("viewer", "operator", "admin") if f'<option value="{o}">' in page] == \
                ["viewer", "operator", "admin"]
        async with http.get(f"{url}/tokens", headers=_session_headers(otto.session)) as resp:
            assert resp.status == 403 and "this needs admin" in await resp.text()
        async with http.get(f"{url}/", headers=_session_headers(otto.session)) as resp:
            assert 'href="/tokens"' not in await resp.text()  # the menu offers it to admins only
        made = {"name": "ci", "role": "viewer", "expires_days": "7"}
        async with http.post(f"{url}/tokens", data=made, headers=as_ada, allow_redirects=False) as resp:
            assert resp.status == 403  # no CSRF token
        async with http.post(f"{url}/tokens", data={**made, "csrf": "forged"}, headers=as_ada) as resp:
            assert resp.status == 403
        for bad, why in (({"role": "root"}, "role: one of"), ({"expires_days": "91"}, "expires_days"),
                         ({"name": " "}, "name: 1 to 100")):
            async with http.post(f"{url}/tokens", data={**made, **bad, "csrf": ada.csrf}, headers=as_ada) as resp:
                assert resp.status == 400 and why in await resp.text(), bad
        async with http.post(f"{url}/tokens", data={**made, "csrf": ada.csrf}, headers=as_ada,
                             allow_redirects=False) as resp:
            page = await resp.text()
            assert resp.status == 201 and "not shown again" in page
        found = re.search(r'<code id="token-value">(oat_[A-Za-z0-9_-]+)</code>', page)
        assert found is not None
        token = found.group(1)
        async with http.get(f"{url}/tokens", headers=as_ada) as resp:
            page = await resp.text()
            assert token not in page and "ci" in page and "never" in page  # shown once, not used yet
        async with http.get(f"{url}/api/me", headers={"Authorization": f"Bearer {token}"}) as resp:
            assert (await resp.json())["role"] == "viewer"
        async with http.get(f"{url}/tokens", headers=as_ada) as resp:
            assert "never" not in await resp.text() and " s ago)" in await resp.text()  # its last use
        token_id = await db.fetchval("SELECT id FROM admin_tokens WHERE name = 'ci'")
        async with http.post(f"{url}/tokens/{token_id}/revoke", headers=as_ada, allow_redirects=False) as resp:
            assert resp.status == 403  # no CSRF token: nothing revoked
        async with http.get(f"{url}/api/me", headers={"Authorization": f"Bearer {token}"}) as resp:
            assert resp.status == 200
        async with http.post(f"{url}/tokens/{token_id}/revoke", data={"csrf": ada.csrf}, headers=as_ada,
                             allow_redirects=False) as resp:
            assert resp.status == 303 and resp.headers["Location"].startswith("/tokens?done=")
            back = resp.headers["Location"]
        async with http.get(f"{url}{back}", headers=as_ada) as resp:
            page = await resp.text()
            assert f"token {token_id} (ci) revoked" in page and "revoked 20" in page
        async with http.get(f"{url}/api/me", headers={"Authorization": f"Bearer {token}"}) as resp:
            assert resp.status == 401
        # the break-glass admin sees the page but makes no token: it is no person
        async with http.post(f"{url}/tokens", data={**made, "csrf": glass.csrf},
                             headers=_session_headers(glass.session)) as resp:
            assert resp.status == 403 and "signed in through the issuer" in await resp.text()
    actions = await db.fetch("SELECT actor, action FROM admin_actions WHERE action LIKE 'token.%' ORDER BY id")
    assert [(a["actor"], a["action"]) for a in actions] == [("ada@127.0.0.1", "token.create"),
                                                            ("ada@127.0.0.1", "token.revoke")]
