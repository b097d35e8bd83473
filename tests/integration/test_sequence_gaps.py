"""pg's sequence gaps in PostgreSQL: a batch reads only the gaps its late numbers fall in, and leaves
the table as a fold of every number over every open gap would (app/core/gaps.py observe); the
open-gap gauges and the backfill pass read the table with bounded work."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import asyncpg
import orjson
import pytest
from aiokafka.errors import KafkaConnectionError

from app.admin import actions
from app.admin.actions import ActionRefused
from app.core.gaps import Gap, observe
from app.metrics import ProjectorMetrics
from app.projector import BACKFILLS_PER_PASS, Projector, _observe
from app.settings import DEV_DEFAULTS, Settings
from app.stack.postgres import PostgresServer
from projections import sql
from projections.migrate import migrate, quote_ident
from topics.catalog import names

NOW = datetime(2026, 12, 1, tzinfo=UTC)
OPEN = 2_000  # gaps open before the batch: every even number 2..4000 is missing


async def table(conn: asyncpg.Connection) -> list[tuple[int, int, datetime, datetime | None]]:
    rows = await conn.fetch("SELECT start_seq, end_seq, first_seen_at, backfill_requested_at FROM pg_sequence_gaps "
                            "WHERE merchant = 'pg' ORDER BY start_seq")
    return [(r["start_seq"], r["end_seq"], r["first_seen_at"], r["backfill_requested_at"]) for r in rows]


class Spy:
    """A connection whose fetches are recorded: (query, arguments, rows returned)."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn
        self.fetched: list[tuple[str, tuple[Any, ...], int]] = []

    async def fetch(self, query: str, *args: Any) -> list[asyncpg.Record]:
        rows = await self.conn.fetch(query, *args)
        self.fetched.append((query, args, len(rows)))
        return rows

    def __getattr__(self, name: str) -> Any:
        return getattr(self.conn, name)


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
        spy = Spy(conn)
        async with conn.transaction():
            await _observe(spy, "pg", seen)  # type: ignore[arg-type]  # a connection's fetch, counted
        # the gaps read are those the late numbers fall in: at most one per number, not every open gap
        holding = [(args, rows) for query, args, rows in spy.fetched if query == sql.SELECT_GAPS_HOLDING]
        assert holding == [(("pg", sorted({n for n in batch if n <= 8_000})), holding[0][1])]
        assert holding[0][1] <= len({n for n in batch if n <= 8_000}) < len(before)

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


class Producer:
    """Records the fetch requests the pass sends."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    async def send_all(self, records: list[tuple[str, bytes, bytes]]) -> None:
        self.sent += [orjson.loads(value) for _, _, value in records]


async def test_each_backfill_pass_requests_at_most_its_limit_going_on_after_the_last(
        postgres: PostgresServer, namespace: str) -> None:
    """Due gaps only (open long enough, not requested yet), at most BACKFILLS_PER_PASS a pass, each
    pass after the last gap the previous one requested and then from the lowest again: gaps whose
    fetch fails (unmarked by the fetcher, due again) do not keep the others waiting."""
    due = 2 * BACKFILLS_PER_PASS + 500
    now = datetime.now(UTC)
    conn = await asyncpg.connect(postgres.dsn)
    try:
        await migrate(conn, namespace)
    finally:
        await conn.close()
    pool = await asyncpg.create_pool(postgres.dsn, min_size=1, max_size=2,
                                     server_settings={"search_path": quote_ident(namespace)})
    assert pool is not None
    try:
        rows = [(2 * n, now - timedelta(days=5), None) for n in range(1, due + 1)] + \
               [(2 * n, now - timedelta(days=1), None) for n in range(due + 1, due + 11)] + \
               [(2 * n, now - timedelta(days=5), now) for n in range(due + 11, due + 21)]
        await pool.executemany("INSERT INTO pg_sequence_gaps VALUES ('pg', $1, $1, $2, $3)", rows)
        projector = Projector.__new__(Projector)
        projector.settings = Settings.from_env({**DEV_DEFAULTS, "ORDERLY_NAMESPACE": namespace})
        projector.n, projector.metrics, projector.backfilled_to = names(namespace), ProjectorMetrics(), {}
        projector.sink = SimpleNamespace(pool=pool)  # type: ignore[assignment]
        projector.producer = producer = Producer()  # type: ignore[assignment]

        async def a_pass() -> list[int]:
            before = len(producer.sent)
            assert await projector.request_backfills() == len(producer.sent) - before
            return [r["until_sequence"] for r in producer.sent[before:]]

        assert await a_pass() == [2 * n for n in range(1, BACKFILLS_PER_PASS + 1)]
        # the fetcher could not do the first five: marked not requested, due again
        for n in range(1, 6):
            await pool.execute(sql.UNMARK_BACKFILLS_REQUESTED, "pg", 2 * n, 2 * n)
        assert await a_pass() == [2 * n for n in range(BACKFILLS_PER_PASS + 1, 2 * BACKFILLS_PER_PASS + 1)]
        assert await a_pass() == [2 * n for n in range(2 * BACKFILLS_PER_PASS + 1, due + 1)] + [2, 4, 6, 8, 10]
        assert await a_pass() == []
        assert await pool.fetchval("SELECT count(*) FROM pg_sequence_gaps WHERE backfill_requested_at IS NULL") == 10
        first = producer.sent[0]
        assert (first["gateway"], first["kind"], first["since_sequence"], first["until_sequence"]) == \
               ("pg", "backfill", 1, 2)
    finally:
        await pool.close()


async def test_a_backfill_not_done_unmarks_what_late_events_left_of_its_gap(postgres: PostgresServer,
                                                                           namespace: str) -> None:
    conn = await asyncpg.connect(postgres.dsn)
    try:
        await migrate(conn, namespace)
        await conn.execute(f"SET search_path = {quote_ident(namespace)}")
        await conn.execute("INSERT INTO pg_sequence_gaps VALUES ('pg', 100, 200, $1, $1), ('pg', 300, 300, $1, $1)",
                           NOW)
        await conn.execute(sql.UPSERT_SEQUENCE_MAX, "pg", 400)
        async with conn.transaction():  # a late 100 and 150: the requested gap is now 101-149 and 151-200
            await _observe(conn, "pg", [(100, 0), (150, 0)])
        assert [(s, e, r) for s, e, _, r in await table(conn)] == [(101, 149, NOW), (151, 200, NOW), (300, 300, NOW)]
        await conn.execute(sql.UNMARK_BACKFILLS_REQUESTED, "pg", 100, 200)  # the fetch of 100-200 failed
        assert [(s, e, r) for s, e, _, r in await table(conn)] == [(101, 149, None), (151, 200, None), (300, 300, NOW)]
    finally:
        await conn.close()


class Refusing(Producer):
    async def send_all(self, records: list[tuple[str, bytes, bytes]]) -> None:
        raise KafkaConnectionError("the broker is away")


async def test_the_consoles_backfill_marks_the_gaps_it_asked_for_and_none_if_kafka_did_not_take_them(
        postgres: PostgresServer, namespace: str) -> None:
    conn = await asyncpg.connect(postgres.dsn)
    try:
        await migrate(conn, namespace)
        await conn.execute(f"SET search_path = {quote_ident(namespace)}")
        n = names(namespace)
        with pytest.raises(ActionRefused, match="no open gap"):
            await actions.request_fetch(conn, Producer(), n, "pg", "dep_1", "ada", "http://127.0.0.1:9")  # type: ignore[arg-type]
        await conn.execute("INSERT INTO pg_sequence_gaps VALUES ('pg', 5, 6, $1, NULL), ('pg', 9, 9, $1, NULL)", NOW)
        with pytest.raises(ActionRefused, match="did not acknowledge"):
            await actions.request_fetch(conn, Refusing(), n, "pg", "dep_1", "ada", "http://127.0.0.1:9")  # type: ignore[arg-type]
        assert [r for _, _, _, r in await table(conn)] == [None, None]  # nothing asked for, nothing marked
        producer = Producer()
        done = await actions.request_fetch(conn, producer, n, "pg", "dep_1", "ada", "http://127.0.0.1:9")  # type: ignore[arg-type]
        assert done.result == "backfill of 2 open gap(s) requested"
        assert [(r["since_sequence"], r["until_sequence"]) for r in producer.sent] == [(4, 6), (8, 9)]
        assert all(r is not None for _, _, _, r in await table(conn))
    finally:
        await conn.close()
