"""Reads made on a timer follow what they look for, not the whole history (integration: real
PostgreSQL, no Kafka): the overview's counts are one count shared by every reader, recounted after
an operator's action; the projector's quarantine gauge and the fetcher's Stripe pass can read
through their partial indexes (migration 0016); the console's refresh of the counts no longer lists
resources (docs/operations.md, "Reads on a timer")."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import asyncpg
import pytest

from app.admin import queries
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
