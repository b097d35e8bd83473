"""The search finds a resource by any id an on-call engineer holds (integration: real PostgreSQL, no
Kafka): a whole resource id, gateway event id or delivery id (the one every log line, the ingest's
answer and each effect's ``caused_by`` name) through the indexes, at any size of the history; part
of a resource id when no whole id matches. The console says when a delivery searched for was set
aside and links to it in the quarantine."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import aiohttp
import asyncpg
from markupsafe import escape

from app.admin import queries, resource_search
from app.stack.postgres import PostgresServer
from tests.integration.test_admin_auth_sessions import served
from tests.support import admin_token, make_settings

ODD = 'd/odd?"<b>#x'  # a delivery id set aside that a link must encode and a page escape


async def _stored(db: asyncpg.Connection) -> None:
    rows = [(f"d-{rid}-{n}", f"evt_{rid}_{n}", rid, "parked" if rid == "dep_x" and n else "applied")
            for rid in ("dep_ab", "dep_abc", "dep_x") for n in range(2)]
    await db.executemany("INSERT INTO webhook_events (delivery_id, gateway, event_id, resource_id, event_type, "
                         "received_at, outcome) VALUES ($1, 'pg', $2, $3, 'deposit.updated', now(), $4)", rows)
    await db.execute("INSERT INTO pg_deposits (pg_deposit_id, pg_version, status, our_order_id, our_user_id) "
                     "VALUES ('dep_ab', 1, 'pending', 'o', 'u'), ('dep_x', 2, 'slip_received', 'o', 'u')")
    await db.executemany("INSERT INTO quarantine (delivery_id, gateway, resource_id, stage, reason, body, redrives) "
                         "VALUES ($1, $2, NULL, 'ingest', 'unroutable', '\\x7b7d', $3)",
                         [("d-set-aside", "pg", 0), (ODD, "pg", 0), ("d-redriven", "pg", 2), ("d-card", "card", 0)])


async def found(db: asyncpg.Connection, text: str, **filters: Any) -> list[tuple[str, int]]:
    items = (await resource_search.search(db, q=text, **filters))["items"]
    return sorted((r["resource_id"], r["deliveries"]) for r in items)


async def test_a_whole_id_finds_its_resource_and_part_of_a_resource_id_the_resources_holding_it(
        db: asyncpg.Connection) -> None:
    await _stored(db)
    assert await found(db, "d-dep_x-1") == [("dep_x", 2)]  # a delivery id: the resource with all its deliveries
    assert await found(db, "evt_dep_ab_0") == [("dep_ab", 2)]  # a gateway event id
    assert await found(db, "dep_ab") == [("dep_ab", 2)]  # a whole resource id: that resource, not dep_abc
    assert await found(db, "p_ab") == [("dep_ab", 2), ("dep_abc", 2)]  # part of a resource id
    assert await found(db, "d-dep_x") == [] and await found(db, "evt_dep_ab") == []  # part of other ids: none
    assert await found(db, "d-set-aside") == []  # set aside: no resource to list
    assert await found(db, "dep_ab", gateway="card") == []  # the gateway searched, the whole id's too
    assert await found(db, "d-dep_x-0", status="slip_received") == [("dep_x", 2)]
    assert await found(db, "d-dep_x-0", status="pending") == []
    assert await found(db, "evt_dep_x_0", status="parked") == [("dep_x", 2)]


async def test_a_whole_id_is_read_through_the_indexes_in_a_generic_plan_too(db: asyncpg.Connection) -> None:
    await _stored(db)
    await db.execute("ANALYZE webhook_events")
    await db.execute("SET enable_seqscan = off")
    await db.execute("SET plan_cache_mode = force_generic_plan")  # as asyncpg's prepared statements may end
    await db.execute(f"PREPARE whole AS {resource_search.WHOLE_ID}")
    await db.execute(f"PREPARE listing AS {resource_search.BY_WHOLE_ID.format(statuses=queries.status_union())}")
    for plan in ([r[0] for r in await db.fetch("EXPLAIN EXECUTE whole('{pg,card}', 'x')")],
                 [r[0] for r in await db.fetch("EXPLAIN EXECUTE listing('{pg}', 'x', NULL, NULL, NULL, NULL, 51)")]):
        text = "\n".join(plan)
        assert "Seq Scan on webhook_events" not in text, text
        for index in ("webhook_events_gateway_resource_id_received_at_idx", "webhook_events_gateway_event_id_idx",
                      "webhook_events_pkey"):
            assert index in text, (index, text)


async def test_the_console_points_at_a_delivery_set_aside(postgres: PostgresServer, namespace: str,
                                                          db: asyncpg.Connection) -> None:
    await _stored(db)
    settings = make_settings("127.0.0.1:1", postgres.dsn, namespace)
    bearer = {"Authorization": f"Bearer {admin_token(settings)}"}
    async with served(settings) as (url, _), aiohttp.ClientSession(headers=bearer) as http:

        async def page(**params: str) -> str:
            async with http.get(f"{url}/resources", params=params) as resp:
                text = await resp.text()
                assert resp.status == 200, text
                return text

        assert '<a href="/quarantine/d-set-aside">d-set-aside</a> was set aside: it is in the quarantine' in \
            await page(q="d-set-aside")
        odd = await page(q=ODD)
        assert f'<a href="/quarantine/{quote(ODD, safe="")}">{escape(ODD)}</a> was set aside' in odd
        assert "<b>#x" not in odd
        assert "d-redriven</a> was set aside and redriven 2\N{MULTIPLICATION SIGN}" in await page(q="d-redriven")
        assert "was set aside" not in await page(q="d-card", gateway="pg")  # another gateway's
        assert "d-card</a> was set aside" in await page(q="d-card")
        later = resource_search.Cursor(datetime.now(UTC), "pg", "z").encode()
        assert "was set aside" not in await page(q="d-set-aside", cursor=later)  # said on the first page only
        listed = await page(q="d-dep_x-0")
        assert "/resources/pg/dep_x" in listed and "was set aside" not in listed
