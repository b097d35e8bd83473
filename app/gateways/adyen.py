"""The `adyen` gateway: Adyen's standard webhooks, each notification item signed and routed on its
own (pure layer; docs/gateways/adyen.md states every rule with its source).

A request holds ``notificationItems``; each item's ``additionalData.hmacSignature`` is
``base64(HMAC-SHA256(bytes.fromhex(key), "pspReference:originalReference:merchantAccountCode:
merchantReference:amount.value:amount.currency:eventCode:success"))``. The ingest verifies every item
(:func:`verify`), then stores each one as its own record (:func:`split`): the record's value is the
item's ``NotificationRequestItem`` object, the exact bytes it had in the body, so its signature can be
checked again at replay. :func:`route` and :func:`read` take such an item record.

Resource: the payment's ``pspReference`` — an ``AUTHORISATION``'s own; every other item must carry it
as ``originalReference`` (quarantined without it). Ordering: see
app/core/adyen.py.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

import msgspec
import orjson
from msgspec import Meta

from app.gateways import limits, schema
from app.gateways.base import Route, SignatureError, any_match, header, hmac_sha256
from app.gateways.limits import ID_MAX, NOT_DOTS, IdText, IsoText, Minor, Text
from app.gateways.schema import Body, Refusal, require_ids, require_times, valid_id

name = "adyen"
# The event codes Orderly decides (docs/gateways/adyen.md, Decisions); any other is quarantined.
EVENT_CODES = frozenset({
    "AUTHORISATION", "CAPTURE", "CAPTURE_FAILED", "REFUND", "REFUND_FAILED", "CANCELLATION",
    "CANCEL_OR_REFUND", "NOTIFICATION_OF_CHARGEBACK", "CHARGEBACK", "CHARGEBACK_REVERSED", "SECOND_CHARGEBACK",
})
ACCEPTED = b"[accepted]"  # the success answer Adyen's older configurations look for (any 2xx is accepted)
BASIC_AUTH_SETTING = "adyen_basic_auth"  # the Settings attribute holding `user:password`, when set
SIGNED = ("pspReference", "originalReference", "merchantAccountCode", "merchantReference")

Reference = Annotated[str, Meta(max_length=ID_MAX, pattern=NOT_DOTS)]  # may be empty: Adyen signs a missing field as ""
Reason = Annotated[str, Meta(max_length=1000)]
MAX_ITEMS = 6  # Adyen's JSON/HTTP POST webhooks carry one item, SOAP ones at most six [W]
RECAPTURED = "recaptured"  # in the reason of Adyen's CAPTURE that re-captures a failed one [F]


def secret_key(secret: str) -> bytes:
    """The HMAC key: Adyen's key is shown as hex in the Customer Area and used as its bytes."""
    try:
        key = bytes.fromhex(secret.strip())
    except ValueError:
        raise ValueError("adyen secret is not a hex key") from None
    if not key:
        raise ValueError("adyen secret is an empty key")
    return key


# --- signatures --------------------------------------------------------------------------------

class _SignedAmount(msgspec.Struct):
    value: Any = None
    currency: Any = None


class _SignedExtra(msgspec.Struct):
    hmacSignature: Any = None


class _SignedItem(msgspec.Struct):
    """An item read only for what its signature covers (any types: a wrong one fails the check)."""

    pspReference: Any = None
    originalReference: Any = None
    merchantAccountCode: Any = None
    merchantReference: Any = None
    amount: _SignedAmount | None = None
    eventCode: Any = None
    success: Any = None
    additionalData: _SignedExtra | None = None


class _SignedWrapper(msgspec.Struct):
    NotificationRequestItem: _SignedItem


class _SignedBody(msgspec.Struct):
    notificationItems: list[_SignedWrapper]


_SIGNED = msgspec.json.Decoder(_SignedBody, float_hook=limits.FLOAT_HOOK)


def _text(field: str, value: Any) -> str:
    """A signed field as it is signed: a string as is, an integer in decimal, missing as ""."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise SignatureError(f"{field} is neither text nor an integer: cannot be signed")


def signing_string(item: _SignedItem) -> bytes:
    amount = item.amount or _SignedAmount()
    parts = [_text(f, getattr(item, f)) for f in SIGNED]
    parts += [_text("amount.value", amount.value), _text("amount.currency", amount.currency),
              _text("eventCode", item.eventCode), _text("success", item.success)]
    return ":".join(parts).encode()


def _offered(item: _SignedItem) -> list[bytes]:
    """The item's signatures (one, or several comma-separated during a key change)."""
    value = item.additionalData.hmacSignature if item.additionalData is not None else None
    if not isinstance(value, str) or not value:
        raise SignatureError("additionalData.hmacSignature missing")
    found = []
    for entry in value.split(","):
        try:
            found.append(base64.b64decode(entry.strip(), validate=True))
        except (binascii.Error, ValueError):
            continue
    if not found:
        raise SignatureError("additionalData.hmacSignature is not base64")
    return found


def _keys(secrets: tuple[str, ...]) -> list[bytes]:
    keys = []
    for secret in secrets:
        try:
            keys.append(secret_key(secret))
        except ValueError:
            continue  # refused at start (app/ingest/app.py); never a 500 here
    if not keys:
        raise SignatureError("no hex key configured for adyen")
    return keys


def verify(raw: bytes, headers: Mapping[str, str], secrets: tuple[str, ...], now: float) -> None:
    """Every item's signature (any of the keys); one that fails refuses the whole request."""
    keys = _keys(secrets)
    try:
        try:
            body = _SIGNED.decode(raw)
        except RecursionError:  # an unsigned field nested past what the decoder reads: the signed
            body = _SIGNED.decode(pruned(raw))  # ones are shallow, split() quarantines the body
    except (msgspec.DecodeError, RecursionError):
        raise SignatureError("not an Adyen notification: no notificationItems to verify") from None
    if not body.notificationItems:
        raise SignatureError("notificationItems is empty: nothing signed")
    for i, wrapper in enumerate(body.notificationItems):
        item = wrapper.NotificationRequestItem
        message = signing_string(item)
        if not any_match([hmac_sha256(k, message) for k in keys], _offered(item)):
            raise SignatureError(f"notificationItems[{i}]: no hmacSignature matches")


_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')  # a JSON string (skipped) or a bracket
PRUNE_DEPTH = 64


def pruned(raw: bytes) -> bytes:
    """``raw`` with every value nested deeper than PRUNE_DEPTH replaced by ``null``, without
    recursion (a regular expression finds the strings and brackets), so the shallow signed fields
    of a body nested past any decoder's recursion can still be read."""
    parts, depth, start, last = [], 0, -1, 0
    for match in _TOKEN.finditer(raw):
        char = raw[match.start()]
        if char in b"[{":
            depth += 1
            if depth == PRUNE_DEPTH + 1:
                start = match.start()
        elif char in b"]}":
            if depth == PRUNE_DEPTH + 1 and start >= 0:
                parts += [raw[last:start], b"null"]
                last, start = match.end(), -1
            depth -= 1
    parts.append(raw[last:])
    return b"".join(parts)


def check_basic_auth(headers: Mapping[str, str], credential: str) -> None:
    """HTTP Basic auth on the route (optional, ORDERLY_ADYEN_BASIC_AUTH), compared in constant time."""
    offered = header(headers, "Authorization") or ""
    expected = "Basic " + base64.b64encode(credential.encode()).decode()
    if not hmac.compare_digest(offered.encode(), expected.encode()):
        raise SignatureError("basic auth missing or wrong")


def sign_item(item: Mapping[str, Any], secret: str) -> str:
    """The ``hmacSignature`` of one ``NotificationRequestItem`` (the simulator's and the tests')."""
    decoded = msgspec.convert(item, _SignedItem)
    return base64.b64encode(hmac_sha256(secret_key(secret), signing_string(decoded))).decode()


def sign_body(items: list[dict[str, Any]], secret: str, live: str = "false") -> bytes:
    """A request body carrying ``items``, each signed (``additionalData.hmacSignature`` set)."""
    wrapped = []
    for item in items:
        extra = dict(item.get("additionalData") or {})
        extra["hmacSignature"] = sign_item(item, secret)
        wrapped.append({"NotificationRequestItem": {**item, "additionalData": extra}})
    return orjson.dumps({"live": live, "notificationItems": wrapped})


def sign_request(raw: bytes, secret: str) -> bytes:
    """``raw`` with every item signed by ``secret`` (the simulator's deliverer): a notification body,
    or one item as the ingest stores it, sent in a request of its own."""
    body = orjson.loads(raw)
    if "notificationItems" not in body:
        return sign_body([body], secret)
    items = [w["NotificationRequestItem"] for w in body["notificationItems"]]
    return sign_body(items, secret, body.get("live", "false"))


def signed_headers(raw: bytes, secret: str, now: float) -> dict[str, str]:
    """Adyen signs inside the body (:func:`sign_body`): no header to add."""
    return {}


# --- schema and routing ------------------------------------------------------------------------

class Amount(Body):
    value: Minor
    currency: Text


class Extra(Body):
    hmacSignature: str | None = None


class Item(Body):
    """Every field app/core/adyen.py and the projector read (DESIGN.md §2.4; [O]'s required fields)."""

    pspReference: IdText
    eventCode: Text
    eventDate: IsoText  # the ordering key
    success: Literal["true", "false"]
    amount: Amount
    merchantAccountCode: Reference
    merchantReference: Reference
    originalReference: Reference | None = None
    reason: Reason | None = None  # unsigned: only marks Adyen's re-capture of a failed capture
    additionalData: Extra | None = None

    def __post_init__(self) -> None:
        if not (self.pspReference.isprintable() and self.eventCode.isprintable()
                and (self.originalReference or "").isprintable() and self.merchantReference.isprintable()):
            require_ids(pspReference=self.pspReference, eventCode=self.eventCode,
                        originalReference=self.originalReference, merchantReference=self.merchantReference)
        require_times(eventDate=self.eventDate)

    @property
    def payment(self) -> str:
        """The payment this item is about (docs/gateways/adyen.md, Resource key)."""
        return self.originalReference or self.pspReference  # none: an AUTHORISATION (else quarantined)

    @property
    def recapture(self) -> bool:
        """Adyen's re-capture of a capture that failed ("Transaction Recaptured" / "Auto-recaptured" [F])."""
        return self.eventCode == "CAPTURE" and RECAPTURED in (self.reason or "").lower()

    @property
    def event_id(self) -> str:
        """The dedupe key, from signed fields only: a resend is the same item. Not ``eventDate``
        (unsigned: one captured item replayed with other dates would be as many items); a re-capture of
        the same pspReference is told apart by its reason (docs/gateways/adyen.md, Dedupe)."""
        amount = self.amount
        key = f"{self.pspReference}:{self.eventCode}:{self.success}:{amount.value}:{amount.currency}"
        return f"{key}:{RECAPTURED}" if self.recapture else key


class _Wrapper(Body):
    NotificationRequestItem: msgspec.Raw


class _Envelope(Body):
    notificationItems: list[_Wrapper]


class Notification(msgspec.Struct, frozen=True, gc=False):
    """An item record read once, for the worker: the typed item, and its bytes (``payload`` wraps
    them for the decisions, which carry them unchanged)."""

    item: Item
    payload: orjson.Fragment  # the body's bytes as received (orjson checked them): decisions carry them as they are
    raw: bytes


class _Head(msgspec.Struct):
    pspReference: Any = None
    originalReference: Any = None
    eventCode: Any = None


ITEM = msgspec.json.Decoder(Item)
ENVELOPE = msgspec.json.Decoder(_Envelope)
HEAD = msgspec.json.Decoder(_Head, float_hook=limits.FLOAT_HOOK)


def split(raw: bytes) -> list[tuple[bytes, Route]]:
    """A verified body as its records: each item's own bytes and where they go. The limits (depth,
    64-bit integers, NUL) apply to each item on its own (route()): one bad item is quarantined alone."""
    try:
        envelope = ENVELOPE.decode(raw)
    except msgspec.ValidationError as exc:
        return [(raw, Route.quarantine("invalid", schema.readable(str(exc))))]
    except RecursionError:
        return [(raw, Route.quarantine("invalid", "body: JSON nests deeper than its items can be read"))]
    except msgspec.DecodeError:
        return [(raw, Route.quarantine("not_json", "body is not JSON"))]
    if (count := len(envelope.notificationItems)) > MAX_ITEMS:
        return [(raw, Route.quarantine("too_many_items",
                                       f"notificationItems: {count} items, at most {MAX_ITEMS} in one request"))]
    parts = []
    for i, wrapper in enumerate(envelope.notificationItems):
        item = bytes(wrapper.NotificationRequestItem)
        found = route(item)
        if found.resource_key is None and found.quarantine_reason is not None:
            found = Route.quarantine(found.quarantine_code or "invalid",
                                     f"notificationItems[{i}].NotificationRequestItem.{found.quarantine_reason}",
                                     found.event_id, found.event_type, found.resource_hint)
        parts.append((item, found))
    return parts


def route(raw: bytes) -> Route:
    """Where one item record goes (never raises)."""
    item = schema.decode(ITEM, raw)
    if isinstance(item, Refusal):
        return refused(raw, item)
    return accept(item)


def accept(item: Item) -> Route:
    key = f"{name}:{item.payment}"
    if item.eventCode not in EVENT_CODES:
        return Route.quarantine("unknown_type", f"eventCode: {item.eventCode!r} is not handled", item.event_id,
                                item.eventCode, key)
    if item.eventCode != "AUTHORISATION" and not item.originalReference:
        # its own pspReference is the modification's or the dispute's: keyed by it, it would park
        # for ever under a payment that never comes (docs/gateways/adyen.md, Resource key)
        return Route.quarantine("invalid", f"originalReference: required for {item.eventCode}", item.event_id,
                                item.eventCode, key)
    return Route(key, item.event_id, item.eventCode)


def refused(raw: bytes, refusal: Refusal) -> Route:
    head = schema.lenient(HEAD, raw)
    if head is None:
        return Route.quarantine(refusal.code, refusal.reason)
    payment = valid_id(head.originalReference) or valid_id(head.pspReference)
    return Route.quarantine(refusal.code, refusal.reason, None, valid_id(head.eventCode),
                            f"{name}:{payment}" if payment is not None else None)


def read(raw: bytes, checked: bool) -> Notification | Route:
    """The worker's one read of an item record (``checked``: the ingest's adapter took it already)."""
    if not checked and (refusal := schema.whole(raw)) is not None:
        return refused(raw, refusal)
    item = schema.typed(ITEM, raw)
    if isinstance(item, Refusal):
        return refused(raw, item)
    if not checked and (found := accept(item)).resource_key is None:
        return found
    return Notification(item, orjson.Fragment(raw), raw)
