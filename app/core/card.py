"""The card gateway's reducer: payment state and totals from *all* stored events, sorted by the
gateway's order (pure layer; gateway-docs/card-gateway-order-playbook.txt).

Ordering key, stated here in code as the playbook asks:
- ``sequence`` when every webhook event of the payment carries one; a ``synced`` event (the GET
  answer, which carries none) then sits right after the last sequenced event it covers, read from
  its totals and state (``covered_upto``), answers placed alike in the order they were fetched;
- otherwise ``(occurred_at, rank)``: an authorisation and its auto-capture can share a timestamp,
  so the rank keeps authorised < captured < refunded, and voided after authorised;
- the event id last, so the order is total and a replay sorts identically.

The reducer restarts from the lowest key after every applied event; an event that cannot apply yet
(capture before authorisation, a refund above what is captured) stays parked, never dropped. Totals
are derived from the applied events on every run, never incremented. A ``synced`` event (the
gateway's GET answer) replaces the working state and totals; later events apply on top.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

import msgspec

from app.core.model import (
    APPLIED,
    DUPLICATE,
    PARKED,
    QUARANTINED,
    SYNCED,
    UNPARKED,
    Decision,
    Delivery,
    Effect,
    Fact,
    Recent,
    numbered,
)
from app.core.model import decide as _decide
from app.core.reducer import Reducer, state_codec
from app.core.rows import CardPaymentRow
from app.core.times import iso_ms
from app.gateways.card import Fetched, Stored, Webhook, read, synced_totals

STATES = ("created", "authorised", "captured", "refunded", "voided")
# Events kept per payment: beyond, quarantined. Every delivery sorts and reduces all of a payment's
# events again (and the reducer restarts after each change), so a payment without a bound made a
# broken or hostile sender's stream of events cost seconds a delivery (10 s at 44,000 events); at
# 1,000 one costs a few ms, and no payment of a real flow comes near (card testing: a few hundred).
MAX_EVENTS = 1000
RANK = {"authorised": 0, "captured": 1, "voided": 1, "refunded": 2, "synced": -1}
NEXT: dict[str, dict[str, str]] = {
    "created": {"authorised": "authorised"},
    "authorised": {"captured": "captured", "voided": "voided"},
    "captured": {"captured": "captured", "refunded": "captured"},
    "refunded": {},
    "voided": {},
}


# Stored in the state in this field order: the JSON object release 0.2 wrote for each event.
class CardEvent(msgspec.Struct, frozen=True, gc=False):
    """One event of a payment as the reducer orders it, with the delivery that brought it."""

    id: str
    kind: str  # authorised | captured | refunded | voided | synced
    occurred_at_ms: int
    amount_minor: int = 0
    sequence: int | None = None
    synced: Any = None  # as the body held it; for kind == "synced": state and totals as fetched
    delivery_id: str = ""
    received_at_ms: int = 0
    source: str = "webhook"


class Reduced(msgspec.Struct, gc=False):
    state: str = "created"
    authorised_minor: int = 0
    captured_minor: int = 0
    refunded_minor: int = 0
    applied: list[str] = msgspec.field(default_factory=list)
    parked: list[str] = msgspec.field(default_factory=list)


def parse_time_ms(value: str) -> int:
    """ISO-8601 with optional sub-second digits and a Z: milliseconds since the epoch."""
    return int(datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() * 1000)


def event_of(event: Fetched | Stored, d: Delivery | None = None) -> CardEvent:
    """The reducer's view of a typed event (with the delivery that brought it, when there is one)."""
    return CardEvent(event.id, event.type.removeprefix("payment."), parse_time_ms(event.occurred_at),
                     event.amount_minor, event.sequence, event.synced,
                     *((d.delivery_id, d.received_at_ms, d.source) if d is not None else ()))


def stored_event(raw: bytes) -> CardEvent:
    """A stored event's body (card_events.payload, as received) as the reducer orders it."""
    found = read(raw, checked=True)
    if not isinstance(found, Webhook):
        raise ValueError(f"unusable card event: {found.quarantine_reason}")
    return event_of(found.event)


def covered_upto(fetch: CardEvent, sequenced: list[CardEvent]) -> int:
    """The sequence after which a synced answer sits among the payment's sequenced events (those in
    sequence order).

    The GET answer carries no sequence, only the state and totals the gateway reached after its
    events up to some sequence. Totals only grow along the sequence and every event moves them or
    the state, so over a run of stored events without a gap the totals decide: the answer covers
    them up to the first capture or refund that would go above its totals, an authorisation while
    it says ``created``, a void while it is not ``voided``. After a gap (events not stored yet) the
    totals cannot tell whether the missing events or this one make them up; there the fetch's own
    moment decides: an event stamped after it is not covered."""
    s = synced_totals(fetch.synced)
    captured = refunded = upto = 0
    for e in sequenced:
        captured += e.amount_minor if e.kind == "captured" else 0
        refunded += e.amount_minor if e.kind == "refunded" else 0
        if captured > s.captured_minor or refunded > s.refunded_minor \
                or (e.kind == "authorised" and s.state == "created") or (e.kind == "voided" and s.state != "voided"):
            break
        gap = (e.sequence or 0) > upto + 1
        if gap and e.occurred_at_ms > fetch.occurred_at_ms:
            break
        upto = e.sequence or 0
    return upto


def ordering_key(events: list[CardEvent]) -> Callable[[CardEvent], tuple[int, int, int, str]]:
    """The sort key for this payment's events (see the module docstring)."""
    sequenced, synced = [], []
    for e in events:  # loops, not all() over a generator: this runs on every delivery
        if e.kind == "synced" and e.sequence is None:
            synced.append(e)
        elif e.sequence is None:
            return lambda e: (e.occurred_at_ms, RANK.get(e.kind, 3), 0, e.id)
        else:
            sequenced.append(e)
    if not sequenced:
        return lambda e: (e.occurred_at_ms, RANK.get(e.kind, 3), 0, e.id)
    if not synced:
        return lambda e: (e.sequence or 0, RANK.get(e.kind, 3), 0, e.id)
    sequenced.sort(key=lambda e: (e.sequence or 0, RANK.get(e.kind, 3), e.id))
    # a synced answer right after the last sequenced event it covers (rank 4: after every kind);
    # answers placed alike in the order they were fetched (a later answer is the newer state)
    place = {e.id: covered_upto(e, sequenced) if e.synced is not None else 0 for e in synced}
    return lambda e: (place[e.id], 4, e.occurred_at_ms, e.id) if e.id in place \
        else (e.sequence or 0, RANK.get(e.kind, 3), 0, e.id)


def reduce(events: list[CardEvent]) -> Reduced:
    """The playbook's reducer, extended with synced events."""
    by_id = {}  # a redelivered event id is one event (loops, not comprehensions, in this hot path)
    for e in events:
        by_id[e.id] = e
    key = ordering_key(list(by_id.values()))
    pending = sorted(by_id.values(), key=key)
    # The state and totals kept in locals, the Reduced built once at the end, rather than the
    # Struct's fields set as the loop goes: about 3.5 k instructions less per card delivery (callgrind).
    state, authorised, captured, refunded = "created", 0, 0, 0
    applied: list[str] = []
    progressed = True
    while progressed and pending:
        progressed = False
        for ev in pending:
            kind = ev.kind
            if kind == "synced" and ev.synced is not None:
                s = synced_totals(ev.synced)
                state = s.state if s.state in STATES else state
                authorised, captured, refunded = s.authorised_minor, s.captured_minor, s.refunded_minor
                # what the gateway reported already includes every earlier event still waiting here
                covered = [p for p in pending if key(p) < key(ev)]
                applied += [p.id for p in covered]
                pending = [p for p in pending if p not in covered]
            else:
                to = NEXT[state].get(kind)
                over = ev.kind == "refunded" and refunded + ev.amount_minor > captured
                if to is None or over:
                    continue  # not yet: stays pending, never dropped
                if kind == "authorised":
                    authorised = ev.amount_minor
                elif kind == "captured":
                    captured += ev.amount_minor
                elif kind == "refunded":
                    refunded += ev.amount_minor
                state = "refunded" if refunded > 0 and refunded == captured else to
            applied.append(ev.id)
            pending.remove(ev)  # the one event of its id (ids are unique here); the loop restarts below
            progressed = True
            break  # restart from the lowest key after every change
    return Reduced(state, authorised, captured, refunded, applied, [p.id for p in pending])


def effects_due(reduced: Reduced, emitted: set[str]) -> list[str]:
    """One-shot business effects the payment has now earned and not yet emitted (resource-bound)."""
    due = []
    if reduced.state in ("captured", "refunded") and reduced.captured_minor > 0:
        due.append("mark_order_paid")
    if reduced.state == "refunded":
        due.append("mark_order_refunded")
    if reduced.state == "voided":
        due.append("release_authorisation")
    if emitted:
        due = [d for d in due if d not in emitted]
    return due


# --- decisions for one delivery ---------------------------------------------------------------

# The JSON of this state is what orderly.state's changelog has always held (a dict in release 0.2).
class State(msgspec.Struct, gc=False):
    """One card payment as the worker holds it: every event stored, what was applied and emitted."""

    n: int = 0
    events: list[CardEvent] = msgspec.field(default_factory=list)
    emitted: list[str] = msgspec.field(default_factory=list)
    applied: list[str] = msgspec.field(default_factory=list)
    currency: str | None = None
    recent: Recent = msgspec.field(default_factory=list, name="_recent")


class Snapshot(msgspec.Struct, gc=False):
    applied: list[str]
    events: int
    emitted: list[str]
    parked: int


load, dump = state_codec(State)
_encode = msgspec.json.Encoder().encode  # the snapshot's


def apply_event(state: State | None, w: Webhook, d: Delivery) -> tuple[State, list[Decision]]:
    """Store the event with the payment's others, rerun the reducer, and decide what changed."""
    state = State() if state is None else state
    body = w.event
    event = event_of(body, d)
    # event_id, event_type, sequence and payload spelt out on each decision, not a dict unpacked: hot
    for e in state.events:
        if e.id == event.id:
            return numbered(state, [_decide(d, DUPLICATE, event_id=event.id, event_type=body.type,
                                            sequence=event.sequence, payload=w.payload)])
    if len(state.events) >= MAX_EVENTS:  # the work a delivery costs stays bounded
        return numbered(state, [_decide(d, QUARANTINED, event_id=event.id, event_type=body.type,
                                        sequence=event.sequence, payload=w.payload,
                                        error=f"payment_ref: payment {d.resource_key.partition(':')[2]} holds "
                                              f"{MAX_EVENTS} events, the most one payment keeps")])
    state.events.append(event)
    state.currency = body.currency or state.currency
    reduced = reduce(state.events)
    before, applied = set(state.applied), set(reduced.applied)
    state.applied = reduced.applied
    newly = [e for e in state.events if e.id in applied and e.id not in before]
    payment_ref = d.resource_key.partition(":")[2]
    applied_at = iso_ms(d.received_at_ms)
    facts = [Fact("card_event", event.id, {
        "gateway_event_id": event.id, "payment_ref": payment_ref, "event_type": body.type,
        "sequence": event.sequence, "occurred_at": iso_ms(event.occurred_at_ms), "received_at": applied_at,
        "payload": w.raw.decode(), "source": "fetch" if event.kind == "synced" else "webhook"})]
    row: CardPaymentRow | None = None
    if newly:
        row = {"payment_ref": payment_ref, "state": reduced.state,
               "authorised_minor": reduced.authorised_minor, "captured_minor": reduced.captured_minor,
               "refunded_minor": reduced.refunded_minor, "currency": state.currency,
               "version": len(state.events)}  # events only accumulate: a newer row has more
        for e in newly:
            facts.append(Fact("card_event_applied", e.id, {"gateway_event_id": e.id, "applied_at": applied_at}))
    effects = []
    for kind in effects_due(reduced, set(state.emitted)):
        effects.append(Effect(f"card:{payment_ref}:{kind}", kind, "card", payment_ref,
                              {"payment_ref": payment_ref, "state": reduced.state,
                               "captured_minor": reduced.captured_minor, "refunded_minor": reduced.refunded_minor},
                              d.delivery_id))
        state.emitted.append(kind)
    outcome = SYNCED if event.kind == "synced" else APPLIED if event.id in applied else PARKED
    decisions = [_decide(d, outcome, row=row, table="card_payments" if newly else None, effects=effects,
                         facts=facts, event_id=event.id, event_type=body.type, sequence=event.sequence,
                         payload=w.payload)]
    # events that were parked and apply now: their own deliveries move to "unparked"
    for e in newly:
        if e.id != event.id:
            original = Delivery(e.delivery_id, "card", d.resource_key, e.received_at_ms, d.seq, e.source)
            decisions.append(_decide(original, UNPARKED, event_id=e.id, event_type=f"payment.{e.kind}",
                                     sequence=e.sequence))
    return numbered(state, decisions)


def snapshot(state: State) -> bytes:
    return _encode(Snapshot(state.applied, len(state.events), state.emitted, len(state.events) - len(state.applied)))


REDUCER: Reducer[State, Webhook] = Reducer(read, apply_event, load, dump, snapshot, snapshot_type=Snapshot)
