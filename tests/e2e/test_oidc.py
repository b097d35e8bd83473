"""Who is at the console, against a real Keycloak (DESIGN.md §3.1; issue #45 items 1, 3, 4, 6).

Each person of the test realm signs in through Keycloak's own login page, driven over plain HTTP
(the admin's /auth/start, Keycloak's form, the admin's /auth/callback): vera is a viewer, otto an
operator, ada an admin, nemo in no group is refused. Each role then tries every operation of the
admin API (401 without a credential, 403 for a role too low, past the guard otherwise); an idle
session ends; sign-out ends a session for good, at Keycloak too (RP-initiated logout); the audit
names each person; the audit table is append-only; break-glass is audited on every use. Needs
PostgreSQL and Keycloak, not Kafka (the actions that need Kafka answer 503, which is past the guard).
"""

from __future__ import annotations

import asyncio
import html
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

import aiohttp
import asyncpg
import pytest
from aiohttp import web
from yarl import URL

from app.admin import auth
from app.admin.app import create_app
from app.settings import Secret
from app.stack.postgres import PostgresServer
from app.stack.process import spare_port
from tests.keycloak import CLIENT_ID, CLIENT_SECRET, PASSWORDS, ROLE_MAP, Keycloak
from tests.support import make_settings

pytestmark = pytest.mark.timeout(300)
BREAK_GLASS = "break-glass-token-for-oidc-tests"


@dataclass
class Admin:
    url: str
    keycloak: Keycloak


@asynccontextmanager
async def serve_admin(keycloak: Keycloak, postgres: PostgresServer, namespace: str,
                      **overrides: object) -> AsyncIterator[Admin]:
    port = spare_port()
    url = f"http://127.0.0.1:{port}"
    chosen: dict[str, object] = {
        "admin_oidc_issuer": keycloak.issuer, "admin_oidc_client_id": CLIENT_ID,
        "admin_oidc_client_secret": Secret(CLIENT_SECRET), "admin_oidc_redirect_url": f"{url}/auth/callback",
        "admin_role_map": ROLE_MAP, "admin_token": None}
    settings = make_settings("127.0.0.1:1", postgres.dsn, namespace).with_overrides(**{**chosen, **overrides})
    runner = web.AppRunner(create_app(settings), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield Admin(url, keycloak)
    finally:
        await runner.cleanup()


async def sign_in(admin: Admin, user: str, password: str | None = None
                  ) -> tuple[aiohttp.ClientSession, int, str, str]:
    """Through Keycloak's own login page: (the browser's session, the callback's status, its body,
    the cookie it set)."""
    # Keycloak's cookies are Secure: a browser sends them to http://127.0.0.1 (a secure context), so does this
    jar = aiohttp.CookieJar(unsafe=True, treat_as_secure_origin=[URL(admin.keycloak.url)])
    http = aiohttp.ClientSession(cookie_jar=jar)
    async with http.get(f"{admin.url}/auth/start?next=/effects", allow_redirects=False) as resp:
        assert resp.status == 303, await resp.text()
        to_issuer = resp.headers["Location"]
    query = parse_qs(urlsplit(to_issuer).query)
    assert query["code_challenge_method"] == ["S256"] and query["state"] and query["nonce"]
    async with http.get(to_issuer) as resp:
        page = await resp.text()
        assert resp.status == 200, page[:500]
    action = re.search(r'<form[^>]*id="kc-form-login"[^>]*action="([^"]+)"', page, re.DOTALL)
    assert action is not None, page[:2000]
    form = {"username": user, "password": password or PASSWORDS[user], "credentialId": ""}
    async with http.post(html.unescape(action.group(1)), data=form, allow_redirects=False) as resp:
        assert resp.status == 302, re.findall(r'(?:kc-feedback-text|alert)[^>]*>([^<]+)', await resp.text())
        back = resp.headers["Location"]
    assert back.startswith(f"{admin.url}/auth/callback?")
    async with http.get(back, allow_redirects=False) as resp:
        set_cookie = [v for v in resp.headers.getall("Set-Cookie", []) if v.startswith(auth.SESSION_COOKIE)]
        return http, resp.status, await resp.text(), "".join(set_cookie)


async def audit_rows(postgres: PostgresServer, namespace: str) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(postgres.dsn, server_settings={"search_path": namespace})
    try:
        return list(await conn.fetch("SELECT actor, action, target, result FROM admin_actions ORDER BY id"))
    finally:
        await conn.close()


async def test_each_person_signs_in_through_keycloak_with_the_role_of_their_group(
        keycloak: Keycloak, postgres: PostgresServer, namespace: str, db: asyncpg.Connection) -> None:
    async with serve_admin(keycloak, postgres, namespace) as admin:
        for user, role in (("vera", "viewer"), ("otto", "operator"), ("ada", "admin")):
            http, status, _, set_cookie = await sign_in(admin, user)
            async with http:
                assert status == 303
                assert "HttpOnly" in set_cookie and "SameSite=Strict" in set_cookie and "Path=/" in set_cookie
                assert "Secure" not in set_cookie  # plain HTTP, no trusted proxy
                async with http.get(f"{admin.url}/api/me") as resp:
                    assert resp.status == 200 and (await resp.json())["person"] == user
                    assert (await resp.json())["role"] == role and (await resp.json())["via"] == "oidc"
                async with http.get(f"{admin.url}/audit") as resp:
                    page = await resp.text()
                    assert resp.status == 200 and f"{user} · {role}" in page and "break-glass" not in page
        http, status, body, _ = await sign_in(admin, "nemo")
        async with http:
            assert status == 403 and "has no role here" in body
            async with http.get(f"{admin.url}/api/me") as resp:
                assert resp.status == 401
    rows = [(r["actor"], r["action"], r["result"]) for r in await audit_rows(postgres, namespace)]
    for user, role in (("vera", "viewer"), ("otto", "operator"), ("ada", "admin")):
        assert (f"{user}@127.0.0.1", "console.login", f"signed in as {role}") in rows
    assert any(a == "nemo@127.0.0.1" and r.startswith("refused: no role") for a, _, r in rows)


async def test_a_wrong_password_never_comes_back_and_a_callback_is_taken_once(
        keycloak: Keycloak, postgres: PostgresServer, namespace: str, db: asyncpg.Connection) -> None:
    async with serve_admin(keycloak, postgres, namespace) as admin:
        http, status, _, _ = await sign_in(admin, "otto")
        async with http:
            assert status == 303
        async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
            forged = f"{admin.url}/auth/callback?state=made-up&code=made-up"
            async with http.get(forged, allow_redirects=False) as resp:
                assert resp.status == 401 and "not started in this browser" in await resp.text()
            async with http.get(f"{admin.url}/api/me") as resp:
                assert resp.status == 401
    rows = await audit_rows(postgres, namespace)
    assert any(r["action"] == "console.login" and r["result"].startswith("refused: this sign-in") for r in rows)


# Every operation of app/admin/api.py, with a path that names nothing (so an allowed one answers
# 404, 409 or 503, never 401 or 403) and the least role DESIGN.md §3.1 gives it.
OPERATIONS: list[tuple[str, str, str]] = [
    ("GET", "/api/overview", "viewer"),
    ("GET", "/api/resources?gateway=card", "viewer"),
    ("GET", "/api/resources/card/no-such-payment", "viewer"),
    ("POST", "/api/resources/card/no-such-payment/fetch", "operator"),
    ("GET", "/api/parked", "viewer"),
    ("GET", "/api/gaps", "viewer"),
    ("GET", "/api/quarantine", "viewer"),
    ("GET", "/api/quarantine/no-such-delivery", "operator"),
    ("POST", "/api/quarantine/no-such-delivery/redrive", "operator"),
    ("GET", "/api/effects?state=dead", "viewer"),
    ("POST", "/api/effects/no-such-effect/retry", "operator"),
    ("POST", "/api/quarantine/redrive?dry_run=true", "operator"),  # bulk by filter (app/admin/bulk.py)
    ("POST", "/api/effects/retry?dry_run=true&gateway=card", "operator"),
    ("GET", "/api/audit", "viewer"),
    ("GET", "/api/me", "viewer"),
    ("GET", "/api/tokens", "admin"),
    ("POST", "/api/tokens", "admin"),
    ("DELETE", "/api/tokens/999999", "admin"),
]
PAGES: list[tuple[str, str]] = [("/", "viewer"), ("/resources", "viewer"), ("/parked", "viewer"),
                                ("/gaps", "viewer"), ("/quarantine", "viewer"), ("/effects", "viewer"),
                                ("/audit", "viewer"), ("/quarantine/no-such-delivery", "operator")]


def test_the_table_covers_every_api_route() -> None:
    app = create_app(make_settings("127.0.0.1:1", "postgresql://x@127.0.0.1:1/x", "t0",
                                   admin_token=Secret(BREAK_GLASS)))
    routes = {(r.method, r.resource.canonical) for r in app.router.routes()
              if r.resource is not None and r.resource.canonical.startswith("/api/") and r.method != "HEAD"}
    covered = {(m, _canonical(p)) for m, p, _ in OPERATIONS}
    assert routes == covered


def _canonical(path: str) -> str:
    path = path.split("?")[0]
    if path in ("/api/quarantine/redrive", "/api/effects/retry"):  # the bulk routes name no id
        return path
    for pattern, name in ((r"^/api/resources/card/[^/]+", "/api/resources/{gateway}/{resource_id}"),
                          (r"^/api/quarantine/[^/]+", "/api/quarantine/{delivery_id}"),
                          (r"^/api/effects/[^/]+", "/api/effects/{dedupe_key}"),
                          (r"^/api/tokens/[^/]+", "/api/tokens/{token_id}")):
        path = re.sub(pattern, name, path)
    return path


async def test_each_role_can_do_exactly_what_design_gives_it(
        keycloak: Keycloak, postgres: PostgresServer, namespace: str, db: asyncpg.Connection) -> None:
    async with serve_admin(keycloak, postgres, namespace) as admin:
        async with aiohttp.ClientSession() as anonymous:
            for method, path, _ in OPERATIONS:
                async with anonymous.request(method, f"{admin.url}{path}") as resp:
                    assert resp.status == 401 and resp.content_type == "application/problem+json", (method, path)
            for path, _ in PAGES:
                async with anonymous.get(f"{admin.url}{path}", allow_redirects=False) as resp:
                    assert resp.status == 303 and resp.headers["Location"].startswith("/login?next="), path
        for user, role in (("vera", "viewer"), ("otto", "operator"), ("ada", "admin")):
            http, status, _, _ = await sign_in(admin, user)
            async with http:
                assert status == 303
                async with http.get(f"{admin.url}/effects") as resp:
                    csrf = re.search(r'name="csrf" value="([^"]+)"', await resp.text())
                assert csrf is not None
                for method, path, needed in OPERATIONS:
                    async with http.request(method, f"{admin.url}{path}",
                                            headers={"X-CSRF-Token": csrf.group(1)}) as resp:
                        allowed = auth.rank(role) >= auth.rank(needed)
                        assert (resp.status not in (401, 403)) if allowed else resp.status == 403, \
                            (user, method, path, resp.status)
                for path, needed in PAGES:
                    async with http.get(f"{admin.url}{path}", allow_redirects=False) as resp:
                        allowed = auth.rank(role) >= auth.rank(needed)
                        assert (resp.status in (200, 404)) if allowed else resp.status == 403, (user, path)
                async with http.post(f"{admin.url}/api/effects/no-such-effect/retry") as resp:
                    assert resp.status == 403  # a session's POST without its CSRF token
    rows = [(r["actor"], r["action"], r["target"], r["result"]) for r in await audit_rows(postgres, namespace)]
    for user in ("otto", "ada"):
        assert any(a == f"{user}@127.0.0.1" and act == "effects.retry" and res.startswith("refused")
                   for a, act, _, res in rows), rows
        assert (f"{user}@127.0.0.1", "quarantine.view", "no-such-delivery", "not found") in rows
    assert not any(a.startswith("vera@") and act in ("effects.retry", "quarantine.view") for a, act, _, _ in rows)
    assert ("vera@127.0.0.1", "forbidden", "POST /api/effects/no-such-effect/retry",
            "refused: viewer, needs operator") in rows


async def test_an_idle_session_ends_and_a_signed_out_one_stays_ended(
        keycloak: Keycloak, postgres: PostgresServer, namespace: str, db: asyncpg.Connection) -> None:
    # idle 6 s, used every 2 s: a use late by up to 4 s on busy cores still finds it alive
    async with serve_admin(keycloak, postgres, namespace, admin_session_idle_s=6) as admin:
        http, status, _, _ = await sign_in(admin, "vera")
        async with http:
            assert status == 303
            for _ in range(4):  # used within the idle limit: it lives on past it
                await asyncio.sleep(2)
                async with http.get(f"{admin.url}/api/me") as resp:
                    assert resp.status == 200
            await asyncio.sleep(7)
            async with http.get(f"{admin.url}/api/me") as resp:
                assert resp.status == 401
        http, _, _, _ = await sign_in(admin, "otto")
        async with http:
            cookie = http.cookie_jar.filter_cookies(URL(admin.url))[auth.SESSION_COOKIE].value
            async with http.get(f"{admin.url}/effects") as resp:
                csrf = re.search(r'name="csrf" value="([^"]+)"', await resp.text())
            assert csrf is not None
            # Keycloak remembers otto: a new sign-in comes straight back with a code, no password asked
            async with http.get(f"{admin.url}/auth/start", allow_redirects=False) as resp:
                to_issuer = resp.headers["Location"]
            async with http.get(to_issuer, allow_redirects=False) as resp:
                assert resp.status == 302 and resp.headers["Location"].startswith(f"{admin.url}/auth/callback?")
            async with http.post(f"{admin.url}/logout", data={"csrf": csrf.group(1)}, allow_redirects=False) as resp:
                assert resp.status == 303
                to_end = URL(resp.headers["Location"])  # RP-initiated logout at the issuer's end_session_endpoint
            assert str(to_end.with_query(None)) == f"{admin.keycloak.issuer}/protocol/openid-connect/logout"
            assert to_end.query["post_logout_redirect_uri"] == f"{admin.url}/login"
            assert to_end.query["client_id"] == CLIENT_ID and to_end.query["id_token_hint"].count(".") == 2
            async with http.get(to_end, allow_redirects=False) as resp:  # the hint's session: no confirmation asked
                assert resp.status == 302 and resp.headers["Location"].startswith(f"{admin.url}/login"), \
                    (resp.status, (await resp.text())[:500])
            async with http.get(to_issuer, allow_redirects=False) as resp:  # signed out there too: the password again
                assert resp.status == 200 and 'id="kc-form-login"' in await resp.text()
        async with aiohttp.ClientSession() as copy, copy.get(
                f"{admin.url}/api/me", headers={"Cookie": f"{auth.SESSION_COOKIE}={cookie}"}) as resp:
            assert resp.status == 401
    rows = [(r["actor"], r["action"], r["result"]) for r in await audit_rows(postgres, namespace)]
    assert ("otto@127.0.0.1", "console.logout", "signed out") in rows


async def test_a_session_ends_at_its_absolute_limit_however_busy(
        keycloak: Keycloak, postgres: PostgresServer, namespace: str, db: asyncpg.Connection) -> None:
    async with serve_admin(keycloak, postgres, namespace, admin_session_max_s=4) as admin:
        http, status, _, _ = await sign_in(admin, "ada")
        async with http:
            assert status == 303
            answers = []
            for _ in range(6):
                async with http.get(f"{admin.url}/api/me") as resp:
                    answers.append(resp.status)
                await asyncio.sleep(1)
            assert answers[0] == 200 and answers[-1] == 401 and answers == sorted(answers), answers  # 200s, then 401s


async def test_break_glass_is_audited_on_every_use_with_a_banner_and_the_audit_is_append_only(
        keycloak: Keycloak, postgres: PostgresServer, namespace: str, db: asyncpg.Connection) -> None:
    async with serve_admin(keycloak, postgres, namespace, admin_token=Secret(BREAK_GLASS)) as admin:
        bearer = {"Authorization": f"Bearer {BREAK_GLASS}"}
        async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
            async with http.get(f"{admin.url}/api/me", headers=bearer) as resp:
                assert (await resp.json())["person"] == "break-glass"
            async with http.get(f"{admin.url}/api/audit?actor=break-glass&action=break-glass",
                                headers=bearer) as resp:
                assert {r["target"] for r in (await resp.json())["items"]} == {"GET /api/me", "GET /api/audit"}
            async with http.post(f"{admin.url}/login", data={"token": BREAK_GLASS, "next": "/"}) as resp:
                page = await resp.text()
                assert resp.status == 200 and 'id="break-glass"' in page and "break-glass · admin" in page
    with pytest.raises(asyncpg.PostgresError, match="append-only"):
        await db.execute("UPDATE admin_actions SET result = 'nothing happened'")
    with pytest.raises(asyncpg.PostgresError, match="append-only"):
        await db.execute("DELETE FROM admin_actions")


async def test_a_personal_token_acts_as_its_owner_with_its_role_until_revoked(
        keycloak: Keycloak, postgres: PostgresServer, namespace: str, db: asyncpg.Connection) -> None:
    async with serve_admin(keycloak, postgres, namespace) as admin:
        http, status, _, _ = await sign_in(admin, "ada")
        async with http:
            assert status == 303
            async with http.get(f"{admin.url}/effects") as resp:
                csrf = re.search(r'name="csrf" value="([^"]+)"', await resp.text())
            assert csrf is not None
            headers = {"X-CSRF-Token": csrf.group(1)}
            for bad in ({"name": "x", "role": "root"}, {"name": "", "role": "viewer"},
                        {"name": "x", "role": "viewer", "expires_days": 91}):
                async with http.post(f"{admin.url}/api/tokens", json=bad, headers=headers) as resp:
                    assert resp.status == 400, bad
            async with http.post(f"{admin.url}/api/tokens", json={"name": "ci", "role": "viewer", "expires_days": 7},
                                 headers=headers) as resp:
                assert resp.status == 201
                made = await resp.json()
            token = made["token"]
            async with http.get(f"{admin.url}/api/tokens") as resp:
                listed = (await resp.json())["items"]
                assert [t["name"] for t in listed] == ["ci"] and "token" not in listed[0] and "hash" not in listed[0]
            async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {token}"}) as robot:
                async with robot.get(f"{admin.url}/api/me") as resp:
                    assert await resp.json() == {"person": "ada", "role": "viewer", "via": "token:ci",
                                                 "source": "127.0.0.1"}
                async with robot.post(f"{admin.url}/api/effects/no-such-effect/retry") as resp:
                    assert resp.status == 403  # the token's role, not its owner's
                async with http.delete(f"{admin.url}/api/tokens/{made['id']}", headers=headers) as resp:
                    assert resp.status == 200
                async with robot.get(f"{admin.url}/api/me") as resp:
                    assert resp.status == 401
    stored = await db.fetchval("SELECT hash FROM admin_tokens WHERE id = $1", made["id"])
    assert stored != token and token not in str(await db.fetch("SELECT * FROM admin_tokens"))
    rows = [(r["actor"], r["action"]) for r in await audit_rows(postgres, namespace)]
    assert ("ada@127.0.0.1", "token.create") in rows and ("ada@127.0.0.1", "token.revoke") in rows


async def test_a_token_made_by_the_command_is_owned_and_audited_as_the_os_user(
        keycloak: Keycloak, postgres: PostgresServer, namespace: str, db: asyncpg.Connection) -> None:
    settings = make_settings("127.0.0.1:1", postgres.dsn, namespace)
    env = {**os.environ, **settings.to_env()}

    def orderly(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "app.cli", "admin", "token", *args], env=env,
                              capture_output=True, text=True, timeout=60, check=False)

    made = orderly("create", "--name", "nightly", "--role", "operator", "--expires-days", "3")
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip().splitlines()[-1]
    assert token.startswith("oat_") and orderly("create", "--name", "x", "--role", "viewer",
                                                "--expires-days", "91").returncode == 2
    async with serve_admin(keycloak, postgres, namespace) as admin, aiohttp.ClientSession(
            headers={"Authorization": f"Bearer {token}"}) as robot:
        async with robot.get(f"{admin.url}/api/me") as resp:
            me = await resp.json()
            assert me["person"].startswith("cli:") and me["role"] == "operator", me
        listed = orderly("list")
        assert "nightly" in listed.stdout and "operator" in listed.stdout, listed
        token_id = made.stdout.split()[1]
        assert orderly("revoke", token_id).returncode == 0
        async with robot.get(f"{admin.url}/api/me") as resp:
            assert resp.status == 401
    actions = [r["action"] for r in await audit_rows(postgres, namespace) if r["actor"].startswith("cli:")]
    assert actions == ["token.create", "token.revoke"]


async def test_the_cookie_is_secure_behind_a_trusted_proxy_that_took_tls_and_only_then(
        keycloak: Keycloak, postgres: PostgresServer, namespace: str, db: asyncpg.Connection) -> None:
    forwarded = {"X-Forwarded-Proto": "https", "X-Forwarded-For": "198.51.100.7"}
    for proxies, secure, source in ((None, False, "127.0.0.1"), ("127.0.0.1", True, "198.51.100.7")):
        async with serve_admin(keycloak, postgres, namespace, admin_token=Secret(BREAK_GLASS),
                               admin_trusted_proxies=proxies) as admin, aiohttp.ClientSession() as http:
            async with http.post(f"{admin.url}/login", data={"token": BREAK_GLASS, "next": "/"}, headers=forwarded,
                                 allow_redirects=False) as resp:
                set_cookie = "".join(resp.headers.getall("Set-Cookie", []))
                assert resp.status == 303 and ("; Secure" in set_cookie) == secure, (proxies, set_cookie)
            async with http.get(f"{admin.url}/api/me", headers={**forwarded, "Authorization": f"Bearer {BREAK_GLASS}"}
                                ) as resp:
                assert (await resp.json())["source"] == source


def test_the_test_realms_groups_map_to_every_role() -> None:
    assert set(auth.parse_role_map(ROLE_MAP).values()) == set(auth.ROLES)
