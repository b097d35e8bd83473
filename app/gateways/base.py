"""What every gateway adapter gives the ingest: signature verification and routing (pure layer).

An adapter never does I/O and never reads a clock: ``now`` is an argument.
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

TOLERANCE_S = 300  # both directions: a stale or a future timestamp is refused
# ASCII digits only: int() would also take "1_796_100_000", " 123", "+5" and "١٧٩٦", so one
# signature would verify under several spellings of its timestamp. 12 digits reach year 33658.
_TIMESTAMP = re.compile(r"[0-9]{1,12}")
REASON_MAX = 300  # a quarantine reason travels in a Kafka header and the HTTP answer


class SignatureError(Exception):
    """The delivery is not proven to come from the gateway; answered 401, nothing stored."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Route:
    """Where a verified body goes: the raw log under its resource key, or quarantine with a reason."""

    resource_key: str | None = None  # None exactly when the body goes to quarantine
    event_id: str | None = None
    event_type: str | None = None
    quarantine_code: str | None = None  # a short, bounded label for metrics
    quarantine_reason: str | None = None  # the detail (names the field), stored with the record
    # A quarantined body whose resource id is valid although another field is not: the key
    # ("gateway:resource_id") under which the record shows in that resource's timeline.
    resource_hint: str | None = None

    @classmethod
    def quarantine(cls, code: str, reason: str, event_id: str | None = None,
                   event_type: str | None = None, resource_hint: str | None = None) -> Route:
        return cls(quarantine_code=code, quarantine_reason=reason[:REASON_MAX], event_id=event_id,
                   event_type=event_type, resource_hint=resource_hint)


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


def header(headers: Mapping[str, str], name: str) -> str | None:
    """A signature header's value (None when absent). Every scheme's headers are ASCII: a value holding
    anything else (a byte that is not UTF-8, which the HTTP layers read as a surrogate escape that
    ``str.encode`` refuses) is refused here, by name, before an adapter encodes or compares it."""
    value = headers.get(name)
    if value is not None and not value.isascii():
        raise SignatureError(f"{name} header is not ASCII")
    return value


def check_timestamp(raw_ts: str | None, now: float) -> None:
    if raw_ts is None or raw_ts == "":
        raise SignatureError("missing timestamp")
    if not _TIMESTAMP.fullmatch(raw_ts):
        raise SignatureError("timestamp is not 1-12 ASCII digits")
    if abs(now - int(raw_ts)) > TOLERANCE_S:
        raise SignatureError("timestamp outside the 300 s tolerance")
