"""The fetcher's Stripe pass between two full ones (app/core/stripe.py FETCH_WANTED_RECENT,
app/fetch_passes.py) against a real PostgreSQL: it finds what the full query finds among the
PaymentIntents with a failed attempt or an attempt step written since its time, or asked about
before, and every parked thin event; through its index, by time, whatever the parameters."""

from __future__ import annotations

from datetime import timedelta

import asyncpg

from app.core.stripe import FETCH_WANTED, FETCH_WANTED_RECENT

HOUR = timedelta(hours=1)
MINUTE = timedelta(minutes=1)


async def _row(db: asyncpg.Connection, n: int, pi: str, kind: str, received: timedelta, written: timedelta,
               outcome: str = "applied") -> None:
    await db.execute(
        "INSERT INTO webhook_events (delivery_id, gateway, event_id, resource_id, event_type, received_at, "
        "projected_at, outcome, payload) VALUES ($1, 'stripe', $1, $2, $3, now() - $4::interval, "
        "now() - $5::interval, $6, $7)", f"d{n}", pi, kind, received, written, outcome, '{"created": 1796000000}')


async def test_it_finds_what_the_full_query_finds_among_what_can_have_changed(db: asyncpg.Connection) -> None:
    failed, step = "payment_intent.payment_failed", "payment_intent.processing"
    rows = [("pi_old", failed, 2 * HOUR, 2 * HOUR), ("pi_old", step, 2 * HOUR, 2 * HOUR),
            ("pi_new", failed, 5 * MINUTE, 5 * MINUTE), ("pi_new", step, 5 * MINUTE, 5 * MINUTE),
            ("pi_late_step", failed, 3 * HOUR, 3 * HOUR), ("pi_late_step", step, 2 * MINUTE, 2 * MINUTE),
            ("pi_late_failure", step, 3 * HOUR, 3 * HOUR), ("pi_late_failure", failed, 2 * MINUTE, 2 * MINUTE),
            # received long ago, written now: a redrive from the quarantine, or a pipeline that lagged
            ("pi_redriven", failed, 5 * HOUR, MINUTE), ("pi_redriven", step, 5 * HOUR, MINUTE),
            ("pi_asked", failed, 4 * HOUR, 4 * HOUR), ("pi_asked", step, 4 * HOUR, 4 * HOUR)]
    for n, (pi, kind, received, written) in enumerate(rows):
        await _row(db, n, pi, kind, received, written)
    await _row(db, 99, "pi_thin", "payment_intent.succeeded", 6 * HOUR, 6 * HOUR, outcome="parked")
    since = await db.fetchval("SELECT now() - interval '1 hour'")
    full = [r["id"] for r in await db.fetch(FETCH_WANTED, 60.0, [])]
    recent = [r["id"] for r in await db.fetch(FETCH_WANTED_RECENT, 60.0, [], since, ["pi_asked"])]
    assert full == ["pi_thin", "pi_redriven", "pi_asked", "pi_late_step", "pi_old", "pi_new", "pi_late_failure"]
    assert recent == [pi for pi in full if pi != "pi_old"]
    everything = await db.fetch(FETCH_WANTED_RECENT, 60.0, [], since - 6 * HOUR, [])
    assert [r["id"] for r in everything] == full
    left_out = await db.fetch(FETCH_WANTED_RECENT, 60.0, ["pi_new", "pi_thin"], since, [])
    assert "pi_new" not in [r["id"] for r in left_out] and "pi_thin" not in [r["id"] for r in left_out]


async def test_its_generic_plan_reads_the_index_by_time(db: asyncpg.Connection) -> None:
    """asyncpg prepares it, and after five runs PostgreSQL may keep a plan for any parameters."""
    await db.execute("SET enable_seqscan = off")
    await db.execute("SET plan_cache_mode = force_generic_plan")
    await db.execute(f"PREPARE wanted_recent AS {FETCH_WANTED_RECENT}")
    generic = [r[0] for r in await db.fetch("EXPLAIN EXECUTE wanted_recent(60, '{}', now(), '{}')")]
    at = next(i for i, line in enumerate(generic) if "webhook_events_stripe_tied_at" in line)
    assert "Index Cond: (projected_at >=" in generic[at + 1], generic
