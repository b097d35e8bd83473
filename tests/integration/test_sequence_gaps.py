"""pg's sequence gaps in PostgreSQL: a batch reads only the gaps its late numbers fall in, and leaves
the table as a fold of every number over every open gap would (app/core/gaps.py observe); the
open-gap gauges and the backfill pass read the table with bounded work."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import asyncpg

from app.core.gaps import Gap, observe
from app.metrics import ProjectorMetrics
from app.projector import _observe
from app.stack.postgres import PostgresServer
from projections import sql
from projections.migrate import migrate, quote_ident

NOW = datetime(2026, 12, 1, tzinfo=UTC)
OPEN = 2_000  # gaps open before the batch: every even number 2..4000 is missing


async def table(conn: asyncpg.Connection) -> list[tuple[int, int, datetime, datetime | None]]:
    rows = await conn.fetch("SELECT start_seq, end_seq, first_seen_at, backfill_requested_at FROM pg_sequence_gaps "
                            "WHERE merchant = 'pg' ORDER BY start_seq")
    return [(r["start_seq"], r["end_seq"], r["first_seen_at"], r["backfill_requested_at"]) for r in rows]


async def test_a_batch_leaves_the_gaps_a_fold_over_all_of_them_would(postgres: PostgresServer,
                                                                      namespace: str) -> None:
    rng = random.Random(47)
    conn = await asyncpg.connect(postgres.dsn)
    try:
        await migrate(conn, namespace)
        await conn.execute(f"SET search_path = {quote_ident(namespace)}")
        # one-number gaps, and wide ones a late number splits; some with a backfill requested
        gaps = [Gap(2 * i, 2 * i, 0, rng.random() < 0.3) for i in range(1, OPEN + 1)]
        gaps += [Gap(5_000, 5_999, 0, True), Gap(7_000, 7_999, 0)]
        requested = {g.start: NOW - timedelta(hours=g.start % 7) if g.backfill_requested else None for g in gaps}
        await conn.executemany("INSERT INTO pg_sequence_gaps VALUES ('pg', $1, $2, $3, $4)",
                               [(g.start, g.end, NOW, requested[g.start]) for g in gaps])
        await conn.execute(sql.UPSERT_SEQUENCE_MAX, "pg", 8_000)
        before = await table(conn)

        # late numbers (some twice, some in no gap), numbers inside the wide gaps, and jumps past the highest
        late = rng.sample(range(2, 2 * OPEN + 1), 600) + rng.sample(range(1, 4001, 2), 50)
        wide = [*rng.sample(range(5_000, 6_000), 40), 7_000, 7_999, 7_500]
        batch = [*late, *wide, *late[:20], 8_003, 8_010, 8_011, 8_500]
        rng.shuffle(batch)
        at_ms = int(NOW.timestamp() * 1000) + 60_000
        seen = [(seq, at_ms + i) for i, seq in enumerate(batch)]
        async with conn.transaction():
            await _observe(conn, "pg", seen, ProjectorMetrics())

        expected_max, expected = 8_000, [Gap(s, e, int(f.timestamp() * 1000), r is not None) for s, e, f, r in before]
        for seq, ms in seen:
            expected_max, expected = observe(expected_max, expected, seq, ms)
        assert await conn.fetchval(sql.SELECT_SEQUENCE_MAX, "pg") == expected_max == 8_500
        after = await table(conn)
        assert [(s, e, int(f.timestamp() * 1000)) for s, e, f, _ in after] == \
               [(g.start, g.end, g.first_seen_ms) for g in expected]
        # a piece of a gap keeps the time its backfill was requested; a gap opened now has none
        for start, end, _, at in after:
            holder = [r for s, e, _, r in before if s <= start and end <= e]
            assert at == (holder[0] if holder else None), (start, end)

        assert tuple(await conn.fetchrow(sql.GAPS_OPEN, ["pg"]) or ()) == \
               (len(expected), sum(g.missing for g in expected))
    finally:
        await conn.close()


async def test_the_backfill_pass_reads_the_due_gaps_lowest_first_and_at_most_its_limit(
        postgres: PostgresServer, namespace: str) -> None:
    conn = await asyncpg.connect(postgres.dsn)
    try:
        await migrate(conn, namespace)
        await conn.execute(f"SET search_path = {quote_ident(namespace)}")
        old, fresh = NOW - timedelta(days=5), NOW - timedelta(days=1)
        rows = [(n, old, None) for n in range(100, 130)] + [(n, fresh, None) for n in range(1, 50)] + \
               [(n, old, NOW) for n in range(50, 100)]
        await conn.executemany("INSERT INTO pg_sequence_gaps VALUES ('pg', $1, $1, $2, $3)", rows)
        due = await conn.fetch(sql.SELECT_GAPS_DUE, "pg", NOW - timedelta(days=4), 20)
        assert [r["start_seq"] for r in due] == list(range(100, 120))
    finally:
        await conn.close()
