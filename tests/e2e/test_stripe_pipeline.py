"""stripe end to end: HTTP → Kafka → worker → PostgreSQL, for the rules of docs/gateways/stripe.md."""

from __future__ import annotations

import asyncio
import contextlib
import io
import random
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import orjson
import pytest

from app.gateways import stripe as adapter
from app.kafka_client import client_options
from app.producer import KeyedProducer
from app.replay import replay
from app.simulator import check, stack, stripe_history, truths
from app.simulator.histories import History
from app.simulator.oracle import Outcome
from app.simulator.stripe import lifecycle
from app.stack.kafka import KafkaBroker
from app.stack.postgres import PostgresServer
from tests.pipeline import Running, running_pipeline
from tests.support import make_settings

T = 1_796_000_000


def event(event_type: str, created: int, obj: dict[str, Any], eid: str | None = None) -> bytes:
    return orjson.dumps({"id": eid or f"evt_{uuid.uuid4().hex[:16]}", "object": "event", "type": event_type,
                         "created": created, "api_version": "2025-06-30.basil", "data": {"object": obj}})


def intent(pi: str, status: str, received: int = 0) -> dict[str, Any]:
    return {"id": pi, "object": "payment_intent", "status": status, "amount": 2000, "amount_received": received,
            "currency": "eur"}


def charge(pi: str, cid: str, status: str, refunded: int = 0) -> dict[str, Any]:
    return {"id": cid, "object": "charge", "status": status, "amount": 2000, "amount_captured": 2000,
            "amount_refunded": refunded, "captured": True, "payment_intent": pi, "currency": "eur"}


def refund(pi: str, rid: str, status: str) -> dict[str, Any]:
    return {"id": rid, "object": "refund", "status": status, "amount": 2000, "charge": f"ch_{pi}",
            "payment_intent": pi, "currency": "eur"}


@pytest.fixture(scope="module")
def pipe(kafka: KafkaBroker, postgres: PostgresServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    s = make_settings(kafka.bootstrap, postgres.dsn, f"st{uuid.uuid4().hex[:8]}")
    with running_pipeline(s, tmp_path_factory.mktemp("stripe-pipeline")) as running:
        yield running


async def outcomes(pipe: Running, pi: str, deliveries: int) -> list[str]:
    async def check(c: Any) -> list[str] | None:
        rows = await c.fetch("SELECT outcome FROM webhook_events WHERE resource_id = $1 ORDER BY seq", pi)
        return [r["outcome"] for r in rows] if len(rows) >= deliveries else None
    found: list[str] = await pipe.wait_for(check)
    assert len(found) == deliveries, found
    return found


async def effects(pipe: Running, pi: str) -> list[str]:
    conn = await pipe.connect()
    try:
        return sorted(r["dedupe_key"] for r in await conn.fetch("SELECT dedupe_key FROM effects WHERE resource_id = $1",
                                                                pi))
    finally:
        await conn.close()


async def test_a_failed_attempt_retried_to_success_out_of_order_is_paid_never_failed(pipe: Running) -> None:
    pi = "pi_e2e_retry"
    succeeded = event("payment_intent.succeeded", T + 5, intent(pi, "succeeded", 2000))
    failed = event("payment_intent.payment_failed", T + 1, intent(pi, "requires_payment_method"))
    await pipe.post("stripe", succeeded, failed, event("charge.failed", T + 1, charge(pi, f"ch_{pi}_1", "failed")),
                    succeeded,
                    event("payment_intent.created", T, intent(pi, "requires_payment_method")))
    assert await outcomes(pipe, pi, 5) == ["applied", "stale", "applied", "duplicate", "stale"]
    row = await pipe.wait_for(lambda c: c.fetchrow("SELECT * FROM stripe_payment_intents WHERE id = $1", pi))
    assert (row["status"], row["amount_received_minor"], row["currency"]) == ("succeeded", 2000, "eur")
    await pipe.wait_for(lambda c: c.fetchval("SELECT 1 FROM effects WHERE resource_id = $1", pi))
    assert await effects(pipe, pi) == [f"stripe:{pi}:mark_order_paid"]


async def test_a_failed_refund_lowers_the_amount_and_only_a_succeeded_one_refunds_the_order(pipe: Running) -> None:
    pi = "pi_e2e_refund"
    await pipe.post("stripe", event("payment_intent.succeeded", T, intent(pi, "succeeded", 2000)),
                    event("refund.failed", T + 8, refund(pi, "re_1", "failed")),
                    event("charge.refunded", T + 3, charge(pi, f"ch_{pi}", "succeeded", 2000)),
                    event("refund.created", T + 3, refund(pi, "re_1", "pending")))
    await outcomes(pipe, pi, 4)
    row = await pipe.wait_for(lambda c: c.fetchrow("SELECT * FROM stripe_payment_intents WHERE id = $1", pi))
    assert (row["status"], row["amount_refunded_minor"]) == ("succeeded", 0)
    await pipe.post("stripe", event("refund.updated", T + 20, refund(pi, "re_2", "succeeded")))
    row = await pipe.wait_for(lambda c: c.fetchrow(
        "SELECT * FROM stripe_payment_intents WHERE id = $1 AND amount_refunded_minor = 2000", pi))
    assert row["status"] == "succeeded"  # refunds live on the charge
    await pipe.wait_for(lambda c: c.fetchval("SELECT count(*) = 2 FROM effects WHERE resource_id = $1", pi))
    assert await effects(pipe, pi) == [f"stripe:{pi}:mark_order_paid", f"stripe:{pi}:mark_order_refunded"]


async def test_a_thin_event_is_stored_and_parked_an_unknown_type_quarantined(pipe: Running) -> None:
    pi = "pi_e2e_thin"
    thin = orjson.dumps({"id": "evt_thin_e2e", "object": "v2.core.event", "type": "v1.payment_intent.succeeded",
                         "created": "2026-11-29T10:00:00.000Z",
                         "related_object": {"id": pi, "type": "payment_intent", "url": f"/v1/payment_intents/{pi}"}})
    other = event("customer.created", T, {"id": "cus_1", "object": "customer"})
    answers = await pipe.post("stripe", thin, other)
    assert "quarantined" not in answers[0] and answers[1]["quarantined"] is True
    assert await outcomes(pipe, pi, 1) == ["parked"]


async def test_without_a_stripe_api_an_uncertain_tie_is_decided_by_the_payloads_alone(pipe: Running) -> None:
    # ORDERLY_STRIPE_API_URL is unset here (tests/e2e/test_stripe_fetch.py sets it): the rank's guess
    # stands, nothing is fetched, the thin event of the same PaymentIntent stays parked
    assert pipe.settings.api_urls.get("stripe") is None
    pi = "pi_e2e_tie_no_api"
    thin = orjson.dumps({"id": "evt_thin_no_api", "object": "v2.core.event", "type": "v1.payment_intent.created",
                         "created": "2026-11-29T10:00:00.000Z",
                         "related_object": {"id": pi, "type": "payment_intent", "url": f"/v1/payment_intents/{pi}"}})
    await pipe.post("stripe", event("payment_intent.created", T, intent(pi, "requires_payment_method")),
                    event("payment_intent.requires_action", T + 1, intent(pi, "requires_action")),
                    event("payment_intent.payment_failed", T + 1, intent(pi, "requires_payment_method")), thin)
    assert await outcomes(pipe, pi, 4) == ["applied", "applied", "applied", "parked"]
    await asyncio.sleep(2)  # the fetcher's passes run: with no API for stripe they ask nothing
    row = await pipe.wait_for(lambda c: c.fetchrow("SELECT * FROM stripe_payment_intents WHERE id = $1", pi))
    assert row["status"] == "requires_payment_method"  # the failure ranks after the step of its second
    assert await outcomes(pipe, pi, 4) == ["applied", "applied", "applied", "parked"]


async def test_a_bad_or_stale_signature_is_refused_and_nothing_stored(pipe: Running) -> None:
    body = event("payment_intent.succeeded", T, intent("pi_e2e_refused", "succeeded", 2000))
    secret = pipe.settings.secrets["stripe"].reveal()[0]
    cases = [adapter.signed_headers(body, "whsec_someone_else", time.time()),
             adapter.signed_headers(body, secret, time.time() - 301)]
    async with aiohttp.ClientSession() as http:
        for headers in cases:
            async with http.post(f"{pipe.ingest.url}/webhooks/stripe", data=body, headers=headers) as resp:
                assert resp.status == 401
    conn = await pipe.connect()
    try:
        assert await conn.fetchval("SELECT count(*) FROM webhook_events WHERE resource_id = 'pi_e2e_refused'") == 0
    finally:
        await conn.close()


async def test_a_simulated_lifecycle_shuffled_with_duplicates_ends_at_stripes_truth(pipe: Running) -> None:
    rng = random.Random(44)
    # without an uncertain same-second tie: those need the fetched answer (the stack test below)
    lives = [life for n in range(12) if not (life := lifecycle(rng, f"pi_e2e_sim{n}")).ties][:6]
    assert len(lives) == 6
    for life in lives:
        arrivals = life.events + rng.sample(life.events, k=min(2, len(life.events)))
        rng.shuffle(arrivals)
        await pipe.post("stripe", *arrivals)
        await outcomes(pipe, life.resource, len(arrivals))
        row = await pipe.wait_for(row_of(life.resource))
        assert {"id": life.resource, **dict(row)} == life.truth.row
        await pipe.wait_for(effects_counted(life.resource, len(life.truth.effects)))
        assert set(await effects(pipe, life.resource)) == life.truth.effects


def row_of(pi: str) -> Callable[[asyncpg.Connection], Awaitable[Any]]:
    return lambda c: c.fetchrow(
        "SELECT status, amount_minor, amount_received_minor, amount_refunded_minor, currency, dispute_status, "
        "to_char(updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"') AS updated_at "
        "FROM stripe_payment_intents WHERE id = $1", pi)


def effects_counted(pi: str, count: int) -> Callable[[asyncpg.Connection], Awaitable[Any]]:
    return lambda c: c.fetchval("SELECT count(*) = $2 FROM effects WHERE resource_id = $1", pi, count)


HISTORIES = 150


async def test_simulated_histories_with_fetches_and_thin_events_match_the_oracle_through_the_stack(
        pipe: Running) -> None:
    """Stripe's histories as `simulate --check` runs them (retries, lost events, duplicates, thin
    events, fetched answers appended as the fetcher does), through HTTP, Kafka, the worker and the
    projector; the read model, the effects and the parked thin events compared with the oracle."""
    batch = [truths.make("stripe", seed, "e2e") for seed in range(HISTORIES)]
    producer = KeyedProducer(pipe.settings.kafka_bootstrap, **client_options(pipe.settings))
    await producer.start()
    try:
        async with aiohttp.ClientSession() as http:
            for history in batch:
                await stack.post_history(http, producer, pipe.settings, pipe.ingest.url, history)
    finally:
        await producer.stop()
    conn = await pipe.connect()
    try:
        deadline = time.monotonic() + 90
        while True:
            wrong = {h.seed: why for h in batch if (why := check.expected(h).differences(await observed(conn, h)))}
            if not wrong or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
    finally:
        await conn.close()
    assert wrong == {}
    assert sum(len(h.deliveries) for h in batch) > 5 * HISTORIES


async def observed(conn: asyncpg.Connection, history: History) -> Outcome:
    got = Outcome()
    rid = history.events[0].resource
    row = await row_of(rid)(conn)
    if row is not None:
        got.rows[rid] = {k: row[k] for k in stripe_history.ROW}
    for r in await conn.fetch("SELECT dedupe_key, type FROM effects WHERE resource_id = $1", rid):
        got.effects.add((r["dedupe_key"], r["type"], None))
    parked = await conn.fetchval("SELECT count(*) FROM webhook_events WHERE resource_id = $1 AND outcome = 'parked'",
                                 rid)
    if parked:
        got.parked[rid] = parked
    return got


def test_replay_of_everything_above_equals_live_and_delivers_nothing_again(pipe: Running, tmp_path: Path) -> None:
    """Replay equals live for stripe: every record above (webhooks, thin events, fetched answers,
    quarantined bodies) rebuilt into a fresh namespace gives the same stripe_payment_intents."""
    delivered_before = asyncio.run(pipe.effects_settled())  # none on its way during the replay
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = replay(pipe.settings, f"rb{uuid.uuid4().hex[:8]}", tmp_path / "replay")
    assert code == 0, out.getvalue()
    assert "no difference from the live namespace" in out.getvalue()
    assert sum(pipe.stub.deliveries.values()) == delivered_before


async def test_the_console_timeline_shows_a_payment_intent(pipe: Running) -> None:
    status, body = await pipe.resource("stripe", "pi_e2e_retry")
    assert status == 200
    assert body["state"]["status"] == "succeeded"
    assert [d["outcome"] for d in body["timeline"]] == ["applied", "stale", "applied", "duplicate", "stale"]
