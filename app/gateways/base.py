"""What every gateway adapter gives the ingest: signature verification and routing (pure layer).

An adapter never does I/O and never reads a clock: ``now`` is an argument.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

TOLERANCE_S = 300  # both directions: a stale or a future timestamp is refused


class SignatureError(Exception):
    """The delivery is not proven to come from the gateway; answered 401, nothing stored."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Route:
    """Where a verified body goes: the raw log under its resource key, or quarantine with a reason."""

    resource_key: str | None = None
    event_id: str | None = None
    event_type: str | None = None
    quarantine_code: str | None = None  # a short, bounded label for metrics
    quarantine_reason: str | None = None  # the detail, stored with the record

    @classmethod
    def quarantine(cls, code: str, reason: str, event_id: str | None = None,
                   event_type: str | None = None) -> Route:
        return cls(quarantine_code=code, quarantine_reason=reason, event_id=event_id, event_type=event_type)


class Gateway(Protocol):
    name: str

    def verify(self, raw: bytes, headers: Mapping[str, str], secrets: tuple[str, ...], now: float) -> None: ...

    def route(self, raw: bytes) -> Route: ...


def hmac_sha256(key: bytes, message: bytes) -> bytes:
    return hmac.digest(key, message, "sha256")  # one-shot C implementation


def any_match(expected: list[bytes], offered: list[bytes]) -> bool:
    """True if any offered signature equals any expected one, comparing in constant time.

    Every pair is compared (no early exit) so the time taken does not reveal which secret or
    which signature came close.
    """
    matched = False
    for want in expected:
        for got in offered:
            matched |= hmac.compare_digest(want, got)
    return matched


def check_timestamp(raw_ts: str | None, now: float) -> None:
    if raw_ts is None or raw_ts == "":
        raise SignatureError("missing timestamp")
    try:
        ts = int(raw_ts)
    except ValueError:
        raise SignatureError("timestamp is not an integer") from None
    if abs(now - ts) > TOLERANCE_S:
        raise SignatureError("timestamp outside the 300 s tolerance")


def load_json_object(raw: bytes) -> dict[str, Any] | None:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return body if isinstance(body, dict) else None


def text_field(obj: Any, *path: str) -> str | None:
    """A non-empty string at ``path`` inside nested objects, else None."""
    for step in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(step)
    return obj if isinstance(obj, str) and obj else None


@dataclass(frozen=True)
class Envelope:
    """The fields every gateway's routing needs: the parsed body, its event id and type."""

    body: dict[str, Any]
    event_id: str
    event_type: str

    def quarantine(self, code: str, reason: str) -> Route:
        return Route.quarantine(code, reason, self.event_id, self.event_type)


def envelope(raw: bytes, id_field: str, type_field: str) -> Envelope | Route:
    """Parse a verified body far enough to route it, or say why it goes to quarantine."""
    body = load_json_object(raw)
    if body is None:
        return Route.quarantine("not_json", "body is not a JSON object")
    event_id, event_type = text_field(body, id_field), text_field(body, type_field)
    if event_id is None or event_type is None:
        return Route.quarantine("missing_fields", f"missing {id_field} or {type_field}", event_id, event_type)
    return Envelope(body, event_id, event_type)
