"""The search finds a resource by any id an on-call engineer holds (integration: real PostgreSQL, no
Kafka): a whole resource id, gateway event id or delivery id (the one every log line, the ingest's
answer and each effect's ``caused_by`` name) through the indexes, at any size of the history; part
of a resource id when no whole id matches. The console says when a delivery searched for was set
aside and links to it in the quarantine."""

from __future__ import annotations

import base64
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import aiohttp
import asyncpg
import orjson
import pytest
from markupsafe import escape

from app.admin import queries, resource_search
from app.gateways.limits import DELIVERY_ID_MAX
from app.stack.postgres import PostgresServer
from tests.integration.test_admin_auth_sessions import served
from tests.support import admin_token, make_settings

ODD = 'd/odd?"<b>#x'  # a delivery id set aside that a link must encode and a page escape
LONGEST = f"fetch-{'e' * (DELIVERY_ID_MAX - 6)}"  # a delivery id as long as the admin takes one


async def _stored(db: asyncpg.Connection) -> None:
    rows = [(f"d-{rid}-{n}", f"evt_{rid}_{n}", rid, "parked" if rid == "dep_x" and n else "applied")
            for rid in ("dep_ab", "dep_abc", "dep_x") for n in range(2)]
    await db.executemany("INSERT INTO webhook_events (delivery_id, gateway, event_id, resource_id, event_type, "
                         "received_at, outcome) VALUES ($1, 'pg', $2, $3, 'deposit.updated', now(), $4)", rows)
    await db.execute("INSERT INTO pg_deposits (pg_deposit_id, pg_version, status, our_order_id, our_user_id) "
                     "VALUES ('dep_ab', 1, 'pending', 'o', 'u'), ('dep_x', 2, 'slip_received', 'o', 'u')")
    await db.executemany("INSERT INTO quarantine (delivery_id, gateway, resource_id, stage, reason, body, redrives) "
                         "VALUES ($1, $2, NULL, 'ingest', 'unroutable', '\\x7b7d', $3)",
                         [("d-set-aside", "pg", 0), (ODD, "pg", 0), ("d-redriven", "pg", 2), ("d-card", "card", 0),
                          (LONGEST, "stripe", 0)])


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
    assert await found(db, "dep_ab", status="pending") == [("dep_ab", 2)]
    assert await found(db, "dep_ab", status="slip_received") == []  # a whole id's resources only, then filtered
    assert await found(db, "dep_ab", match="part") == [("dep_ab", 2), ("dep_abc", 2)]  # asked: the ids holding it
    assert (await resource_search.search(db, q="dep_ab"))["match"] == "whole"
    assert (await resource_search.search(db, q="p_ab"))["match"] == "part"
    assert (await resource_search.search(db))["match"] is None


async def test_the_next_pages_match_as_the_first(db: asyncpg.Connection) -> None:
    """A cursor keeps how its first page matched: a resource stored meanwhile whose id is the text
    searched does not turn the next page into a whole-id search that ends the listing."""
    rows = [(f"d-{rid}", f"e-{rid}", rid) for rid in ("zz_1_a", "zz_1_b", "zz_1_c")]
    await db.executemany("INSERT INTO webhook_events (delivery_id, gateway, event_id, resource_id, event_type, "
                         "received_at, outcome) VALUES ($1, 'pg', $2, $3, 'x', now() - interval '10 minutes' "
                         "+ make_interval(secs => ascii(right($3, 1))), 'applied')", rows)
    first = await resource_search.search(db, q="zz_1", limit=1)
    assert [r["resource_id"] for r in first["items"]] == ["zz_1_c"] and first["match"] == "part"
    await db.execute("INSERT INTO webhook_events (delivery_id, gateway, event_id, resource_id, event_type, "
                     "received_at, outcome) VALUES ('d-zz_1', 'pg', 'e-zz_1', 'zz_1', 'x', now(), 'applied')")
    listed, cursor = [], first["next_cursor"]
    while cursor:
        page = await resource_search.search(db, q="zz_1", limit=1, cursor=cursor)
        listed += [r["resource_id"] for r in page["items"]]
        cursor = page["next_cursor"]
    assert listed == ["zz_1_b", "zz_1_a"]
    assert (await resource_search.search(db, q="zz_1"))["match"] == "whole"  # a new search: the whole id now
    before = resource_search.Cursor(datetime.now(UTC), "pg", "zz_9")  # as handed out before cursors said how
    old = base64.urlsafe_b64encode(orjson.dumps([before.last_at.isoformat(), "pg", "zz_9"])).decode().rstrip("=")
    assert resource_search.Cursor.decode(old) == before
    for odd in (["x", "pg", "a"], [before.last_at.isoformat(), "pg", "a", "sideways"]):
        with pytest.raises(resource_search.BadCursor):
            resource_search.Cursor.decode(base64.urlsafe_b64encode(orjson.dumps(odd)).decode())


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
        whole = await page(q="dep_ab")
        assert "The resources of this whole id" in whole and "/resources/pg/dep_abc" not in whole
        assert 'href="/resources?q=dep_ab&amp;match=part"' in whole
        ids = await page(q="dep_ab", match="part")
        assert "/resources/pg/dep_abc" in ids and "The resources of this whole id" not in ids
        async with http.get(f"{url}/api/resources", params={"q": "dep_ab", "match": "part"}) as resp:
            body = await resp.json()
            assert resp.status == 200 and body["match"] == "part" and len(body["items"]) == 2, body
        async with http.get(f"{url}/api/resources", params={"q": "dep_ab", "match": "exact"}) as resp:
            assert resp.status == 400 and "match must be one of auto, part" in await resp.text()
        assert "was set aside" in await page(q=LONGEST)  # searched for whole
        async with http.get(f"{url}/api/quarantine/{quote(LONGEST, safe='')}") as resp:
            assert resp.status == 200, await resp.text()  # the longest delivery id Orderly makes: viewable
        async with http.get(f"{url}/api/quarantine/{quote(LONGEST + 'x', safe='')}") as resp:
            assert resp.status == 400
