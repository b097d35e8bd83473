"""Reads made on a timer follow what they look for, not the whole history (integration: real
PostgreSQL, no Kafka): the overview's counts are one count shared by every reader, recounted after
an operator's action; the projector's quarantine gauge and the fetcher's Stripe pass can read
through their partial indexes (migration 0016); the console's refresh of the counts no longer lists
resources (docs/operations.md, "Reads on a timer")."""

from __future__ import annotations

import asyncio
import random
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import asyncpg
import pytest

from app.admin import actions, queries
from app.admin.context import ADMIN
from app.core.stripe import FETCH_WANTED
from app.projector import QUARANTINED_BY_STAGE
from app.stack.postgres import PostgresServer
from tests.integration.test_admin_auth_sessions import served
from tests.support import admin_token, make_settings


def app_metrics(app: Any) -> Any:
    return app[ADMIN].metrics


async def _deliveries(db: asyncpg.Connection, first: int, n: int, outcome: str) -> None:
    await db.execute("INSERT INTO webhook_events (delivery_id, gateway, event_id, resource_id, event_type, "
                     "received_at, outcome) SELECT 'd' || i, 'pg', 'e' || i, 'dep_' || i, 'deposit.updated', "
                     "now(), $3 FROM generate_series($1::int, $2::int) i", first, first + n - 1, outcome)


async def test_readers_share_one_count_and_an_action_counts_again(
        postgres: PostgresServer, namespace: str, db: asyncpg.Connection) -> None:
    await _deliveries(db, 1, 30, "applied")
    await db.execute("INSERT INTO effects (dedupe_key, type, gateway, resource_id, payload, caused_by, dead_at, "
                     "attempts) VALUES ('k1', 'credit_user', 'pg', 'dep_1', '{}', 'd1', now(), 5)")
    settings = make_settings("127.0.0.1:1", postgres.dsn, namespace)
    bearer = {"Authorization": f"Bearer {admin_token(settings)}"}
    async with served(settings) as (url, app), aiohttp.ClientSession(headers=bearer) as http:

        async def overview() -> dict[str, Any]:
            async with http.get(f"{url}/api/overview") as resp:
                assert resp.status == 200, await resp.text()
                body: dict[str, Any] = await resp.json()
                return body

        answers = await asyncio.gather(*(overview() for _ in range(16)))
        assert len({a["counted_at"] for a in answers}) == 1  # one count for sixteen readers at once
        first = answers[0]
        assert first["deliveries"] == {"total": {"applied": 30}, "last_hour": {"applied": 30}}
        assert (first["effects_dead"], first["effects_pending"]) == (1, 0)

        await _deliveries(db, 31, 5, "stale")
        async with http.post(f"{url}/api/effects/k1/retry") as resp:
            assert resp.status == 200, await resp.text()
        after = await overview()  # within the second the counts stay fresh: the action made them stale
        assert after["counted_at"] != first["counted_at"]
        assert (after["effects_dead"], after["effects_pending"]) == (0, 1)
        assert after["deliveries"]["total"] == {"applied": 30, "stale": 5}
        assert app_metrics(app).overview_count_seconds._value.get() > 0


async def test_an_action_of_a_command_or_another_admin_makes_the_counts_stale(
        postgres: PostgresServer, namespace: str, db: asyncpg.Connection) -> None:
    """The audit says when an operator last changed something, whichever process acted: counts
    begun before it are counted again, within the second they would otherwise stay fresh."""
    await db.execute("INSERT INTO effects (dedupe_key, type, gateway, resource_id, payload, caused_by, dead_at, "
                     "attempts) VALUES ('k1', 'credit_user', 'pg', 'dep_1', '{}', 'd1', now(), 5)")
    settings = make_settings("127.0.0.1:1", postgres.dsn, namespace)
    bearer = {"Authorization": f"Bearer {admin_token(settings)}"}
    async with served(settings) as (url, _), aiohttp.ClientSession(headers=bearer) as http:
        async with http.get(f"{url}/api/overview") as resp:
            first = await resp.json()
        assert first["effects_dead"] == 1
        await actions.retry_effect(db, "k1", "cli:ana@host")  # `orderly effects retry k1`: another process
        async with http.get(f"{url}/api/overview") as resp:
            after = await resp.json()
        assert (after["effects_dead"], after["effects_pending"]) == (0, 1), after
        async with http.get(f"{url}/api/overview") as resp:
            assert (await resp.json())["counted_at"] == after["counted_at"]  # and fresh again


async def test_the_timer_reads_can_use_their_partial_indexes(db: asyncpg.Connection) -> None:
    """With sequential scans off, a plan still scans the table only when no index can answer it:
    the partial indexes' predicates match the queries'."""
    await db.execute("SET enable_seqscan = off")

    async def plan(query: str, *args: object) -> str:
        return "\n".join(r[0] for r in await db.fetch("EXPLAIN " + query, *args))

    assert "quarantine_open" in await plan(QUARANTINED_BY_STAGE)
    assert "Seq Scan on quarantine" not in await plan(QUARANTINED_BY_STAGE)
    wanted = await plan(FETCH_WANTED, 60.0, [])
    assert "webhook_events_stripe_failed" in wanted and "Seq Scan on webhook_events" not in wanted
    counts = await plan(queries.OVERVIEW)
    assert "quarantine_open" in counts
    assert "admin_actions_changes" in await plan(queries.LAST_CHANGE)
    # asyncpg prepares each statement: after five runs PostgreSQL may keep a plan for any parameters
    await db.execute("SET plan_cache_mode = force_generic_plan")
    slices = [(queries.RECENT_SLICE[True, True], "NULL, now(), now()"),
              (queries.RECENT_SLICE[True, False], "'pg', now()")]
    for n, (query, args) in enumerate([(FETCH_WANTED, "60, '{}'"), *slices]):
        await db.execute(f"PREPARE s{n} AS {query}")
        generic = [r[0] for r in await db.fetch(f"EXPLAIN EXECUTE s{n}({args})")]
        assert not any("Seq Scan on webhook_events" in line for line in generic), generic
        # the slice's bounds narrow the scan (an index condition), not only filter what it read
        assert n == 0 or any("Cond:" in line and "received_at >= $2" in line for line in generic), generic


async def test_the_refresh_of_the_counts_does_not_list_resources(
        postgres: PostgresServer, namespace: str, db: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch) -> None:
    """The console's counts refresh every 5 s while a tab is open: only the counts, not the recent
    resources (a grouping of every delivery) the page shows once."""
    await _deliveries(db, 1, 3, "applied")
    searches: list[int] = []
    search = queries.search

    async def counted(*args: Any, **kw: Any) -> dict[str, Any]:
        searches.append(kw.get("limit", 0))
        return await search(*args, **kw)

    monkeypatch.setattr(queries, "search", counted)
    settings = make_settings("127.0.0.1:1", postgres.dsn, namespace)
    jar = aiohttp.CookieJar(unsafe=True)  # cookies of an address, not a name
    async with served(settings) as (url, _), aiohttp.ClientSession(cookie_jar=jar) as http:
        async with http.post(f"{url}/login", data={"token": admin_token(settings), "next": "/"},
                             allow_redirects=False) as resp:
            assert resp.status == 303
        async with http.get(f"{url}/?partial=counts") as resp:
            assert resp.status == 200 and 'id="counts"' in await resp.text()
        assert searches == []
        async with http.get(f"{url}/") as resp:
            page = await resp.text()
            assert resp.status == 200 and "dep_1" in page  # the page itself lists the recent resources
        assert searches == [10]


async def _pages(fetch_page: Any, limit: int) -> list[tuple[str, str, Any, int, int, Any]]:
    """Every page, cursor after cursor: (gateway, id, last delivery, deliveries, parked, status) in order."""
    listed: list[tuple[str, str, Any, int, int, Any]] = []
    cursor = None
    for _ in range(500):
        page = await fetch_page(cursor)
        listed += [(r["gateway"], r["resource_id"], r["last_at"], r["deliveries"], r["parked"], r["status"])
                   for r in page["items"]]
        assert len(page["items"]) <= limit
        cursor = page["next_cursor"]
        if cursor is None:
            return listed
    raise AssertionError("the cursor never ended")


async def test_newest_first_read_back_a_slice_at_a_time_lists_what_grouping_every_delivery_lists(
        db: asyncpg.Connection) -> None:
    """Without a text search the listing reads back in time through the BRIN index (1 min, then
    eight times longer each, then all before); page after page it lists exactly what the query over
    every delivery lists: deliveries from seconds to 63 years old and one in the future, ties on
    the time, gateways and status filters, a cursor at each page size."""
    rng = random.Random(47)
    now = datetime.now(UTC)
    ages = [0, 1, 30, 59, 61, 400, 500, 3_000, 4_000, 30_000, 40_000, 200_000, 300_000, 2e6, 3e6, 1e7, 2e7,
            1e8, 1.3e8, 3e8, 2e9, -60]  # 2e9: older than nine slices (about 36 years)
    rows = []
    for i in range(90):
        gw = rng.choice(["pg", "card", "stripe"])
        resource = f"{'pi' if gw == 'stripe' else 'r'}_{i}"
        for j in range(rng.randint(1, 4)):
            at = now - timedelta(seconds=rng.choice(ages)) if i % 7 else now - timedelta(seconds=3_000)  # ties
            outcome = "parked" if rng.random() < 0.15 else rng.choice(["applied", "stale", "duplicate"])
            rows.append((f"d{i}-{j}", gw, f"e{i}-{j}", resource, at, outcome))
    await db.executemany("INSERT INTO webhook_events (delivery_id, gateway, event_id, resource_id, event_type, "
                         "received_at, outcome) VALUES ($1, $2, $3, $4, 'x', $5, $6)", rows)
    await db.execute("INSERT INTO stripe_payment_intents (id, status) SELECT DISTINCT resource_id, "
                     "CASE WHEN length(resource_id) % 2 = 0 THEN 'succeeded' ELSE 'processing' END "
                     "FROM webhook_events WHERE gateway = 'stripe'")
    await db.execute("VACUUM ANALYZE webhook_events")  # the BRIN index summarised, as autovacuum leaves it
    statuses = queries._status_union()

    def every_delivery(gateway: str | None, status: str | None, limit: int) -> Any:
        async def page(cursor: str | None) -> dict[str, Any]:  # the grouping of every delivery, as before
            after = queries.Cursor.decode(cursor) if cursor else None
            found = await db.fetch(queries.SEARCH.format(statuses=statuses), gateway, status, None, None,
                                   after.last_at if after else None, after.gateway if after else None,
                                   after.resource_id if after else None, limit + 1)
            items = [dict(r) for r in found[:limit]]
            last = items[-1] if len(found) > limit else None
            return {"items": items, "next_cursor": queries.Cursor(last["last_at"], last["gateway"],
                                                                  last["resource_id"]).encode() if last else None}
        return page

    gateways: tuple[str | None, ...] = (None, "pg", "stripe")
    statuses_asked: tuple[str | None, ...] = (None, "parked", "succeeded", "canceled")
    for gateway in gateways:
        for status in statuses_asked:
            for limit in (1, 7, 50):
                expected = await _pages(every_delivery(gateway, status, limit), limit)
                listed = await _pages(lambda cursor, g=gateway, s=status, n=limit: queries.search(
                    db, g, s, None, n, cursor), limit)
                assert listed == expected, (gateway, status, limit)
                if gateway is None and status is None:
                    assert len(listed) == 90
                if status == "canceled":
                    assert listed == []


async def test_a_cursor_at_the_start_of_the_calendar_lists_nothing_and_does_not_fail(db: asyncpg.Connection) -> None:
    await _deliveries(db, 1, 3, "applied")
    cursor = queries.Cursor(datetime(1, 1, 1, 0, 0, 30, tzinfo=UTC), "pg", "dep_1").encode()
    assert await queries.search(db, cursor=cursor) == {"items": [], "next_cursor": None}
