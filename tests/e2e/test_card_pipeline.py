"""The card gateway end to end: Standard Webhooks in, the reducer in the worker, card_payments and
card_events out — the playbook's pay_8c21 walk-through over HTTP with real Kafka and PostgreSQL."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from app.stack.kafka import KafkaBroker
from app.stack.postgres import PostgresServer
from tests.card_api import CardApi, serve_card_api
from tests.pipeline import Running, running_pipeline
from tests.support import make_settings


@pytest.fixture(scope="module")
def gateway() -> Iterator[CardApi]:
    with serve_card_api() as api:
        yield api


@pytest.fixture(scope="module")
def pipe(kafka: KafkaBroker, postgres: PostgresServer, gateway: CardApi,
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    s = make_settings(kafka.bootstrap, postgres.dsn, f"card{uuid.uuid4().hex[:8]}",
                      api_urls={"card": gateway.url}, fetch_parked_after_s=2.0, fetch_interval_s=0.5)
    with running_pipeline(s, tmp_path_factory.mktemp("card-pipeline")) as running:
        yield running


def card_event(ref: str, eid: str, kind: str, second: int, amount: int) -> bytes:
    return orjson.dumps({"id": eid, "type": f"payment.{kind}", "payment_ref": ref, "sequence": None,
                         "occurred_at": f"2026-11-29T10:02:{15 + second:02d}.123Z", "amount_minor": amount,
                         "currency": "EUR"})


async def post(pipe: Running, *bodies: bytes) -> list[dict[str, Any]]:
    return await pipe.post("card", *bodies)


async def payment(pipe: Running, ref: str, captured: int, refunded: int) -> Any:
    return await pipe.wait_for(lambda c: c.fetchrow(
        "SELECT * FROM card_payments WHERE payment_ref = $1 AND captured_minor = $2 AND refunded_minor = $3",
        ref, captured, refunded))


async def test_pay_8c21_over_refund_parks_until_the_second_capture(pipe: Running) -> None:
    ref = "pay_8c21"
    # arrival order: capture first (the authorisation hit a restarting pod), the 10000 refund in the gap
    await post(pipe, card_event(ref, "evt_c1", "captured", 1, 8000), card_event(ref, "evt_r", "refunded", 2, 10000),
               card_event(ref, "evt_a", "authorised", 0, 12000))
    row = await payment(pipe, ref, 8000, 0)
    assert (row["state"], row["authorised_minor"]) == ("captured", 12000)
    parked = await pipe.wait_for(lambda c: c.fetch(
        "SELECT gateway_event_id FROM card_events WHERE payment_ref = $1 AND applied_at IS NULL", ref))
    assert [r["gateway_event_id"] for r in parked] == ["evt_r"]
    await post(pipe, card_event(ref, "evt_c2", "captured", 3, 3500))
    row = await payment(pipe, ref, 11500, 10000)
    assert row["state"] == "captured"  # totals not level: a partial refund keeps Captured
    await pipe.wait_for(lambda c: c.fetchval(
        "SELECT count(*) = 4 FROM card_events WHERE payment_ref = $1 AND applied_at IS NOT NULL", ref))
    # the effects process writes its table from orderly.effects: it may lag the card projection
    await pipe.wait_for(lambda c: c.fetchval("SELECT 1 FROM effects WHERE resource_id = $1", ref))
    conn = await pipe.connect()
    try:
        outcomes = {r["event_id"]: r["outcome"] for r in await conn.fetch(
            "SELECT event_id, outcome FROM webhook_events WHERE resource_id = $1", ref)}
        assert outcomes == {"evt_c1": "unparked", "evt_r": "unparked", "evt_a": "applied", "evt_c2": "applied"}
        effects = [r["dedupe_key"] for r in await conn.fetch(
            "SELECT dedupe_key FROM effects WHERE resource_id = $1", ref)]
        assert effects == ["card:pay_8c21:mark_order_paid"]
    finally:
        await conn.close()
    status, body = await pipe.resource("card", ref)
    assert status == 200
    assert (body["state"]["state"], body["state"]["captured_minor"], body["parked"]) == ("captured", 11500, 0)
    assert sorted(d["event_id"] for d in body["timeline"]) == ["evt_a", "evt_c1", "evt_c2", "evt_r"]


async def test_full_refund_moves_to_refunded_and_rows_come_back_after_deletion(pipe: Running) -> None:
    ref = "pay_full"
    await post(pipe, card_event(ref, "f_a", "authorised", 0, 5000), card_event(ref, "f_c", "captured", 1, 5000),
               card_event(ref, "f_r", "refunded", 2, 5000), card_event(ref, "f_r", "refunded", 2, 5000))
    row = await payment(pipe, ref, 5000, 5000)
    assert row["state"] == "refunded"
    await pipe.wait_for(lambda c: c.fetchval("SELECT count(*) = 2 FROM effects WHERE resource_id = $1", ref))
    conn = await pipe.connect()
    try:
        before = [dict(r) for r in await conn.fetch(
            "SELECT payment_ref, state, authorised_minor, captured_minor, refunded_minor, currency "
            "FROM card_payments WHERE payment_ref = $1", ref)]
        events_before = [dict(r) for r in await conn.fetch(
            "SELECT gateway_event_id, event_type, applied_at IS NOT NULL AS applied, source FROM card_events "
            "WHERE payment_ref = $1 ORDER BY 1", ref)]
        await conn.execute("DELETE FROM card_events WHERE payment_ref = $1", ref)
        await conn.execute("DELETE FROM card_payments WHERE payment_ref = $1", ref)
        await conn.execute("DELETE FROM projector_offsets")  # the projector replays every decision
    finally:
        await conn.close()
    # the running projector only re-reads after a restart (offsets are read on assignment)
    pipe.pipeline.kill("projector")
    pipe.pipeline.start("projector")
    await payment(pipe, ref, 5000, 5000)
    conn = await pipe.connect()
    try:
        after = [dict(r) for r in await conn.fetch(
            "SELECT payment_ref, state, authorised_minor, captured_minor, refunded_minor, currency "
            "FROM card_payments WHERE payment_ref = $1", ref)]
        events_after = await pipe.wait_for(lambda c: c.fetch(
            "SELECT gateway_event_id, event_type, applied_at IS NOT NULL AS applied, source FROM card_events "
            "WHERE payment_ref = $1 ORDER BY 1", ref), until=lambda rows: len(rows) == len(events_before))
        assert after == before and [dict(r) for r in events_after] == events_before
    finally:
        await conn.close()


async def test_withheld_authorisation_is_fetched_and_synced(pipe: Running, gateway: CardApi) -> None:
    ref = "pay_fetch"
    gateway.payments[ref] = {"payment_ref": ref, "state": "captured", "authorised_minor": 9000,
                             "captured_minor": 9000, "refunded_minor": 0, "currency": "EUR"}
    gateway.fail_first[ref] = 2  # the gateway's API errors first: retried, nothing written meanwhile
    await post(pipe, card_event(ref, "w_c", "captured", 1, 9000))  # the authorisation never arrives
    row = await pipe.wait_for(lambda c: c.fetchrow("SELECT * FROM card_payments WHERE payment_ref = $1", ref),
                              timeout=90)
    assert (row["state"], row["captured_minor"], row["authorised_minor"]) == ("captured", 9000, 9000)
    synced = await pipe.wait_for(lambda c: c.fetch(
        "SELECT gateway_event_id, source, applied_at FROM card_events WHERE payment_ref = $1 AND source = 'fetch'",
        ref))
    assert [(s["gateway_event_id"], s["applied_at"] is not None) for s in synced] == \
        [(f"sync_{ref}_captured_9000_9000_0", True)]
    # asked until answered: two 503s, then the payment (a later pass may ask again, and gets it again)
    assert gateway.answers[ref][:3] == [503, 503, 200] and set(gateway.answers[ref][3:]) <= {200}
    # the parked capture is covered by the synced base, so nothing is parked any more
    await pipe.wait_for(lambda c: c.fetchval(
        "SELECT count(*) = 0 FROM card_events WHERE payment_ref = $1 AND applied_at IS NULL", ref))


async def test_unknown_payment_is_never_corrupted_by_a_404(pipe: Running, gateway: CardApi) -> None:
    ref = "pay_ghost"
    await post(pipe, card_event(ref, "g_r", "refunded", 1, 100))  # a refund with nothing captured: parks
    await pipe.wait_for(lambda c: c.fetchval("SELECT 1 FROM card_events WHERE payment_ref = $1", ref))
    deadline = time.monotonic() + 10
    while gateway.calls[ref] < 2:  # asked, and asked again on the next pass: each time a 404
        assert time.monotonic() < deadline, gateway.answers.get(ref)
        await asyncio.sleep(0.1)
    assert set(gateway.answers[ref]) == {404}
    conn = await pipe.connect()
    try:
        assert await conn.fetchval("SELECT count(*) FROM card_payments WHERE payment_ref = $1", ref) == 0
        assert await conn.fetchval("SELECT count(*) FROM card_events WHERE payment_ref = $1", ref) == 1
    finally:
        await conn.close()


async def test_reconcile_finds_no_difference_and_catches_a_tampered_row(pipe: Running) -> None:
    import io

    from app.reconcile import run as reconcile

    out = io.StringIO()
    assert await reconcile(pipe.settings, out) == 0, out.getvalue()
    conn = await pipe.connect()
    try:
        tamper = "UPDATE card_payments SET captured_minor = captured_minor + $1 WHERE payment_ref = 'pay_8c21'"
        await conn.execute(tamper, 1)
        out = io.StringIO()
        assert await reconcile(pipe.settings, out) == 1
        assert "pay_8c21" in out.getvalue()
        await conn.execute(tamper, -1)
    finally:
        await conn.close()
