"""The adyen gateway's reducer: a payment's state and totals from *all* its stored notification
items, sorted by Adyen's order (pure layer; docs/gateways/adyen.md states each rule's source).

Ordering key, stated here in code:
- ``eventDate`` as an instant in milliseconds (ISO 8601 with an offset, seconds or milliseconds);
- ties by the lifecycle :data:`RANK` (an authorisation and its auto-capture can share a second);
- the event id last, so the order is total and a replay sorts identically.

The reducer restarts from the lowest key after every applied item; an item that cannot apply yet
(anything before the authorisation, a CAPTURE_FAILED before its capture, a refund above what is
captured) stays parked, never dropped. Captures and refunds are held by their own pspReference, so
totals are derived (never ``+=``), a repeated capture of one pspReference counts once, and
CAPTURE_FAILED / REFUND_FAILED undo exactly the modification they name. Effects are those earned by
any state the sorted history passes through, so every arrival order emits the same set. No fetch:
Adyen has no API to read a payment; a parked item waits for the item it needs.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TypedDict

import msgspec

from app.core.model import APPLIED, DUPLICATE, PARKED, UNPARKED, Decision, Delivery, Effect, Recent, numbered
from app.core.model import decide as _decide
from app.core.reducer import Reducer, state_codec
from app.gateways.adyen import Item, Notification, read

RANK = {"AUTHORISATION": 0, "CAPTURE": 1, "CANCELLATION": 1, "CANCEL_OR_REFUND": 1, "CAPTURE_FAILED": 2,
        "REFUND": 3, "REFUND_FAILED": 4, "NOTIFICATION_OF_CHARGEBACK": 5, "CHARGEBACK": 6,
        "CHARGEBACK_REVERSED": 7, "SECOND_CHARGEBACK": 8}
STATES = ("authorised", "refused", "cancelled", "captured", "refunded", "chargeback")
TABLE = "adyen_payments"


class AdyenEvent(msgspec.Struct, frozen=True, gc=False):
    """One notification item of a payment as the reducer orders it, with the delivery that brought it."""

    id: str
    code: str
    success: bool
    psp: str  # the item's own pspReference: the capture, refund or dispute it is about
    at_ms: int
    amount_minor: int = 0
    delivery_id: str = ""
    received_at_ms: int = 0


class Reduced(msgspec.Struct, gc=False):
    state: str = "created"
    authorised_minor: int = 0
    captures: dict[str, int] = msgspec.field(default_factory=dict)  # capture pspReference -> amount
    refunds: dict[str, int] = msgspec.field(default_factory=dict)  # refund pspReference -> amount
    before_chargeback: str = ""
    applied: list[str] = msgspec.field(default_factory=list)
    parked: list[str] = msgspec.field(default_factory=list)
    earned: list[str] = msgspec.field(default_factory=list)  # effects, in the order first earned
    updated_ms: int = 0  # the eventDate of the latest applied item

    @property
    def captured_minor(self) -> int:
        return sum(self.captures.values())

    @property
    def refunded_minor(self) -> int:
        return sum(self.refunds.values())


def parse_time_ms(value: str) -> int:
    """ISO 8601 with an offset (or Z, or none: UTC), seconds or fractions: ms since the epoch."""
    moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def event_of(item: Item, d: Delivery | None = None) -> AdyenEvent:
    return AdyenEvent(item.event_id, item.eventCode, item.success == "true", item.pspReference,
                      parse_time_ms(item.eventDate), item.amount.value,
                      *((d.delivery_id, d.received_at_ms) if d is not None else ()))


def order_key(e: AdyenEvent) -> tuple[int, int, str]:
    return (e.at_ms, RANK.get(e.code, 9), e.id)


def _settle(out: Reduced) -> None:
    """The money state from the totals (a partial refund stays captured)."""
    captured, refunded = out.captured_minor, out.refunded_minor
    out.state = "authorised" if captured == 0 else "refunded" if refunded >= captured else "captured"


def step(out: Reduced, ev: AdyenEvent) -> bool:
    """Apply ``ev`` to ``out`` if it can apply now (True), else leave ``out`` as it is (False)."""
    state = out.state
    if state == "created":  # nothing but the authorisation applies before it
        if ev.code != "AUTHORISATION":
            return False
        out.state = "authorised" if ev.success else "refused"
        out.authorised_minor = ev.amount_minor if ev.success else 0
        return True
    if ev.code == "AUTHORISATION" or not ev.success:
        return True  # a second authorisation, or a modification Adyen did not carry out: no change
    code = ev.code
    if state == "refused":
        return False  # nothing follows a refusal: shown as parked
    if code in ("NOTIFICATION_OF_CHARGEBACK", "CHARGEBACK", "SECOND_CHARGEBACK"):
        if code != "NOTIFICATION_OF_CHARGEBACK" and state != "chargeback":
            out.before_chargeback, out.state = state, "chargeback"
        return True
    if code == "CHARGEBACK_REVERSED":
        if state != "chargeback":
            return False
        out.state = out.before_chargeback
        return True
    if state == "chargeback":
        return False  # a money movement during a chargeback waits for its reversal (shown as parked)
    return _money(out, ev)


def _money(out: Reduced, ev: AdyenEvent) -> bool:
    code, state = ev.code, out.state
    if state == "cancelled":
        return code in ("CANCELLATION", "CANCEL_OR_REFUND")  # a repeat: no change
    if code == "CAPTURE":
        out.captures[ev.psp] = ev.amount_minor
    elif code == "CAPTURE_FAILED":
        if ev.psp not in out.captures or out.captured_minor - out.captures[ev.psp] < out.refunded_minor:
            return False
        del out.captures[ev.psp]
    elif code == "REFUND":
        if ev.psp not in out.refunds and out.refunded_minor + ev.amount_minor > out.captured_minor:
            return False  # above what is captured: waits for a capture (or a refund's failure)
        out.refunds[ev.psp] = ev.amount_minor
    elif code == "REFUND_FAILED":
        if ev.psp not in out.refunds:
            return False
        del out.refunds[ev.psp]
    elif code == "CANCELLATION":
        if out.captured_minor:
            return False
        out.state = "cancelled"
        return True
    elif code == "CANCEL_OR_REFUND":
        if not out.captured_minor:
            out.state = "cancelled"
            return True
        rest = out.captured_minor - out.refunded_minor
        if rest > 0:
            out.refunds[ev.psp] = rest
    _settle(out)
    return True


def _earn(out: Reduced, ev: AdyenEvent) -> None:
    due = []
    if out.captured_minor > 0:
        due.append("mark_order_paid")
    if out.state == "refunded":
        due.append("mark_order_refunded")
    if out.state == "refused":
        due.append("mark_order_failed")
    if ev.success and ev.code in ("NOTIFICATION_OF_CHARGEBACK", "CHARGEBACK", "SECOND_CHARGEBACK"):
        due.append("open_dispute")
    for kind in due:
        if kind not in out.earned:
            out.earned.append(kind)


def reduce(events: list[AdyenEvent]) -> Reduced:
    """The payment's state from all its items in Adyen's order (see the module docstring)."""
    by_id = {e.id: e for e in events}  # a redelivered item is one item
    pending = sorted(by_id.values(), key=order_key)
    out = Reduced()
    progressed = True
    while progressed and pending:
        progressed = False
        for ev in pending:
            if not step(out, ev):
                continue  # not yet: stays pending, never dropped
            out.applied.append(ev.id)
            out.updated_ms = max(out.updated_ms, ev.at_ms)
            _earn(out, ev)
            pending.remove(ev)
            progressed = True
            break  # restart from the lowest key after every change
    out.parked = [p.id for p in pending]
    return out


# --- decisions for one delivery ---------------------------------------------------------------

class AdyenPaymentRow(TypedDict):
    psp_reference: str
    merchant_reference: str | None
    state: str
    authorised_minor: int
    captured_minor: int
    refunded_minor: int
    currency: str | None
    updated_at: str
    version: int  # the payment's stored items: they only accumulate, a newer row has more


class State(msgspec.Struct, gc=False):
    """One Adyen payment as the worker holds it: every item stored, what was applied and emitted."""

    n: int = 0
    events: list[AdyenEvent] = msgspec.field(default_factory=list)
    emitted: list[str] = msgspec.field(default_factory=list)
    applied: list[str] = msgspec.field(default_factory=list)
    merchant_reference: str | None = None
    currency: str | None = None
    recent: Recent = msgspec.field(default_factory=list, name="_recent")


class Snapshot(msgspec.Struct, gc=False):
    state: str
    applied: list[str]
    events: int
    emitted: list[str]
    parked: int


load, dump = state_codec(State)
_encode = msgspec.json.Encoder().encode


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat()


def apply_event(state: State | None, n: Notification, d: Delivery) -> tuple[State, list[Decision]]:
    """Store the item with the payment's others, rerun the reducer, and decide what changed."""
    state = State() if state is None else state
    item = n.item
    event = event_of(item, d)
    for e in state.events:
        if e.id == event.id:
            return numbered(state, [_decide(d, DUPLICATE, event_id=event.id, event_type=item.eventCode,
                                            payload=n.body)])
    state.events.append(event)
    if item.eventCode == "AUTHORISATION" or state.merchant_reference is None:
        # the payment's own reference and currency are the authorisation's
        state.merchant_reference = item.merchantReference or state.merchant_reference
        state.currency = item.amount.currency
    reduced = reduce(state.events)
    before = set(state.applied)
    state.applied = reduced.applied
    newly = [e for e in state.events if e.id in reduced.applied and e.id not in before]
    psp = d.resource_key.partition(":")[2]
    row: AdyenPaymentRow | None = None
    if newly:
        row = {"psp_reference": psp, "merchant_reference": state.merchant_reference, "state": reduced.state,
               "authorised_minor": reduced.authorised_minor, "captured_minor": reduced.captured_minor,
               "refunded_minor": reduced.refunded_minor, "currency": state.currency,
               "updated_at": _iso(reduced.updated_ms), "version": len(state.events)}
    effects = []
    for kind in reduced.earned:
        if kind in state.emitted:
            continue
        effects.append(Effect(f"adyen:{psp}:{kind}", kind, "adyen", psp,
                              {"psp_reference": psp, "merchant_reference": state.merchant_reference,
                               "state": reduced.state, "captured_minor": reduced.captured_minor,
                               "refunded_minor": reduced.refunded_minor, "currency": state.currency},
                              d.delivery_id))
        state.emitted.append(kind)
    outcome = APPLIED if event.id in reduced.applied else PARKED
    decisions = [_decide(d, outcome, row=row, table=TABLE if row is not None else None, effects=effects,
                         event_id=event.id, event_type=item.eventCode, payload=n.body)]
    for e in newly:  # items that were parked and apply now: their own deliveries move to "unparked"
        if e.id != event.id:
            original = Delivery(e.delivery_id, "adyen", d.resource_key, e.received_at_ms, d.seq)
            decisions.append(_decide(original, UNPARKED, event_id=e.id, event_type=e.code))
    return numbered(state, decisions)


def snapshot(state: State) -> bytes:
    reduced = reduce(state.events)
    return _encode(Snapshot(reduced.state, state.applied, len(state.events), state.emitted,
                            len(state.events) - len(state.applied)))


REDUCER: Reducer[State, Notification] = Reducer(read, apply_event, load, dump, snapshot, snapshot_type=Snapshot)
