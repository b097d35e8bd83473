"""Typed validation at the edge (DESIGN.md §2.4): no validly signed body of any shape gets past
route() unless the pure core can decide it and every decision and state serialises."""

from __future__ import annotations

import asyncio
import base64
import random
import re
from typing import Any, ClassVar

import orjson
import pytest
from hypothesis import HealthCheck, given, settings

from app.core import pg as pg_core
from app.core.model import QUARANTINED, Decision, Delivery
from app.gateways import card, paymos, pg, registry
from app.gateways.base import REASON_MAX, Route, SignatureError, hmac_sha256
from app.simulator import adyen as adyen_simulator
from app.simulator import card as card_simulator
from app.simulator import lifecycles, stripe_history
from app.simulator import paymos as paymos_simulator
from app.simulator import pg as pg_simulator
from tests import hostile, paymos_events, pg_events
from tests.hostile import Item
from topics.records import PROJECTED, Correlation

CODES = {"not_json", "invalid", "unknown_type", "unknown_object"}
MANY = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                         HealthCheck.data_too_large])


def names_path(reason: str | None, path: str) -> bool:
    """The reason starts with the field path itself, or a path inside it."""
    return reason is not None and reason.startswith(path) and reason[len(path):][:1] in (":", ".", "[")


def check_quarantined(item: Item) -> None:
    route = registry.GATEWAYS[item.gateway].adapter.route(item.body)
    assert route.resource_key is None, f"{item.mutation} was routed"
    assert route.quarantine_code in CODES
    assert names_path(route.quarantine_reason, item.path or ""), (item.mutation, route.quarantine_reason)
    assert len(route.quarantine_reason or "") <= REASON_MAX
    assert route.resource_hint == item.resource_key, (item.mutation, route)


# --- route() never raises; what is valid routes; what is hostile is quarantined, naming its path ---

@MANY
@given(hostile.bodies())
def test_route_never_raises_and_always_decides(item: Item) -> None:
    route = registry.GATEWAYS[item.gateway].adapter.route(item.body)
    assert (route.resource_key is None) != (route.quarantine_reason is None)
    assert route.resource_key is None or route.resource_hint is None


@MANY
@given(hostile.valid_events())
def test_valid_events_of_every_type_route_to_their_resource(item: Item) -> None:
    route = registry.GATEWAYS[item.gateway].adapter.route(item.body)
    assert route.resource_key == item.resource_key, route.quarantine_reason


@MANY
@given(hostile.mutated())
def test_each_hostile_mutation_is_quarantined_naming_the_field(item: Item) -> None:
    check_quarantined(item)


def test_every_path_and_every_hostile_value_of_the_full_bodies() -> None:
    items = hostile.every_mutation()
    assert len(items) > 1000
    for item in items:
        check_quarantined(item)


def known_valid_bodies() -> list[tuple[str, str, bytes]]:
    """(gateway, resource key, body) of the events the other tests and the simulator send."""
    out = [("pg", "pg:dep_1", pg_events.deposit("dep_1", v, status))
           for v, status in enumerate(["pending", "slip_received", "settled", "reversed", "expired", "canceled",
                                       "under_review", "rejected"], start=1)]
    out += [("pg", "pg:wdr_1", pg_events.withdrawal("wdr_1", 7, "filling", 400_000,
                                                    fill={"leg_ref": "leg_1", "sequence": 1, "amount_minor": 400_000})),
            ("pg", "pg:wdr_1", pg_events.withdrawal("wdr_1", 11, "settled", 1_000_000)),
            ("pg", "pg:btxn_1", pg_events.balance_txn("btxn_1", 500_000))]
    for event_type, _ in hostile.PAYMOS_TYPES:
        out.append(("paymos", "paymos:res_1", paymos_events.event(event_type, "res_1", "paid", 1_796_000_000_000,
                                                                  amount="1.5", paid_late_at=1_796_000_000)))
    truth = lifecycles.Truth()
    for seed in range(3):
        rng = random.Random(seed)
        emitted = (pg_simulator.lifecycle(rng, 30, 10, truth) + card_simulator.lifecycle(rng, 30, truth)
                   + paymos_simulator.lifecycle(rng, 15, truth))
        out += [(e.gateway, f"{e.gateway}:{e.resource}", e.body) for e in emitted]
        out += [("stripe", f"stripe:{e.resource}", e.body) for e in stripe_history.demo(rng, 15, truth)]
        # adyen: each request's items, as the ingest stores them
        out += [("adyen", f"adyen:{e.resource}", orjson.dumps(w["NotificationRequestItem"]))
                for e in adyen_simulator.demo(rng, 15, truth) for w in orjson.loads(e.body)["notificationItems"]]
    return out


def test_the_events_of_the_tests_and_the_simulator_route_to_their_resource() -> None:
    bodies = known_valid_bodies()
    assert {gw for gw, _, _ in bodies} == set(hostile.GATEWAYS)
    for gateway, key, body in bodies:
        route = registry.GATEWAYS[gateway].adapter.route(body)
        assert route.resource_key == key, (body, route.quarantine_reason)


# --- what route() accepts, the core decides, and every decision and state serialises -------------

class RecordingConn:
    """Stands in for PostgreSQL under the projector: checks what a bigint, smallint or text
    parameter can hold instead of storing it."""

    LIMITS: ClassVar[dict[str, int]] = {"bigint": 2**63, "smallint": 2**15, "integer": 2**31}

    async def execute(self, sql: str, *args: Any) -> None:
        types = dict(re.findall(r"\$(\d+)::(\w+)", sql))
        for i, arg in enumerate(args, start=1):
            for value in arg if isinstance(arg, list) else [arg]:
                self.check(types.get(str(i), "text"), value)

    async def executemany(self, sql: str, rows: list[Any]) -> None:
        for row in rows:
            await self.execute(sql, *row)

    async def fetchval(self, sql: str, *args: Any) -> Any:
        await self.execute(sql, *args)
        return "stored"

    async def fetch(self, sql: str, *args: Any) -> list[Any]:
        return []

    def check(self, kind: str, value: Any) -> None:
        if isinstance(value, int) and not isinstance(value, bool) and kind in self.LIMITS:
            assert -self.LIMITS[kind] <= value < self.LIMITS[kind], (kind, value)
        if isinstance(value, str):
            assert "\x00" not in value


def project(decisions: list[Decision]) -> None:
    from app.metrics import ProjectorMetrics
    from app.projector import project as write

    rows = [PROJECTED.decode(d.to_bytes()) for d in decisions]  # as the projector reads them
    asyncio.run(write(RecordingConn(), rows, ProjectorMetrics()))  # type: ignore[arg-type]


def decide(item: Item, resource_key: str) -> tuple[bytes, list[Decision]]:
    """The core's decisions on a body its adapter's route accepted, read as the worker reads it
    (both with and without the ingest's check: the two reads must take it alike); the state written."""
    d = Delivery("dlv_2", item.gateway, resource_key, 1_796_000_000_000, 2)
    reducer = registry.GATEWAYS[item.gateway].reducer
    event = reducer.read(item.body, True)
    assert not isinstance(event, Route), event
    assert not isinstance(reducer.read(item.body, False), Route)
    first: list[Decision] = []
    state: object = None
    if item.gateway == "pg" and orjson.loads(item.body)["data"]["object"]["object"] == "deposit":
        resource_id = resource_key.partition(":")[2]  # parked until its correlation
        correlation = Correlation(resource_id, f"mr_{resource_id}", "ord_1", "usr_1")
        state, first = pg_core.apply_correlation(None, correlation, Delivery("dlv_1", "pg", resource_key,
                                                                             1_796_000_000_000, 1, "correlation"))
    state, decisions = reducer.apply_event(state, event, d)
    return reducer.dump(state), first + decisions


@MANY
@given(hostile.bodies())
def test_what_route_accepts_the_core_decides_and_everything_serialises(item: Item) -> None:
    route = registry.GATEWAYS[item.gateway].adapter.route(item.body)
    if route.resource_key is None:
        return
    _, decisions = decide(item, route.resource_key)
    for decision in decisions:
        decision.to_bytes()
        assert decision.outcome != QUARANTINED, decision.error
    project(decisions)


# --- the three crashes of issue #16, and the strict timestamp digits -------------------------------

def test_pg_review_that_is_a_string_is_quarantined_under_its_deposit() -> None:
    body = orjson.loads(pg_events.deposit("dep_1", 3, "under_review"))
    body["data"]["object"]["review"] = "manual"
    route = pg.route(orjson.dumps(body))
    assert route.resource_key is None and route.resource_hint == "pg:dep_1"
    assert route.quarantine_reason == "data.object.review: expected object | null, got str"
    assert (route.event_id, route.event_type, route.quarantine_code) == ("evt_dep_1_v3", "deposit.under_review",
                                                                         "invalid")


@pytest.mark.parametrize("amount", [2**63, 2**64, -(2**63) - 1, -1, 80.0])
def test_card_amount_outside_signed_64_bits_or_negative_is_quarantined(amount: int | float) -> None:
    body = {"id": "evt_1", "type": "payment.captured", "payment_ref": "pay_8c21", "sequence": None,
            "occurred_at": "2026-11-29T10:02:15.123Z", "amount_minor": amount, "currency": "EUR"}
    route = card.route(hostile.encode(body))
    assert route.resource_key is None and route.resource_hint == "card:pay_8c21"
    assert names_path(route.quarantine_reason, "amount_minor")


def test_pg_fill_without_amount_is_quarantined_under_its_withdrawal() -> None:
    route = pg.route(pg_events.withdrawal("wdr_1", 7, "filling", 400_000, fill={"leg_ref": "leg_1"}))
    assert route.resource_key is None and route.resource_hint == "pg:wdr_1"
    assert route.quarantine_reason == "data.fill.amount_minor: required field missing"


def test_nesting_far_past_any_recursion_limit_is_quarantined() -> None:
    deep = b'{"id":"evt_1","type":"deposit.settled","pad":' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    for adapter in (pg, card, paymos):
        route = adapter.route(deep)
        assert route.resource_key is None and route.quarantine_code == "invalid"
        assert "nests deeper than 32" in (route.quarantine_reason or "")


def test_a_nul_anywhere_is_quarantined_with_its_path() -> None:
    body = orjson.loads(pg_events.deposit("dep_1", 3, "pending"))
    body["data"]["object"]["metadata"] = {"note": "a\x00b"}
    route = pg.route(orjson.dumps(body))
    assert route.resource_hint == "pg:dep_1"
    assert route.quarantine_reason == "data.object.metadata.note: a string holds a NUL character"


NOW = 1_796_100_000
CARD_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def pg_headers(stamp: str, raw: bytes) -> dict[str, str]:
    return {"PG-Signature": f"t={stamp},v1={hmac_sha256(b's', f'{stamp}.'.encode() + raw).hex()}"}


def card_headers(stamp: str, raw: bytes) -> dict[str, str]:
    digest = hmac_sha256(card.secret_key(CARD_SECRET), f"msg_1.{stamp}.".encode() + raw)
    return {"webhook-id": "msg_1", "webhook-timestamp": stamp,
            "webhook-signature": "v1," + base64.b64encode(digest).decode()}


def test_a_canonical_timestamp_with_a_matching_signature_passes() -> None:
    pg.verify(b"{}", pg_headers(str(NOW), b"{}"), ("s",), NOW)
    card.verify(b"{}", card_headers(str(NOW), b"{}"), (CARD_SECRET,), NOW)


# Each is signed correctly over its own spelling: only the spelling is refused. (A trailing space
# before pg's comma is header syntax: the parser strips it and the signature covers the digits.)
# A spelling with characters past ASCII is refused with its header, before its digits are read.
@pytest.mark.parametrize("stamp", ["1_796_100_000", " 1796100000", "+1796100000",
                                   "\u0661\u0667\u0669\u0666\u0661\u0660\u0660\u0660\u0660\u0660",
                                   "\uff11\uff17\uff19\uff16\uff11\uff10\uff10\uff10\uff10\uff10",
                                   "-1796100000", "0001796100000", "1796100000.0", "1e9", "0x6b0e1d20"])
def test_timestamps_are_one_to_twelve_ascii_digits(stamp: str) -> None:
    with pytest.raises(SignatureError, match=r"ASCII digits|header is not ASCII"):
        pg.verify(b"{}", pg_headers(stamp, b"{}"), ("s",), NOW)
    with pytest.raises(SignatureError, match=r"ASCII digits|header is not ASCII"):
        card.verify(b"{}", card_headers(stamp, b"{}"), (CARD_SECRET,), NOW)
    with pytest.raises(SignatureError, match=r"ASCII digits|header is not ASCII"):
        card.verify(b"{}", card_headers(stamp + "\n", b"{}"), (CARD_SECRET,), NOW)
