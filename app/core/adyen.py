"""The adyen gateway's reducer: a payment's state and totals from *all* its stored notification
items, sorted by Adyen's order (pure layer; docs/gateways/adyen.md states each rule's source).

Ordering key, stated here in code:
- ``eventDate`` as an instant in milliseconds (ISO 8601 with an offset, seconds or milliseconds);
- ties by the lifecycle :data:`RANK` (an authorisation and its auto-capture can share a second);
- the event id last, so the order is total and a replay sorts identically.

One pass in key order; after an item that changed something the lowest parked item that applies
now goes first (as restarting from the lowest key would), so the cost is the items plus the parked
ones re-tried after each change; at most MAX_EVENTS items per payment are kept. An item that cannot
apply yet (anything before the authorisation, a CAPTURE_FAILED before its capture, a refund above
what is captured, a modification in another currency) stays parked, never dropped. Captures and
refunds are held by their own pspReference, so totals are derived (never ``+=``); one repeating a
pspReference with another amount never applies (the read model's CHECKs), captures never pass what
was authorised, and CAPTURE_FAILED / REFUND_FAILED undo exactly the modification they name. Effects are those earned by
any state the sorted history passes through, so every arrival order emits the same set. No fetch:
Adyen has no API to read a payment; a parked item waits for the item it needs.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TypedDict

import msgspec

from app.core.model import (
    APPLIED,
    DUPLICATE,
    PARKED,
    QUARANTINED,
    UNPARKED,
    Decision,
    Delivery,
    Effect,
    Recent,
    numbered,
)
from app.core.model import decide as _decide
from app.core.reducer import Reducer, state_codec
from app.gateways.adyen import Item, Notification, read

RANK = {"AUTHORISATION": 0, "CAPTURE": 1, "CANCELLATION": 1, "CANCEL_OR_REFUND": 1, "CAPTURE_FAILED": 2,
        "REFUND": 3, "REFUND_FAILED": 4, "NOTIFICATION_OF_CHARGEBACK": 5, "CHARGEBACK": 6,
        "CHARGEBACK_REVERSED": 7, "SECOND_CHARGEBACK": 8}
STATES = ("authorised", "refused", "cancelled", "captured", "refunded", "chargeback")
TABLE = "adyen_payments"
MAX_EVENTS = 100  # items kept per payment: beyond, quarantined (the state stays far below a record's limit)


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
    currency: str = ""
    merchant_reference: str = ""
    recapture: bool = False  # Adyen's CAPTURE re-capturing a failed capture of the same pspReference


class Reduced(msgspec.Struct, gc=False):
    state: str = "created"
    authorised_minor: int = 0
    merchant_reference: str | None = None  # the (earliest) authorisation's
    currency: str | None = None  # the (earliest) authorisation's: every modification must be in it
    captures: dict[str, int] = msgspec.field(default_factory=dict)  # capture pspReference -> amount
    failed: dict[str, int] = msgspec.field(default_factory=dict)  # captures undone by CAPTURE_FAILED
    refunds: dict[str, int] = msgspec.field(default_factory=dict)  # refund pspReference -> amount
    before_chargeback: str = ""
    applied: list[str] = msgspec.field(default_factory=list)
    parked: list[str] = msgspec.field(default_factory=list)
    why: dict[str, str] = msgspec.field(default_factory=dict)  # a parked item's reason, when it has one
    earned: list[str] = msgspec.field(default_factory=list)  # effects, in the order first earned
    updated_ms: int = 0  # the eventDate of the latest applied item
    moves: int = 0  # changes made: a parked item is looked at again only after one
    steps: int = 0  # items tried: the reducer's cost (tests/unit/test_adyen_core.py bounds it)

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
                      d.delivery_id if d is not None else "", d.received_at_ms if d is not None else 0,
                      item.amount.currency, item.merchantReference, item.recapture)


def order_key(e: AdyenEvent) -> tuple[int, int, str]:
    return (e.at_ms, RANK.get(e.code, 9), e.id)


def _settle(out: Reduced) -> None:
    """The money state from the totals (a partial refund stays captured)."""
    captured, refunded = out.captured_minor, out.refunded_minor
    out.state = "authorised" if captured == 0 else "refunded" if refunded >= captured else "captured"
    out.moves += 1


def step(out: Reduced, ev: AdyenEvent) -> bool:
    """Apply ``ev`` to ``out`` if it can apply now (True), else leave ``out`` as it is (False)."""
    out.steps += 1
    state = out.state
    if state == "created":  # nothing but the authorisation applies before it
        if ev.code != "AUTHORISATION":
            return False
        out.state = "authorised" if ev.success else "refused"
        out.authorised_minor = ev.amount_minor if ev.success else 0
        out.merchant_reference, out.currency = ev.merchant_reference, ev.currency
        out.moves += 1
        return True
    if ev.code == "AUTHORISATION" or not ev.success:
        return True  # a second authorisation, or a modification Adyen did not carry out: no change
    code = ev.code
    if state == "refused":
        return False  # nothing follows a refusal: shown as parked
    if code in ("NOTIFICATION_OF_CHARGEBACK", "CHARGEBACK", "SECOND_CHARGEBACK"):
        if code != "NOTIFICATION_OF_CHARGEBACK" and state != "chargeback":
            out.before_chargeback, out.state = state, "chargeback"
            out.moves += 1
        return True
    if code == "CHARGEBACK_REVERSED":
        if state != "chargeback":
            return False
        out.state = out.before_chargeback
        out.moves += 1
        return True
    if state == "chargeback":
        return False  # a money movement during a chargeback waits for its reversal (shown as parked)
    if ev.currency != out.currency:
        out.why[ev.id] = f"amount.currency: {ev.currency} is not the payment's {out.currency}"
        return False
    return _money(out, ev)


def _held(out: Reduced, ev: AdyenEvent, held: int | None, what: str) -> bool | None:
    """A modification repeating a pspReference already held: no change with the same amount; with
    another it never applies (a row the read model's CHECKs refuse otherwise), parked with why."""
    if held is None:
        return None
    if held != ev.amount_minor:
        out.why[ev.id] = f"amount.value: {what} {ev.psp} is held at {held} already"
        return False
    return True


def _money(out: Reduced, ev: AdyenEvent) -> bool:
    code, state = ev.code, out.state
    if state == "cancelled":
        return code in ("CANCELLATION", "CANCEL_OR_REFUND")  # a repeat: no change
    if code == "CAPTURE":
        if ev.recapture:
            if ev.psp not in out.failed:
                return False  # waits for the failure it re-captures
            del out.failed[ev.psp]
        elif (repeat := _held(out, ev, out.captures.get(ev.psp, out.failed.get(ev.psp)), "capture")) is not None:
            return repeat
        if out.captured_minor + ev.amount_minor > out.authorised_minor:  # so never past 2^63-1 either
            out.why[ev.id] = f"amount.value: captures would pass the {out.authorised_minor} authorised"
            return False
        out.captures[ev.psp] = ev.amount_minor
    elif code == "CAPTURE_FAILED":
        if ev.psp not in out.captures or out.captured_minor - out.captures[ev.psp] < out.refunded_minor:
            return False
        out.failed[ev.psp] = out.captures.pop(ev.psp)
    elif code == "REFUND":
        if (repeat := _held(out, ev, out.refunds.get(ev.psp), "refund")) is not None:
            return repeat
        if out.refunded_minor + ev.amount_minor > out.captured_minor:
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
        out.moves += 1
        return True
    elif code == "CANCEL_OR_REFUND":
        if not out.captured_minor:
            out.state = "cancelled"
            out.moves += 1
            return True
        rest = out.captured_minor - out.refunded_minor
        if rest > 0:
            out.refunds[ev.psp] = out.refunds.get(ev.psp, 0) + rest
    _settle(out)
    return True


def _earn(out: Reduced, ev: AdyenEvent) -> None:
    """Effects earned by the state ``ev`` left. ``mark_order_refunded`` only once all that was
    authorised is refunded (or on CANCEL_OR_REFUND): against the captures seen so far, a refund
    arriving before an earlier partial capture would read as a full one."""
    due = []
    if out.captured_minor > 0:
        due.append("mark_order_paid")
    if out.state == "refunded" and (out.refunded_minor >= out.authorised_minor or ev.code == "CANCEL_OR_REFUND"):
        due.append("mark_order_refunded")
    if out.state == "refused":
        due.append("mark_order_failed")
    if ev.success and ev.code in ("NOTIFICATION_OF_CHARGEBACK", "CHARGEBACK", "SECOND_CHARGEBACK"):
        due.append("open_dispute")
    for kind in due:
        if kind not in out.earned:
            out.earned.append(kind)


def _applied(out: Reduced, ev: AdyenEvent) -> None:
    out.applied.append(ev.id)
    out.why.pop(ev.id, None)
    out.updated_ms = max(out.updated_ms, ev.at_ms)
    _earn(out, ev)


def reduce(events: list[AdyenEvent]) -> Reduced:
    """The payment's state from all its items in Adyen's order (see the module docstring): one pass
    in key order; after an item that changed something, the lowest parked item that applies now
    goes first, then the next lowest, until none does (what restarting from the lowest key did)."""
    by_id = {e.id: e for e in events}  # a redelivered item is one item
    out = Reduced()
    parked: list[AdyenEvent] = []
    for ev in sorted(by_id.values(), key=order_key):
        moves = out.moves
        if not step(out, ev):
            parked.append(ev)  # not yet: stays pending, never dropped
            continue
        _applied(out, ev)
        while parked and out.moves != moves:
            moves = out.moves
            freed = next((p for p in parked if step(out, p)), None)
            if freed is None:
                break
            parked.remove(freed)
            _applied(out, freed)
            moves = -1  # re-check the rest after any applied item, as the restart did
    out.parked = [p.id for p in parked]
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
    if any(e.id == event.id for e in state.events):
        return numbered(state, [_decide(d, DUPLICATE, event_id=event.id, event_type=item.eventCode,
                                        payload=n.payload)])
    psp = d.resource_key.partition(":")[2]
    if len(state.events) >= MAX_EVENTS:  # the state (one record of the changelog) stays bounded
        return numbered(state, [_decide(d, QUARANTINED, event_id=event.id, event_type=item.eventCode,
                                        payload=n.payload, error=f"originalReference: payment {psp} holds "
                                        f"{MAX_EVENTS} notification items, the most one payment keeps")])
    state.events.append(event)
    reduced = reduce(state.events)
    state.merchant_reference, state.currency = reduced.merchant_reference, reduced.currency
    before = set(state.applied)
    state.applied = reduced.applied
    newly = [e for e in state.events if e.id in reduced.applied and e.id not in before]
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
                         error=reduced.why.get(event.id), event_id=event.id, event_type=item.eventCode,
                         payload=n.payload)]
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
