"""Typed records and headers carried by the topics, with their orjson codecs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import msgspec
import orjson

# Headers of every orderly.raw record. The value is the body bytes exactly as received.
H_GATEWAY = "gateway"
H_DELIVERY_ID = "delivery_id"
H_RECEIVED_AT = "received_at"  # unix milliseconds, as ASCII digits
H_SOURCE = "source"            # "webhook" (ingest) or "fetch" (fetcher's synced events)
H_CHECKED = "checked"          # CHECKED_VALUE: the ingest's adapter validated the body (else the worker checks it)
H_REASON = "reason"            # quarantine only
H_RECORD = "record"            # "correlation" on a merchant's correlation in orderly.raw; absent on webhooks
H_STAGE = "stage"              # quarantine only: ingest, worker, projector, effects, fetcher
H_RESOURCE = "resource_key"    # quarantine only: gateway:resource_id, when the record has one
H_TOPIC = "topic"              # quarantine only: the topic a projector's or effects' record came from
H_SOURCE_KEY = "source_key"    # quarantine only: that record's key
CORRELATION = "correlation"
# "2": the ingest's adapter took the body and found it JSON every reader of the log reads (UTF-8,
# numbers within a double's range: limits.unreadable), so the worker reads it with one typed decode.
# "1", written by earlier builds, promised the first only: the worker checks such a record in full.
CHECKED_VALUE = b"2"
CHECKED = (H_CHECKED, CHECKED_VALUE)
# The ingest writes received_at as the milliseconds of its clock. A record appended some other way
# may carry anything there: the worker sets aside one that is not a time a timestamp column holds
# (0 .. 9999-12-31), and what reads the header elsewhere takes it as no time.
RECEIVED_MAX = 253_402_300_799_999


def received_ms(text: str | bytes) -> int:
    """The received_at header's milliseconds (``0`` when empty); ValueError if it holds no time."""
    received = int(text.decode() if isinstance(text, bytes) else text) if text else 0
    if not 0 <= received <= RECEIVED_MAX:
        raise ValueError(f"received_at header {str(received)[:24]}: not a time in milliseconds since 1970")
    return received


def received_ms_or_none(value: str | bytes | None) -> int | None:
    """:func:`received_ms` of a header that may be missing, empty or hold no time: None then."""
    try:
        return received_ms(value) if value else None
    except ValueError:  # UnicodeDecodeError too
        return None


def log_place(topic: str, partition: int, offset: int) -> str:
    """The delivery id of a record that names none (no delivery_id header, or an empty one): its place
    in the log. The worker decides it under this id, and the sweeper looks for its decision under it."""
    return f"{topic}:{partition}:{offset}"


def raw_headers(
    gateway: str, delivery_id: str, received_at_ms: int, source: str = "webhook"
) -> list[tuple[str, bytes]]:
    return [
        (H_GATEWAY, gateway.encode()),
        (H_DELIVERY_ID, delivery_id.encode()),
        (H_RECEIVED_AT, str(received_at_ms).encode()),
        (H_SOURCE, source.encode()),
    ]


def correlation_headers(gateway: str, delivery_id: str, received_at_ms: int) -> list[tuple[str, bytes]]:
    """Headers of a merchant's correlation appended to orderly.raw (pg's: key ``pg:{deposit_id}``)."""
    return [*raw_headers(gateway, delivery_id, received_at_ms, source="merchant"), (H_RECORD, CORRELATION.encode())]


def quarantine_headers(original: list[tuple[str, bytes]], stage: str, reason: str,
                       resource_key: str | None) -> list[tuple[str, bytes]]:
    """A set-aside record's headers: its own, with the stage that set it aside, why, and its resource."""
    kept = [(k, v or b"") for k, v in original if k not in (H_STAGE, H_REASON, H_RESOURCE)]  # a null value as empty
    extra = [(H_STAGE, stage.encode()), (H_REASON, reason.encode(errors="replace"))]
    if resource_key:
        extra.append((H_RESOURCE, resource_key.encode(errors="replace")))
    return kept + extra


def header_map(headers: list[tuple[str, bytes]] | tuple[tuple[str, bytes], ...]) -> dict[str, str]:
    return {k: v.decode() for k, v in headers}


@dataclass(frozen=True)
class Correlation:
    """The merchant's mapping for a pg deposit, registered when its create-deposit call returns."""

    pg_deposit_id: str
    merchant_reference: str
    our_order_id: str
    our_user_id: str

    def to_bytes(self) -> bytes:
        return orjson.dumps(asdict(self))

    @classmethod
    def from_bytes(cls, raw: bytes) -> Correlation:
        return cls(**orjson.loads(raw))


# What the worker writes to orderly.effects, orderly.facts and orderly.decisions, and the projector,
# the effects recorder and replay read back: one definition for both sides. Not frozen: the worker
# builds one or more per record, and a frozen dataclass's __init__ sets each field through
# object.__setattr__ (five times the cost: a tenth of the decision path); nothing mutates them
# after the core has numbered them.
@dataclass
class Effect:
    dedupe_key: str
    type: str
    gateway: str
    resource_id: str
    payload: dict[str, Any]
    caused_by: str  # the delivery id whose applied transition emitted it

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_bytes(self) -> bytes:
        return orjson.dumps(self)


@dataclass
class Fact:
    """An append-only fact, keyed by its own id (leg_ref, btxn_id, claim_id, note key)."""

    kind: str
    key: str
    data: dict[str, Any]


@dataclass
class Decision:
    delivery_id: str
    gateway: str
    resource_id: str
    outcome: str
    received_at_ms: int
    seq: int
    event_id: str | None = None
    event_type: str | None = None
    sequence: int | None = None  # the gateway's global sequence (pg), for gap tracking
    row: Mapping[str, Any] | None = None  # the read-model row after an applied transition
    table: str | None = None  # the read-model table ``row`` belongs to
    effects: list[Effect] = field(default_factory=list)
    facts: list[Fact] = field(default_factory=list)
    payload: Any = None  # the event as the gateway sent it (the worker writes its bytes), for the timeline
    error: str | None = None

    def to_bytes(self) -> bytes:
        return orjson.dumps(self)  # orjson serialises dataclasses natively, without asdict's deep copy

    @staticmethod
    def from_bytes(raw: bytes) -> Decision:
        return DECISIONS.decode(raw)


# float_hook: Python's float() reads a payload's number of 1e289 or more at its usual speed, where
# msgspec takes 7 µs (the ingest refuses such numbers now; a log written before may still hold them).
DECISIONS = msgspec.json.Decoder(Decision, float_hook=float)


class ProjectedDecision(msgspec.Struct):
    """A decision as the projector reads it: Decision's fields (tests/unit/test_projected_decision.py
    holds them alike), its payload kept as the JSON bytes written, which go to PostgreSQL's jsonb as
    they are where it takes them (app/projector.py _payload_json): reading the gateway's event into
    Python objects and writing it again cost 2.0 µs a pg decision, against 1.0 µs now."""

    delivery_id: str
    gateway: str
    resource_id: str
    outcome: str
    received_at_ms: int
    seq: int
    event_id: str | None = None
    event_type: str | None = None
    sequence: int | None = None
    row: dict[str, Any] | None = None
    table: str | None = None
    effects: list[Effect] = msgspec.field(default_factory=list)
    facts: list[Fact] = msgspec.field(default_factory=list)
    payload: msgspec.Raw = msgspec.field(default_factory=lambda: msgspec.Raw(b"null"))
    error: str | None = None


PROJECTED = msgspec.json.Decoder(ProjectedDecision, float_hook=float)
EFFECTS = msgspec.json.Decoder(Effect, float_hook=float)
