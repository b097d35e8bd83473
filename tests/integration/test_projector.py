"""The projector on its own: guarded upserts, offsets in the same transaction (a redelivered batch
changes nothing), and a record PostgreSQL refuses is set aside instead of wedging the sink."""

from __future__ import annotations

import asyncpg
import orjson

from app.bootstrap import prepare
from app.core.model import Delivery
from app.core.pg import apply_correlation, apply_event
from app.gateways.pg import Webhook, read
from app.producer import KeyedProducer
from app.projector import Projector
from app.settings import Settings
from app.stack.kafka import KafkaBroker
from app.stack.postgres import PostgresServer
from projections import sql
from tests.pg_events import deposit
from tests.support import make_settings
from topics.catalog import names
from topics.records import Correlation

CORR = {"pg_deposit_id": "dep_p", "merchant_reference": "mr_p", "our_order_id": "ord_p", "our_user_id": "usr_p"}


def decisions_for(events: list[bytes]) -> list[bytes]:
    state, out = apply_correlation(None, Correlation(**CORR), Delivery("dlv_c", "pg", "pg:dep_p", 1_700_000_000_000, 0))
    for i, ev in enumerate(events):
        webhook = read(ev, True)  # the adapter's one read, as the worker does
        assert isinstance(webhook, Webhook), webhook
        state, more = apply_event(state, webhook, Delivery(f"dlv_{i}", "pg", "pg:dep_p", 1_700_000_000_001 + i, i + 1))
        out += more
    return [d.to_bytes() for d in out]


async def publish(s: Settings, values: list[bytes]) -> None:
    producer = KeyedProducer(s.kafka_bootstrap)
    await producer.start()
    try:
        await producer.send_all([(names(s.namespace).decisions, b"pg:dep_p", v) for v in values])
    finally:
        await producer.stop()


async def drain(s: Settings) -> None:
    projector = Projector(s)
    await projector.start()
    try:
        await projector.sink.drain(idle_s=1.5)
    finally:
        await projector.stop()


async def test_redelivered_decisions_change_nothing(kafka: KafkaBroker, postgres: PostgresServer,
                                                    namespace: str) -> None:
    s = make_settings(kafka.bootstrap, postgres.dsn, namespace)
    await prepare(s)
    await publish(s, decisions_for([deposit("dep_p", 9, "settled"), deposit("dep_p", 6, "expired")]))
    await drain(s)
    conn = await asyncpg.connect(postgres.dsn, server_settings={"search_path": namespace})
    try:
        snapshot = [await conn.fetch(f"SELECT * FROM {t} ORDER BY 1") for t in
                    ("pg_deposits", "ledger_entries", "webhook_events", "pg_deposit_correlations")]
        assert snapshot[0][0]["status"] == "settled" and len(snapshot[1]) == 1
        # forget the offsets: every decision is delivered again
        await conn.execute("DELETE FROM projector_offsets")
        await drain(s)
        again = [await conn.fetch(f"SELECT * FROM {t} ORDER BY 1") for t in
                 ("pg_deposits", "ledger_entries", "webhook_events", "pg_deposit_correlations")]
        assert again == snapshot
        # a decision carrying an older version never overwrites a newer row
        older = decisions_for([deposit("dep_p", 3, "pending")])[-1]
        await publish(s, [older])
        await drain(s)
        assert await conn.fetchval("SELECT pg_version FROM pg_deposits WHERE pg_deposit_id='dep_p'") == 9
    finally:
        await conn.close()


async def test_a_refused_record_is_set_aside(kafka: KafkaBroker, postgres: PostgresServer, namespace: str) -> None:
    s = make_settings(kafka.bootstrap, postgres.dsn, namespace)
    await prepare(s)
    good = decisions_for([deposit("dep_p", 9, "settled")])
    bad = orjson.loads(good[-1])
    bad["delivery_id"], bad["row"]["status"], bad["row"]["pg_version"] = "dlv_bad", None, 10  # NOT NULL breaks
    await publish(s, [good[0], orjson.dumps(bad), good[1]])
    await drain(s)
    conn = await asyncpg.connect(postgres.dsn, server_settings={"search_path": namespace})
    try:
        assert await conn.fetchval("SELECT status FROM pg_deposits") == "settled"
        [error] = await conn.fetch("SELECT kind, detail FROM projection_errors")
        assert error["kind"] == "projector_refused" and "status" in orjson.loads(error["detail"])["error"]
        assert await conn.fetchval("SELECT count(*) FROM webhook_events WHERE delivery_id = 'dlv_bad'") == 0
        offsets = await conn.fetch(sql.SELECT_OFFSETS, "projector", names(namespace).decisions)
        assert sum(r["next_offset"] for r in offsets) == 3
    finally:
        await conn.close()


async def test_the_payload_is_stored_as_the_decision_holds_it(kafka: KafkaBroker, postgres: PostgresServer,
                                                              namespace: str) -> None:
    """The payload's JSON text goes to jsonb as written (a number's digits as sent); one with a
    number jsonb refuses as written (more than 16,383 digits after the point) is stored as read,
    its decision projected; one jsonb refuses however written (a NUL escape) sets aside its record alone."""
    s = make_settings(kafka.bootstrap, postgres.dsn, namespace)
    await prepare(s)
    correlation, first, second, third = decisions_for(
        [deposit("dep_p", 5, "pending"), deposit("dep_p", 7, "under_review"), deposit("dep_p", 9, "settled")])

    def with_payload(decision: bytes, payload: bytes) -> bytes:
        held = orjson.loads(decision)
        held["payload"] = "__payload__"
        return orjson.dumps(held).replace(b'"__payload__"', payload)

    await publish(s, [correlation, with_payload(first, rb'{"amount": 1.10, "text": "caf\u00e9 \ud83d\ude00"}'),
                      with_payload(second, b'{"tiny": 1e-16384, "big": 1180591620717411303424}'),
                      with_payload(third, rb'{"nul": "a\u0000b"}')])
    await drain(s)
    conn = await asyncpg.connect(postgres.dsn, server_settings={"search_path": namespace})
    try:
        rows = await conn.fetch("SELECT delivery_id, payload::text AS payload FROM webhook_events "
                                "WHERE delivery_id IN ('dlv_0', 'dlv_1', 'dlv_2') ORDER BY delivery_id")
        assert [tuple(r) for r in rows] == [("dlv_0", '{"text": "café 😀", "amount": 1.10}'),
                                            ("dlv_1", '{"big": 1180591620717411303424, "tiny": 0.0}')]
        assert await conn.fetchval("SELECT pg_version FROM pg_deposits") == 7  # the second one projected
        [error] = await conn.fetch("SELECT kind, detail FROM projection_errors")
        assert error["kind"] == "projector_refused"
    finally:
        await conn.close()
