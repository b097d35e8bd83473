"""The `card` gateway: Standard Webhooks verification and routing by payment_ref (pure layer).

Ordering key: ``sequence`` when present, else ``(occurred_at, rank)`` — see app/core/card.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping

from app.gateways.base import (
    Route,
    SignatureError,
    any_match,
    check_timestamp,
    envelope,
    hmac_sha256,
    text_field,
)

name = "card"
EVENT_TYPES = frozenset({"payment.authorised", "payment.captured", "payment.refunded", "payment.voided"})
SECRET_PREFIX = "whsec_"


def secret_key(secret: str) -> bytes:
    """The HMAC key of a Standard Webhooks secret: base64 after the ``whsec_`` prefix."""
    encoded = secret.removeprefix(SECRET_PREFIX)
    try:
        key = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("card secret is not base64 after 'whsec_'") from None
    if not key:
        raise ValueError("card secret decodes to an empty key")
    return key


def sign(raw: bytes, secret: str, msg_id: str, timestamp: int) -> str:
    digest = hmac_sha256(secret_key(secret), f"{msg_id}.{timestamp}.".encode() + raw)
    return "v1," + base64.b64encode(digest).decode()


def _offered(value: str) -> list[bytes]:
    found = []
    for entry in value.split():
        version, sep, b64 = entry.partition(",")
        if version != "v1" or not sep:
            continue  # other schemes (e.g. v1a asymmetric) are not ours to check
        try:
            found.append(base64.b64decode(b64, validate=True))
        except (binascii.Error, ValueError):
            continue
    return found


def verify(raw: bytes, headers: Mapping[str, str], secrets: tuple[str, ...], now: float) -> None:
    msg_id = headers.get("webhook-id")
    timestamp = headers.get("webhook-timestamp")
    value = headers.get("webhook-signature")
    if not msg_id or not value:
        raise SignatureError("missing webhook-id or webhook-signature header")
    check_timestamp(timestamp, now)
    offered = _offered(value)
    if not offered:
        raise SignatureError("webhook-signature has no v1 entry")
    signed = f"{msg_id}.{timestamp}.".encode() + raw
    if not any_match([hmac_sha256(secret_key(s), signed) for s in secrets], offered):
        raise SignatureError("no webhook-signature v1 matches")


def route(raw: bytes) -> Route:
    env = envelope(raw, "id", "type")
    if isinstance(env, Route):
        return env
    if env.event_type not in EVENT_TYPES:
        return env.quarantine("unknown_type", f"unknown event type {env.event_type!r}")
    payment_ref = text_field(env.body, "payment_ref")
    if payment_ref is None:
        return env.quarantine("missing_fields", "payment_ref missing")
    return Route(f"{name}:{payment_ref}", env.event_id, env.event_type)
