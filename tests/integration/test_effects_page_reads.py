"""The effects page's reads cost the same whatever the history holds (integration: real PostgreSQL,
no Kafka): each state's list reads through its partial index (migration 0018 for the delivered
ones, which only accumulate), newest first; each tab's count stops at a cap and says so
(docs/operations.md, "Reads on a timer")."""

from __future__ import annotations

import random
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import asyncpg

from app.admin import queries
from app.stack.postgres import PostgresServer
from tests.integration.test_admin_auth_sessions import served
from tests.support import admin_token, make_settings

STATES = {"pending": (False, False), "dead": (False, True), "delivered": (True, False)}  # (delivered, dead)


async def _effects(db: asyncpg.Connection, counts: dict[str, int], seed: int = 7) -> dict[str, list[str]]:
    """``counts`` effects of each state, created at shuffled times (some equal: the key breaks the
    tie); the keys of each state newest first, as the page must list them."""
    rng = random.Random(seed)
    base = datetime(2026, 12, 1, tzinfo=UTC)
    rows, expected = [], {}
    for state, n in counts.items():
        delivered, dead = STATES[state]
        made = [(base + timedelta(seconds=rng.randrange(50)), f"{state}-{i:03d}") for i in range(n)]
        rows += [(key, at, at if delivered else None, at if dead else None) for at, key in made]
        expected[state] = [key for at, key in sorted(made, key=lambda m: (-m[0].timestamp(), m[1]))]
    rng.shuffle(rows)  # stored in no particular order
    await db.executemany("INSERT INTO effects (dedupe_key, type, gateway, resource_id, payload, caused_by, "
                         "created_at, delivered_at, dead_at) VALUES ($1, 'credit_user', 'pg', 'dep', '{}', 'd', "
                         "$2, $3, $4)", rows)
    return expected


async def test_each_state_is_listed_newest_first_through_its_index(db: asyncpg.Connection) -> None:
    expected = await _effects(db, {"pending": 30, "dead": 20, "delivered": 60})
    for state, keys in expected.items():
        for limit in (5, 200):
            listed = await queries.effects(db, state, limit)
            assert [e["dedupe_key"] for e in listed] == keys[:limit]
            assert {e["status"] for e in listed} == {state}
    await db.execute("ANALYZE effects")
    await db.execute("SET enable_seqscan = off")
    await db.execute("SET plan_cache_mode = force_generic_plan")  # as asyncpg's prepared statements may end
    for state, index in (("pending", "effects_due"), ("dead", "effects_dead"), ("delivered", "effects_delivered")):
        await db.execute(f"PREPARE list_{state} AS {queries.EFFECTS[state]}")
        plan = "\n".join(r[0] for r in await db.fetch(f"EXPLAIN EXECUTE list_{state}(200)"))
        assert re.search(rf"(using|Index Scan on) {index} ", plan), plan  # its own partial index, not the key's
        if state == "delivered":  # read in its order: no sort of every delivered effect
            assert "Sort" not in plan, plan
    await db.execute("PREPARE counts AS " + queries.EFFECT_COUNTS)
    plan = "\n".join(r[0] for r in await db.fetch("EXPLAIN EXECUTE counts(11)"))
    assert plan.count("Limit") == 3, plan  # each count stops at the cap


async def test_a_count_past_the_cap_says_so_and_one_within_it_is_exact(
        db: asyncpg.Connection, monkeypatch: Any) -> None:
    await _effects(db, {"pending": 12, "dead": 3, "delivered": 11})
    for cap, counted in ((11, (12, 3, 11)), (12, (12, 3, 11)), (2, (3, 3, 3)), (1_000, (12, 3, 11))):
        monkeypatch.setattr(queries, "EFFECT_COUNT_CAP", cap)  # past the cap: cap + 1
        assert await queries.effect_counts(db) == dict(zip(("effects_pending", "effects_dead", "effects_delivered"),
                                                           counted, strict=True)), cap
    await db.execute("INSERT INTO effects (dedupe_key, type, gateway, resource_id, payload, caused_by) "
                     "SELECT 'more-' || i, 'credit_user', 'pg', 'dep', '{}', 'd' FROM generate_series(1, 1222) i")
    assert (await queries.effect_counts(db))["effects_pending"] == 1_001
    monkeypatch.setattr(queries, "EFFECT_COUNT_CAP", 10_000)
    assert (await queries.effect_counts(db))["effects_pending"] == 1_234
    overview = await queries.overview(db)  # the overview counts every effect, as integers
    assert (overview["effects_pending"], overview["effects_dead"], overview["effects_delivered"]) == (1234, 3, 11)


async def test_the_page_shows_each_tabs_count(postgres: PostgresServer, namespace: str,
                                              db: asyncpg.Connection, monkeypatch: Any) -> None:
    await _effects(db, {"pending": 4, "dead": 2, "delivered": 7})
    monkeypatch.setattr(queries, "EFFECT_COUNT_CAP", 5)
    settings = make_settings("127.0.0.1:1", postgres.dsn, namespace)
    bearer = {"Authorization": f"Bearer {admin_token(settings)}"}
    async with served(settings) as (url, _), aiohttp.ClientSession(headers=bearer) as http:
        async with http.get(f"{url}/effects?state=delivered") as resp:
            page = await resp.text()
            assert resp.status == 200, page
        assert "dead (2)" in page and "pending (4)" in page and "delivered (5+)" in page
        assert all(f"delivered-{i:03d}" in page for i in range(7))
        monkeypatch.setattr(queries, "EFFECT_COUNT_CAP", 10_000)
        await db.execute("INSERT INTO effects (dedupe_key, type, gateway, resource_id, payload, caused_by) "
                         "SELECT 'more-' || i, 'credit_user', 'pg', 'dep', '{}', 'd' FROM generate_series(1, 1230) i")
        async with http.get(f"{url}/effects?state=dead") as resp:
            page = await resp.text()
        assert "pending (1,234)" in page and "delivered (7)" in page
