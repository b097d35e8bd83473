"""A bulk retry of pending effects against a real PostgreSQL leaves a row an effects process has
claimed (its request may be in flight): made due now, a second process would claim it and the
merchant would hear it twice (app/admin/bulk.py RETRY; the review of the bulk actions)."""

from __future__ import annotations

from datetime import UTC, datetime

import asyncpg

from app.admin import bulk
from app.effects import CLAIM_DUE

LEASE_S = 30.0


async def _effect(db: asyncpg.Connection, key: str, due_in_s: float) -> None:
    await db.execute("INSERT INTO effects (dedupe_key, type, gateway, resource_id, payload, caused_by, "
                     "next_attempt_at) VALUES ($1, 'credit_user', 'pg', $1, '{}', 'd', "
                     "now() + make_interval(secs => $2))", key, due_in_s)


async def test_a_bulk_retry_of_pending_effects_leaves_a_claimed_one_alone(db: asyncpg.Connection) -> None:
    await _effect(db, "claimed", 0)
    claimed = await db.fetch(CLAIM_DUE, 10, LEASE_S)  # the effects process's own claim: leased for LEASE_S
    assert [r["dedupe_key"] for r in claimed] == ["claimed"]
    await _effect(db, "backing-off", 600)  # failed earlier, waiting out a long back-off
    f = bulk.parse_filter("effects", {"state": "pending"}, datetime.now(UTC))
    done = await bulk.retry_effects(db, f, "ana", dry_run=False, lease_s=LEASE_S)
    assert (done.matched, done.acted) == (2, 1), done.result
    # a second process claims only the one made due, never the one in flight
    assert [r["dedupe_key"] for r in await db.fetch(CLAIM_DUE, 10, LEASE_S)] == ["backing-off"]


async def test_a_bulk_retry_brings_dead_effects_back_whatever_their_time(db: asyncpg.Connection) -> None:
    await _effect(db, "dead", 0)
    await db.execute("UPDATE effects SET dead_at = now(), attempts = 5 WHERE dedupe_key = 'dead'")
    f = bulk.parse_filter("effects", {"state": "dead"}, datetime.now(UTC))
    done = await bulk.retry_effects(db, f, "ana", dry_run=False, lease_s=LEASE_S)
    assert (done.matched, done.acted) == (1, 1), done.result
    assert [r["dedupe_key"] for r in await db.fetch(CLAIM_DUE, 10, LEASE_S)] == ["dead"]
