"""The `pg` gateway: PG-Signature verification and routing by object kind (pure layer).

Ordering: deposits and withdrawals carry ``data.object.version`` (unique per object, increasing in
the order the state changed); balance transactions have none and are deduped on their id.
``sequence`` is global per merchant and only feeds gap detection.
"""

from __future__ import annotations

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

name = "pg"
SIGNATURE_HEADER = "PG-Signature"
# The object kind decides the path, never the event type or an id prefix.
OBJECT_KINDS = frozenset({"deposit", "withdrawal", "balance_transaction"})


def parse_signature_header(value: str) -> tuple[str, list[bytes]]:
    timestamp: str | None = None
    signatures: list[bytes] = []
    for part in value.split(","):
        key, sep, item = part.strip().partition("=")
        if not sep:
            continue
        if key == "t":
            if timestamp is not None:
                raise SignatureError("PG-Signature carries two timestamps")
            timestamp = item
        elif key == "v1":
            try:
                signatures.append(bytes.fromhex(item))
            except ValueError:
                continue  # a malformed entry proves nothing; another entry may still match
    if timestamp is None:
        raise SignatureError("PG-Signature has no t=")
    if not signatures:
        raise SignatureError("PG-Signature has no v1= signature")
    return timestamp, signatures


def sign(raw: bytes, secret: str, timestamp: int) -> str:
    """The header value the gateway sends (used by the simulator and the tests)."""
    digest = hmac_sha256(secret.encode(), f"{timestamp}.".encode() + raw).hex()
    return f"t={timestamp},v1={digest}"


def verify(raw: bytes, headers: Mapping[str, str], secrets: tuple[str, ...], now: float) -> None:
    value = headers.get(SIGNATURE_HEADER)
    if not value:
        raise SignatureError("missing PG-Signature header")
    timestamp, offered = parse_signature_header(value)
    check_timestamp(timestamp, now)
    signed = f"{timestamp}.".encode() + raw
    if not any_match([hmac_sha256(s.encode(), signed) for s in secrets], offered):
        raise SignatureError("no PG-Signature v1 matches")


def route(raw: bytes) -> Route:
    env = envelope(raw, "id", "type")
    if isinstance(env, Route):
        return env
    kind = text_field(env.body, "data", "object", "object")
    if kind not in OBJECT_KINDS:
        return env.quarantine("unknown_object", f"unknown object kind {kind!r}")
    resource_id = text_field(env.body, "data", "object", "id")
    if resource_id is None:
        return env.quarantine("missing_fields", "data.object.id missing")
    return Route(f"{name}:{resource_id}", env.event_id, env.event_type)
