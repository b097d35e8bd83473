"""The fetcher keeps the limits every input keeps (DESIGN §2.4) on what it appends: a backfilled
event past them goes to orderly.quarantine (stage fetcher, the reason; redriven to orderly.raw once
fixed), the events around it to orderly.raw; the worker would otherwise set it aside again each time
the gap is backfilled."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from app.fetcher import Fetcher, fetched_delivery_id
from app.gateways import card, registry
from app.gateways.limits import DELIVERY_ID_MAX, ID_MAX, INT64_MAX, id_error
from tests.pg_events import deposit
from tests.support import make_settings, serve_in_thread


class Appended:
    def __init__(self) -> None:
        self.records: list[tuple[str, bytes, bytes, Any]] = []

    async def send_and_wait(self, topic: str, key: bytes, value: bytes, headers: Any) -> None:
        self.records.append((topic, key, value, headers))


def deep(levels: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(levels):
        value = {"a": value}
    return value


@contextmanager
def events_api(page: list[dict[str, Any]]) -> Iterator[str]:
    async def events(request: web.Request) -> web.Response:
        since = int(request.query["since_sequence"])
        return web.json_response({"data": [e for e in page if e["sequence"] > since]})

    app = web.Application()
    app.router.add_get("/v1/pay/events", events)
    with serve_in_thread(app) as url:
        yield url


@pytest.mark.parametrize("extra", [{"note": "a\x00b"}, {"nested": deep(40)}, {"big": 2**63}],
                         ids=["nul", "deep", "big_int"])
async def test_a_backfilled_event_past_the_limits_is_set_aside_and_the_rest_appended(extra: dict[str, Any]) -> None:
    page = [orjson.loads(deposit("dep_lim", v, "pending", sequence=v, **(extra if v == 2 else {})))
            for v in (1, 2, 3)]
    with events_api(page) as url:
        fetcher = Fetcher(make_settings("127.0.0.1:1", "postgresql://x@127.0.0.1:1/x", "unit",
                                        api_urls={"pg": url}, fetch_rate_per_s=1000.0))
        appended = Appended()
        fetcher.producer = appended  # type: ignore[assignment]
        async with aiohttp.ClientSession() as fetcher.http:
            count = await fetcher.backfill(registry.GATEWAYS["pg"], url, "/v1/pay/events",
                                           {"since_sequence": 0, "until_sequence": 3})
    assert count == 2
    raw = [orjson.loads(value)["sequence"] for topic, _, value, _ in appended.records if topic == "unit.raw"]
    assert raw == [1, 3]
    [(_, key, value, headers)] = [r for r in appended.records if r[0] == "unit.quarantine"]
    found = dict(headers)
    assert orjson.loads(value)["sequence"] == 2 and key == b"fetch-evt_dep_lim_v2"
    assert (found["stage"], found["topic"], found["source"], found["resource_key"]) == (
        b"fetcher", b"unit.raw", b"fetch", b"pg:dep_lim")
    assert fetcher.metrics.set_aside.labels("fetcher", "pg")._value.get() == 1



def test_a_fetched_delivery_id_is_within_the_admins_limit_for_delivery_ids() -> None:
    """The console and the API view, redrive and search a delivery by its id: the longest the fetcher
    makes is within their limit. A fetched event id is the longest a gateway's webhook carries or
    card's synced id (an id as long as the ingest takes, the longest state, the largest totals);
    Stripe's synced id is cut to 100 characters of its PaymentIntent id and a hash."""
    card_synced = orjson.loads(card.synced_event("r" * ID_MAX, {
        "state": max(card.FETCHED_STATES, key=len), "currency": "EUR",
        **dict.fromkeys(("authorised_minor", "captured_minor", "refunded_minor"), INT64_MAX)}, 0))["id"]
    longest = max(["e" * ID_MAX, card_synced], key=len)
    assert len(card_synced) > ID_MAX  # card's are the longest: the limit is not the ingest's
    for each in (True, False):
        assert id_error("delivery_id", fetched_delivery_id(longest, each), DELIVERY_ID_MAX) is None
    assert id_error("delivery_id", "d" * (DELIVERY_ID_MAX + 1), DELIVERY_ID_MAX) is not None
    assert fetched_delivery_id("evt_1") != fetched_delivery_id("evt_1")  # each fetched answer a delivery of its own
    assert fetched_delivery_id("evt_1", each=False) == fetched_delivery_id("evt_1", each=False) == "fetch-evt_1"
