"""The `paymos` gateway: X-Paymos-Signature verification and routing by the resource in ``data``.

Routing is on the exact ``event_type`` (18 known); the resource id comes from ``data.id``, never
from an id prefix. Ordering key: ``data.updated_at`` with the state-machine rank as tie-breaker.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Any

import msgspec
import orjson

from app.gateways import limits, schema
from app.gateways.base import Route, SignatureError, any_match, header, hmac_sha256
from app.gateways.limits import DECIMAL_MAX, IdText, TakenId, Text, UnixMs, UnixS
from app.gateways.schema import Body, Document, Refusal, field, require_ids, valid_id

name = "paymos"
SIGNATURE_HEADER = "X-Paymos-Signature"

INVOICE_EVENTS = frozenset({
    "invoice.awaiting_payment", "invoice.confirming", "invoice.underpaid_waiting", "invoice.paid",
    "invoice.paid_over", "invoice.underpaid", "invoice.expired", "invoice.cancelled", "invoice.paid_late",
})
WITHDRAWAL_EVENTS = frozenset({
    "withdrawal.created", "withdrawal.processing", "withdrawal.completed", "withdrawal.failed",
    "withdrawal.cancelled", "withdrawal.completion_rewound",
})
CHANNEL_EVENTS = frozenset({
    "payment_channel.deposit.confirming", "payment_channel.deposit.reorged",
    "payment_channel.deposit.confirmed",
})
EVENT_TYPES = INVOICE_EVENTS | WITHDRAWAL_EVENTS | CHANNEL_EVENTS
OBJECT_OF = {
    **dict.fromkeys(INVOICE_EVENTS, "invoice"),
    **dict.fromkeys(WITHDRAWAL_EVENTS, "withdrawal"),
    **dict.fromkeys(CHANNEL_EVENTS, "payment_channel_deposit"),
}


def signed_headers(raw: bytes, secret: str, now: float) -> dict[str, str]:
    """The headers the gateway sends with ``raw`` (no timestamp in this scheme)."""
    return {SIGNATURE_HEADER: sign(raw, secret)}


def sign(raw: bytes, secret: str) -> str:
    return "sha256=" + hmac_sha256(secret.encode(), raw).hex()


def verify(raw: bytes, headers: Mapping[str, str], secrets: tuple[str, ...], now: float) -> None:
    # Paymos signs no timestamp: a replayed delivery is harmless because of dedupe and ordering.
    value = header(headers, SIGNATURE_HEADER)
    if not value:
        raise SignatureError("missing X-Paymos-Signature header")
    offered = []
    for entry in value.split(","):
        scheme, sep, digest = entry.strip().partition("=")
        if scheme == "sha256" and sep:
            try:
                offered.append(bytes.fromhex(digest))
            except ValueError:
                continue
    if not offered:
        raise SignatureError("X-Paymos-Signature has no sha256= entry")
    if not any_match([hmac_sha256(s.encode(), raw) for s in secrets], offered):
        raise SignatureError("no X-Paymos-Signature matches")


# Crypto amounts are decimal strings end to end. A field of ``data`` is an amount when a word of its
# name (between underscores) is amount, net or fee: "amount", "net", "amount_paid", "network_fee";
# not "network" or "feedback". The adapter refuses a float anywhere in ``data`` and an amount that
# is not a decimal string; app/core/paymos.py passes every amount field on to the merchant's effects.
AMOUNT_NAME = re.compile(r"(?:^|_)(?:amount|net|fee)(?:_|$)")
DECIMAL = re.compile(r"-?[0-9]+(\.[0-9]+)?")


@functools.lru_cache(maxsize=1024)  # called per field of every event; a body's field names are few
def is_amount(name: str) -> bool:
    return AMOUNT_NAME.search(name) is not None


class Resource(Body):
    """The fields of ``data`` app/core/paymos.py and the projector read (DESIGN.md §2.4), as the
    worker reads them in a body the ingest took (:class:`Checked`); :class:`StrictResource` is the
    ingest's, with its checks of the id."""

    id: TakenId  # the resource: inv_…, wdr_…, pcd_…
    object: Text
    status: Text
    is_final: bool
    updated_at: UnixMs  # the ordering key
    paid_late_at: UnixS | None = None  # invoice.paid_late: Unix seconds, says the document


class StrictResource(Resource):
    id: IdText

    def __post_init__(self) -> None:
        if not self.id.isprintable():
            require_ids(id=self.id)


class Event(Body):
    event_id: IdText
    event_type: Text
    data: dict[str, Any]  # converted to StrictResource; kept whole for the amount rule
    created_at: UnixMs | None = None

    def __post_init__(self) -> None:
        if not (self.event_id.isprintable() and self.event_type.isprintable()):
            require_ids(event_id=self.event_id, event_type=self.event_type)  # which one, by name


class Checked(Body):
    """The worker's typed view of a body the ingest took already: ``data`` kept as its bytes (the
    state's snapshot and the row's, as sent), read as the :class:`Resource` in a second decode. The
    ingest's checks were made on these bytes (its :class:`Event`, the whole of ``data``,
    :class:`StrictResource`, ``limits.unreadable``): the ids' dots pattern and printability, which
    cost more than the rest of the read, are not made again."""

    event_id: TakenId
    event_type: Text
    data: msgspec.Raw
    created_at: UnixMs | None = None


class Head(msgspec.Struct):
    """What a refused body may still tell: its ids, read without types."""

    event_id: Any = None
    event_type: Any = None
    data: Any = None


DECODER = msgspec.json.Decoder(Event)
HEAD = msgspec.json.Decoder(Head, float_hook=limits.FLOAT_HOOK)
CHECKED = msgspec.json.Decoder(Checked)
RESOURCE = msgspec.json.Decoder(Resource)


def amount_error(data: dict[str, Any]) -> str | None:
    for key, value in data.items():
        if isinstance(value, float):
            return f"data.{key}: a float; crypto amounts are decimal strings"
        if value is not None and AMOUNT_NAME.search(key) and not (
                isinstance(value, str) and len(value) <= DECIMAL_MAX and DECIMAL.fullmatch(value)):
            return f"data.{key}: expected a decimal string of at most {DECIMAL_MAX} characters"
    return None


class Webhook(msgspec.Struct, frozen=True, gc=False):
    """A paymos body read once, for the worker: the typed event and resource, the body as received
    (``payload``, which decisions and parked events carry unchanged) and its ``data`` as sent."""

    event_id: str
    event_type: str
    resource: Resource
    payload: orjson.Fragment  # the body's bytes as received (checked): decisions carry them as they are
    data: msgspec.Raw  # ``data`` as the gateway sent it, every field (the amounts go to the merchant as they are)
    raw: bytes

    def fields(self) -> Document:
        """``data`` as a JSON object (for the amounts an effect carries)."""
        found: Document = msgspec.json.decode(self.data)
        return found


def route(raw: bytes) -> Route:
    event = schema.decode(DECODER, raw)
    if isinstance(event, Refusal):
        return refused(raw, event)
    found = accept(event)
    return found if isinstance(found, Route) else Route(f"{name}:{found.id}", event.event_id, event.event_type)


def read(raw: bytes, checked: bool) -> Webhook | Route:
    """The worker's one read of a record's body; ``checked``: the ingest's adapter took it already
    (else the same checks as :func:`route` first). A quarantine Route if refused."""
    if not checked:
        strict = schema.decode(DECODER, raw)
        if isinstance(strict, Refusal):
            return refused(raw, strict)
        if isinstance(taken := accept(strict), Route):
            return taken
    try:  # the decoders called here, not through schema.typed: a call less per decode, on every event
        view = CHECKED.decode(raw)
        return Webhook(view.event_id, view.event_type, RESOURCE.decode(view.data), orjson.Fragment(raw), view.data, raw)
    except (msgspec.DecodeError, RecursionError):
        return _read_as_the_ingest(raw)


def _read_as_the_ingest(raw: bytes) -> Webhook | Route:
    """``data`` read as the ingest's :class:`Event` reads it, where the typed read refused it: an
    object first, in which the last of a key given twice wins whatever the others hold
    (``"status": 5, "status": "paid"``), then the Resource; kept as orjson writes that object, as
    the state's snapshot must read as that Resource again. Else the refusal, in schema.typed's words."""
    view = schema.typed(CHECKED, raw)
    if isinstance(view, Refusal):
        return refused(raw, view)
    try:
        data = msgspec.json.decode(view.data)
    except (msgspec.DecodeError, RecursionError):
        return refused(raw, Refusal("not_json", "data: not JSON"))
    resource = schema.convert(data, Resource, "data")
    if isinstance(resource, Refusal):
        return refused(raw, resource)
    return Webhook(view.event_id, view.event_type, resource, orjson.Fragment(raw), msgspec.Raw(orjson.dumps(data)), raw)


def accept(event: Event) -> Resource | Route:
    """The resource of a body the schema took, or the quarantine Route where it goes instead."""
    resource_id = valid_id(event.data.get("id"))
    hint = f"{name}:{resource_id}" if resource_id is not None else None

    def quarantine(code: str, reason: str) -> Route:
        return Route.quarantine(code, reason, event.event_id, event.event_type, hint)

    if event.event_type not in EVENT_TYPES:
        return quarantine("unknown_type", f"event_type: unknown event type {event.event_type!r}")
    resource = schema.convert(event.data, StrictResource, "data")
    if isinstance(resource, Refusal):
        return quarantine(resource.code, resource.reason)
    if resource.object != OBJECT_OF[event.event_type]:
        return quarantine("unknown_object", f"data.object: {resource.object!r} does not match {event.event_type}")
    if (problem := amount_error(event.data)) is not None:
        return quarantine("invalid", problem)
    return resource


def refused(raw: bytes, refusal: Refusal) -> Route:
    head = schema.lenient(HEAD, raw)
    if head is None:
        return Route.quarantine(refusal.code, refusal.reason)
    event_type, resource_id = valid_id(head.event_type), valid_id(field(head.data, "id"))
    if event_type is not None and event_type not in EVENT_TYPES:
        refusal = Refusal("unknown_type", f"event_type: unknown event type {event_type!r}")
    return Route.quarantine(refusal.code, refusal.reason, valid_id(head.event_id), event_type,
                            f"{name}:{resource_id}" if resource_id is not None else None)
