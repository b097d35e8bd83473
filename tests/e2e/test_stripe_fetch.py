"""The stripe fetch end to end: HTTP → Kafka → worker → PostgreSQL, the fetcher asking the
simulator's Stripe API (app/simulator/stripe_api.py) for what a thin event or an uncertain
same-second tie left open, and the answer, appended as a ``synced`` record, bringing the row to
Stripe's truth (docs/gateways/stripe.md, "Fetch"). Without ORDERLY_STRIPE_API_URL the payloads alone
decide: tests/e2e/test_stripe_pipeline.py."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import aiohttp
import orjson
import pytest

from app.setting_kinds import Secret
from app.simulator import api, lifecycles, stripe_api
from app.simulator.gateway_api import Served
from app.simulator.stripe import lifecycle
from app.stack.kafka import KafkaBroker
from app.stack.postgres import PostgresServer
from tests.pipeline import Running, running_pipeline
from tests.support import admin_token, make_settings, serve_in_thread

T = 1_796_000_000
COMPARED = ("status", "amount_minor", "amount_received_minor", "amount_refunded_minor", "currency")


class Stripe:
    def __init__(self) -> None:
        self.truth = lifecycles.Truth()
        self.served = Served()


@pytest.fixture(scope="module")
def stripe() -> Iterator[tuple[Stripe, str]]:
    sim = Stripe()
    app = api.build(sim.truth, [])
    sim.served = app[api.SERVED]
    with serve_in_thread(app) as url:
        yield sim, url


@pytest.fixture(scope="module")
def pipe(kafka: KafkaBroker, postgres: PostgresServer, stripe: tuple[Stripe, str],
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    s = make_settings(kafka.bootstrap, postgres.dsn, f"sf{uuid.uuid4().hex[:8]}", api_urls={"stripe": stripe[1]},
                      api_keys={"stripe": Secret("sk_test_e2e")}, fetch_parked_after_s=1.0, fetch_interval_s=0.5)
    with running_pipeline(s, tmp_path_factory.mktemp("stripe-fetch")) as running:
        yield running


def event(event_type: str, created: int, obj: dict[str, Any]) -> bytes:
    return orjson.dumps({"id": f"evt_{uuid.uuid4().hex[:16]}", "object": "event", "type": event_type,
                         "created": created, "api_version": "2025-06-30.basil", "data": {"object": obj}})


def thin(pi: str, event_type: str, created: int) -> bytes:
    iso = datetime.fromtimestamp(created, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return orjson.dumps({"id": f"evt_thin_{uuid.uuid4().hex[:12]}", "object": "v2.core.event",
                         "type": f"v1.{event_type}", "created": iso,
                         "related_object": {"id": pi, "type": "payment_intent", "url": f"/v1/payment_intents/{pi}"}})


def intent(pi: str, status: str) -> dict[str, Any]:
    return {"id": pi, "object": "payment_intent", "status": status, "amount": 2000, "amount_received": 0,
            "currency": "eur", "latest_charge": None}


async def row(pipe: Running, pi: str, status: str) -> dict[str, Any]:
    found = await pipe.wait_for(lambda c: c.fetchrow(
        f"SELECT {', '.join(COMPARED)} FROM stripe_payment_intents WHERE id = $1 AND status = $2", pi, status))
    return dict(found)


async def outcomes(pipe: Running, pi: str) -> dict[str, str]:
    conn = await pipe.connect()
    try:
        return {r["event_type"]: r["outcome"] for r in await conn.fetch(
            "SELECT event_type, outcome FROM webhook_events WHERE resource_id = $1", pi)}
    finally:
        await conn.close()


async def test_a_thin_event_alone_is_fetched_and_the_row_is_stripes_truth(pipe: Running,
                                                                           stripe: tuple[Stripe, str]) -> None:
    sim = stripe[0]
    rng = random.Random(4401)
    # refunded and without a dispute (a fetch of the PaymentIntent does not ask for its disputes)
    life = next(life for n in range(200) if (life := lifecycle(rng, f"pi_e2e_fetch_thin{n}")).truth.row["status"]
                == "succeeded" and life.answers[-1][2] and life.truth.row["dispute_status"] is None)
    stripe_api.answers(sim.truth)[life.resource] = life.answers
    await pipe.post("stripe", thin(life.resource, "payment_intent.succeeded", life.created[-1]))
    got = await row(pipe, life.resource, "succeeded")
    assert got == {k: life.truth.row[k] for k in COMPARED}
    await pipe.wait_for(lambda c: c.fetchval(
        "SELECT outcome = 'unparked' FROM webhook_events WHERE resource_id = $1 AND event_type LIKE 'v1.%'",
        life.resource))
    assert (await outcomes(pipe, life.resource))["synced"] == "synced"
    assert sim.served.count("stripe GET /v1/payment_intents/{id}", 200) >= 1
    assert sim.served.count("stripe GET /v1/refunds", 200) >= 1
    await pipe.wait_for(lambda c: c.fetchval("SELECT count(*) = $2 FROM effects WHERE resource_id = $1",
                                             life.resource, len(life.truth.effects)))


async def test_an_uncertain_same_second_tie_is_fetched_and_the_row_is_stripes_truth(
        pipe: Running, stripe: tuple[Stripe, str]) -> None:
    sim = stripe[0]
    pi = "pi_e2e_fetch_tie"
    # the truth: the attempt failed, and its retry needed an action within the same second; the
    # lifecycle's rank puts the failure last (requires_payment_method): a guess, which the fetch settles
    stripe_api.answers(sim.truth)[pi] = [(intent(pi, "requires_action"), None, [])]
    await pipe.post("stripe", event("payment_intent.created", T, intent(pi, "requires_payment_method")),
                    event("payment_intent.payment_failed", T + 1, intent(pi, "requires_payment_method")),
                    event("payment_intent.requires_action", T + 1, intent(pi, "requires_action")))
    got = await row(pipe, pi, "requires_action")
    assert got == {"status": "requires_action", "amount_minor": 2000, "amount_received_minor": 0,
                   "amount_refunded_minor": 0, "currency": "eur"}
    seen = await outcomes(pipe, pi)
    assert seen["synced"] == "synced" and seen["payment_intent.requires_action"] == "stale"


async def test_the_admins_fetch_now_asks_stripe_for_a_payment_intent(pipe: Running,
                                                                     stripe: tuple[Stripe, str]) -> None:
    sim = stripe[0]
    pi = "pi_e2e_fetch_now"
    await pipe.post("stripe", event("payment_intent.processing", T, intent(pi, "processing")))
    await row(pipe, pi, "processing")
    stripe_api.answers(sim.truth)[pi] = [({**intent(pi, "succeeded"), "amount_received": 2000}, None, [])]
    async with aiohttp.ClientSession() as http, http.post(
            f"{pipe.admin}/api/resources/stripe/{pi}/fetch",
            headers={"Authorization": f"Bearer {admin_token(pipe.settings)}"}) as resp:
        assert resp.status == 200, await resp.text()
    got = await row(pipe, pi, "succeeded")
    assert got["amount_received_minor"] == 2000
    await pipe.wait_for(lambda c: c.fetchval("SELECT 1 FROM effects WHERE dedupe_key = $1",
                                             f"stripe:{pi}:mark_order_paid"))


async def test_a_tie_under_a_terminal_payment_intent_is_not_fetched(pipe: Running, stripe: tuple[Stripe, str]) -> None:
    sim = stripe[0]
    pi = "pi_e2e_fetch_tie_done"
    stripe_api.answers(sim.truth)[pi] = [({**intent(pi, "succeeded"), "amount_received": 2000}, None, [])]
    await pipe.post("stripe", event("payment_intent.succeeded", T + 9, {**intent(pi, "succeeded"),
                                                                        "amount_received": 2000}))
    await row(pipe, pi, "succeeded")
    await pipe.post("stripe", event("payment_intent.payment_failed", T + 1, intent(pi, "requires_payment_method")),
                    event("payment_intent.requires_action", T + 1, intent(pi, "requires_action")))
    await pipe.wait_for(lambda c: c.fetchval("SELECT count(*) = 3 FROM webhook_events WHERE resource_id = $1", pi))
    await asyncio.sleep(3 * pipe.settings.fetch_parked_after_s)  # several of the fetcher's passes
    assert "synced" not in await outcomes(pipe, pi)  # succeeded is certain: the tie settles nothing
