"""Where each bad body goes, whole: the quarantine code (a metric's label), the reason naming the field
(stored with the record), and the event id, type and resource hint the timeline shows it under
(killing mutmut's survivors in app/gateways' routing, docs/testing.md)."""

from __future__ import annotations

import dataclasses

import orjson

from app.gateways import adyen, card, limits, paymos, pg, registry, stripe
from app.gateways.base import Route
from app.gateways.limits import INT64_MAX, INT64_MIN
from tests import paymos_events
from tests.pg_events import deposit


def item(**changed: object) -> dict[str, object]:
    return {"pspReference": "PSP1", "merchantAccountCode": "M", "merchantReference": "R",
            "amount": {"value": 100, "currency": "EUR"}, "eventCode": "AUTHORISATION", "success": "true",
            "eventDate": "2026-01-01T00:00:00+00:00", **changed}


def body(*items: dict[str, object]) -> bytes:
    return orjson.dumps({"live": "false", "notificationItems": [{"NotificationRequestItem": i} for i in items]})


def routes(raw: bytes) -> list[Route]:
    return [route for _, route in adyen.split(raw)]


def test_adyen_bodies_refused_whole() -> None:
    assert routes(b"not json") == [Route.quarantine("not_json", "body is not JSON")]
    assert routes(b'{"notificationItems": 5}') == [
        Route.quarantine("invalid", "notificationItems: expected array, got int")]
    deep = b"[" * 100_000 + b"]" * 100_000
    assert routes(b'{"live":' + deep + b"}") == [
        Route.quarantine("invalid", "body: JSON nests deeper than its items can be read")]
    assert routes(body(*[item()] * 7)) == [
        Route.quarantine("too_many_items", "notificationItems: 7 items, at most 6 in one request")]


def test_adyen_items_routed_one_by_one_naming_their_place() -> None:
    found = routes(body(item(), item(eventCode="FOO"), item(pspReference=5), item(eventCode="CAPTURE"),
                        item(eventCode="CAPTURE", pspReference="PSP2", originalReference="PSP1")))
    assert found == [
        Route("adyen:PSP1", "PSP1:AUTHORISATION:true:100:EUR", "AUTHORISATION"),
        Route.quarantine("unknown_type", "notificationItems[1].NotificationRequestItem.eventCode: 'FOO' is not handled",
                         "PSP1:FOO:true:100:EUR", "FOO", "adyen:PSP1"),
        Route.quarantine("invalid", "notificationItems[2].NotificationRequestItem.pspReference: expected str, got int",
                         None, "AUTHORISATION", None),
        Route.quarantine("invalid",
                         "notificationItems[3].NotificationRequestItem.originalReference: required for CAPTURE",
                         "PSP1:CAPTURE:true:100:EUR", "CAPTURE", "adyen:PSP1"),
        Route("adyen:PSP1", "PSP2:CAPTURE:true:100:EUR", "CAPTURE"),
    ]


def test_adyen_route_alone_keeps_the_reason_unprefixed() -> None:
    assert adyen.route(orjson.dumps(item(eventCode="FOO"))) == Route.quarantine(
        "unknown_type", "eventCode: 'FOO' is not handled", "PSP1:FOO:true:100:EUR", "FOO", "adyen:PSP1")


def test_pruned_replaces_exactly_what_is_deeper_than_the_limit() -> None:
    limit = adyen.PRUNE_DEPTH
    at_limit = b'{"a":' + b"[" * (limit - 1) + b'"]}"' + b"]" * (limit - 1) + b"}"
    assert adyen.pruned(at_limit) == at_limit  # brackets inside a string are not nesting
    over = b"[" * (limit + 1) + b"]" * (limit + 1)
    assert adyen.pruned(over) == b"[" * limit + b"null" + b"]" * limit
    twice = b"[" + b"[" * limit + b"1" + b"]" * limit + b"," + b"[" * limit + b"{}" + b"]" * limit + b"]"
    inner = b"[" * (limit - 1) + b"null" + b"]" * (limit - 1)
    assert adyen.pruned(twice) == b"[" + inner + b"," + inner + b"]"
    assert orjson.loads(adyen.pruned(b'{"k":' + over + b',"v":"x"}'))["v"] == "x"


def thin(**changed: object) -> bytes:
    return orjson.dumps({"id": "evt_1", "object": "v2.core.event", "type": "v1.payment_intent.succeeded",
                         "created": "2026-11-29T10:00:00Z", **changed,
                         "related_object": changed.get("related_object", {"id": "pi_1", "type": "payment_intent"})})


def test_stripe_thin_events_routed_whole() -> None:
    assert stripe.route(thin()) == Route("stripe:pi_1", "evt_1", "v1.payment_intent.succeeded")
    assert stripe.route(thin(type="v1.charge.succeeded", related_object={"id": "ch_1", "type": "charge"})) == \
        Route("stripe:ch_1", "evt_1", "v1.charge.succeeded")
    for unknown in ("v1.foo", "payment_intent.succeeded"):
        assert stripe.route(thin(type=unknown)) == Route.quarantine(
            "unknown_type", f"type: unknown thin event type {unknown!r}", "evt_1", unknown)
    assert stripe.route(thin(related_object=None)) == Route.quarantine(
        "invalid", "related_object: a thin event names the object it is about", "evt_1", "v1.payment_intent.succeeded")
    assert stripe.route(thin(type="v1.charge.succeeded")) == Route.quarantine(
        "invalid", "related_object.type: v1.charge.succeeded is about a charge, got 'payment_intent'",
        "evt_1", "v1.charge.succeeded", "stripe:pi_1")


def test_int64_error_at_its_bounds() -> None:
    assert limits.int64_error("n", INT64_MIN) is None
    assert limits.int64_error("n", INT64_MAX) is None
    assert limits.int64_error("n", INT64_MIN - 1) == "n: integer outside the signed 64-bit range"
    assert limits.int64_error("n", INT64_MAX + 1) == "n: integer outside the signed 64-bit range"
    assert limits.int64_error("n", True) == "n: expected an integer, got bool"
    assert limits.int64_error("n", "1") == "n: expected an integer, got str"


def test_a_gateway_registered_for_a_test_is_taken_out_by_name_and_an_unknown_name_is_no_error() -> None:
    toy = dataclasses.replace(registry.GATEWAYS["pg"], name="toy_mutants")
    assert registry.register(toy) is toy and registry.find("toy_mutants") is toy
    registry.unregister("toy_mutants")
    assert registry.find("toy_mutants") is None and "pg" in registry.GATEWAYS
    registry.unregister("toy_mutants")  # gone already: nothing to take out


def test_card_an_unchecked_record_past_a_limit_is_refused_whole_under_its_head() -> None:
    raw = orjson.dumps({"id": "evt_1", "type": "payment.captured", "payment_ref": "pay_1",
                        "occurred_at": "2026-01-01T00:00:00Z", "amount_minor": 5, "note": "a\u0000b"})
    found = card.read(raw, False)
    assert isinstance(found, Route)
    why = limits.body_error(raw)
    assert why is not None and found == Route.quarantine("invalid", why, "evt_1", "payment.captured", "card:pay_1")


def test_unchecked_reads_refuse_a_body_past_a_limit_or_the_schema_with_its_reason() -> None:
    nul = orjson.dumps({**item(), "merchantReference": "a\u0000b"})
    found = adyen.read(nul, False)
    why = limits.body_error(nul)
    assert isinstance(found, Route) and why is not None
    assert (found.quarantine_code, found.quarantine_reason) == ("invalid", why)
    typed = adyen.read(orjson.dumps(item(pspReference=5)), False)
    assert isinstance(typed, Route)
    assert (typed.quarantine_code, typed.quarantine_reason) == ("invalid", "pspReference: expected str, got int")
    raw = paymos_events.event("invoice.paid", "inv_1", "paid", 1_764_412_395_000, "evt_1", note="a\u0000b")
    refused = paymos.read(raw, False)
    why = limits.body_error(raw)
    assert isinstance(refused, Route) and why is not None
    assert (refused.quarantine_code, refused.quarantine_reason) == ("invalid", why)
    assert isinstance(paymos.read(b'{"event_id": 5}', False), Route)
    assert isinstance(paymos.read(b'{"event_id": 5}', True), Route)


def test_a_good_body_routes_under_its_resource_with_its_event_id_and_type() -> None:
    assert pg.route(deposit("dep_1", 3, "settled", "evt_9")) == Route("pg:dep_1", "evt_9", "deposit.settled")
    raw = orjson.dumps({"id": "evt_1", "type": "payment.captured", "payment_ref": "pay_1",
                        "occurred_at": "2026-01-01T00:00:00Z", "amount_minor": 5})
    assert card.route(raw) == Route("card:pay_1", "evt_1", "payment.captured")


def test_an_unchecked_item_of_an_unknown_code_is_refused_and_a_read_keeps_its_bytes() -> None:
    raw = orjson.dumps(item(eventCode="FOO"))
    assert adyen.read(raw, False) == adyen.route(raw)
    good = orjson.dumps(item())
    read = adyen.read(good, True)
    assert isinstance(read, adyen.Notification) and read.raw == good
    unknown = orjson.dumps({"id": "evt_1", "type": "payment.lost", "payment_ref": "pay_1",
                            "occurred_at": "2026-01-01T00:00:00Z", "amount_minor": 5})
    found = card.route(unknown)
    assert (found.quarantine_code, found.event_id, found.event_type, found.resource_hint) == (
        "unknown_type", "evt_1", "payment.lost", "card:pay_1")


def test_paymos_a_refused_body_keeps_its_ids_and_an_unknown_type_is_named_before_the_fields_fault() -> None:
    def refused(event_type: str) -> Route:
        return paymos.route(orjson.dumps({"event_id": "evt_1", "event_type": event_type, "data": [1]}))

    assert refused("invoice.weird") == Route(None, "evt_1", "invoice.weird", "unknown_type",
                                             "event_type: unknown event type 'invoice.weird'", None)
    assert refused("invoice.paid") == Route(None, "evt_1", "invoice.paid", "invalid",
                                            "data: expected object, got array", None)
