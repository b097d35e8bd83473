"""Two bulk redrives of the same waiting records at once (a double-clicked console button, two
operators, two admin replicas) against a real PostgreSQL: each record is appended once, not once
per call (app/admin/bulk.py; DESIGN.md §3.1: an explicit, counted operator action)."""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import asyncpg

from app.admin import bulk
from app.stack.postgres import PostgresServer
from projections.migrate import connect
from topics.catalog import names


class SlowProducer:
    """Acknowledges each append after a moment, as a broker does: long enough for a second call to
    pick the same rows before the first has marked them."""

    def __init__(self) -> None:
        self.appended: list[bytes] = []

    async def send_and_wait(self, topic: str, key: bytes, value: bytes, headers: list[tuple[str, bytes]]) -> None:
        await asyncio.sleep(0.05)
        self.appended.append(value)


async def test_two_bulk_redrives_at_once_append_each_waiting_record_once(
        db: asyncpg.Connection, postgres: PostgresServer, namespace: str) -> None:
    n = names(namespace)
    for i in range(3):
        await db.execute(
            "INSERT INTO quarantine (delivery_id, gateway, stage, reason, topic, record_key, body) "
            "VALUES ($1, 'pg', 'projector', 'bad row', $2, $3, $4)", f"d{i}", n.state, b"k", f"body{i}".encode())
    producer = SlowProducer()
    f = bulk.parse_filter("quarantine", {"state": "waiting"}, datetime.now(UTC))
    other = await connect(postgres.dsn, namespace)
    try:
        first, second = await asyncio.gather(
            bulk.redrive_quarantined(db, producer, n, f, 0, "ana", dry_run=False),  # type: ignore[arg-type]
            bulk.redrive_quarantined(other, producer, n, f, 0, "bo", dry_run=False))  # type: ignore[arg-type]
    finally:
        await other.close()
    assert Counter(producer.appended) == {b"body0": 1, b"body1": 1, b"body2": 1}
    assert await db.fetchval("SELECT array_agg(redrives ORDER BY delivery_id) FROM quarantine") == [1, 1, 1]
    assert first.acted + second.acted == 3, (first.result, second.result)


class Migrating:
    """Acknowledges each append; at the first, a migration changes a column the locking read returns.
    It waits for the first record's transaction, and the next record's read waits for it: that read's
    statement, cached on the admin's connection, is stale."""

    def __init__(self, migrate: asyncpg.Connection) -> None:
        self.migrate = migrate
        self.appended: list[bytes] = []
        self.migration: asyncio.Future[Any] | None = None

    async def send_and_wait(self, topic: str, key: bytes, value: bytes, headers: list[tuple[str, bytes]]) -> None:
        self.appended.append(value)
        if self.migration is None:
            self.migration = asyncio.ensure_future(
                self.migrate.execute("ALTER TABLE quarantine ALTER COLUMN reason TYPE varchar(4000)"))
            await asyncio.sleep(0.3)  # queued for the table's lock before this record's transaction ends


async def test_a_migration_during_a_bulk_redrive_neither_stops_it_nor_appends_a_record_twice(
        db: asyncpg.Connection, postgres: PostgresServer, namespace: str) -> None:
    """asyncpg prepares a stale statement anew only outside a transaction: each record's redrive is
    one, so the record whose locking read failed (before its append, rolled back) is redriven once
    more, and the call ends with its audit row as usual."""
    n = names(namespace)
    for i in range(3):
        await db.execute(
            "INSERT INTO quarantine (delivery_id, gateway, stage, reason, topic, record_key, body) "
            "VALUES ($1, 'pg', 'projector', 'bad row', $2, $3, $4)", f"d{i}", n.state, b"k", f"body{i}".encode())
    other = await connect(postgres.dsn, namespace)
    try:
        producer = Migrating(other)
        f = bulk.parse_filter("quarantine", {"state": "waiting"}, datetime.now(UTC))
        done = await bulk.redrive_quarantined(db, producer, n, f, 0, "ana", dry_run=False)  # type: ignore[arg-type]
        assert producer.migration is not None
        await producer.migration
    finally:
        await other.close()
    assert producer.appended == [b"body0", b"body1", b"body2"]
    assert await db.fetchval("SELECT array_agg(redrives ORDER BY delivery_id) FROM quarantine") == [1, 1, 1]
    assert done.acted == 3 and await db.fetchval(
        "SELECT result FROM admin_actions WHERE action = 'quarantine.redrive.bulk'") == done.result
