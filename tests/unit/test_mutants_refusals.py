"""Where the card, paymos, adyen and pg adapters send a body: a non-printable id is refused as
``invalid`` naming its field (DESIGN.md §2.4: ids of printable text; a reason that names the field),
an unknown type as ``unknown_type`` even when a field is wrong too, and a body taken keeps its event
id, type and bytes (killing mutmut's survivors in app/gateways, docs/testing.md).

A quarantine Route never shows a value that is not an id (``schema.valid_id``): a non-printable type
is left out of it.
"""

from __future__ import annotations

import orjson
import pytest

from app.gateways import adyen, card, paymos, pg
from app.gateways.base import Route
from app.gateways.limits import DECIMAL_MAX
from tests import paymos_events
from tests.pg_events import deposit


def card_body(**changed: object) -> bytes:
    return orjson.dumps({"id": "evt_1", "type": "payment.captured", "payment_ref": "pay_1",
                         "occurred_at": "2026-01-01T00:00:00Z", "amount_minor": 5, **changed})


def adyen_item(**changed: object) -> bytes:
    return orjson.dumps({"pspReference": "PSP1", "merchantAccountCode": "M", "merchantReference": "R",
                         "amount": {"value": 100, "currency": "EUR"}, "eventCode": "AUTHORISATION",
                         "success": "true", "eventDate": "2026-01-01T00:00:00+00:00", **changed})


# --- a non-printable type or code: invalid, naming the field, never shown ---

def test_card_a_non_printable_type_is_invalid_by_name() -> None:
    found = card.route(card_body(type="payment.\x01captured"))
    assert (found.resource_key, found.quarantine_code, found.event_id, found.event_type) == (
        None, "invalid", "evt_1", None)
    assert (found.quarantine_reason or "").startswith("type: ")


def test_paymos_a_non_printable_type_is_invalid_by_name() -> None:
    raw = paymos_events.event("invoice.paid", "inv_1", "paid", 1_764_412_395_000, "evt_1")
    found = paymos.route(raw.replace(b'"invoice.paid"', b'"invoice.\\u0001paid"'))
    assert (found.resource_key, found.quarantine_code, found.event_id, found.event_type) == (
        None, "invalid", "evt_1", None)
    assert (found.quarantine_reason or "").startswith("event_type: ")


def test_adyen_a_non_printable_event_code_is_invalid_by_name() -> None:
    found = adyen.route(adyen_item(eventCode="AUTHORI\x01SATION"))
    assert (found.resource_key, found.quarantine_code) == (None, "invalid")
    assert (found.quarantine_reason or "").startswith("eventCode: ")


def test_adyen_an_item_that_needs_an_original_reference_is_invalid_without_it() -> None:
    found = adyen.route(adyen_item(eventCode="CAPTURE"))
    assert (found.resource_key, found.quarantine_code) == (None, "invalid")
    assert (found.quarantine_reason or "").startswith("originalReference: ")


# --- an unknown type is named first, whatever else is wrong ---

def test_card_an_unknown_type_with_a_wrong_field_is_unknown_type() -> None:
    found = card.route(card_body(type="payment.lost", amount_minor="5"))
    assert found == Route.quarantine("unknown_type", "type: unknown event type 'payment.lost'", "evt_1",
                                     "payment.lost", "card:pay_1")


def test_paymos_an_unknown_type_keeps_its_event_id_type_and_resource() -> None:
    raw = paymos_events.event("invoice.lost", "inv_1", "paid", 1_764_412_395_000, "evt_1")
    assert paymos.route(raw) == Route.quarantine("unknown_type", "event_type: unknown event type 'invoice.lost'",
                                                 "evt_1", "invoice.lost", "paymos:inv_1")


def test_pg_an_unknown_object_kind_is_shown_up_to_40_characters() -> None:
    kind = "k" * 60
    raw = orjson.dumps({"id": "evt_1", "object": "event", "type": "deposit.pending", "sequence": 1,
                        "created": "2026-11-29T10:33:15Z", "data": {"object": {"id": "dep_1", "object": kind}}})
    assert pg.route(raw) == Route.quarantine("unknown_object", f"data.object.object: unknown object kind {'k' * 40!r}",
                                             "evt_1", "deposit.pending", "pg:dep_1")


# --- a body taken: its event id, type, bytes; amounts up to DECIMAL_MAX characters ---

def test_paymos_a_body_taken_routes_with_its_event_id_and_type_and_keeps_its_bytes() -> None:
    raw = paymos_events.event("invoice.paid", "inv_1", "paid", 1_764_412_395_000, "evt_1")
    assert paymos.route(raw) == Route("paymos:inv_1", "evt_1", "invoice.paid")
    for checked in (False, True):
        found = paymos.read(raw, checked)
        assert isinstance(found, paymos.Webhook) and found.raw == raw
        assert (found.event_id, found.event_type) == ("evt_1", "invoice.paid")


@pytest.mark.parametrize(("digits", "taken"), [(DECIMAL_MAX, True), (DECIMAL_MAX + 1, False)])
def test_paymos_an_amount_of_at_most_decimal_max_characters_is_taken(digits: int, taken: bool) -> None:
    raw = paymos_events.event("invoice.paid", "inv_1", "paid", 1_764_412_395_000, "evt_1", amount="1" * digits)
    found = paymos.route(raw)
    assert (found.resource_key == "paymos:inv_1") is taken, found
    if not taken:
        assert (found.quarantine_code, (found.quarantine_reason or "")[:12]) == ("invalid", "data.amount:")


def test_pg_a_deposit_taken_keeps_its_event_id_and_type() -> None:
    assert pg.route(deposit("dep_1", 2, "pending", "evt_7")) == Route("pg:dep_1", "evt_7", "deposit.pending")
