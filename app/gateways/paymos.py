"""The `paymos` gateway: X-Paymos-Signature verification and routing by the resource in ``data``.

Routing is on the exact ``event_type`` (18 known); the resource id comes from ``data.id``, never
from an id prefix. Ordering key: ``data.updated_at`` with the state-machine rank as tie-breaker.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import msgspec

from app.core.paymos import AMOUNT_FIELD
from app.gateways import schema
from app.gateways.base import Route, SignatureError, any_match, hmac_sha256
from app.gateways.limits import DECIMAL_MAX, IdText, Text, UnixMs, UnixS
from app.gateways.schema import Body, Refusal, field, require_ids, valid_id

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
    value = headers.get(SIGNATURE_HEADER)
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


# Crypto amounts are decimal strings end to end. app/core/paymos.py treats every field of ``data``
# whose name holds one of these words as an amount (and refuses a float anywhere in ``data``): the
# adapter applies the same rule, so what it accepts the core can apply.
AMOUNT_NAME = AMOUNT_FIELD
DECIMAL = re.compile(r"-?[0-9]+(\.[0-9]+)?")


class Resource(Body):
    """The fields of ``data`` app/core/paymos.py and the projector read (DESIGN.md §2.4)."""

    id: IdText  # the resource: inv_…, wdr_…, pcd_…
    object: Text
    status: Text
    is_final: bool
    updated_at: UnixMs  # the ordering key
    paid_late_at: UnixS | None = None  # invoice.paid_late: Unix seconds, says the document

    def __post_init__(self) -> None:
        require_ids(id=self.id)


class Event(Body):
    event_id: IdText
    event_type: Text
    data: dict[str, Any]  # converted to Resource; kept whole for the amount rule
    created_at: UnixMs | None = None

    def __post_init__(self) -> None:
        require_ids(event_id=self.event_id, event_type=self.event_type)


class Head(msgspec.Struct):
    """What a refused body may still tell: its ids, read without types."""

    event_id: Any = None
    event_type: Any = None
    data: Any = None


DECODER = msgspec.json.Decoder(Event)
HEAD = msgspec.json.Decoder(Head)


def amount_error(data: dict[str, Any]) -> str | None:
    for key, value in data.items():
        if isinstance(value, float):
            return f"data.{key}: a float; crypto amounts are decimal strings"
        if value is not None and AMOUNT_NAME.search(key) and not (
                isinstance(value, str) and len(value) <= DECIMAL_MAX and DECIMAL.fullmatch(value)):
            return f"data.{key}: expected a decimal string of at most {DECIMAL_MAX} characters"
    return None


def route(raw: bytes) -> Route:
    event = schema.decode(DECODER, raw)
    if isinstance(event, Refusal):
        return refused(raw, event)
    resource_id = valid_id(event.data.get("id"))
    hint = f"{name}:{resource_id}" if resource_id is not None else None

    def quarantine(code: str, reason: str) -> Route:
        return Route.quarantine(code, reason, event.event_id, event.event_type, hint)

    if event.event_type not in EVENT_TYPES:
        return quarantine("unknown_type", f"event_type: unknown event type {event.event_type!r}")
    resource = schema.convert(event.data, Resource, "data")
    if isinstance(resource, Refusal):
        return quarantine(resource.code, resource.reason)
    if resource.object != OBJECT_OF[event.event_type]:
        return quarantine("unknown_object", f"data.object: {resource.object!r} does not match {event.event_type}")
    if (problem := amount_error(event.data)) is not None:
        return quarantine("invalid", problem)
    return Route(f"{name}:{resource.id}", event.event_id, event.event_type)


def refused(raw: bytes, refusal: Refusal) -> Route:
    head = schema.lenient(HEAD, raw)
    if head is None:
        return Route.quarantine(refusal.code, refusal.reason)
    event_type, resource_id = valid_id(head.event_type), valid_id(field(head.data, "id"))
    if event_type is not None and event_type not in EVENT_TYPES:
        refusal = Refusal("unknown_type", f"event_type: unknown event type {event_type!r}")
    return Route.quarantine(refusal.code, refusal.reason, valid_id(head.event_id), event_type,
                            f"{name}:{resource_id}" if resource_id is not None else None)
