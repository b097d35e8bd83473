"""The `pg` gateway: PG-Signature verification and routing by object kind (pure layer).

Ordering: deposits and withdrawals carry ``data.object.version`` (unique per object, increasing in
the order the state changed); balance transactions have none and are deduped on their id.
``sequence`` is global per merchant and only feeds gap detection.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec
import orjson

from app.gateways import limits, schema
from app.gateways.base import Route, SignatureError, any_match, check_timestamp, header, hmac_sha256
from app.gateways.limits import IdText, Int64, IsoText, Minor, Seq, SmallCount, TakenId, Text
from app.gateways.schema import Body, Document, Refusal, field, require_ids, require_times, valid_id

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


def signed_headers(raw: bytes, secret: str, now: float) -> dict[str, str]:
    """The headers the gateway sends with ``raw`` (the simulator's and the tests')."""
    return {SIGNATURE_HEADER: sign(raw, secret, int(now))}


def sign(raw: bytes, secret: str, timestamp: int) -> str:
    """The header value the gateway sends (used by the simulator and the tests)."""
    digest = hmac_sha256(secret.encode(), f"{timestamp}.".encode() + raw).hex()
    return f"t={timestamp},v1={digest}"


def verify(raw: bytes, headers: Mapping[str, str], secrets: tuple[str, ...], now: float) -> None:
    value = header(headers, SIGNATURE_HEADER)
    if not value:
        raise SignatureError("missing PG-Signature header")
    timestamp, offered = parse_signature_header(value)
    check_timestamp(timestamp, now)
    signed = f"{timestamp}.".encode() + raw
    if not any_match([hmac_sha256(s.encode(), signed) for s in secrets], offered):
        raise SignatureError("no PG-Signature v1 matches")


# --- the envelope: every field app/core/pg.py and the projector read (DESIGN.md §2.4) ---------------
# Optional in the gateway's document stays optional here; money is minor units, never negative.


class Reason(Body):
    display_th: str | None = None
    display_en: str | None = None


class Review(Body):
    reasons: list[Reason] | None = None  # the core shows reasons[0].display_th


class Rejection(Body):
    display_th: str | None = None


class Overpayment(Body):
    """An immutable flag: appended to pg_deposit_overpayment_flags keyed on claim_id."""

    claim_id: TakenId | None = None
    cause: Text | None = None
    amount_minor: Minor | None = None
    slip_received_at: IsoText | None = None
    status: Text | None = None
    action_required: Text | None = None
    expected_response_at: IsoText | None = None


class Deposit(Body, tag_field="object", tag="deposit"):
    id: TakenId
    version: Int64
    status: Text
    is_terminal: bool | None = None
    late_slip_accepted_until: IsoText | None = None
    ordered_amount_minor: Minor | None = None
    transferred_amount_minor: Minor | None = None
    amount_received_minor: Minor | None = None
    fee_total_minor: Minor | None = None
    credited_amount_minor: Minor | None = None
    fee_breakdown: Any = None  # stored raw (jsonb); the body-wide limits cover it
    overpayment: Overpayment | None = None
    balance_transaction_id: TakenId | None = None
    clearing_available_at: IsoText | None = None
    partial: bool | None = None
    cancel_reason_code: Text | None = None
    review: Review | None = None
    rejection: Rejection | None = None


class PayoutMetadata(Body):
    payout_id: TakenId  # close_payout's key: the merchant's payout


class Withdrawal(Body, tag_field="object", tag="withdrawal"):
    id: TakenId
    version: Int64
    status: Text
    amount_total_minor: Minor
    remaining_minor: Minor
    metadata: PayoutMetadata
    filled_minor: Minor | None = None
    fee_total_minor: Minor | None = None
    fee_recognized_minor: Minor | None = None
    refunded_minor: Minor | None = None
    settled_splits: SmallCount | None = None


class Source(Body):
    id: TakenId | None = None


class BalanceTransaction(Body, tag_field="object", tag="balance_transaction"):
    id: TakenId
    type: Text
    direction: Text
    amount_minor: Minor
    created_at: IsoText
    bucket_from: Text | None = None
    bucket_to: Text | None = None
    source: Source | None = None
    balance_after: Int64 | None = None  # a snapshot, may be below zero


class Fill(Body):
    """One chunk of a withdrawal, appended to pg_withdrawal_fills keyed on leg_ref."""

    leg_ref: TakenId
    amount_minor: Minor
    sequence: SmallCount | None = None
    fee_recognized_minor: Minor | None = None
    settled_at: IsoText | None = None
    auto_confirm_at: IsoText | None = None
    balance_transaction_id: TakenId | None = None


class Data(Body):
    object: Deposit | Withdrawal | BalanceTransaction  # the object kind decides the path
    fill: Fill | None = None
    previous_attributes: dict[str, Any] | None = None


class Taken(Body):
    """A body as the worker reads a record the ingest took: every field the core and the projector
    read, typed and bounded in C; the ingest's checks made in Python and its ids' dots pattern
    (:class:`Event`) were made on these same bytes there, and are not made again."""

    id: TakenId
    type: Text
    data: Data
    sequence: Seq | None = None  # global per merchant: gap detection only


# --- the ingest's schema: the same fields, each id also matched against the dots pattern, and the
# checks msgspec cannot make in C (printable ids, times in range) in __post_init__. One subclass per
# struct: a field's position is its base's, so a refusal names the same field as it always did.


class StrictOverpayment(Overpayment):
    claim_id: IdText | None = None

    def __post_init__(self) -> None:
        require_ids(claim_id=self.claim_id)
        require_times(slip_received_at=self.slip_received_at, expected_response_at=self.expected_response_at)


class StrictDeposit(Deposit):
    id: IdText
    overpayment: StrictOverpayment | None = None
    balance_transaction_id: IdText | None = None

    def __post_init__(self) -> None:
        if not (self.id.isprintable() and (self.balance_transaction_id or "").isprintable()):
            require_ids(id=self.id, balance_transaction_id=self.balance_transaction_id)  # which one, by name
        if self.late_slip_accepted_until is not None or self.clearing_available_at is not None:
            require_times(late_slip_accepted_until=self.late_slip_accepted_until,
                          clearing_available_at=self.clearing_available_at)


class StrictPayoutMetadata(PayoutMetadata):
    payout_id: IdText

    def __post_init__(self) -> None:
        if not self.payout_id.isprintable():
            require_ids(payout_id=self.payout_id)


class StrictWithdrawal(Withdrawal):
    id: IdText
    metadata: StrictPayoutMetadata

    def __post_init__(self) -> None:
        if not self.id.isprintable():
            require_ids(id=self.id)


class StrictSource(Source):
    id: IdText | None = None

    def __post_init__(self) -> None:
        require_ids(id=self.id)


class StrictBalanceTransaction(BalanceTransaction):
    id: IdText
    source: StrictSource | None = None

    def __post_init__(self) -> None:
        require_ids(id=self.id)
        require_times(created_at=self.created_at)


class StrictFill(Fill):
    leg_ref: IdText
    balance_transaction_id: IdText | None = None

    def __post_init__(self) -> None:
        require_ids(leg_ref=self.leg_ref, balance_transaction_id=self.balance_transaction_id)
        require_times(settled_at=self.settled_at, auto_confirm_at=self.auto_confirm_at)


class StrictData(Data):
    object: StrictDeposit | StrictWithdrawal | StrictBalanceTransaction
    fill: StrictFill | None = None


class Event(Taken):
    """A webhook's body as the ingest checks it (and the worker, a record no adapter took)."""

    id: IdText
    data: StrictData

    def __post_init__(self) -> None:
        if not (self.id.isprintable() and self.type.isprintable()):
            require_ids(id=self.id, type=self.type)  # which one, by name


class Head(msgspec.Struct):
    """What a refused body may still tell: its ids, read without types."""

    id: Any = None
    type: Any = None
    data: Any = None


DECODER = msgspec.json.Decoder(Event)
HEAD = msgspec.json.Decoder(Head, float_hook=limits.FLOAT_HOOK)


class DataParts(Body):
    object: msgspec.Raw
    fill: msgspec.Raw = msgspec.Raw(b"null")


class Parts(Body):
    """``data.object`` and ``data.fill`` of a body the schema took, as their bytes."""

    data: DataParts


class Extras(Body):
    """What a deposit's row and facts carry of ``data.object`` as the gateway sent it."""

    overpayment: Any = None


TAKEN, PARTS, EXTRAS = msgspec.json.Decoder(Taken), msgspec.json.Decoder(Parts), msgspec.json.Decoder(Extras)
_NULL = msgspec.Raw(b"null")


class Webhook(msgspec.Struct, frozen=True, gc=False):
    """A pg body read once, for the worker: the typed event, the body as received (``payload``, which
    decisions carry unchanged), and ``data.object`` and ``data.fill`` as sent (their bytes)."""

    event: Taken
    payload: orjson.Fragment  # the body's bytes as received (checked): decisions carry them as they are
    object: msgspec.Raw  # the state keeps it as sent
    fill: msgspec.Raw | None
    raw: bytes

    def overpayment(self) -> Any:
        """``data.object.overpayment`` as sent, every field (None when it has none)."""
        return EXTRAS.decode(self.object).overpayment

    def fill_fields(self) -> Document | None:
        """``data.fill`` as sent, every field."""
        found: Document | None = msgspec.json.decode(self.fill) if self.fill is not None else None
        return found


def route(raw: bytes) -> Route:
    event = schema.decode(DECODER, raw)
    if isinstance(event, Refusal):
        return refused(raw, event)
    return accept(event)


def accept(event: Taken) -> Route:
    """Where a body the schema took goes."""
    return Route(f"{name}:{event.data.object.id}", event.id, event.type)


def read(raw: bytes, checked: bool) -> Webhook | Route:
    """The worker's one read of a record's body; ``checked``: the ingest's adapter took it already
    (else the same checks as :func:`route`). A quarantine Route if refused."""
    event: Taken | Refusal
    if not checked:
        event = schema.decode(DECODER, raw)
    else:
        try:  # the decoder called here, not through schema.typed: a call less on every event
            event = TAKEN.decode(raw)
        except (msgspec.DecodeError, RecursionError):
            event = schema.typed(TAKEN, raw)  # why, in its words
    if isinstance(event, Refusal):
        return refused(raw, event)
    parts = PARTS.decode(raw)  # the schema took the body: it has both, objects or null
    fill = parts.data.fill
    return Webhook(event, orjson.Fragment(raw), parts.data.object, None if fill == _NULL else fill, raw)


def refused(raw: bytes, refusal: Refusal) -> Route:
    head = schema.lenient(HEAD, raw)
    if head is None:
        return Route.quarantine(refusal.code, refusal.reason)
    kind, resource_id = field(head.data, "object", "object"), valid_id(field(head.data, "object", "id"))
    if not isinstance(kind, str) or kind not in OBJECT_KINDS:
        refusal = Refusal("unknown_object", f"data.object.object: unknown object kind {str(kind)[:40]!r}")
    return Route.quarantine(refusal.code, refusal.reason, valid_id(head.id), valid_id(head.type),
                            f"{name}:{resource_id}" if resource_id is not None else None)
