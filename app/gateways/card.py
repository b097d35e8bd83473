"""The `card` gateway: Standard Webhooks verification and routing by payment_ref (pure layer).

Ordering key: ``sequence`` when present, else ``(occurred_at, rank)`` — see app/core/card.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import msgspec
import orjson

from app.gateways import limits, schema
from app.gateways.base import Route, SignatureError, any_match, check_timestamp, header, hmac_sha256
from app.gateways.limits import IdText, IsoText, Minor, Seq, TakenId, Text, int64_error
from app.gateways.schema import Body, Refusal, require_ids, require_times, valid_id

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


def signed_headers(raw: bytes, secret: str, now: float) -> dict[str, str]:
    """The headers the gateway sends with ``raw`` (the simulator's and the tests'): a fresh message id."""
    msg_id = "msg_" + hashlib.sha256(raw + str(now).encode()).hexdigest()[:16]
    return {"webhook-id": msg_id, "webhook-timestamp": str(int(now)),
            "webhook-signature": sign(raw, secret, msg_id, int(now))}


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
    msg_id = header(headers, "webhook-id")
    timestamp = header(headers, "webhook-timestamp")
    value = header(headers, "webhook-signature")
    if not msg_id or not value:
        raise SignatureError("missing webhook-id or webhook-signature header")
    check_timestamp(timestamp, now)
    offered = _offered(value)
    if not offered:
        raise SignatureError("webhook-signature has no v1 entry")
    signed = f"{msg_id}.{timestamp}.".encode() + raw
    if not any_match([hmac_sha256(secret_key(s), signed) for s in secrets], offered):
        raise SignatureError("no webhook-signature v1 matches")


class Fields(Body):
    """Every field app/core/card.py and the projector read (DESIGN.md §2.4), with the checks msgspec
    makes in C but the ids' dots pattern; :class:`Event` adds that pattern and the checks made in Python."""

    id: TakenId
    type: Text
    payment_ref: TakenId
    occurred_at: IsoText  # the ordering key when a payment's events lack a sequence
    sequence: Seq | None = None
    amount_minor: Minor = 0
    currency: Text | None = None


def check(event: Fields) -> None:
    """The checks made in Python (a ValueError names the field): printable ids, a time in range."""
    if not (event.id.isprintable() and event.type.isprintable() and event.payment_ref.isprintable()):
        require_ids(id=event.id, type=event.type, payment_ref=event.payment_ref)  # which one, by name
    require_times(occurred_at=event.occurred_at)


class Event(Fields):
    """A webhook's body as the ingest checks it."""

    id: IdText
    payment_ref: IdText

    def __post_init__(self) -> None:
        check(self)


class Synced(Body):
    """A fetched answer's state and totals (app/fetcher.py writes them, in this order)."""

    state: str | None = None
    authorised_minor: Minor = 0
    captured_minor: Minor = 0
    refunded_minor: Minor = 0


class Fetched(Fields):
    """What the worker reads of a card record the ingest checked (or the fetcher wrote): a webhook,
    or the fetcher's ``synced`` answer. The ingest's Python checks and dots pattern are not made again.
    ``synced`` is kept as the document holds it (any JSON value), as the state has always stored it:
    only a ``synced`` event's is read, by the reducer (:func:`synced_totals`); on a webhook it is one
    more field the gateway may add, which the ingest's schema skips and so must the worker's."""

    synced: Any = None


class Stored(Body):
    """A record the ingest or the fetcher checked already, read for only what the reducer uses: what
    the worker falls back to when the strict schema refuses such a record (one appended by an older
    release, or the fetcher's ``synced`` answer for a ref long enough to take its derived id past
    the ids' 200 characters), so that a record once acknowledged is decided, not set aside."""

    id: str
    type: str
    payment_ref: str
    occurred_at: str
    sequence: Seq | None = None  # the money and the order keep their limits: the read models hold them
    amount_minor: Minor = 0
    currency: str | None = None
    synced: Any = None


def synced_totals(value: Any) -> Synced:
    """A ``synced`` event's state and totals (app/fetcher.py writes them); raises ValueError when
    they are not of that shape, which sets the record aside with the reason."""
    try:
        return msgspec.convert(value, Synced)
    except msgspec.ValidationError as exc:
        raise ValueError(f"synced: {exc}") from None


class Unchecked(Fetched):
    """A record no adapter took yet (an older log, a direct append): the ingest's checks, on the
    same read."""

    id: IdText
    payment_ref: IdText

    def __post_init__(self) -> None:
        check(self)


class Webhook(msgspec.Struct, frozen=True, gc=False):
    """A card body read once, for the worker: the typed event, and the body as received
    (``payload``), which decisions carry unchanged."""

    event: Fetched | Stored
    payload: orjson.Fragment  # the body's bytes as received (checked): decisions carry them as they are
    raw: bytes


class Head(msgspec.Struct):
    """What a refused body may still tell: its ids, read without types."""

    id: Any = None
    type: Any = None
    payment_ref: Any = None


DECODER = msgspec.json.Decoder(Event)
HEAD = msgspec.json.Decoder(Head, float_hook=limits.FLOAT_HOOK)
FETCHED = msgspec.json.Decoder(Fetched)
STORED = msgspec.json.Decoder(Stored)
UNCHECKED = msgspec.json.Decoder(Unchecked)


def route(raw: bytes) -> Route:
    event = schema.decode(DECODER, raw)
    if isinstance(event, Refusal):
        return refused(raw, event)
    return accept(event)


def read(raw: bytes, checked: bool) -> Webhook | Route:
    """The worker's one read of a record's body; ``checked``: the ingest's adapter took it already,
    or the fetcher wrote it (else the same checks as :func:`route`). A quarantine Route if refused."""
    if not checked:
        strict = schema.decode(UNCHECKED, raw)
        if isinstance(strict, Refusal):
            return refused(raw, strict)
        route = accept(strict)
        return Webhook(strict, orjson.Fragment(raw), raw) if route.resource_key is not None else route
    event: Fetched | Stored | Refusal = schema.typed(FETCHED, raw)
    if isinstance(event, Refusal):
        event = schema.typed(STORED, raw)
    if isinstance(event, Refusal):
        return refused(raw, event)
    return Webhook(event, orjson.Fragment(raw), raw)


def accept(event: Fields) -> Route:
    """Where a body the schema took goes."""
    if event.type not in EVENT_TYPES:
        return Route.quarantine("unknown_type", f"type: unknown event type {event.type!r}", event.id, event.type,
                                f"{name}:{event.payment_ref}")
    return Route(f"{name}:{event.payment_ref}", event.id, event.type)


def refused(raw: bytes, refusal: Refusal) -> Route:
    head = schema.lenient(HEAD, raw)
    if head is None:
        return Route.quarantine(refusal.code, refusal.reason)
    event_type, payment_ref = valid_id(head.type), valid_id(head.payment_ref)
    if event_type is not None and event_type not in EVENT_TYPES:
        refusal = Refusal("unknown_type", f"type: unknown event type {event_type!r}")
    return Route.quarantine(refusal.code, refusal.reason, valid_id(head.id), event_type,
                            f"{name}:{payment_ref}" if payment_ref is not None else None)


FETCHED_STATES = {"created", "authorised", "captured", "refunded", "voided"}


def synced_event(ref: str, answer: object, now_ms: int) -> bytes:
    """The gateway's answer to ``GET /payments/{ref}`` as a raw ``synced`` event (the fetcher appends
    it, the reducer takes it as the new base); its id is derived from the ref, state and totals, so
    an unchanged repeat is a duplicate. ValueError when the answer is unusable."""
    if not isinstance(answer, dict):
        raise ValueError(f"the answer is not a JSON object: {type(answer).__name__}")
    totals = {k: answer.get(k) or 0 for k in ("authorised_minor", "captured_minor", "refunded_minor")}
    # money as the webhooks carry it: integers within signed 64 bits, never negative, never a float
    if answer.get("state") not in FETCHED_STATES or any(int64_error(k, v) or v < 0 for k, v in totals.items()):
        raise ValueError(f"unusable gateway answer for {ref}: {str(answer)[:300]}")
    if not isinstance(answer.get("currency"), str) or not 1 <= len(answer["currency"]) <= 8:
        raise ValueError(f"unusable currency in the gateway's answer for {ref}")
    event_id = "sync_{}_{}_{}_{}_{}".format(ref, answer["state"], *totals.values())
    return orjson.dumps({
        "id": event_id, "type": "synced", "payment_ref": ref, "sequence": None,
        "occurred_at": datetime.fromtimestamp(now_ms / 1000, UTC).isoformat().replace("+00:00", "Z"),
        "amount_minor": 0, "currency": answer.get("currency"),
        "synced": {"state": answer["state"], **totals}})
