"""The `stripe` gateway: ``Stripe-Signature`` verification and routing to the PaymentIntent (pure layer).

Sources and choices: docs/gateways/stripe.md. The ordering key is the reducer's (app/core/stripe.py
``snapshot_key``); this module checks who sent a body and which resource it is about.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Annotated, Any
from urllib.parse import quote

import msgspec
import orjson

from app.gateways import limits, schema
from app.gateways.base import Route, SignatureError, any_match, check_timestamp, header, hmac_sha256
from app.gateways.limits import IdText, IsoText, Minor, Text, UnixS
from app.gateways.schema import Body, Document, Refusal, field, require_ids, require_times, valid_id

name = "stripe"
SIGNATURE_HEADER = "Stripe-Signature"
SECRET_PREFIX = "whsec_"

PAYMENT_INTENT_EVENTS = frozenset({
    "payment_intent.created", "payment_intent.processing", "payment_intent.requires_action",
    "payment_intent.amount_capturable_updated", "payment_intent.partially_funded",
    "payment_intent.succeeded", "payment_intent.payment_failed", "payment_intent.canceled",
})
CHARGE_EVENTS = frozenset({
    "charge.pending", "charge.succeeded", "charge.failed", "charge.captured", "charge.refunded",
    "charge.updated", "charge.expired",
})
REFUND_EVENTS = frozenset({"refund.created", "refund.updated", "refund.failed", "charge.refund.updated"})
DISPUTE_EVENTS = frozenset({
    "charge.dispute.created", "charge.dispute.updated", "charge.dispute.closed",
    "charge.dispute.funds_withdrawn", "charge.dispute.funds_reinstated",
})
EVENT_TYPES = PAYMENT_INTENT_EVENTS | CHARGE_EVENTS | REFUND_EVENTS | DISPUTE_EVENTS
# The object each event type carries in data.object (API reference, "Types of events").
OBJECT_OF = {
    **dict.fromkeys(PAYMENT_INTENT_EVENTS, "payment_intent"), **dict.fromkeys(CHARGE_EVENTS, "charge"),
    **dict.fromkeys(REFUND_EVENTS, "refund"), **dict.fromkeys(DISPUTE_EVENTS, "dispute"),
}
THIN_PREFIX = "v1."  # thin events about v1 resources are typed v1.<type> (docs: event destinations)
_HEX_SHA256 = re.compile(r"[0-9a-f]{64}")  # the SDK compares lower-case hex strings


def secret_key(secret: str) -> bytes:
    """The HMAC key: the endpoint secret string as given, UTF-8 (stripe-python ``_compute_signature``)."""
    if not secret.strip():
        raise ValueError("stripe secret is empty (an empty HMAC key is forgeable)")
    return secret.encode()


def sign(raw: bytes, secret: str, timestamp: int) -> str:
    return hmac_sha256(secret_key(secret), f"{timestamp}.".encode() + raw).hex()


def signed_headers(raw: bytes, secret: str, now: float) -> dict[str, str]:
    """The header Stripe sends with ``raw`` (the simulator's and the tests')."""
    return {SIGNATURE_HEADER: f"t={int(now)},v1={sign(raw, secret, int(now))}"}


def parse_header(value: str) -> tuple[str | None, list[bytes]]:
    """The first ``t`` and every well-formed ``v1`` of a Stripe-Signature header (``v0`` and other
    schemes are ignored, as by the SDK)."""
    timestamp: str | None = None
    offered = []
    for item in value.split(","):
        scheme, _, text = item.partition("=")
        if scheme == "t" and timestamp is None:
            timestamp = text
        elif scheme == "v1" and _HEX_SHA256.fullmatch(text):
            offered.append(bytes.fromhex(text))
    return timestamp, offered


def verify(raw: bytes, headers: Mapping[str, str], secrets: tuple[str, ...], now: float) -> None:
    value = header(headers, SIGNATURE_HEADER)
    if not value:
        raise SignatureError("missing Stripe-Signature header")
    timestamp, offered = parse_header(value)
    check_timestamp(timestamp, now)  # |now - t| > 300 s refused both ways: stricter than the SDK
    assert timestamp is not None  # check_timestamp refused a missing one
    if len(timestamp) > 1 and timestamp.startswith("0"):
        raise SignatureError("timestamp has a leading zero")  # the SDK would sign int(t): one spelling only
    if not offered:
        raise SignatureError("Stripe-Signature has no v1 entry")
    signed = f"{timestamp}.".encode() + raw
    if not any_match([hmac_sha256(secret_key(s), signed) for s in secrets], offered):
        raise SignatureError("no Stripe-Signature v1 matches")


# --- the schema: every field app/core/stripe.py and the read model read -------------------------

Url = Annotated[str, msgspec.Meta(max_length=2000)]


class Obj(Body):
    """A PaymentIntent, Charge, Refund or Dispute as a snapshot carries it (the fields Orderly reads)."""

    id: IdText
    object: Text
    status: Text | None = None
    amount: Minor | None = None
    amount_received: Minor | None = None  # PaymentIntent
    amount_captured: Minor | None = None  # Charge
    amount_refunded: Minor | None = None  # Charge: pending refunds count, a failed one is given back
    currency: Text | None = None
    payment_intent: IdText | None = None  # Charge, Refund, Dispute
    charge: IdText | None = None  # Refund, Dispute
    captured: bool | None = None
    refunded: bool | None = None

    def __post_init__(self) -> None:
        if not (self.id.isprintable() and self.object.isprintable()):
            require_ids(id=self.id, object=self.object)
        require_ids(payment_intent=self.payment_intent, charge=self.charge)


class Data(Body):
    object: Obj


class Snapshot(Body, tag_field="object", tag="event"):
    """A v1 event: the object as it was when the event was created."""

    id: IdText
    type: Text
    created: UnixS  # whole seconds
    data: Data

    def __post_init__(self) -> None:
        require_ids(id=self.id, type=self.type)


class Related(Body):
    id: IdText
    type: Text
    url: Url | None = None


class Thin(Body, tag_field="object", tag="v2.core.event"):
    """A thin event: a reference to the object that changed, no state."""

    id: IdText
    type: Text
    created: IsoText
    related_object: Related | None = None

    def __post_init__(self) -> None:
        require_ids(id=self.id, type=self.type)
        require_times(created=self.created)


class SyncedData(Body):
    object: Obj  # the PaymentIntent as fetched
    charge: Obj | None = None  # its latest_charge, expanded
    refunds: list[Obj] = msgspec.field(default_factory=list)


class Synced(Body, tag_field="object", tag="orderly.synced"):
    """Orderly's fetched answer (never a webhook: the ingest refuses it), appended by the fetcher."""

    id: IdText
    created: UnixS  # the second of the fetch
    data: SyncedData
    type: Text = "synced"


Event = Snapshot | Thin | Synced
# msgspec takes the union as a type; typed as one for its decoder's
EVENT: type[Snapshot | Thin | Synced] = Event  # type: ignore[assignment]
DECODER = msgspec.json.Decoder(Event)
READ: msgspec.json.Decoder[Snapshot | Thin | Synced] = msgspec.json.Decoder(EVENT)


class Webhook(msgspec.Struct, frozen=True, gc=False):
    """A stripe body read once, for the worker: the typed event, and the body as received (``payload``)."""

    event: Snapshot | Thin | Synced
    payload: orjson.Fragment  # the body's bytes as received (orjson checked them): decisions carry them as they are
    raw: bytes


class HeadObject(msgspec.Struct):
    id: Any = None
    object: Any = None
    payment_intent: Any = None
    charge: Any = None


class HeadData(msgspec.Struct):
    object: Any = None


class Head(msgspec.Struct):
    """What a refused body may still tell: its ids, read without types."""

    id: Any = None
    type: Any = None
    data: Any = None
    related_object: Any = None


HEAD = msgspec.json.Decoder(Head, float_hook=limits.FLOAT_HOOK)


def resource_id(obj: Obj) -> str:
    """The PaymentIntent an object belongs to; without one, a refund's or dispute's charge; else itself."""
    if obj.object == "payment_intent":
        return obj.id
    return obj.payment_intent or obj.charge or obj.id


def route(raw: bytes) -> Route:
    event = schema.decode(DECODER, raw)
    if isinstance(event, Refusal):
        return refused(raw, event)
    return accept(event)


def read(raw: bytes, checked: bool) -> Webhook | Route:
    """The worker's one read of a record's body (``checked``: the ingest or the fetcher took it)."""
    if not checked and (refusal := schema.whole(raw)) is not None:
        return refused(raw, refusal)
    event: Snapshot | Thin | Synced | Refusal = schema.typed(READ, raw)
    if isinstance(event, Refusal):
        return refused(raw, event)
    if not checked and (found := accept(event)).resource_key is None:
        return found
    return Webhook(event, orjson.Fragment(raw), raw)


def accept(event: Snapshot | Thin | Synced) -> Route:
    """Where a body the schema took goes (Orderly's own synced answer never comes as a webhook)."""
    if isinstance(event, Synced):
        return Route.quarantine("invalid", "object: 'orderly.synced' is Orderly's fetched answer, not a webhook",
                                event.id, event.type)
    if isinstance(event, Thin):
        return accept_thin(event)
    obj = event.data.object
    hint = f"{name}:{resource_id(obj)}"
    if event.type not in EVENT_TYPES:
        return Route.quarantine("unknown_type", f"type: unknown event type {event.type!r}", event.id, event.type, hint)
    if obj.object != OBJECT_OF[event.type]:
        return Route.quarantine("invalid", f"data.object.object: {event.type} carries a {OBJECT_OF[event.type]}, "
                                f"got {obj.object!r}", event.id, event.type, hint)
    return Route(hint, event.id, event.type)


def accept_thin(event: Thin) -> Route:
    base = event.type.removeprefix(THIN_PREFIX)
    if not event.type.startswith(THIN_PREFIX) or base not in EVENT_TYPES:
        return Route.quarantine("unknown_type", f"type: unknown thin event type {event.type!r}", event.id, event.type)
    related = event.related_object
    if related is None:
        return Route.quarantine("invalid", "related_object: a thin event names the object it is about",
                                event.id, event.type)
    if related.type != OBJECT_OF[base]:
        return Route.quarantine("invalid", f"related_object.type: {event.type} is about a {OBJECT_OF[base]}, "
                                f"got {related.type!r}", event.id, event.type, f"{name}:{related.id}")
    # a charge's, refund's or dispute's thin event cannot name its PaymentIntent: keyed by its own id
    return Route(f"{name}:{related.id}", event.id, event.type)


def refused(raw: bytes, refusal: Refusal) -> Route:
    head = schema.lenient(HEAD, raw)
    if head is None:
        return Route.quarantine(refusal.code, refusal.reason)
    event_type = valid_id(head.type)
    obj = field(head.data, "object")
    key = None
    if isinstance(obj, dict):
        for step in ("payment_intent", "charge", "id"):
            if step != "id" and obj.get("object") == "payment_intent":
                continue
            if (found := valid_id(obj.get(step))) is not None:
                key = found
                break
    elif (related := valid_id(field(head.related_object, "id"))) is not None:
        key = related
    if event_type is not None and event_type not in EVENT_TYPES and not event_type.startswith(THIN_PREFIX):
        refusal = Refusal("unknown_type", f"type: unknown event type {event_type!r}")
    return Route.quarantine(refusal.code, refusal.reason, valid_id(head.id), event_type,
                            f"{name}:{key}" if key is not None else None)


# --- the fetched answer as a record (the fetcher writes it; the reducer reads it as Synced) ---------

def synced_id(payment_intent: Obj, charge: Obj | None, refunds: list[Obj]) -> str:
    """Derived from what the answer says, so an unchanged repeat is a duplicate."""
    said = [(o.id, o.status, o.amount, o.amount_received, o.amount_refunded)
            for o in (payment_intent, charge, *refunds) if o is not None]
    return f"sync_{payment_intent.id[:100]}_" + hashlib.sha256(orjson.dumps(said)).hexdigest()[:24]


# What the fetcher asks Stripe's API for a PaymentIntent (``{id}``: its quoted id; the registry's
# Fetch): the PaymentIntent with its latest charge expanded (it has no ``charges`` list since API
# version 2022-11-15), and its refunds.
INTENT_PATH = "/v1/payment_intents/{id}?expand[]=latest_charge"
REFUNDS_PATH = "/v1/refunds?payment_intent={id}&limit=100"


def fetch_paths(payment_intent_id: str) -> tuple[str, str]:
    """The two GET paths for one PaymentIntent, as the fetcher builds them."""
    pi = quote(payment_intent_id, safe="")
    return INTENT_PATH.replace("{id}", pi), REFUNDS_PATH.replace("{id}", pi)


def synced(payment_intent_id: str, answers: object, now_ms: int) -> bytes:
    """The fetcher's record for the pair of answers to :func:`fetch_paths` (the registry's
    ``Fetch.synced``); raises ValueError naming the field when they are unusable."""
    if not isinstance(answers, tuple) or len(answers) != 2:
        raise ValueError("answer: expected the PaymentIntent and its refunds")
    intent_answer, refunds_answer = answers
    if isinstance(intent_answer, dict) and intent_answer.get("id") != payment_intent_id:
        raise ValueError(f"answer.id: asked for {payment_intent_id!r}, got {intent_answer.get('id')!r}"[:300])
    return synced_from(intent_answer, refunds_answer, now_ms // 1000)


def synced_from(intent_answer: object, refunds_answer: object, now_s: int) -> bytes:
    """The record for the two answers of :func:`fetch_paths` (raises ValueError naming the field)."""
    if not isinstance(intent_answer, dict):
        raise ValueError("answer: the PaymentIntent is not a JSON object")
    charge = intent_answer.get("latest_charge")
    refunds = refunds_answer.get("data") if isinstance(refunds_answer, dict) else None
    if not isinstance(refunds_answer, dict) or refunds_answer.get("object") != "list" or not isinstance(refunds, list):
        raise ValueError("answer: the refunds are not a list object")
    if refunds_answer.get("has_more") is True:  # a partial list would under-count what is refunded
        raise ValueError("answer.has_more: more than 100 refunds, the list is incomplete")
    return synced_body(intent_answer, charge if isinstance(charge, dict) else None,
                       [r for r in refunds if isinstance(r, dict)], now_s)


def synced_body(payment_intent: Document, charge: Document | None, refunds: list[Document], now_s: int) -> bytes:
    """The record the fetcher appends for ``GET /v1/payment_intents/{id}`` (latest_charge expanded)
    and ``GET /v1/refunds?payment_intent=…``; raises ValueError naming the field if unusable."""
    try:
        pi = msgspec.convert(payment_intent, Obj)
        ch = msgspec.convert(charge, Obj) if charge is not None else None
        rs = msgspec.convert(refunds, list[Obj])
    except msgspec.ValidationError as exc:
        raise ValueError(schema.readable(str(exc), "answer")) from None
    if pi.object != "payment_intent":
        raise ValueError(f"answer.object: expected 'payment_intent', got {pi.object!r}")
    try:  # the answers as given: a field Orderly does not read may still hold what JSON here cannot
        return orjson.dumps({"id": synced_id(pi, ch, rs), "object": "orderly.synced", "type": "synced",
                             "created": now_s, "data": {"object": payment_intent, "charge": charge,
                                                        "refunds": refunds}})
    except TypeError as exc:  # orjson.JSONEncodeError: e.g. an integer beyond signed 64-bit
        raise ValueError(f"answer: not storable as JSON ({exc})"[:300]) from None
