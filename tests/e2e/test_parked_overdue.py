"""Adyen has no fetch: a payment parked longer than ORDERLY_PARKED_ALERT_AFTER_S is shown to the
operator (DESIGN §2.6), in the admin's parked listing and in the projector's
orderly_parked_overdue_resources{gateway} (alert OrderlyParkedOverdue), with real Kafka and
PostgreSQL. An adyen CAPTURE whose AUTHORISATION has not come parks; past the (short) setting it is
overdue; a CAPTURE parked just now is not; once the AUTHORISATION comes nothing is overdue."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from app.gateways import adyen
from app.stack.kafka import KafkaBroker
from app.stack.postgres import PostgresServer
from app.stack.process import spare_port
from tests.e2e.test_observability import scrape, until, value
from tests.pipeline import Running, running_pipeline
from tests.support import make_settings

ALERT_AFTER_S = 8.0


@pytest.fixture(scope="module")
def pipe_and_metrics(kafka: KafkaBroker, postgres: PostgresServer,
                     tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Running, str]]:
    s = make_settings(kafka.bootstrap, postgres.dsn, f"overdue{uuid.uuid4().hex[:8]}",
                      parked_alert_after_s=ALERT_AFTER_S)
    port = spare_port()
    with running_pipeline(s, tmp_path_factory.mktemp("parked-overdue"), metrics_ports={"projector": port}) as running:
        yield running, f"http://127.0.0.1:{port}/metrics"


def item(code: str, psp: str, value: int, payment: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"pspReference": psp, "eventCode": code, "success": "true",
                            "eventDate": f"2026-11-29T11:02:{10 if payment is None else 40}+01:00",
                            "amount": {"value": value, "currency": "EUR"}, "merchantAccountCode": "Shop",
                            "merchantReference": f"order-{payment or psp}"}
    if payment is not None:
        body["originalReference"] = payment
    return body


async def post(pipe: Running, *items: dict[str, Any]) -> None:
    async with aiohttp.ClientSession() as http, http.post(
            f"{pipe.ingest.url}/webhooks/adyen",
            data=adyen.sign_body(list(items), pipe.settings.secrets["adyen"].reveal()[0])) as resp:
        assert (resp.status, await resp.read()) == (200, b"[accepted]")


async def listed(pipe: Running) -> dict[str, dict[str, Any]]:
    status, body = await pipe.admin_get("/api/parked")
    assert status == 200
    return {p["resource_id"]: p for p in body["items"] if p["gateway"] == "adyen"}


async def test_a_capture_without_its_authorisation_is_overdue_past_the_setting(
        pipe_and_metrics: tuple[Running, str]) -> None:
    pipe, metrics = pipe_and_metrics
    late, fresh = f"L{uuid.uuid4().hex[:15].upper()}", f"N{uuid.uuid4().hex[:15].upper()}"
    posted = time.monotonic()
    await post(pipe, item("CAPTURE", f"{late}C", 1000, late))
    await pipe.wait_for(lambda c: c.fetchval(
        "SELECT count(*) = 1 FROM webhook_events WHERE resource_id = $1 AND outcome = 'parked'", late))
    young = (await listed(pipe))[late]["overdue"], value(await scrape(metrics), "orderly_parked_overdue_resources",
                                                         gateway="adyen")
    if time.monotonic() - posted < ALERT_AFTER_S:  # (a machine this slow proves nothing here)
        assert young[0] is False and young[1] in (0.0, None), young

    # past the setting: overdue in the listing, and counted by the projector's gauge
    deadline = posted + ALERT_AFTER_S + 30
    while not (await listed(pipe))[late]["overdue"]:
        assert time.monotonic() < deadline, await listed(pipe)
        await asyncio.sleep(0.5)
    assert time.monotonic() - posted > ALERT_AFTER_S  # not before the setting
    await until(metrics, "orderly_parked_overdue_resources", 1.0, gateway="adyen")
    assert value(await scrape(metrics), "orderly_parked_overdue_resources", gateway="card") == 0.0

    # a capture parked just now is listed, not overdue; the gauge still counts one resource
    posted = time.monotonic()
    await post(pipe, item("CAPTURE", f"{fresh}C", 500, fresh))
    await pipe.wait_for(lambda c: c.fetchval(
        "SELECT count(*) = 1 FROM webhook_events WHERE resource_id = $1 AND outcome = 'parked'", fresh))
    now, gauge = await listed(pipe), value(await scrape(metrics), "orderly_parked_overdue_resources", gateway="adyen")
    assert now[late]["overdue"] is True and fresh in now
    if time.monotonic() - posted < ALERT_AFTER_S:  # (as above: a machine this slow proves nothing here)
        assert (now[fresh]["overdue"], gauge) == (False, 1.0), (now, gauge)

    # the authorisations come: nothing is parked, nothing overdue
    await post(pipe, item("AUTHORISATION", late, 1000), item("AUTHORISATION", fresh, 500))
    await pipe.wait_for(lambda c: c.fetchval(
        "SELECT count(*) = 2 FROM adyen_payments WHERE psp_reference = ANY($1) AND state = 'captured'", [late, fresh]))
    assert not {late, fresh} & set(await listed(pipe))
    await until(metrics, "orderly_parked_overdue_resources", 0.0, gateway="adyen")
