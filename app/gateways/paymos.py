"""The `paymos` gateway: X-Paymos-Signature verification and routing by the resource in ``data``.

Routing is on the exact ``event_type`` (18 known); the resource id comes from ``data.id``, never
from an id prefix. Ordering key: ``data.updated_at`` with the state-machine rank as tie-breaker.
"""

from __future__ import annotations

from collections.abc import Mapping

from app.gateways.base import Route, SignatureError, any_match, hmac_sha256, load_json_object, text_field

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


def route(raw: bytes) -> Route:
    body = load_json_object(raw)
    if body is None:
        return Route.quarantine("not_json", "body is not a JSON object")
    event_id = text_field(body, "event_id")
    event_type = text_field(body, "event_type")
    resource_id = text_field(body, "data", "id")
    if event_id is None or event_type is None:
        return Route.quarantine("missing_fields", "missing event_id or event_type", event_id, event_type)
    if event_type not in EVENT_TYPES:
        return Route.quarantine("unknown_type", f"unknown event type {event_type!r}", event_id, event_type)
    if resource_id is None:
        return Route.quarantine("missing_fields", "data.id missing", event_id, event_type)
    if text_field(body, "data", "object") != OBJECT_OF[event_type]:
        return Route.quarantine("unknown_object", f"data.object does not match {event_type}", event_id, event_type)
    return Route(f"{name}:{resource_id}", event_id, event_type)
