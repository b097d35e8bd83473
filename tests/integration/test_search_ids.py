"""The search finds a resource by any id an on-call engineer holds (integration: real PostgreSQL, no
Kafka): part of its resource id, an exact gateway event id, or an exact delivery id (the one every
log line, the ingest's answer and each effect's ``caused_by`` name); the console says when that
delivery was set aside and links to it in the quarantine."""

from __future__ import annotations

import aiohttp
import asyncpg

from app.admin import queries
from app.stack.postgres import PostgresServer
from tests.integration.test_admin_auth_sessions import served
from tests.support import admin_token, make_settings


async def _stored(db: asyncpg.Connection) -> None:
    rows = [(f"d-{rid}-{n}", f"evt_{rid}_{n}", rid) for rid in ("dep_ab", "dep_abc", "dep_x") for n in range(2)]
    await db.executemany("INSERT INTO webhook_events (delivery_id, gateway, event_id, resource_id, event_type, "
                         "received_at, outcome) VALUES ($1, 'pg', $2, $3, 'deposit.updated', now(), 'applied')", rows)
    await db.execute("INSERT INTO quarantine (delivery_id, gateway, resource_id, stage, reason, body) "
                     "VALUES ('d-set-aside', 'pg', NULL, 'ingest', 'unroutable', '\\x7b7d')")


async def found(db: asyncpg.Connection, text: str) -> list[str]:
    return sorted(r["resource_id"] for r in (await queries.search(db, q=text))["items"])


async def test_any_id_of_a_delivery_finds_its_resource(db: asyncpg.Connection) -> None:
    await _stored(db)
    assert await found(db, "d-dep_x-1") == ["dep_x"]  # a delivery id, whole
    assert await found(db, "evt_dep_ab_0") == ["dep_ab"]  # a gateway event id, whole
    assert await found(db, "p_ab") == ["dep_ab", "dep_abc"]  # part of a resource id
    assert await found(db, "d-dep_x") == []  # part of a delivery id or an event id is no match
    assert await found(db, "evt_dep_ab") == []
    assert await found(db, "d-set-aside") == []  # set aside: no resource to list


async def test_the_console_points_at_a_delivery_set_aside(postgres: PostgresServer, namespace: str,
                                                          db: asyncpg.Connection) -> None:
    await _stored(db)
    settings = make_settings("127.0.0.1:1", postgres.dsn, namespace)
    bearer = {"Authorization": f"Bearer {admin_token(settings)}"}
    async with served(settings) as (url, _), aiohttp.ClientSession(headers=bearer) as http:
        async with http.get(f"{url}/resources", params={"q": "d-set-aside"}) as resp:
            page = await resp.text()
            assert resp.status == 200, page
        assert '<a href="/quarantine/d-set-aside">d-set-aside</a> was set aside' in page
        async with http.get(f"{url}/resources", params={"q": "d-dep_x-0"}) as resp:
            page = await resp.text()
            assert resp.status == 200, page
        assert "/resources/pg/dep_x" in page and "was set aside" not in page
