"""The adyen gateway end to end: a request of several notification items over HTTP, each item in
orderly.raw under its own payment, the reducer in the worker, adyen_payments and effects out, with
real Kafka and PostgreSQL (docs/gateways/adyen.md); at the end, replay of all of it equals live."""

from __future__ import annotations

import asyncio
import contextlib
import io
import random
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from app.gateways import adyen
from app.replay import diff, replay
from app.simulator import check, lifecycles, plugins, stack, truths
from app.simulator.deliver import Chaos, deliver
from app.stack.kafka import KafkaBroker
from app.stack.postgres import PostgresServer
from tests.pipeline import Running, running_pipeline
from tests.support import make_settings


@pytest.fixture(scope="module")
def pipe(kafka: KafkaBroker, postgres: PostgresServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    s = make_settings(kafka.bootstrap, postgres.dsn, f"adyen{uuid.uuid4().hex[:8]}")
    with running_pipeline(s, tmp_path_factory.mktemp("adyen-pipeline")) as running:
        yield running


def item(code: str, psp: str, second: int, value: int, payment: str | None = None,
         success: str = "true") -> dict[str, Any]:
    body: dict[str, Any] = {"pspReference": psp, "eventCode": code, "success": success,
                            "eventDate": f"2026-11-29T11:02:{10 + second:02d}+01:00",
                            "amount": {"value": value, "currency": "EUR"}, "merchantAccountCode": "Shop",
                            "merchantReference": f"order-{payment or psp}"}
    if payment is not None:
        body["originalReference"] = payment
    return body


async def post(pipe: Running, *items: dict[str, Any], key: str | None = None) -> tuple[int, bytes]:
    secret = key or pipe.settings.secrets["adyen"].reveal()[0]
    async with aiohttp.ClientSession() as http, http.post(
            f"{pipe.ingest.url}/webhooks/adyen", data=adyen.sign_body(list(items), secret)) as resp:
        return resp.status, await resp.read()


async def test_a_request_of_several_items_is_stored_item_by_item_and_decided_in_adyens_order(pipe: Running) -> None:
    pay, other = f"P{uuid.uuid4().hex[:15].upper()}", f"Q{uuid.uuid4().hex[:15].upper()}"
    first = (item("CAPTURE", "CAP1", 5, 1000, pay), item("REFUND", "REF1", 9, 300, pay),
             item("AUTHORISATION", other, 1, 500))
    assert await post(pipe, *first) == (200, b"[accepted]")
    assert await post(pipe, item("AUTHORISATION", pay, 0, 1000)) == (200, b"[accepted]")
    assert await post(pipe, *first) == (200, b"[accepted]")  # Adyen resends: every item a duplicate
    row = await pipe.wait_for(lambda c: c.fetchrow(
        "SELECT * FROM adyen_payments WHERE psp_reference = $1 AND refunded_minor = 300", pay))
    assert (row["state"], row["authorised_minor"], row["captured_minor"], row["currency"],
            row["merchant_reference"]) == ("captured", 1000, 1000, "EUR", f"order-{pay}")
    row = await pipe.wait_for(lambda c: c.fetchrow("SELECT * FROM adyen_payments WHERE psp_reference = $1", other))
    assert (row["state"], row["authorised_minor"]) == ("authorised", 500)
    outcomes = await pipe.wait_for(lambda c: c.fetch(
        "SELECT event_type, outcome FROM webhook_events WHERE resource_id = $1 ORDER BY event_type, outcome", pay),
        until=lambda rows: sum(r["outcome"] != "duplicate" for r in rows) >= 3)
    assert sorted((r["event_type"], r["outcome"]) for r in outcomes if r["outcome"] != "duplicate") == [
        ("AUTHORISATION", "applied"), ("CAPTURE", "unparked"), ("REFUND", "unparked")]
    await pipe.wait_for(lambda c: c.fetchval(
        "SELECT count(*) = 2 FROM webhook_events WHERE resource_id = $1 AND outcome = 'duplicate'", pay))
    effects = await pipe.wait_for(lambda c: c.fetch("SELECT dedupe_key FROM effects WHERE resource_id = $1", pay))
    assert [r["dedupe_key"] for r in effects] == [f"adyen:{pay}:mark_order_paid"]


async def test_a_refusal_fails_the_order_and_a_forged_item_stores_nothing(pipe: Running) -> None:
    refused, forged = f"R{uuid.uuid4().hex[:15].upper()}", f"F{uuid.uuid4().hex[:15].upper()}"
    status, _ = await post(pipe, item("AUTHORISATION", forged, 0, 700), key="ab" * 32)
    assert status == 401
    assert await post(pipe, item("AUTHORISATION", refused, 0, 700, success="false")) == (200, b"[accepted]")
    row = await pipe.wait_for(lambda c: c.fetchrow("SELECT * FROM adyen_payments WHERE psp_reference = $1", refused))
    assert row["state"] == "refused"
    effects = await pipe.wait_for(lambda c: c.fetch("SELECT dedupe_key FROM effects WHERE resource_id = $1", refused))
    assert [r["dedupe_key"] for r in effects] == [f"adyen:{refused}:mark_order_failed"]
    conn = await pipe.connect()
    try:
        assert await conn.fetchval("SELECT count(*) FROM webhook_events WHERE resource_id = $1", forged) == 0
    finally:
        await conn.close()


async def test_simulated_lifecycles_delivered_with_retries_and_duplicates_end_at_adyens_truth(pipe: Running) -> None:
    """`orderly simulate`'s Adyen: requests of one or two items, each item signed by the deliverer,
    first attempts failing and 200s lost, decided into adyen_payments and effects as Adyen's truth."""
    rng, truth = random.Random(44), lifecycles.Truth()
    simulate = plugins.simulator_of("adyen").lifecycles
    assert simulate is not None
    events = simulate(rng, 40, truth)
    stats = await deliver(pipe.ingest.url, events, {"adyen": pipe.settings.secrets["adyen"].reveal()[0]}, rng,
                          Chaos(first_attempt_fails=0.3, duplicate=0.2, time_scale=1 / 400_000))
    assert stats.given_up["adyen"] == 0 and stats.accepted["adyen"] >= len(events)
    want = {psp: (t["state"], t["authorised_minor"], t["captured_minor"], t["refunded_minor"])
            for psp, t in truth.by_gateway["adyen"].items()}
    rows = await pipe.wait_for(lambda c: _rows_if(c, want), timeout=90)
    assert rows == want
    expected = sorted((psp, kind) for psp, t in truth.by_gateway["adyen"].items() for kind in t["effects"])
    effects = await pipe.wait_for(lambda c: c.fetch(
        "SELECT resource_id, type FROM effects WHERE gateway = 'adyen' AND resource_id = ANY($1)", list(want)),
        until=lambda rows: len(rows) >= len(expected))
    assert sorted((r["resource_id"], r["type"]) for r in effects) == expected


Rows = dict[str, tuple[str, int, int, int]]  # psp -> state and totals


async def _rows_if(conn: Any, want: Rows) -> Rows | None:
    rows = {r["psp_reference"]: (r["state"], r["authorised_minor"], r["captured_minor"], r["refunded_minor"])
            for r in await conn.fetch("SELECT * FROM adyen_payments WHERE psp_reference = ANY($1)", list(want))}
    return rows if rows == want else None


def test_simulate_check_through_the_stack_matches_the_oracle(pipe: Running) -> None:
    """`orderly simulate --check --gateway adyen --target`: each item in a request of its own, signed,
    in the history's arrival order; the read model, the effects recorded and delivered, nothing parked."""
    out = io.StringIO()
    total, bad = stack.run(pipe.settings, pipe.ingest.url, ["adyen"], 300, 1, "e2e", out,
                           delivered=lambda: Counter(pipe.stub.deliveries), timeout_s=90.0)
    assert (total, bad) == (300, 0), out.getvalue()[-4000:]
    keys = {e[0] for i in range(300) for e in check.expected(truths.make("adyen", 1 + i, "e2e")).effects}
    assert keys and {k: n for k, n in pipe.stub.deliveries.items() if k in keys} == dict.fromkeys(keys, 1)


async def test_a_parked_capture_and_an_unhandled_item_are_kept_for_the_replay(pipe: Running) -> None:
    """What the replay below must rebuild besides the applied items: a CAPTURE whose AUTHORISATION
    never came (parked, no row) and an item of an event code Orderly does not handle (quarantined
    at the ingest with a reason naming the field)."""
    orphan, odd = f"O{uuid.uuid4().hex[:15].upper()}", f"U{uuid.uuid4().hex[:15].upper()}"
    assert await post(pipe, item("CAPTURE", f"{orphan}C", 0, 900, orphan),
                      item("AUTHORISATION_ADJUSTMENT", odd, 1, 100)) == (200, b"[accepted]")
    await pipe.wait_for(lambda c: c.fetchval(
        "SELECT count(*) = 1 FROM webhook_events WHERE resource_id = $1 AND outcome = 'parked'", orphan))
    reason = await pipe.wait_for(lambda c: c.fetchval(
        "SELECT reason FROM quarantine WHERE gateway = 'adyen' AND reason LIKE '%AUTHORISATION_ADJUSTMENT%'"))
    # the item's place in its request, then the field
    assert reason.startswith("notificationItems[1].NotificationRequestItem.eventCode: "), reason


def test_replay_of_everything_above_equals_live_and_delivers_nothing_again(pipe: Running, tmp_path: Path) -> None:
    """Replay equals live for adyen: every item above (multi-item requests, duplicates, a refusal,
    simulated lifecycles with retries and lost 200s, `simulate --check`'s 300 histories, a parked
    capture, a quarantined item) rebuilt from orderly.raw into a fresh namespace gives the same
    adyen_payments, and delivers no effect again; a row changed in the live namespace is found."""
    delivered_before = asyncio.run(pipe.effects_settled())  # none on its way during the replay
    into = f"rb{uuid.uuid4().hex[:8]}"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = replay(pipe.settings, into, tmp_path / "replay")
    assert code == 0, out.getvalue()
    assert "no difference from the live namespace" in out.getvalue()
    assert sum(pipe.stub.deliveries.values()) == delivered_before  # nothing delivered again

    async def rebuilt_and_tampered() -> tuple[int, dict[str, tuple[int, int]]]:
        conn = await pipe.connect()
        try:
            rows = await conn.fetchval(f"SELECT count(*) FROM {into}.adyen_payments")
            psp = await conn.fetchval("SELECT psp_reference FROM adyen_payments WHERE state = 'captured' LIMIT 1")
            await conn.execute("UPDATE adyen_payments SET captured_minor = captured_minor + 1 "
                               "WHERE psp_reference = $1", psp)
        finally:
            await conn.close()
        return rows, await diff(pipe.settings, pipe.settings.with_overrides(namespace=into))

    rows, found = asyncio.run(rebuilt_and_tampered())
    assert rows >= 300  # the check's histories alone
    assert found["adyen_payments"] == (1, 1)
