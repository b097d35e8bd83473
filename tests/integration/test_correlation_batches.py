"""The correlation store decides concurrent claims a batch at a time (app/ingest/correlations.py)
against a real PostgreSQL: whatever collides, every answer is the one some one-at-a-time order of
the same claims gives. A claim answered True is what is stored for its deposit; one answered False
conflicts with what is stored (another mapping for its deposit, or its reference stored for another
deposit); nothing but a claim is stored; and identical claims get one answer. Also: a claim refused by
PostgreSQL fails alone, and PostgreSQL away is Unavailable for each claim of the batch."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.ingest import correlations as store_module
from app.ingest.answers import Unavailable
from app.ingest.correlations import CorrelationStore
from app.stack.postgres import PostgresServer
from projections.migrate import migrate, quote_ident
from topics.records import Correlation

CLAIM = st.builds(Correlation, st.sampled_from(["d1", "d2", "d3", "d4"]), st.sampled_from(["m1", "m2", "m3"]),
                  st.sampled_from(["o1", "o2"]), st.just("u1"))


async def fresh_schema(dsn: str) -> str:
    schema = f"corr{uuid.uuid4().hex[:8]}"
    conn = await asyncpg.connect(dsn)
    try:
        await migrate(conn, schema)
    finally:
        await conn.close()
    return schema


async def stored_rows(dsn: str, schema: str) -> dict[str, tuple[str, str, str, str]]:
    conn = await asyncpg.connect(dsn, server_settings={"search_path": quote_ident(schema)})
    try:
        return {r[0]: tuple(r) for r in await conn.fetch("SELECT * FROM pg_deposit_correlations")}
    finally:
        await conn.close()


@pytest.fixture
async def schema(postgres: PostgresServer) -> AsyncIterator[str]:
    yield await fresh_schema(postgres.dsn)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(earlier=st.lists(CLAIM, max_size=3), burst=st.lists(CLAIM, min_size=1, max_size=40))
def test_concurrent_claims_are_answered_as_one_at_a_time(postgres: PostgresServer, earlier: list[Correlation],
                                                         burst: list[Correlation]) -> None:
    async def scenario() -> None:
        schema = await fresh_schema(postgres.dsn)
        store = CorrelationStore(postgres.dsn, schema)
        try:
            for c in earlier:  # stored before, one at a time
                await store.claim(c, 10)
            answers = await asyncio.gather(*(store.claim(c, 10) for c in burst))
        finally:
            await store.close()
        rows = await stored_rows(postgres.dsn, schema)
        fields = {c: (c.pg_deposit_id, c.merchant_reference, c.our_order_id, c.our_user_id) for c in earlier + burst}
        assert set(rows.values()) <= set(fields.values())  # nothing but a claim is stored
        references = {row[1]: deposit for deposit, row in rows.items()}
        for c, answer in zip(burst, answers, strict=True):
            if answer:  # new or identical: what is stored for its deposit
                assert rows.get(c.pg_deposit_id) == fields[c], (c, rows)
            elif c.pg_deposit_id in rows:  # another mapping for its deposit
                assert rows[c.pg_deposit_id] != fields[c], (c, rows)
            else:  # its reference stored for another deposit
                assert references.get(c.merchant_reference) not in (None, c.pg_deposit_id), (c, rows)
        same: dict[Correlation, bool] = {}
        for c, answer in zip(burst, answers, strict=True):
            assert same.setdefault(c, answer) == answer  # identical claims, one answer
        # as one at a time would have it: a deposit whose first claim in the burst found nothing in
        # its way is stored (a burst never leaves every claim of a free deposit refused)
        for c in burst:
            if c.pg_deposit_id not in rows and c.merchant_reference not in references:
                pytest.fail(f"{c} found its deposit and reference free, yet nothing was stored: {rows}")

    asyncio.run(scenario())


async def test_a_claim_postgresql_refuses_fails_alone(schema: str, postgres: PostgresServer,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    store = CorrelationStore(postgres.dsn, schema)
    real = store_module.CorrelationStore._decide

    async def refusing(self: CorrelationStore, claims: list[Correlation], timeout_s: float) -> list[bool]:
        if any(c.pg_deposit_id == "poison" for c in claims):
            raise asyncpg.DataError("refused")
        return await real(self, claims, timeout_s)

    monkeypatch.setattr(store_module.CorrelationStore, "_decide", refusing)
    try:
        results = await asyncio.gather(*(store.claim(Correlation(d, f"m_{d}", "o", "u"), 10)
                                         for d in ("a", "poison", "b")), return_exceptions=True)
    finally:
        await store.close()
    assert results[0] is True and results[2] is True
    assert isinstance(results[1], asyncpg.DataError)
    assert set(await stored_rows(postgres.dsn, schema)) == {"a", "b"}


async def test_postgresql_away_is_unavailable_for_every_claim_of_the_batch() -> None:
    store = CorrelationStore("postgresql://orderly@127.0.0.1:1/orderly", "orderly")  # nothing listens
    try:
        results = await asyncio.gather(*(store.claim(Correlation(f"d{i}", f"m{i}", "o", "u"), 5) for i in range(5)),
                                       return_exceptions=True)
    finally:
        await store.close()
    assert all(isinstance(r, Unavailable) for r in results), results
    assert len({id(r) for r in results}) == 5  # each caller raises its own
    assert all(str(r).startswith("postgres unreachable:") and isinstance(r.__cause__, OSError)
               for r in results if isinstance(r, Unavailable)), results
