"""paymos end to end: HTTP → Kafka → worker → PostgreSQL, for every rule of the event catalogue."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.stack.kafka import KafkaBroker
from app.stack.postgres import PostgresServer
from tests.paymos_events import event as paymos_event
from tests.pipeline import Running, running_pipeline
from tests.support import make_settings, read_topic
from topics.catalog import names

BASE_MS = 1_764_412_395_000  # 2025-11-29: the gateway's times are unix ms between 2000 and 2100 (validated)


def event(event_type: str, rid: str, status: str, at: int, **extra: Any) -> bytes:
    """A paymos event whose data.updated_at (and created_at) is ``at`` ms after BASE_MS."""
    return paymos_event(event_type, rid, status, BASE_MS + at, **extra)


@pytest.fixture(scope="module")
def pipe(kafka: KafkaBroker, postgres: PostgresServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    s = make_settings(kafka.bootstrap, postgres.dsn, f"pm{uuid.uuid4().hex[:8]}")
    with running_pipeline(s, tmp_path_factory.mktemp("paymos-pipeline")) as running:
        yield running


async def post(pipe: Running, *bodies: bytes) -> list[dict[str, Any]]:
    return await pipe.post("paymos", *bodies)


async def settled(pipe: Running, rid: str, deliveries: int) -> list[str]:
    async def check(c: Any) -> list[str] | None:
        rows = await c.fetch("SELECT outcome FROM webhook_events WHERE resource_id = $1 ORDER BY received_at", rid)
        return [r["outcome"] for r in rows] if len(rows) >= deliveries else None
    result: list[str] = await pipe.wait_for(check)
    assert len(result) == deliveries, result  # one decision per delivery, none twice
    return result


async def effects(pipe: Running, rid: str) -> list[tuple[str, str]]:
    conn = await pipe.connect()
    try:
        return [(r["dedupe_key"], r["type"]) for r in await conn.fetch(
            "SELECT dedupe_key, type FROM effects WHERE resource_id = $1 ORDER BY created_at, dedupe_key", rid)]
    finally:
        await conn.close()


async def test_older_snapshot_after_newer_and_terminal_redelivery(pipe: Running) -> None:
    paid = event("invoice.paid", "inv_a", "paid", 2000, amount="0.50000000", received_amount="0.50000000")
    await post(pipe, paid, event("invoice.confirming", "inv_a", "confirming", 1000), paid)
    assert await settled(pipe, "inv_a", 3) == ["applied", "stale", "duplicate"]
    row = await pipe.wait_for(lambda c: c.fetchrow("SELECT * FROM paymos_invoices WHERE id = 'inv_a'"))
    assert (row["status"], row["is_final"], row["updated_at_ms"]) == ("paid", True, BASE_MS + 2000)
    await pipe.wait_for(lambda c: c.fetchval("SELECT 1 FROM effects WHERE resource_id = 'inv_a'"))
    assert await effects(pipe, "inv_a") == [("paymos:inv_a:credit", "invoice_paid")]
    # decimal strings stay exact in PostgreSQL
    conn = await pipe.connect()
    try:
        amount = await conn.fetchval("SELECT (snapshot->>'amount')::numeric FROM paymos_invoices WHERE id = 'inv_a'")
        assert amount == Decimal("0.50000000")
    finally:
        await conn.close()


async def test_paid_late_is_one_note_and_no_decision(pipe: Running) -> None:
    await post(pipe, event("invoice.expired", "inv_b", "expired", 1000),
               event("invoice.paid_late", "inv_b", "expired", 3000, paid_late_at=1_796_000_000),
               event("invoice.paid_late", "inv_b", "expired", 3500, event_id="evt_late_again"))
    await settled(pipe, "inv_b", 3)
    notes = await pipe.wait_for(lambda c: c.fetch("SELECT * FROM order_notes WHERE resource_id = 'inv_b'"))
    assert [n["kind"] for n in notes] == ["paid_late"]
    row = await pipe.wait_for(lambda c: c.fetchrow("SELECT * FROM paymos_invoices WHERE id = 'inv_b'"))
    assert row["status"] == "expired" and row["updated_at_ms"] == BASE_MS + 1000
    await pipe.wait_for(lambda c: c.fetchval("SELECT count(*) = 2 FROM effects WHERE resource_id = 'inv_b'"))
    kinds = [t for _, t in await effects(pipe, "inv_b")]
    assert sorted(kinds) == ["add_order_note", "invoice_expired"]  # never paid, failed or cancelled by it


async def test_withdrawal_completion_rewound_reopens_the_payout(pipe: Running) -> None:
    await post(pipe, event("withdrawal.completed", "wdr_a", "completed", 1000),
               event("withdrawal.cancelled", "wdr_a", "cancelled", 1500),  # out of a terminal state: refused
               event("withdrawal.completion_rewound", "wdr_a", "signed", 2000),
               event("withdrawal.completed", "wdr_a", "completed", 3000))
    await pipe.wait_for(lambda c: c.fetchval(
        f"SELECT 1 FROM paymos_withdrawals WHERE id = 'wdr_a' AND updated_at_ms = {BASE_MS + 3000}"))
    await pipe.wait_for(lambda c: c.fetchval("SELECT count(*) = 3 FROM effects WHERE resource_id = 'wdr_a'"))
    assert sorted(k for k, _ in await effects(pipe, "wdr_a")) == [
        "paymos:wdr_a:payout_completed:0", "paymos:wdr_a:payout_completed:1", "paymos:wdr_a:payout_reopened:0"]
    conn = await pipe.connect()
    try:
        outcomes = [r["outcome"] for r in await conn.fetch(
            "SELECT outcome FROM webhook_events WHERE resource_id = 'wdr_a' AND event_type = 'withdrawal.cancelled'")]
        assert outcomes == ["stale"]  # parked while terminal, stale once newer snapshots applied
    finally:
        await conn.close()


async def test_channel_deposit_is_credited_once_across_a_reorg(pipe: Running) -> None:
    await post(pipe, event("payment_channel.deposit.confirmed", "pcd_a", "confirmed", 1000, net_amount="2.5"),
               event("payment_channel.deposit.reorged", "pcd_a", "reorged", 2000),
               event("payment_channel.deposit.confirming", "pcd_a", "confirming", 3000),
               event("payment_channel.deposit.confirmed", "pcd_a", "confirmed", 4000, net_amount="2.5"))
    await pipe.wait_for(lambda c: c.fetchval(
        f"SELECT 1 FROM paymos_channel_deposits WHERE id = 'pcd_a' AND updated_at_ms = {BASE_MS + 4000}"))
    await pipe.wait_for(lambda c: c.fetchval("SELECT 1 FROM effects WHERE resource_id = 'pcd_a'"))  # another process
    assert await effects(pipe, "pcd_a") == [("paymos:pcd_a:credit_channel_deposit", "credit_channel_deposit")]


async def test_unknown_type_is_quarantined_and_the_stream_goes_on(pipe: Running) -> None:
    [answer] = await post(pipe, event("invoice.refunded", "inv_q", "refunded", 1000))
    assert answer["quarantined"] is True
    await post(pipe, event("invoice.paid", "inv_q", "paid", 2000))
    await settled(pipe, "inv_q", 1)
    quarantined = await read_topic(pipe.settings.kafka_bootstrap, names(pipe.settings.namespace).quarantine)
    assert any(b"invoice.refunded" in r.value for r in quarantined)
    assert pipe.ingest.metrics.quarantined.labels("paymos", "unknown_type")._value.get() >= 1
    await pipe.wait_for(lambda c: c.fetchval("SELECT 1 FROM quarantine WHERE resource_id = 'inv_q'"))
    status, body = await pipe.resource("paymos", "inv_q")
    assert status == 200
    assert body["state"]["status"] == "paid"
    # the quarantined delivery shows in the invoice's timeline with its reason, then the paid one
    assert [d["outcome"] for d in body["timeline"]] == ["quarantined", "applied"]
    assert "unknown event type" in body["timeline"][0]["why"]


HISTORY = [("invoice.confirming", "confirming", 100), ("invoice.paid", "paid", 200),
           ("invoice.awaiting_payment", "awaiting_payment", 300), ("invoice.paid_over", "paid_over", 400)]


@pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisDeprecationWarning")  # see test_ingest_fuzz
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                               HealthCheck.too_slow])
@given(data=st.data())
def test_any_order_with_a_reorg_detour_over_http(pipe: Running, data: st.DataObject) -> None:
    rid = f"inv_h{uuid.uuid4().hex[:8]}"
    history = [event(t, rid, s, at) for t, s, at in HISTORY]
    order = data.draw(st.permutations(history + data.draw(st.lists(st.sampled_from(history), max_size=2))))

    async def scenario() -> None:
        await post(pipe, *order)
        row = await pipe.wait_for(lambda c: c.fetchrow(
            "SELECT * FROM paymos_invoices WHERE id = $1 AND updated_at_ms = $2", rid, BASE_MS + 400))
        assert row["status"] == "paid_over"
        await settled(pipe, rid, len(order))
        # the effects process writes this table from orderly.effects: it may lag webhook_events
        await pipe.wait_for(lambda c: c.fetchval(
            "SELECT count(*) >= 1 FROM effects WHERE resource_id = $1 "
            "AND type IN ('invoice_paid', 'invoice_paid_over')", rid))
        credits = [k for k, t in await effects(pipe, rid) if t in ("invoice_paid", "invoice_paid_over")]
        assert credits == [f"paymos:{rid}:credit"]

    asyncio.run(scenario())
