"""Hypothesis strategies of well-formed JSON webhook bodies, valid and hostile, for the five gateways.

DESIGN.md §2.4: a gateway, a bug in one, or whoever holds a leaked secret can send a validly signed
body of any shape. ``mutated()`` takes a valid event and breaks one field path the core or the
projector reads (a wrong JSON type, an integer past 64 bits or below zero, a float for money, nesting
past 32, a long / NUL / control-character id, a time outside 2000..2100, a missing required field),
or adds one hostile unknown field; ``valid_events()`` are events of every type, some padded to just
under 1 MiB; ``bodies()`` mixes both. Every item names its gateway, its bytes, the resource key
it is about while its resource id is valid, and the mutated path. Event and resource ids are unique
per generated body. ``signed_headers`` signs an item as its gateway would.

stripe: v1 snapshot events (docs/gateways/stripe.md). adyen: one ``NotificationRequestItem``, the
record the ingest stores for each item (docs/gateways/adyen.md); ``request_body`` wraps it in a
request and signs it as Adyen would, the signature being inside the body.
"""

from __future__ import annotations

import base64
import copy
import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from hypothesis import strategies as st

if TYPE_CHECKING:
    from app.settings import Settings

GATEWAYS = ("pg", "card", "paymos", "stripe", "adyen")
MAX_BODY = 1024 * 1024  # the ingest's limit (app/ingest/body.py): a padded body stays just under it
Path = tuple[str | int, ...]


@dataclass(frozen=True)
class Item:
    gateway: str
    body: bytes
    resource_key: str | None  # "gateway:resource_id" while the body's resource id is valid
    path: str | None = None  # the mutated field path, "data.object.review"; None: a valid event
    mutation: str = "valid"  # what was done to it, for failure messages

    @property
    def is_valid(self) -> bool:
        return self.path is None

    def __repr__(self) -> str:  # a padded body is a megabyte: show its head
        body = self.body if len(self.body) <= 600 else self.body[:600] + b"...(%d bytes)" % len(self.body)
        return f"Item({self.gateway!r}, {body!r}, resource_key={self.resource_key!r}, mutation={self.mutation!r})"


def signed_headers(item: Item, settings: Settings, now: float | None = None) -> dict[str, str]:
    """The gateway's own signature headers for ``item.body`` (tests/support.signed_headers)."""
    from tests.support import signed_headers as sign  # the ingest and Kafka client load only here

    headers = sign(item.gateway, item.body, settings, now)
    basic = settings.adyen_basic_auth
    if item.gateway == "adyen" and basic is not None:  # the route's Basic auth, when the stack has one
        headers["Authorization"] = "Basic " + base64.b64encode(basic.reveal().encode()).decode()
    return headers


def request_body(item: Item, settings: Settings) -> bytes:
    """What is POSTed for ``item``: its body, or for adyen the item in a request of its own, signed
    when its signed fields can be signed at all (else sent unsigned: refused with 401, nothing stored)."""
    if item.gateway != "adyen":
        return item.body
    from app.gateways import adyen  # the adapter signs: the strategies above never import app/

    body = json.loads(item.body)
    if isinstance(body, dict):
        try:
            return adyen.sign_body([body], settings.secrets["adyen"].reveal()[0])
        except Exception:  # a field the HMAC covers has a shape nothing can sign (msgspec's or ours)
            pass
    return encode({"live": "false", "notificationItems": [{"NotificationRequestItem": body}]})


# --- valid events ---------------------------------------------------------------------------------

_SERIAL = itertools.count(1)
serials = st.builds(lambda: next(_SERIAL))  # a fresh number per draw: ids never repeat in a run
INT64_MAX = 2**63 - 1
T_MIN, T_MAX = datetime(2000, 1, 1, tzinfo=UTC), datetime(2100, 1, 1, tzinfo=UTC)
UNIX_MS_MIN, UNIX_MS_MAX = 946_684_800_000, 4_102_444_800_000
_printable = st.text(st.characters(categories=("L", "N", "P", "S")), max_size=12).filter(str.isprintable)


@st.composite
def ids(draw: st.DrawFn, prefix: str) -> str:
    """A unique valid id: ASCII, or with printable Unicode, or exactly 200 characters long."""
    base = f"{prefix}_h{draw(serials)}"
    shape = draw(st.sampled_from(["plain", "plain", "unicode", "longest"]))
    if shape == "unicode":
        return base + draw(_printable)
    return base.ljust(200, "x") if shape == "longest" else base


@st.composite
def iso_times(draw: st.DrawFn) -> str:
    moment = draw(st.datetimes(T_MIN.replace(tzinfo=None), (T_MAX - timedelta(seconds=1)).replace(tzinfo=None)))
    text = moment.strftime("%Y-%m-%dT%H:%M:%S")
    if draw(st.booleans()):
        text += f".{moment.microsecond // 1000:03d}"
    if T_MIN + timedelta(days=1) < moment.replace(tzinfo=UTC) < T_MAX - timedelta(days=1) and draw(st.booleans()):
        return text + draw(st.sampled_from(["+07:00", "-05:30", "+00:00"]))
    return text + "Z"


unix_ms = st.integers(UNIX_MS_MIN, UNIX_MS_MAX)
money = st.integers(0, INT64_MAX)
decimals = st.from_regex(r"-?[0-9]{1,20}(\.[0-9]{1,18})?", fullmatch=True)
_no_nul = st.text(st.characters(exclude_characters="\x00", exclude_categories=["Cs"]), max_size=8)
fee_breakdowns = st.recursive(st.none() | st.booleans() | st.integers(-(2**63), INT64_MAX) | _no_nul,
                              lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_no_nul, inner, max_size=3),
                              max_leaves=8)
DEPOSIT_STATUSES = ["pending", "slip_received", "settled", "reversed", "expired", "canceled", "under_review",
                    "rejected", "on_hold"]  # on_hold: a status the catalogue may add (update_order_status)


def _maybe(draw: st.DrawFn, obj: dict[str, Any], name: str, values: st.SearchStrategy[Any]) -> None:
    if draw(st.booleans()):
        obj[name] = draw(values)


@st.composite
def pg_deposits(draw: st.DrawFn) -> dict[str, Any]:
    status = draw(st.sampled_from(DEPOSIT_STATUSES))
    obj: dict[str, Any] = {"id": draw(ids("dep")), "object": "deposit", "version": draw(st.integers(0, INT64_MAX)),
                           "status": status}
    if status in ("settled", "reversed"):  # the money CHECK of the gateway document
        ordered, transferred = draw(st.integers(1, INT64_MAX)), draw(st.integers(1, INT64_MAX))
        received = min(ordered, transferred)
        fee = draw(st.integers(0, received))
        obj.update(ordered_amount_minor=ordered, transferred_amount_minor=transferred,
                   amount_received_minor=received, fee_total_minor=fee, credited_amount_minor=received - fee)
    else:
        _maybe(draw, obj, "ordered_amount_minor", money | st.none())
    _maybe(draw, obj, "is_terminal", st.booleans() | st.none())
    _maybe(draw, obj, "late_slip_accepted_until", iso_times())
    _maybe(draw, obj, "fee_breakdown", fee_breakdowns)
    _maybe(draw, obj, "balance_transaction_id", ids("btxn"))
    _maybe(draw, obj, "clearing_available_at", iso_times())
    _maybe(draw, obj, "partial", st.booleans())
    _maybe(draw, obj, "cancel_reason_code", st.sampled_from(["user_canceled", "timeout"]))
    _maybe(draw, obj, "metadata", st.just({"user_id": "meta_user_never_used"}))
    if draw(st.booleans()):
        obj["overpayment"] = {"claim_id": draw(ids("clm")), "cause": "additional_transfer",
                              "amount_minor": draw(st.integers(1, INT64_MAX)), "slip_received_at": draw(iso_times()),
                              "status": "open", "action_required": "contact_support",
                              "expected_response_at": draw(iso_times() | st.none())}
    if status == "under_review" or draw(st.booleans()):
        obj["review"] = {"reasons": [{"display_th": "กำลังตรวจสอบ", "display_en": "Under review"}]}
    if status == "rejected" or draw(st.booleans()):
        obj["rejection"] = {"display_th": "ถูกปฏิเสธ"}
    return {"type": f"deposit.{status}", "data": {"object": obj}}


@st.composite
def pg_withdrawals(draw: st.DrawFn) -> dict[str, Any]:
    total = draw(st.integers(1, INT64_MAX))
    filled = draw(st.integers(0, total))
    status = "settled" if filled == total else "filling"
    obj: dict[str, Any] = {"id": draw(ids("wdr")), "object": "withdrawal", "version": draw(st.integers(0, INT64_MAX)),
                           "status": status, "amount_total_minor": total, "filled_minor": filled,
                           "remaining_minor": total - filled, "metadata": {"payout_id": draw(ids("po"))}}
    for name in ("fee_total_minor", "fee_recognized_minor", "refunded_minor"):
        _maybe(draw, obj, name, money)
    _maybe(draw, obj, "settled_splits", st.integers(0, 2**15 - 1))
    data: dict[str, Any] = {"object": obj}
    if draw(st.booleans()):
        fill: dict[str, Any] = {"leg_ref": draw(ids("leg")), "amount_minor": draw(money)}
        _maybe(draw, fill, "sequence", st.integers(0, 2**15 - 1))
        _maybe(draw, fill, "fee_recognized_minor", money)
        _maybe(draw, fill, "settled_at", iso_times())
        _maybe(draw, fill, "auto_confirm_at", iso_times())
        _maybe(draw, fill, "balance_transaction_id", ids("btxn"))
        data["fill"] = fill
    _maybe(draw, data, "previous_attributes", st.just({"status": "pending"}))
    return {"type": f"withdrawal.{'settled' if status == 'settled' else 'filled'}", "data": data}


@st.composite
def pg_balance_txns(draw: st.DrawFn) -> dict[str, Any]:
    obj: dict[str, Any] = {"id": draw(ids("btxn")), "object": "balance_transaction", "type": "deposit",
                           "direction": draw(st.sampled_from(["credit", "debit"])), "amount_minor": draw(money),
                           "created_at": draw(iso_times()), "bucket_from": draw(st.none() | st.just("pending")),
                           "bucket_to": "available"}
    _maybe(draw, obj, "source", st.builds(lambda n: {"id": f"dep_h{n}"}, serials))
    _maybe(draw, obj, "balance_after", st.integers(-(2**63), INT64_MAX))
    return {"type": draw(st.sampled_from(["balance_transaction.created", "balance.cleared"])), "data": {"object": obj}}


@st.composite
def pg_events(draw: st.DrawFn) -> dict[str, Any]:
    event = draw(st.one_of(pg_deposits(), pg_withdrawals(), pg_balance_txns()))
    body = {"id": draw(ids("evt")), "object": "event", "type": event["type"], "created": draw(iso_times()),
            "data": event["data"]}
    _maybe(draw, body, "sequence", st.integers(0, INT64_MAX) | st.none())
    return body


CARD_TYPES = ["payment.authorised", "payment.captured", "payment.refunded", "payment.voided"]


@st.composite
def card_events(draw: st.DrawFn) -> dict[str, Any]:
    body = {"id": draw(ids("evt")), "type": draw(st.sampled_from(CARD_TYPES)), "payment_ref": draw(ids("pay")),
            "occurred_at": draw(iso_times()), "sequence": draw(st.none() | st.integers(0, INT64_MAX))}
    _maybe(draw, body, "amount_minor", money)
    _maybe(draw, body, "currency", st.sampled_from(["EUR", "THB", "USD"]))
    return body


PAYMOS_FAMILIES = {
    "invoice": ("invoice", ["awaiting_payment", "confirming", "underpaid_waiting", "paid", "paid_over", "underpaid",
                            "expired", "cancelled", "paid_late"]),
    "withdrawal": ("withdrawal", ["created", "processing", "completed", "failed", "cancelled", "completion_rewound"]),
    "payment_channel.deposit": ("payment_channel_deposit", ["confirming", "reorged", "confirmed"]),
}
PAYMOS_TYPES = [(f"{family}.{step}", kind) for family, (kind, steps) in PAYMOS_FAMILIES.items() for step in steps]
FINAL = {"paid", "paid_over", "underpaid", "expired", "cancelled", "completed", "failed", "confirmed"}


@st.composite
def paymos_events(draw: st.DrawFn) -> dict[str, Any]:
    event_type, kind = draw(st.sampled_from(PAYMOS_TYPES))
    step = event_type.rsplit(".", 1)[1]
    status = {"completion_rewound": "signed", "paid_late": "expired"}.get(step, step)
    data: dict[str, Any] = {"id": draw(ids({"invoice": "inv", "withdrawal": "wdr"}.get(kind, "pcd"))),
                            "object": kind, "status": status, "is_final": status in FINAL,
                            "updated_at": draw(unix_ms), "amount": draw(decimals)}
    _maybe(draw, data, "fee", decimals | st.none())
    _maybe(draw, data, "currency", st.just("USDT"))
    if step == "paid_late":
        data["paid_late_at"] = draw(st.integers(UNIX_MS_MIN // 1000, UNIX_MS_MAX // 1000))
    body = {"event_id": draw(ids("evt")), "event_type": event_type, "data": data}
    _maybe(draw, body, "created_at", unix_ms)
    return body


# Stripe's v1 event types and the object each carries (API reference, "Types of events"; docs/gateways/stripe.md)
STRIPE_TYPES = {
    "payment_intent": ["created", "processing", "requires_action", "amount_capturable_updated", "partially_funded",
                       "succeeded", "payment_failed", "canceled"],
    "charge": ["pending", "succeeded", "failed", "captured", "refunded", "updated", "expired"],
    "refund": ["created", "updated", "failed"],
    "dispute": ["created", "updated", "closed", "funds_withdrawn", "funds_reinstated"],
}
STRIPE_EVENTS = [(("charge." if kind == "dispute" else "") + f"{kind}.{step}", kind)
                 for kind, steps in STRIPE_TYPES.items() for step in steps] + [("charge.refund.updated", "refund")]


@st.composite
def stripe_events(draw: st.DrawFn) -> dict[str, Any]:
    event_type, kind = draw(st.sampled_from(STRIPE_EVENTS))
    obj: dict[str, Any] = {"id": draw(ids({"payment_intent": "pi", "charge": "ch", "refund": "re"}.get(kind, "dp"))),
                           "object": kind}
    _maybe(draw, obj, "status", st.sampled_from(["succeeded", "requires_payment_method", "pending", "won"]) | st.none())
    for name in ("amount", "amount_received", "amount_captured", "amount_refunded"):
        _maybe(draw, obj, name, money | st.none())
    _maybe(draw, obj, "currency", st.sampled_from(["eur", "usd", "jpy"]))
    if kind != "payment_intent":
        _maybe(draw, obj, "payment_intent", ids("pi") | st.none())
        _maybe(draw, obj, "charge", ids("ch") | st.none())
    _maybe(draw, obj, "captured", st.booleans())
    _maybe(draw, obj, "refunded", st.booleans())
    body = {"id": draw(ids("evt")), "object": "event", "type": event_type,
            "created": draw(st.integers(UNIX_MS_MIN // 1000, UNIX_MS_MAX // 1000)), "data": {"object": obj}}
    _maybe(draw, body, "api_version", st.just("2025-06-30.basil"))
    _maybe(draw, body, "livemode", st.booleans())
    return body


ADYEN_CODES = ["AUTHORISATION", "CAPTURE", "CAPTURE_FAILED", "REFUND", "REFUND_FAILED", "CANCELLATION",
               "CANCEL_OR_REFUND", "NOTIFICATION_OF_CHARGEBACK", "CHARGEBACK", "CHARGEBACK_REVERSED",
               "SECOND_CHARGEBACK"]  # the event codes docs/gateways/adyen.md decides


@st.composite
def adyen_items(draw: st.DrawFn) -> dict[str, Any]:
    code = draw(st.sampled_from(ADYEN_CODES))
    item: dict[str, Any] = {"pspReference": draw(ids("PSP")), "eventCode": code,
                            "success": draw(st.sampled_from(["true", "false"])), "eventDate": draw(iso_times()),
                            "amount": {"value": draw(money), "currency": draw(st.sampled_from(["EUR", "USD"]))},
                            "merchantAccountCode": "HostileShop", "merchantReference": draw(ids("order"))}
    if code != "AUTHORISATION" or draw(st.booleans()):
        item["originalReference"] = draw(ids("PSP"))
    _maybe(draw, item, "reason", _printable)
    return item


def _stripe_resource(body: Any) -> Any:
    """A PaymentIntent's own id; a charge's, refund's or dispute's PaymentIntent, else its charge,
    else its own id (docs/gateways/stripe.md, the resource key): the first that is an id."""
    obj = lookup(body, ("data", "object"))
    if not isinstance(obj, dict):
        return None
    steps = ("id",) if obj.get("object") == "payment_intent" else ("payment_intent", "charge", "id")
    return next((obj.get(step) for step in steps if is_id(obj.get(step))), None)


def _adyen_resource(body: Any) -> Any:
    """The payment: the item's originalReference, else its own pspReference (docs/gateways/adyen.md)."""
    if not isinstance(body, dict):
        return None
    return next((body.get(f) for f in ("originalReference", "pspReference") if is_id(body.get(f))), None)


BUILDERS = {"pg": pg_events, "card": card_events, "paymos": paymos_events, "stripe": stripe_events,
            "adyen": adyen_items}
RESOURCE_PATH: dict[str, Path] = {"pg": ("data", "object", "id"), "card": ("payment_ref",), "paymos": ("data", "id")}
RESOURCE_OF: dict[str, Callable[[Any], Any]] = {"stripe": _stripe_resource, "adyen": _adyen_resource}


def encode(body: Any) -> bytes:
    # json, not orjson: orjson refuses to write integers past 64 bits and nesting past 254
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


def nested(levels: int) -> Any:
    value: Any = 0
    for _ in range(levels):
        value = [value]
    return value


# an adyen item travels inside a request (its envelope and signature): a padded item leaves room for it
ENVELOPE_ROOM = {"adyen": 512}


def padded(body: dict[str, Any], gateway: str = "") -> dict[str, Any]:
    """``body`` with an unknown field that brings it (its request, for adyen) to just under the
    ingest's 1 MiB."""
    room = MAX_BODY - len(encode(body)) - len(',"x_padding":""') - 16 - ENVELOPE_ROOM.get(gateway, 0)
    return {**body, "x_padding": "p" * max(0, room)}


def lookup(body: Any, path: Path) -> Any:
    for step in path:
        if isinstance(step, int):
            if not isinstance(body, list) or len(body) <= step:
                return None
            body = body[step]
        elif not isinstance(body, dict):
            return None
        else:
            body = body.get(step)
    return body


def is_id(value: Any) -> bool:
    """DESIGN §2.4's id, restated here so the tests do not lean on the code they check."""
    return isinstance(value, str) and 1 <= len(value) <= 200 and value.isprintable()


def resource_key(gateway: str, body: Any) -> str | None:
    rid = RESOURCE_OF[gateway](body) if gateway in RESOURCE_OF else lookup(body, RESOURCE_PATH[gateway])
    return f"{gateway}:{rid}" if is_id(rid) else None


def dotted(path: Path) -> str:
    return "".join(f"[{step}]" if isinstance(step, int) else f".{step}" for step in path).lstrip(".")


@st.composite
def valid_events(draw: st.DrawFn, gateway: str | None = None) -> Item:
    """A valid event of any type of ``gateway`` (any gateway when None)."""
    gw = gateway or draw(st.sampled_from(GATEWAYS))
    body = draw(BUILDERS[gw]())
    shape = draw(st.sampled_from(["plain"] * 6 + ["nested_32", "big_int_19_digits", "padded"]))
    if shape == "nested_32":  # the whole body nests exactly 32 deep: allowed
        body["x_nested"] = nested(31)
    elif shape == "big_int_19_digits":  # 19 digits and still inside 64 bits: allowed
        body["x_big"] = draw(st.sampled_from([INT64_MAX, -(2**63), 1_000_000_000_000_000_000]))
    elif shape == "padded":
        body = padded(body, gw)
    return Item(gw, encode(body), resource_key(gw, body))


# --- mutations ----------------------------------------------------------------------------------------
# The field paths the core and the projector read, with what each must hold. Kinds: id (1-200
# printable), ptext (an event type: printable, bounded), text (bounded), str (any string), iso, unix_ms,
# unix_s, int64, minor (money: 0..2**63-1), seq (0..2**63-1), small (a smallint column), bool, object,
# list, decimal (a crypto amount), any (stored raw), tag (pg's object kind), kind (paymos data.object).
Field = tuple[Path, str, bool]  # path, kind, required

PG_ENVELOPE: list[Field] = [(("id",), "id", True), (("type",), "ptext", True), (("sequence",), "seq", False),
                            (("data",), "object", True), (("data", "object"), "object", True),
                            (("data", "object", "object"), "tag", True), (("data", "fill"), "object", False),
                            (("data", "previous_attributes"), "object", False)]
_O = ("data", "object")
_FLAG = (*_O, "overpayment")
PG_OBJECT: dict[str, list[Field]] = {
    "deposit": [
        ((*_O, "id"), "id", True), ((*_O, "version"), "int64", True), ((*_O, "status"), "text", True),
        ((*_O, "is_terminal"), "bool", False), ((*_O, "late_slip_accepted_until"), "iso", False),
        *(((*_O, name), "minor", False) for name in ("ordered_amount_minor", "transferred_amount_minor",
                                                      "amount_received_minor", "fee_total_minor",
                                                      "credited_amount_minor")),
        ((*_O, "fee_breakdown"), "any", False), (_FLAG, "object", False), ((*_FLAG, "claim_id"), "id", False),
        ((*_FLAG, "cause"), "text", False), ((*_FLAG, "amount_minor"), "minor", False),
        ((*_FLAG, "slip_received_at"), "iso", False), ((*_FLAG, "status"), "text", False),
        ((*_FLAG, "action_required"), "text", False), ((*_FLAG, "expected_response_at"), "iso", False),
        ((*_O, "balance_transaction_id"), "id", False), ((*_O, "clearing_available_at"), "iso", False),
        ((*_O, "partial"), "bool", False), ((*_O, "cancel_reason_code"), "text", False),
        ((*_O, "review"), "object", False), ((*_O, "review", "reasons"), "list", False),
        ((*_O, "review", "reasons", 0), "object", True), ((*_O, "review", "reasons", 0, "display_th"), "str", False),
        ((*_O, "rejection"), "object", False), ((*_O, "rejection", "display_th"), "str", False),
    ],
    "withdrawal": [
        ((*_O, "id"), "id", True), ((*_O, "version"), "int64", True), ((*_O, "status"), "text", True),
        ((*_O, "amount_total_minor"), "minor", True), ((*_O, "remaining_minor"), "minor", True),
        *(((*_O, name), "minor", False) for name in ("filled_minor", "fee_total_minor", "fee_recognized_minor",
                                                      "refunded_minor")),
        ((*_O, "settled_splits"), "small", False), ((*_O, "metadata"), "object", True),
        ((*_O, "metadata", "payout_id"), "id", True),
        (("data", "fill", "leg_ref"), "id", True), (("data", "fill", "amount_minor"), "minor", True),
        (("data", "fill", "sequence"), "small", False), (("data", "fill", "fee_recognized_minor"), "minor", False),
        (("data", "fill", "settled_at"), "iso", False), (("data", "fill", "auto_confirm_at"), "iso", False),
        (("data", "fill", "balance_transaction_id"), "id", False),
    ],
    "balance_transaction": [
        ((*_O, "id"), "id", True), ((*_O, "type"), "text", True), ((*_O, "direction"), "text", True),
        ((*_O, "amount_minor"), "minor", True), ((*_O, "created_at"), "iso", True),
        ((*_O, "bucket_from"), "text", False), ((*_O, "bucket_to"), "text", False), ((*_O, "source"), "object", False),
        ((*_O, "source", "id"), "id", False), ((*_O, "balance_after"), "int64", False),
    ],
}
CARD_FIELDS: list[Field] = [
    (("id",), "id", True), (("type",), "card_type", True), (("payment_ref",), "id", True),
    (("occurred_at",), "iso", True), (("sequence",), "seq", False), (("amount_minor",), "minor", False),
    (("currency",), "text", False),
]
PAYMOS_FIELDS: list[Field] = [
    (("event_id",), "id", True), (("event_type",), "paymos_type", True), (("created_at",), "unix_ms", False),
    (("data",), "object", True), (("data", "id"), "id", True), (("data", "object"), "kind", True),
    (("data", "status"), "text", True), (("data", "is_final"), "bool", True), (("data", "updated_at"), "unix_ms", True),
    (("data", "paid_late_at"), "unix_s", False), (("data", "amount"), "decimal", False),
    (("data", "fee"), "decimal", False), (("data", "net_amount"), "decimal", False),
]


STRIPE_FIELDS: list[Field] = [
    (("id",), "id", True), (("type",), "stripe_type", True), (("created",), "unix_s", True),
    (("data",), "object", True), (_O, "object", True), ((*_O, "id"), "id", True),
    ((*_O, "object"), "stripe_object", True), ((*_O, "status"), "text", False), ((*_O, "amount"), "minor", False),
    ((*_O, "amount_received"), "minor", False), ((*_O, "amount_captured"), "minor", False),
    ((*_O, "amount_refunded"), "minor", False), ((*_O, "currency"), "text", False),
    ((*_O, "payment_intent"), "id", False), ((*_O, "charge"), "id", False), ((*_O, "captured"), "bool", False),
    ((*_O, "refunded"), "bool", False),
]
ADYEN_FIELDS: list[Field] = [
    (("pspReference",), "id", True), (("eventCode",), "adyen_code", True), (("eventDate",), "iso", True),
    (("success",), "adyen_success", True), (("amount",), "object", True), (("amount", "value"), "minor", True),
    (("amount", "currency"), "text", True), (("merchantAccountCode",), "account", True),
    (("merchantReference",), "reference", True), (("originalReference",), "reference", False),
]


def fields(gateway: str, body: dict[str, Any]) -> list[Field]:
    if gateway == "pg":
        return PG_ENVELOPE + PG_OBJECT.get(str(lookup(body, (*_O, "object"))), [])
    return {"card": CARD_FIELDS, "paymos": PAYMOS_FIELDS, "stripe": STRIPE_FIELDS, "adyen": ADYEN_FIELDS}[gateway]


_TYPE_OF = {"str": "x", "int": 7, "float": 1.5, "bool": True, "list": [1], "object": {"a": 1}, "null": None}
_ACCEPTS = {"int64": "int", "minor": "int", "seq": "int", "small": "int", "unix_ms": "int", "unix_s": "int",
            "bool": "bool", "object": "object", "list": "list", "any": None}  # every other kind: a string
Maker = Callable[[int], Any]  # a serial (keeps ids unique) -> a hostile value
_BAD_ID: list[tuple[str, Maker]] = [
    ("empty id", lambda n: ""), ("201-character id", lambda n: f"h{n}_".ljust(201, "x")),
    ("6000-character id", lambda n: f"h{n}_".ljust(6000, "x")), ("NUL in id", lambda n: f"h{n}\x00"),
    ("control character in id", lambda n: f"h{n}\x07"), ("line break in id", lambda n: f"h{n}\n"),
    ("unicode line separator in id", lambda n: f"h{n}\u2028"), ("zero-width space in id", lambda n: f"h{n}\u200b"),
]
_BAD_TEXT: list[tuple[str, Maker]] = [
    ("empty", lambda n: ""), ("201 characters", lambda n: "t" * 201), ("6000 characters", lambda n: "t" * 6000),
    ("NUL in text", lambda n: "a\x00b"),
]
_BAD_INT64: list[tuple[str, Maker]] = [("2**63", lambda n: 2**63), ("-2**63-1", lambda n: -(2**63) - 1),
                                       ("2**64", lambda n: 2**64), ("10**30", lambda n: 10**30)]
def _constant(value: Any) -> Maker:
    return lambda n: value


_BAD_TIME: list[tuple[str, Maker]] = [
    (label, _constant(v)) for label, v in [
        ("1970", "1970-01-01T00:00:00Z"), ("1999", "1999-12-31T23:59:59Z"), ("2200", "2200-01-01T00:00:00Z"),
        ("just past 2100", "2100-01-01T00:00:01Z"), ("not a date", "not a date"), ("month 13", "2026-13-01T00:00:00Z"),
        ("date only", "2026-11-29"), ("unix ms as text", "1796000000000"), ("empty time", ""),
        ("full-width digits", "\uff12\uff10\uff12\uff16-11-29T10:33:15Z")]]
_BAD: dict[str, list[tuple[str, Maker]]] = {
    "id": _BAD_ID,
    "ptext": _BAD_ID[:5],
    "text": _BAD_TEXT,
    "str": [("NUL in text", lambda n: "a\x00b")],
    "int64": _BAD_INT64,
    "minor": [("-1 money", lambda n: -1), ("float money", lambda n: 80.5), ("integral float money", lambda n: 100.0),
              *_BAD_INT64],
    "seq": [("-1", lambda n: -1), *_BAD_INT64],
    "small": [("-1", lambda n: -1), ("32768", lambda n: 32768), *_BAD_INT64],
    "iso": _BAD_TIME,
    "unix_ms": [(label, _constant(v)) for label, v in [
        ("0 ms", 0), ("-1 ms", -1), ("seconds for ms", 1_796_000_000), ("1999 ms", 946_684_799_999),
        ("past 2100 ms", 4_102_444_800_001), ("2**62 ms", 2**62), ("float ms", 1.796e12)]] + _BAD_INT64,
    "unix_s": [(label, _constant(v)) for label, v in [
        ("0 s", 0), ("ms for seconds", 1_796_000_000_000), ("1999 s", 946_684_799), ("past 2100 s", 4_102_444_801)]],
    "decimal": [(label, _constant(v)) for label, v in [
        ("exponent", "1e5"), ("letters", "abc"), ("empty amount", ""), ("trailing dot", "1."), ("leading dot", ".5"),
        ("plus sign", "+1"), ("arabic digits", "١٢"), ("81 digits", "1" * 81), ("comma", "1,5"), ("NaN", "NaN"),
        ("float amount", 1.5), ("integer amount", 5)]],
    "tag": [("unknown object kind", lambda n: "refund"), ("empty kind", lambda n: ""), ("capitalised kind",
                                                                                          lambda n: "Deposit")],
    "kind": [("foreign object kind", lambda n: "deposit"), ("empty kind", lambda n: "")],
    "card_type": [("unknown type", lambda n: "payment.disputed"), *_BAD_ID[:5]],
    "paymos_type": [("unknown type", lambda n: "invoice.refunded"), ("capitalised type", lambda n: "INVOICE.PAID"),
                    *_BAD_ID[:5]],
    "stripe_type": [("unknown type", lambda n: "payment_intent.exploded"), ("a thin type on a snapshot",
                                                                             lambda n: "v1.payment_intent.created"),
                    *_BAD_ID[:5]],
    "stripe_object": [("foreign object kind", lambda n: "deposit"), ("empty kind", lambda n: "")],
    "adyen_code": [("unhandled event code", lambda n: "AUTHORISATION_ADJUSTMENT"), *_BAD_ID[:5]],
    "adyen_success": [("yes for true", lambda n: "yes"), ("capitalised True", lambda n: "True")],
    "reference": _BAD_ID[1:],  # Adyen signs a missing reference as "": empty is allowed
    "account": _BAD_ID[1:4],  # signed, stored, never shown or keyed on: only too long or NUL is refused
}


def _hostile_values(kind: str, required: bool) -> list[tuple[str, Maker]]:
    accepts = _ACCEPTS.get(kind, "str")
    wrong = [(f"wrong type {name}", _constant(value)) for name, value in _TYPE_OF.items()
             if accepts is not None and name != accepts and not (name == "null" and not required)]
    deep: list[tuple[str, Maker]] = [("nesting 40 deep", lambda n: nested(40)), ("nesting 300 deep",
                                                                                lambda n: nested(300))]
    universal: list[tuple[str, Maker]] = [("2**64", lambda n: 2**64), ("NUL string", lambda n: "\x00")]
    return wrong + _BAD.get(kind, []) + deep + universal


def _set(body: Any, path: Path, value: Any) -> None:
    parent = lookup(body, path[:-1])
    parent[path[-1]] = value


def _parent_exists(body: Any, path: Path) -> bool:
    parent = lookup(body, path[:-1])
    step = path[-1]
    if isinstance(parent, list):
        return isinstance(step, int) and step < len(parent)
    return isinstance(parent, dict) and isinstance(step, str)


Mutation = tuple[Path, str, Maker]  # path, label, value maker


def mutations(gateway: str, body: dict[str, Any]) -> list[Mutation]:
    """Every way ``mutated`` may break ``body``: each field path it reads (or may add) times each
    hostile value for it, plus hostile unknown fields."""
    found: list[Mutation] = []
    extras: list[Field] = [(("x_extra",), "any", False)]
    if isinstance(body.get("data"), dict):
        extras.append((("data", "x_extra"), "any", False))
    for path, kind, required in [f for f in fields(gateway, body) if _parent_exists(body, f[0])] + extras:
        found += [(path, label, make) for label, make in _hostile_values(kind, required)]
        if required and isinstance(path[-1], str):
            found.append((path, "missing required field", lambda n: _MISSING))
    return found


def apply(gateway: str, body: dict[str, Any], mutation: Mutation, serial: int, pad: bool = False) -> Item:
    path, label, make = mutation
    body = copy.deepcopy(body)
    value = make(serial)
    if value is _MISSING:
        lookup(body, path[:-1]).pop(path[-1])
    else:
        _set(body, path, value)
    if pad:
        body = padded(body, gateway)
    raw = encode(body)
    assert len(raw) <= MAX_BODY, "a hostile body must still be one the ingest takes"
    return Item(gateway, raw, resource_key(gateway, body), dotted(path), f"{label} at {dotted(path)}")


@st.composite
def mutated(draw: st.DrawFn, gateway: str | None = None) -> Item:
    """A valid event with one field path broken, or with one hostile unknown field added."""
    gw = gateway or draw(st.sampled_from(GATEWAYS))
    body = draw(BUILDERS[gw]())
    return apply(gw, body, draw(st.sampled_from(mutations(gw, body))), draw(serials),
                 pad=draw(st.integers(0, 9)) == 0)


_MISSING = object()


def bodies(gateway: str | None = None) -> st.SearchStrategy[Item]:
    """Hostile bodies with valid events of every type mixed in (about one in four)."""
    return st.one_of(mutated(gateway), mutated(gateway), mutated(gateway), valid_events(gateway))


def full_bodies() -> list[tuple[str, dict[str, Any]]]:
    """One valid event per object kind with every optional field the core reads present, so that
    ``mutations`` reaches every path (tests walk them all)."""
    t = "2026-11-29T10:33:15Z"
    flag = {"claim_id": "clm_1", "cause": "same_transfer_excess", "amount_minor": 100, "slip_received_at": t,
            "status": "open", "action_required": "contact_support", "expected_response_at": t}
    deposit = {"id": "dep_full", "object": "deposit", "version": 9, "status": "settled", "is_terminal": True,
               "late_slip_accepted_until": t, "ordered_amount_minor": 500_000, "transferred_amount_minor": 500_000,
               "amount_received_minor": 500_000, "fee_total_minor": 2_500, "credited_amount_minor": 497_500,
               "fee_breakdown": {"gateway": 2_000, "vat": 500}, "overpayment": flag, "balance_transaction_id": "btxn_1",
               "clearing_available_at": t, "partial": False, "cancel_reason_code": "timeout",
               "review": {"reasons": [{"display_th": "กำลังตรวจสอบ", "display_en": "Under review"}]},
               "rejection": {"display_th": "ถูกปฏิเสธ"}}
    withdrawal = {"id": "wdr_full", "object": "withdrawal", "version": 7, "status": "filling",
                  "amount_total_minor": 1_000_000, "filled_minor": 400_000, "remaining_minor": 600_000,
                  "fee_total_minor": 10, "fee_recognized_minor": 4, "refunded_minor": 0, "settled_splits": 1,
                  "metadata": {"payout_id": "po_1"}}
    fill = {"leg_ref": "leg_1", "amount_minor": 400_000, "sequence": 1, "fee_recognized_minor": 4, "settled_at": t,
            "auto_confirm_at": t, "balance_transaction_id": "btxn_2"}
    btxn = {"id": "btxn_full", "object": "balance_transaction", "type": "deposit", "direction": "credit",
            "amount_minor": 500_000, "created_at": t, "bucket_from": "pending", "bucket_to": "available",
            "source": {"id": "dep_full"}, "balance_after": 123}

    def pg(obj: dict[str, Any], type_: str, **data: Any) -> tuple[str, dict[str, Any]]:
        return "pg", {"id": f"evt_{obj['id']}", "object": "event", "type": type_, "sequence": 1042, "created": t,
                      "data": {"object": obj, "previous_attributes": {"status": "pending"}, **data}}

    return [
        pg(deposit, "deposit.settled"), pg(withdrawal, "withdrawal.filled", fill=fill),
        pg(btxn, "balance_transaction.created"),
        ("card", {"id": "evt_card_full", "type": "payment.captured", "payment_ref": "pay_8c21", "sequence": 17,
                  "occurred_at": "2026-11-29T10:02:15.123Z", "amount_minor": 8_000, "currency": "EUR"}),
        ("paymos", {"event_id": "evt_paymos_full", "event_type": "invoice.paid_late", "created_at": 1_796_000_000_000,
                    "data": {"id": "inv_full", "object": "invoice", "status": "expired", "is_final": True,
                             "updated_at": 1_796_000_000_000, "paid_late_at": 1_796_000_100, "amount": "125.5",
                             "fee": "0.5", "net_amount": "125.0"}}),
        ("stripe", {"id": "evt_stripe_full", "object": "event", "type": "charge.refunded", "created": 1_796_000_000,
                    "api_version": "2025-06-30.basil", "livemode": False,
                    "data": {"object": {"id": "ch_full", "object": "charge", "status": "succeeded", "amount": 2_000,
                                        "amount_received": 2_000, "amount_captured": 2_000, "amount_refunded": 500,
                                        "currency": "eur", "payment_intent": "pi_full", "charge": "ch_full",
                                        "captured": True, "refunded": False}}}),
        ("adyen", {"pspReference": "PSPFULLREFUND", "originalReference": "PSPFULL", "eventCode": "REFUND",
                   "success": "true", "eventDate": "2026-11-29T11:02:40+01:00",
                   "amount": {"value": 500, "currency": "EUR"}, "merchantAccountCode": "HostileShop",
                   "merchantReference": "order-full", "reason": ""}),
    ]


def every_mutation() -> list[Item]:
    """Each mutation of each full body: a deterministic sweep of every path and hostile value."""
    serial = itertools.count(1)
    return [apply(gw, body, m, next(serial)) for gw, body in full_bodies() for m in mutations(gw, body)]


# --- raw header bytes (issue #45, item 5) ------------------------------------------------------------
# What no HTTP client library sends: bytes that are not UTF-8, NUL, header lines past aiohttp's 8 KiB,
# repeated and too many headers, in a signed request of every gateway, framed with a Content-Length (the
# ingest's fast path, app/webhook_http.py) and chunked (aiohttp's parser). Every answer is under 500;
# one whose gateway's proof was broken is a 4xx.

HEADER_GATEWAYS = ("pg", "card", "paymos", "stripe", "adyen")
ADYEN_BASIC = "orderly:hostile-basic"  # the ORDERLY_ADYEN_BASIC_AUTH the hostile stack runs with


@dataclass(frozen=True)
class RawRequest:
    gateway: str
    data: bytes  # the whole request, as written to the socket
    what: str  # for failure messages
    refused: bool  # a proof (signature, Basic auth) or the head itself is broken: a 4xx, never a 2xx


def header_bodies(serial: int) -> dict[str, bytes]:
    """A valid, unsigned body of every gateway, about resources of their own (``serial`` keeps ids apart)."""
    t = "2026-11-29T10:02:15.123Z"
    pi = f"pi_hdr{serial}"
    return {
        "pg": encode({"id": f"evt_hdr{serial}", "object": "event", "type": "deposit.pending", "sequence": 1,
                      "created": t, "data": {"object": {"id": f"dep_hdr{serial}", "object": "deposit", "version": 1,
                                                        "status": "pending"}}}),
        "card": encode({"id": f"evt_hdr{serial}", "type": "payment.authorised", "payment_ref": f"pay_hdr{serial}",
                        "sequence": 1, "occurred_at": t, "amount_minor": 8000, "currency": "EUR"}),
        "paymos": encode({"event_id": f"evt_hdr{serial}", "event_type": "invoice.confirming",
                          "created_at": 1_796_000_000_000, "data": {"id": f"inv_hdr{serial}", "object": "invoice",
                                                                    "status": "confirming",
                                                                    "updated_at": 1_796_000_000_000}}),
        "stripe": encode({"id": f"evt_hdr{serial}", "object": "event", "type": "payment_intent.succeeded",
                          "created": 1_796_000_000, "data": {"object": {
                              "id": pi, "object": "payment_intent", "status": "succeeded", "amount": 2000,
                              "amount_received": 2000, "currency": "eur"}}}),
        "adyen": encode({"live": "false", "notificationItems": [{"NotificationRequestItem": {
            "pspReference": f"PSPHDR{serial}", "eventCode": "AUTHORISATION", "success": "true", "eventDate": t,
            "amount": {"value": 8000, "currency": "EUR"}, "merchantAccountCode": "Shop",
            "merchantReference": f"order-hdr{serial}"}}]}),
    }


def _head(gateway: str, headers: list[tuple[bytes, bytes]], body: bytes, chunked: bool) -> bytes:
    framing = [(b"Transfer-Encoding", b"chunked")] if chunked else [(b"Content-Length", b"%d" % len(body))]
    lines = [b"POST /webhooks/%s HTTP/1.1" % gateway.encode(), b"Host: 127.0.0.1", b"Connection: close",
             *(name + b": " + value for name, value in [*headers, *framing])]
    wire = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body) if chunked and body else (b"0\r\n\r\n" if chunked else body)
    return b"\r\n".join(lines) + b"\r\n\r\n" + wire


def header_requests(gateway: str, body: bytes, proof: dict[str, str]) -> list[RawRequest]:
    """Every raw-header attack on one signed request: ``proof`` is what proves ``body`` (its signature
    headers, adyen's Authorization), each broken in turn, then headers beside it, in both framings."""
    out: list[RawRequest] = []
    good = [(k.encode(), v.encode()) for k, v in proof.items()]
    for chunked in (False, True):
        framing = "chunked" if chunked else "content-length"

        def add(what: str, headers: list[tuple[bytes, bytes]], refused: bool, framing: str = framing,
                chunked: bool = chunked) -> None:
            out.append(RawRequest(gateway, _head(gateway, headers, body, chunked), f"{what} ({framing})", refused))

        add("the proof untouched", good, False)
        for i, (name, value) in enumerate(good):
            others = good[:i] + good[i + 1:]
            label = name.decode()
            add(f"{label} + byte 0xff", [*others, (name, value + b"\xff")], True)
            add(f"{label} not UTF-8", [*others, (name, b"\xc3\x28" + value)], True)
            add(f"{label} latin-1 only", [*others, (name, b"\xe9" * 40)], True)
            add(f"{label} + NUL", [*others, (name, value + b"\x00")], True)
            add(f"{label} 9 KiB", [*others, (name, value + b"A" * 9000)], True)
            add(f"{label} 70 KiB", [*others, (name, value + b"A" * 70_000)], True)
            add(f"{label} repeated, broken first", [*others, (name, value + b"\xff"), (name, value)], True)
            add(f"{label} repeated, good first", [*others, (name, value), (name, value + b"\xff")], False)
        add("an unrelated header not UTF-8", [*good, (b"X-Note", b"\xff\xfe\xc3\x28")], False)
        add("an unrelated header with NUL", [*good, (b"X-Note", b"a\x00b")], True)
        add("an unrelated header of 70 KiB", [*good, (b"X-Note", b"\xff" * 70_000)], True)
        add("a header name not ASCII", [*good, (b"X-\xff\xfe", b"1")], True)
        add("a gzip Content-Encoding", [*good, (b"Content-Encoding", b"gzip")], True)  # 415 on both paths
        add("200 repeated headers", [*good, *[(b"X-Many", b"\xff%d" % n) for n in range(200)]], True)
    return out


def every_header_request(settings: Settings) -> list[RawRequest]:
    """``header_requests`` of a signed request of every gateway (ADYEN_BASIC as adyen's Basic auth)."""
    from app.simulator.deliver import signed_body  # the ingest's modules load only here, as above

    out: list[RawRequest] = []
    for serial, gateway in enumerate(HEADER_GATEWAYS, 1):
        secret = settings.secrets[gateway].reveal()[0]
        body = signed_body(gateway, header_bodies(serial)[gateway], secret)
        proof = signed_headers(Item(gateway, body, None), settings)
        if gateway == "adyen":
            proof["Authorization"] = "Basic " + base64.b64encode(ADYEN_BASIC.encode()).decode()
        out += header_requests(gateway, body, proof)
    return out
