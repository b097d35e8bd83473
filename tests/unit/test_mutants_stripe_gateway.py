"""The stripe adapter's rules at their edges (killing mutmut's survivors in app/gateways/stripe.py,
docs/testing.md): the ids a quarantined body keeps, the worker's read of a body the ingest did not
check, a refused body keyed as its valid form would be, the fetched answer's record and its errors,
ids and names of printable characters only."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from app.gateways import stripe as adapter
from app.gateways.base import Route

NOW = 1_796_119_200


def event(event_type: str, obj: dict[str, Any], eid: str = "evt_1") -> bytes:
    return orjson.dumps({"id": eid, "object": "event", "type": event_type, "created": NOW, "data": {"object": obj}})


def intent(**changed: Any) -> dict[str, Any]:
    return {"id": "pi_1", "object": "payment_intent", "status": "succeeded", "amount": 2000, "currency": "eur",
            **changed}


def ids(route: Route | adapter.Webhook) -> tuple[str | None, str | None, str | None, str | None]:
    assert isinstance(route, Route), route
    return route.resource_key, route.event_id, route.event_type, route.resource_hint


def test_a_routed_or_quarantined_body_keeps_its_event_id_and_type() -> None:
    assert ids(adapter.route(event("payment_intent.succeeded", intent()))) == (
        "stripe:pi_1", "evt_1", "payment_intent.succeeded", None)
    unknown = adapter.route(event("payment_intent.unheard_of", intent()))
    assert ids(unknown) == (None, "evt_1", "payment_intent.unheard_of", "stripe:pi_1")
    assert unknown.quarantine_code == "unknown_type"
    mismatched = adapter.route(event("charge.succeeded", intent()))
    assert ids(mismatched) == (None, "evt_1", "charge.succeeded", "stripe:pi_1")
    assert mismatched.quarantine_code == "invalid"
    answer = adapter.synced_body(intent(), None, [], NOW)
    sent = adapter.route(answer)  # Orderly's own record sent as a webhook
    assert ids(sent) == (None, orjson.loads(answer)["id"], "synced", None) and sent.quarantine_code == "invalid"


NUL = event("payment_intent.created", intent(description="a\u0000b"))


def test_the_workers_read_of_an_unchecked_body_refuses_what_breaks_a_limit_keeping_its_ids() -> None:
    refused = adapter.read(NUL, False)
    assert ids(refused) == (None, "evt_1", "payment_intent.created", "stripe:pi_1")
    assert isinstance(refused, Route) and refused.quarantine_code == "invalid"
    assert refused.quarantine_reason is not None and refused.quarantine_reason.startswith("data.object.description: ")


def test_the_workers_read_of_a_checked_body_keeps_the_bytes_as_the_decisions_payload() -> None:
    for raw in (NUL, event("payment_intent.created", intent())):
        w = adapter.read(raw, True)
        assert isinstance(w, adapter.Webhook)
        assert orjson.dumps(w.payload) == raw and w.raw == raw and w.event.id == "evt_1"


@pytest.mark.parametrize(("obj", "key"), [
    # a PaymentIntent is keyed by its own id, whatever other ids it holds (as accepted: the routing table)
    (intent(charge="ch_9", payment_intent="pi_9"), "stripe:pi_1"),
    ({"id": "ch_1", "object": "charge", "status": "succeeded", "payment_intent": "pi_1"}, "stripe:pi_1"),
    ({"id": "re_1", "object": "refund", "status": "succeeded", "charge": "ch_1"}, "stripe:ch_1"),
])
def test_a_body_refused_for_one_field_keeps_the_key_its_valid_form_has(obj: dict[str, Any], key: str) -> None:
    event_type = {"payment_intent": "payment_intent.succeeded", "charge": "charge.succeeded",
                  "refund": "refund.updated"}[obj["object"]]
    assert adapter.route(event(event_type, obj)).resource_key == key
    refused = adapter.route(event(event_type, {**obj, "amount": "2000"}))
    assert ids(refused) == (None, "evt_1", event_type, key) and refused.quarantine_code == "invalid"


def test_a_refused_body_of_an_unknown_type_is_named_unknown_type_with_its_ids() -> None:
    refused = adapter.route(event("payment_intent.unheard_of", intent(amount="2000")))
    assert ids(refused) == (None, "evt_1", "payment_intent.unheard_of", "stripe:pi_1")
    assert refused.quarantine_code == "unknown_type"
    assert refused.quarantine_reason is not None and "payment_intent.unheard_of" in refused.quarantine_reason


def test_the_fetched_answers_record_is_a_synced_event_whose_id_follows_every_object_it_holds() -> None:
    ch = {"id": "ch_1", "object": "charge", "status": "succeeded", "amount": 2000, "amount_refunded": 0,
          "payment_intent": "pi_1"}
    record = orjson.loads(adapter.synced_body(intent(), ch, [], NOW))
    assert (record["object"], record["type"], record["created"]) == ("orderly.synced", "synced", NOW)
    assert record["data"] == {"object": intent(), "charge": ch, "refunds": []}
    again = orjson.loads(adapter.synced_body(intent(), ch, [], NOW + 5))
    changed = orjson.loads(adapter.synced_body(intent(), {**ch, "amount_refunded": 500}, [], NOW))
    assert again["id"] == record["id"] != changed["id"]  # an unchanged repeat is a duplicate, a change not


def test_an_unusable_fetched_answer_names_the_field() -> None:
    with pytest.raises(ValueError, match=r"^answer\.amount: "):
        adapter.synced_body(intent(amount="2000"), None, [], NOW)
    with pytest.raises(ValueError, match=r"^answer: not storable as JSON \(.+\)$"):
        adapter.synced_body(intent(metadata={"n": 2**70}), None, [], NOW)


@pytest.mark.parametrize(("raw", "field"), [
    (event("payment_intent.succeeded", intent(object="payment_intent\u0001")), "data.object.object"),
    (event("payment_intent.succeeded\u0001", intent()), "type"),
    (orjson.dumps({"id": "evt_1\u0001", "object": "v2.core.event", "type": "v1.payment_intent.succeeded",
                   "created": "2026-12-01T10:00:00Z", "related_object": {"id": "pi_1", "type": "payment_intent"}}),
     "id"),
    (orjson.dumps({"id": "evt_1", "object": "v2.core.event", "type": "v1.payment_intent.succeeded\u0001",
                   "created": "2026-12-01T10:00:00Z", "related_object": {"id": "pi_1", "type": "payment_intent"}}),
     "type"),
])
def test_an_id_type_or_object_name_with_a_control_character_is_invalid_naming_the_field(raw: bytes, field: str) -> None:
    refused = adapter.route(raw)
    assert refused.resource_key is None and refused.quarantine_code == "invalid"
    assert refused.quarantine_reason is not None and refused.quarantine_reason.startswith(f"{field}: ")
    assert "printable" in refused.quarantine_reason
