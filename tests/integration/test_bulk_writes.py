"""The set-based writes (projections/bulk.py) against a real PostgreSQL: a batch written in one go
leaves the same rows as the same batch written one row per statement, in order, whatever keys repeat
inside it. This is what lets the projector batch without changing a guard."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import asyncpg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.effects import EFFECTS
from app.stack.postgres import PostgresServer
from projections import sql
from projections.bulk import Bulk, write
from projections.migrate import connect, migrate

maybe_time = st.none() | st.sampled_from(["2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z"])
deposit_rows = st.lists(st.tuples(
    st.sampled_from(["d1", "d2", "d3"]), st.integers(1, 5), st.sampled_from(["pending", "settled", "reversed"]),
    st.booleans(), maybe_time, st.integers(1, 10**12), maybe_time, maybe_time,
).map(lambda r: [r[0], r[1], r[2], r[3], r[4], r[5], r[5], r[5], 0, r[5], '{"fee": 1}', None, None, None,
                 "o", "u", r[6], r[7]]), max_size=12)
event_rows = st.lists(st.tuples(
    st.sampled_from(["dlv_1", "dlv_2"]), st.integers(0, 4),
    st.sampled_from(["applied", "stale", "duplicate", "parked"]),
).map(lambda r: (r[0], "pg", "evt", "d1", "deposit.settled", datetime(2026, 1, 1, tzinfo=UTC), r[2], '{"a": 1}',
                 r[1], None)), max_size=12)
effect_rows = st.lists(st.tuples(st.sampled_from(["k1", "k2"]), st.sampled_from(['{"n": 1}', '{"n": 2}'])).map(
    lambda r: (r[0], "credit_user", "pg", "d1", r[1], "dlv")), max_size=6)

TABLES: list[tuple[Bulk, str, str]] = [
    (sql.UPSERT_ROW["pg_deposits"], "pg_deposits", "SELECT * FROM pg_deposits ORDER BY pg_deposit_id"),
    (sql.WEBHOOK_EVENTS, "webhook_events", "SELECT delivery_id, outcome, seq FROM webhook_events ORDER BY 1"),
    (EFFECTS, "effects", "SELECT dedupe_key, payload FROM effects ORDER BY 1"),
]


async def rows_after(conn: asyncpg.Connection, bulk: Bulk, table: str, query: str, batch: list[Any],
                     at_once: bool) -> list[dict[str, Any]]:
    await conn.execute(f"TRUNCATE {table} CASCADE")
    async with conn.transaction():
        if at_once:
            await write(conn, bulk, batch)
        else:
            for row in batch:
                await write(conn, bulk, [row])
    return [{k: v for k, v in r.items() if k != "updated_at"} for r in await conn.fetch(query)]


@pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisDeprecationWarning")  # see test_ingest_fuzz
def test_a_batch_in_one_statement_equals_its_rows_one_by_one(postgres: PostgresServer, namespace: str) -> None:
    async def prepare() -> None:
        admin = await asyncpg.connect(postgres.dsn)
        try:
            await migrate(admin, namespace)
        finally:
            await admin.close()

    asyncio.run(prepare())

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(deposits=deposit_rows, events=event_rows, effects=effect_rows)
    def batch(deposits: list[Any], events: list[Any], effects: list[Any]) -> None:
        async def compare() -> None:
            conn = await connect(postgres.dsn, namespace)
            try:
                for (bulk, table, query), rows in zip(TABLES, (deposits, events, effects), strict=True):
                    at_once = await rows_after(conn, bulk, table, query, rows, at_once=True)
                    assert at_once == await rows_after(conn, bulk, table, query, rows, at_once=False), table
            finally:
                await conn.close()

        asyncio.run(compare())

    batch()
