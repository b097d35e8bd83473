"""The stripe adapter checked against Stripe's own code and examples: the official `stripe` package
(a test dependency, pinned in pyproject.toml) verifies what Orderly signs and signs what Orderly
verifies, and Stripe's published example objects (its OpenAPI fixtures, which stripe-mock serves)
parse and route. Sources: docs/gateways/stripe.md."""

from __future__ import annotations

import json
import time
import typing
from pathlib import Path
from typing import Any

import orjson
import pytest
import stripe
from stripe import SignatureVerificationError, StripeClient, Webhook, WebhookSignature

from app.core import stripe as core
from app.gateways import stripe as adapter
from app.gateways.base import SignatureError

SECRET = "whsec_test_4eC39HqLyjWDarjtT1zdp7dc"
ROLLED = "whsec_test_rolled_0123456789abcdef"
FIXTURES = json.loads((Path(__file__).parent / "data" / "stripe_openapi_fixtures.json").read_text())["resources"]


def body(event_type: str = "payment_intent.succeeded", obj: dict[str, Any] | None = None) -> bytes:
    obj = obj or {"id": "pi_1", "object": "payment_intent", "status": "succeeded", "amount": 2000,
                  "amount_received": 2000, "currency": "eur"}
    return orjson.dumps({"id": "evt_1", "object": "event", "type": event_type, "created": int(time.time()),
                         "api_version": "2025-06-30.basil", "livemode": False, "pending_webhooks": 1,
                         "request": {"id": None, "idempotency_key": None}, "data": {"object": obj}})


def test_the_sdk_accepts_what_orderly_signs() -> None:
    raw, now = body(), time.time()
    header = adapter.signed_headers(raw, SECRET, now)[adapter.SIGNATURE_HEADER]
    assert WebhookSignature.verify_header(raw.decode(), header, SECRET, tolerance=300) is True
    event = Webhook.construct_event(raw, header, SECRET)
    assert (event.id, event.type, event.data.object.id) == ("evt_1", "payment_intent.succeeded", "pi_1")
    with pytest.raises(SignatureVerificationError):
        WebhookSignature.verify_header(raw.decode().replace("2000", "2001"), header, SECRET, tolerance=300)
    with pytest.raises(SignatureVerificationError):
        WebhookSignature.verify_header(raw.decode(), header, ROLLED, tolerance=300)


def test_orderly_accepts_what_the_sdk_signs() -> None:
    raw, now = body(), int(time.time())
    header = WebhookSignature.generate_signature_header(raw.decode(), SECRET, timestamp=now)
    adapter.verify(raw, {"Stripe-Signature": header}, (SECRET,), float(now))
    assert adapter.route(raw).resource_key == "stripe:pi_1"
    with pytest.raises(SignatureError, match="no Stripe-Signature v1 matches"):
        adapter.verify(raw.replace(b"2000", b"2001"), {"Stripe-Signature": header}, (SECRET,), float(now))
    with pytest.raises(SignatureError):
        adapter.verify(raw, {"Stripe-Signature": header}, (ROLLED,), float(now))


def test_rotation_both_secrets_sign_one_header_and_either_verifies_on_both_sides() -> None:
    raw, now = body(), int(time.time())
    old = WebhookSignature.generate_signature_header(raw.decode(), ROLLED, timestamp=now)
    new = WebhookSignature.generate_signature_header(raw.decode(), SECRET, timestamp=now)
    header = f"{new},v1={old.partition(',v1=')[2]},v0=6ffbb59b2300aae63f272406069a9788598b792a944a07aba816edb039989a39"
    for secret in (SECRET, ROLLED):
        assert WebhookSignature.verify_header(raw.decode(), header, secret, tolerance=300) is True
        adapter.verify(raw, {"Stripe-Signature": header}, (secret,), float(now))  # one secret configured
    adapter.verify(raw, {"Stripe-Signature": old}, (SECRET, ROLLED), float(now))  # both configured, old header
    with pytest.raises(SignatureError):
        adapter.verify(raw, {"Stripe-Signature": header}, ("whsec_unrelated",), float(now))


def test_a_v0_signature_alone_passes_neither_side() -> None:
    raw, now = body(), int(time.time())
    v1 = WebhookSignature.generate_signature_header(raw.decode(), SECRET, timestamp=now).partition(",v1=")[2]
    header = f"t={now},v0={v1}"  # the right digest under the test-mode scheme name
    with pytest.raises(SignatureVerificationError):
        WebhookSignature.verify_header(raw.decode(), header, SECRET, tolerance=300)
    with pytest.raises(SignatureError, match="no v1"):
        adapter.verify(raw, {"Stripe-Signature": header}, (SECRET,), float(now))


def test_tolerance_old_refused_by_both_future_refused_only_by_orderly() -> None:
    raw, now = body(), int(time.time())
    old = WebhookSignature.generate_signature_header(raw.decode(), SECRET, timestamp=now - 301)
    with pytest.raises(SignatureVerificationError, match="tolerance"):
        WebhookSignature.verify_header(raw.decode(), old, SECRET, tolerance=300)
    with pytest.raises(SignatureError, match="300 s"):
        adapter.verify(raw, {"Stripe-Signature": old}, (SECRET,), float(now))
    future = WebhookSignature.generate_signature_header(raw.decode(), SECRET, timestamp=now + 301)
    assert WebhookSignature.verify_header(raw.decode(), future, SECRET, tolerance=300) is True  # the SDK's gap
    with pytest.raises(SignatureError, match="300 s"):
        adapter.verify(raw, {"Stripe-Signature": future}, (SECRET,), float(now))  # stricter: documented


def test_a_thin_event_orderly_signs_is_one_the_sdk_parses_and_both_name_the_same_object() -> None:
    raw = orjson.dumps({"id": "evt_test_65R9", "object": "v2.core.event", "type": "v1.payment_intent.succeeded",
                        "livemode": False, "created": "2026-12-01T10:00:00.000Z",
                        "related_object": {"id": "pi_9", "type": "payment_intent", "url": "/v1/payment_intents/pi_9"}})
    header = adapter.signed_headers(raw, SECRET, time.time())[adapter.SIGNATURE_HEADER]
    notification = StripeClient("sk_test_unused").parse_event_notification(raw, header, SECRET)
    assert notification.id == "evt_test_65R9" and notification.type == "v1.payment_intent.succeeded"
    assert adapter.route(raw).resource_key == "stripe:pi_9"
    with pytest.raises(ValueError, match="thin event"):  # the SDK, too, refuses a thin event as a snapshot
        Webhook.construct_event(raw, header, SECRET)


@pytest.mark.parametrize(("event_type", "resource", "expected"), [
    ("payment_intent.created", "payment_intent", "stripe:pi_1PgafyB7WZ01zgkWSjxsAJo3"),
    ("charge.succeeded", "charge", "stripe:ch_1PgafuB7WZ01zgkWXYmPNZs8"),  # no PaymentIntent: its own id
    ("refund.created", "refund", "stripe:ch_1PgafuB7WZ01zgkWXYmPNZs8"),  # no PaymentIntent: its charge
    ("charge.dispute.created", "dispute", "stripe:ch_1PgafuB7WZ01zgkWXYmPNZs8"),
])
def test_stripes_published_example_objects_parse_and_route(event_type: str, resource: str, expected: str) -> None:
    raw = body(event_type, FIXTURES[resource])
    route = adapter.route(raw)
    assert (route.resource_key, route.quarantine_reason) == (expected, None)
    w = adapter.read(raw, True)
    assert isinstance(w, adapter.Webhook) and isinstance(w.event, adapter.Snapshot)
    assert w.event.data.object.status == FIXTURES[resource]["status"]


def test_stripes_published_example_event_of_another_type_is_quarantined_with_its_type() -> None:
    raw = orjson.dumps(FIXTURES["event"])
    route = adapter.route(raw)
    assert route.resource_key is None and route.quarantine_code == "unknown_type"
    assert route.quarantine_reason == "type: unknown event type 'plan.created'"


def literals(cls: type, attribute: str = "status") -> set[str]:
    hint = cls.__annotations__[attribute]  # the SDK's own typing objects (get_type_hints trips on others)
    found = set()
    for arg in typing.get_args(hint) or (hint,):
        found |= set(typing.get_args(arg)) if typing.get_origin(arg) is typing.Literal else set()
    return found


def test_the_statuses_orderly_names_are_the_sdks() -> None:
    assert core.TERMINAL["payment_intent"] <= literals(stripe.PaymentIntent)
    disputes = literals(stripe.Dispute)
    assert core.DISPUTE_CLOSED <= disputes and {"appeal_needs_response", "appeal_under_review"} <= disputes
    assert {"pending", "succeeded", "failed"} == literals(stripe.Charge)
    # Refund.status is an Optional[str] in the SDK; its docstring lists the five the reducer knows
    assert core.REFUND_COUNTED | core.TERMINAL["refund"] == {"pending", "requires_action", "succeeded", "failed",
                                                             "canceled"}
