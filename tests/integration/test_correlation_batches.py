"""The correlation store decides concurrent claims a batch at a time (app/ingest/correlation_store.py)
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

from app.ingest import correlation_store as store_module
from app.ingest.answers import Unavailable
from app.ingest.correlation_store import CorrelationStore
from app.metrics import IngestMetrics
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
@given(earlier=st.lists(CLAIM, max_size=3), burst_on=st.lists(st.tuples(CLAIM, st.booleans()), min_size=1, max_size=40),
       at_once=st.sampled_from([2, 3, 256]))
def test_concurrent_claims_are_answered_as_one_at_a_time(
        postgres: PostgresServer, earlier: list[Correlation], burst_on: list[tuple[Correlation, bool]], at_once: int,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Two ingests (two stores, each claim to one of them) and batches of 2, 3 or up to 256 claims: batches
    that follow each other, and one store's SELECT seeing what the other's INSERT committed."""
    monkeypatch.setattr(store_module, "CLAIMS_AT_ONCE", at_once)
    burst = [c for c, _ in burst_on]

    async def scenario() -> None:
        schema = await fresh_schema(postgres.dsn)
        stores = [CorrelationStore(postgres.dsn, schema), CorrelationStore(postgres.dsn, schema)]
        try:
            for c in earlier:  # stored before, one at a time
                await stores[0].claim(c, 10)
            answers = await asyncio.gather(*(stores[int(other)].claim(c, 10) for c, other in burst_on))
        finally:
            for store in stores:
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


def outcomes(metrics: IngestMetrics) -> dict[str, float]:
    return {o: metrics.correlation_batches.labels(o)._value.get()
            for o in ("decided", "again", "alone", "refused", "unavailable", "busy")}


async def test_two_ingests_deciding_the_same_deposits_in_crossed_orders_do_not_deadlock(
        schema: str, postgres: PostgresServer) -> None:
    """Each batch goes in deposit order: two ingests' batches of the same 256 deposits, given in
    opposite orders, take their rows in one order (before, 4 rounds in 10 deadlocked)."""
    for round_ in range(6):
        claims = [Correlation(f"r{round_}d{i:03}", f"r{round_}m{i:03}", "o", "u") for i in range(256)]
        metrics = [IngestMetrics(), IngestMetrics()]
        stores = [CorrelationStore(postgres.dsn, schema, m) for m in metrics]
        try:
            answers = await asyncio.gather(*(stores[0].claim(c, 10) for c in claims),
                                           *(stores[1].claim(c, 10) for c in reversed(claims)))
        finally:
            for store in stores:
                await store.close()
        assert all(answers)  # identical claims: both 200
        assert [outcomes(m)["again"] for m in metrics] == [0, 0]


async def test_a_batch_picked_as_a_deadlocks_victim_is_decided_again(
        schema: str, postgres: PostgresServer, monkeypatch: pytest.MonkeyPatch) -> None:
    metrics = IngestMetrics()
    store = CorrelationStore(postgres.dsn, schema, metrics)
    real = store_module.CorrelationStore._decide
    calls = []

    async def deadlocked_once(self: CorrelationStore, claims: list[Correlation], deadline: float) -> list[bool]:
        calls.append(len(claims))
        if len(calls) == 1:
            raise asyncpg.DeadlockDetectedError("deadlock detected")
        return await real(self, claims, deadline)

    monkeypatch.setattr(store_module.CorrelationStore, "_decide", deadlocked_once)
    try:
        answers = await asyncio.gather(*(store.claim(Correlation(f"v{i}", f"vm{i}", "o", "u"), 10) for i in range(5)))
    finally:
        await store.close()
    assert answers == [True] * 5 and calls == [5, 5]
    assert outcomes(metrics)["again"] == 1 and outcomes(metrics)["alone"] == 0


async def test_a_refusal_of_the_batchs_own_is_a_503_for_each_claim_not_one_at_a_time(
        schema: str, postgres: PostgresServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """A lock or statement timeout, read-only after a failover, too many connections: PostgreSQL's,
    not a claim's. Each caller is answered at once, and no claim is decided by itself afterwards."""
    metrics = IngestMetrics()
    store = CorrelationStore(postgres.dsn, schema, metrics)
    calls = []

    async def refusing(self: CorrelationStore, claims: list[Correlation], deadline: float) -> list[bool]:
        calls.append(len(claims))
        raise asyncpg.LockNotAvailableError("canceling statement due to lock timeout")

    monkeypatch.setattr(store_module.CorrelationStore, "_decide", refusing)
    try:
        answers = await asyncio.gather(*(store.claim(Correlation(f"l{i}", f"lm{i}", "o", "u"), 10) for i in range(6)),
                                       return_exceptions=True)
    finally:
        await store.close()
    assert calls == [6]
    assert all(isinstance(a, Unavailable) and isinstance(a.__cause__, asyncpg.LockNotAvailableError)
               for a in answers), answers
    assert str(answers[0]).startswith("postgres unavailable: LockNotAvailableError")
    assert outcomes(metrics)["unavailable"] == 1


async def test_claims_past_the_waiting_bound_are_refused_at_once_and_stopping_answers_the_rest(
        schema: str, postgres: PostgresServer, monkeypatch: pytest.MonkeyPatch) -> None:
    metrics = IngestMetrics()
    store = CorrelationStore(postgres.dsn, schema, metrics)
    monkeypatch.setattr(store_module, "WAITING_MAX", 4)
    monkeypatch.setattr(store_module, "CLAIMS_AT_ONCE", 2)
    stuck = asyncio.Event()

    async def slow(self: CorrelationStore, claims: list[Correlation], deadline: float) -> list[bool]:
        stuck.set()
        await asyncio.sleep(60)  # PostgreSQL far slower than the PUTs
        return [True] * len(claims)

    monkeypatch.setattr(store_module.CorrelationStore, "_decide", slow)
    loop = asyncio.get_running_loop()
    started = loop.time()
    claims = [asyncio.create_task(store.claim(Correlation(f"w{i}", f"wm{i}", "o", "u"), 30)) for i in range(10)]
    await stuck.wait()  # four claims waited (the bound), six came past it; two of the four in the batch
    await asyncio.sleep(0.1)
    refused = [t for t in claims if t.done()]
    assert refused == claims[4:] and all(isinstance(t.exception(), Unavailable) for t in refused)
    assert "4 correlations waiting already" in str(refused[0].exception())
    assert metrics.correlations_waiting._value.get() == 2 and outcomes(metrics)["busy"] == 6
    await store.close()  # the batch under way and the two waiting are answered now, not in 30 s
    answers = await asyncio.gather(*claims, return_exceptions=True)
    assert all(isinstance(a, Unavailable) for a in answers), answers
    assert loop.time() - started < 10
