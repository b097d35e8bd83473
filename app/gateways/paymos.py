"""The `paymos` gateway: X-Paymos-Signature verification and routing by the resource in ``data``.

Routing is on the exact ``event_type`` (18 known); the resource id comes from ``data.id``, never
from an id prefix. Ordering key: ``data.updated_at`` with the state-machine rank as tie-breaker.
"""

from __future__ import annotations

from collections.abc import Mapping

from app.gateways.base import Route, SignatureError, any_match, envelope, hmac_sha256, text_field

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
    env = envelope(raw, "event_id", "event_type")
    if isinstance(env, Route):
        return env
    if env.event_type not in EVENT_TYPES:
        return env.quarantine("unknown_type", f"unknown event type {env.event_type!r}")
    resource_id = text_field(env.body, "data", "id")
    if resource_id is None:
        return env.quarantine("missing_fields", "data.id missing")
    if text_field(env.body, "data", "object") != OBJECT_OF[env.event_type]:
        return env.quarantine("unknown_object", f"data.object does not match {env.event_type}")
    return Route(f"{name}:{resource_id}", env.event_id, env.event_type)
