"""The stripe adapter's own rules (docs/gateways/stripe.md): the Stripe-Signature header's shapes,
routing to the PaymentIntent, and what is quarantined with a reason naming the field."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.gateways import stripe as adapter
from app.gateways.base import SignatureError

SECRET = "whsec_unit"
NOW = 1_796_000_000


def body(event_type: str = "payment_intent.succeeded", obj: dict[str, Any] | None = None) -> bytes:
    obj = obj if obj is not None else {"id": "pi_1", "object": "payment_intent", "status": "succeeded"}
    return orjson.dumps({"id": "evt_1", "object": "event", "type": event_type, "created": NOW, "data": {"object": obj}})


def header(value: str) -> dict[str, str]:
    return {"Stripe-Signature": value}


def test_the_key_is_the_secret_string_itself_and_an_empty_one_is_refused() -> None:
    raw = body()
    digest = adapter.sign(raw, SECRET, NOW)
    adapter.verify(raw, header(f"t={NOW},v1={digest}"), (SECRET,), NOW)
    with pytest.raises(ValueError, match="empty"):
        adapter.secret_key(" ")


@pytest.mark.parametrize(("value", "reason"), [
    ("", "missing Stripe-Signature"),
    ("v1=00", "missing timestamp"),
    (f"t=0{NOW},v1=%s", "leading zero"),
    (f"t={NOW} ,v1=%s", "ASCII digits"),
    (f"t={NOW}", "no v1 entry"),
    (f"t={NOW},v1=%S", "no v1 entry"),  # upper-case hex: the SDK compares lower-case strings
    (f"t={NOW - 301},v1=%s", "300 s"),
    (f"t={NOW + 301},v1=%s", "300 s"),
])
def test_header_shapes_refused_with_their_reason(value: str, reason: str) -> None:
    raw = body()
    digest = adapter.sign(raw, SECRET, int(value.split(",")[0].removeprefix("t=").strip() or 0)
                          if value.startswith("t=") else NOW)
    value = value.replace("%s", digest).replace("%S", digest.upper())
    with pytest.raises(SignatureError, match=reason):
        adapter.verify(raw, header(value) if value else {}, (SECRET,), NOW)


def test_the_first_t_counts_and_any_v1_may_match() -> None:
    raw = body()
    good = adapter.sign(raw, SECRET, NOW)
    adapter.verify(raw, header(f"t={NOW},t={NOW + 9},v1={'0' * 64},v1={good},v0=ignored"), (SECRET,), NOW)
    with pytest.raises(SignatureError):
        adapter.verify(raw, header(f"t={NOW + 1},t={NOW},v1={good}"), (SECRET,), NOW)


@pytest.mark.parametrize(("event_type", "obj", "key"), [
    ("charge.succeeded", {"id": "ch_1", "object": "charge", "payment_intent": "pi_9"}, "stripe:pi_9"),
    ("charge.refund.updated", {"id": "re_1", "object": "refund", "charge": "ch_1", "payment_intent": "pi_9"},
     "stripe:pi_9"),
    ("refund.failed", {"id": "re_1", "object": "refund", "charge": "ch_7", "payment_intent": None}, "stripe:ch_7"),
    ("charge.dispute.closed", {"id": "dp_1", "object": "dispute", "charge": "ch_7"}, "stripe:ch_7"),
    ("refund.updated", {"id": "re_5", "object": "refund"}, "stripe:re_5"),
    # a PaymentIntent's own id, even when a (malformed) payment_intent field names another
    ("payment_intent.canceled", {"id": "pi_1", "object": "payment_intent", "payment_intent": "pi_2"}, "stripe:pi_1"),
])
def test_routing_to_the_payment_intent_else_the_charge_else_itself(event_type: str, obj: dict[str, Any],
                                                                   key: str) -> None:
    route = adapter.route(body(event_type, obj))
    assert (route.resource_key, route.quarantine_reason) == (key, None)


@pytest.mark.parametrize(("raw", "code", "reason", "hint"), [
    (body("charge.succeeded", {"id": "re_1", "object": "refund", "payment_intent": "pi_3"}), "invalid",
     "data.object.object: charge.succeeded carries a charge, got 'refund'", "stripe:pi_3"),
    (body("invoice.paid", {"id": "in_1", "object": "invoice"}), "unknown_type",
     "type: unknown event type 'invoice.paid'", "stripe:in_1"),
    (body("charge.succeeded", {"id": "ch_1", "object": "charge", "payment_intent": "pi_3", "amount": -1}),
     "invalid", "data.object.amount: expected int >= 0", "stripe:pi_3"),
    (orjson.dumps({"id": "evt_1", "object": "event", "type": "payment_intent.created", "created": 5,
                   "data": {"object": {"id": "pi_4", "object": "payment_intent"}}}),
     "invalid", "created:", "stripe:pi_4"),
    (orjson.dumps({"id": "sync_x", "object": "orderly.synced", "created": NOW,
                   "data": {"object": {"id": "pi_1", "object": "payment_intent"}}}),
     "invalid", "object: 'orderly.synced' is Orderly's fetched answer, not a webhook", None),
    (orjson.dumps({"id": "evt_t", "object": "v2.core.event", "type": "v1.charge.succeeded",
                   "created": "2026-11-29T10:00:00Z", "related_object": {"id": "pi_1", "type": "payment_intent"}}),
     "invalid", "related_object.type: v1.charge.succeeded is about a charge", "stripe:pi_1"),
    (orjson.dumps({"id": "evt_t", "object": "v2.core.event", "type": "v1.billing.meter.error_report_triggered",
                   "created": "2026-11-29T10:00:00Z", "related_object": {"id": "mtr_1", "type": "billing.meter"}}),
     "unknown_type", "type: unknown thin event type", None),
    (orjson.dumps({"id": "evt_t", "object": "v2.core.event", "type": "v1.payment_intent.created",
                   "created": "1999-12-31T23:59:59Z", "related_object": {"id": "pi_1", "type": "payment_intent"}}),
     "invalid", "created: time outside", "stripe:pi_1"),
])
def test_quarantined_with_the_field_named(raw: bytes, code: str, reason: str, hint: str | None) -> None:
    route = adapter.route(raw)
    assert route.resource_key is None and route.quarantine_code == code
    assert route.quarantine_reason is not None and route.quarantine_reason.startswith(reason), route.quarantine_reason
    assert route.resource_hint == hint
    assert adapter.read(raw, False) == route  # the worker's own read of an unchecked record says the same


@given(st.binary(max_size=300))
def test_route_and_read_never_raise(raw: bytes) -> None:
    adapter.route(raw)
    adapter.read(raw, False)
    adapter.read(raw, True)
