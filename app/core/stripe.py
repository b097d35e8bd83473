"""The stripe gateway's reducer: a PaymentIntent's read model and effects from *all* its stored
snapshots, each object's latest by Stripe's lifecycle (pure layer; docs/gateways/stripe.md).

Stripe's events carry no version, ``created`` is whole seconds, and neither statuses nor amounts are
monotone (a failed attempt returns a PaymentIntent to ``requires_payment_method``; a failed refund
lowers a charge's ``amount_refunded``). So every snapshot is kept, and per object (the
PaymentIntent, each charge, refund and dispute, by id) the latest is the one with the greatest
:func:`snapshot_key`:

1. terminal first: a ``succeeded`` or ``canceled`` PaymentIntent, a ``failed`` or ``canceled``
   refund never changes status again, whatever the ``created`` of the others (a dispute has no such
   status: a lost one can be appealed, so its snapshots go by ``created``);
2. ``created`` (seconds);
3. the lifecycle rank of the event type within one second (:data:`RANK`: what each type can follow);
   Orderly's fetched answer ranks -1, below an event of its own second;
4. the event id: the order is total, so a replay sorts identically.

The read model and the effects are derived from those latest snapshots on every delivery, never
incremented, so any arrival order with duplicates ends where creation order ends. A same-second tie
the rank cannot settle (a failure and a retry's step) and a thin event ask for a fetch (a
``stripe_fetch`` fact); the fetched answer is one more snapshot of each object it holds.
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
    STALE,
    SYNCED,
    UNPARKED,
    Decision,
    Delivery,
    Effect,
    Fact,
    Recent,
    decide,
    numbered,
)
from app.core.reducer import Reducer, state_codec
from app.gateways.stripe import Obj, Snapshot, Synced, Webhook, read

GATEWAY = "stripe"
TABLE = "stripe_payment_intents"
# Events kept per PaymentIntent: beyond, quarantined. Every delivery derives the read model from all
# of them again, so without a bound a sender that never stops made each delivery dearer for ever; at
# 1,000 one costs a few ms, far above a real flow (a hundred card-testing attempts, 100 refunds).
MAX_EVENTS = 1000
RANK = {
    "payment_intent.created": 0, "payment_intent.requires_action": 1, "payment_intent.processing": 2,
    "payment_intent.amount_capturable_updated": 3, "payment_intent.partially_funded": 3,
    "payment_intent.payment_failed": 4, "payment_intent.succeeded": 5, "payment_intent.canceled": 5,
    "charge.pending": 0, "charge.succeeded": 1, "charge.failed": 1, "charge.captured": 2, "charge.expired": 2,
    "charge.updated": 3, "charge.refunded": 4,
    "refund.created": 0, "refund.updated": 1, "charge.refund.updated": 1, "refund.failed": 2,
    "charge.dispute.created": 0, "charge.dispute.updated": 1, "charge.dispute.funds_withdrawn": 2,
    "charge.dispute.funds_reinstated": 3, "charge.dispute.closed": 4,
    "synced": -1,
}
TERMINAL = {"payment_intent": frozenset({"succeeded", "canceled"}), "refund": frozenset({"failed", "canceled"})}
# Closed, though an appeal (appeal_needs_response, appeal_under_review) can reopen a lost one: each
# dispute is closed once for the merchant, at the first closed status heard of.
DISPUTE_CLOSED = frozenset({"won", "lost", "warning_closed", "prevented"})
REFUND_COUNTED = frozenset({"pending", "requires_action", "succeeded"})  # what a charge's amount_refunded holds
# A retry can follow a failure within one second as well as precede it: such a tie is a guess.
ATTEMPT_STEPS = frozenset({"payment_intent.requires_action", "payment_intent.processing",
                           "payment_intent.amount_capturable_updated"})
FAILED_ATTEMPT = "payment_intent.payment_failed"
# The fetcher's query (the registry's Fetch.parked): the PaymentIntents waiting longer than $1
# seconds for a fetch, except the ids in $2 — a parked thin event, or a same-second failure and
# attempt step (:func:`tie`, read from the timeline's stored payloads) that no fetched answer of
# that second or later has settled yet, its PaymentIntent not terminal. A superset of what
# :func:`tie` flags (it also asks when a later snapshot has replaced the tied one): one fetch too
# many is harmless, its answer one more snapshot.
# Only ``pi_`` ids: a charge's, refund's or dispute's thin event is keyed by its own id, which the
# PaymentIntents API cannot answer.
# Failed attempts only accumulate (a decline is common; an abandoned PaymentIntent is never
# terminal), and a settled tie stays settled: FETCH_WANTED_RECENT (Fetch.parked_recent, the
# fetcher's passes between two of FETCH_WANTED's: app/fetch_passes.py) looks only at the
# PaymentIntents with a failed attempt or an attempt step written to the read model at or after $3
# (a tie appears with the later of its two, in either order; a redriven or late one is written
# late, whenever the ingest received it) and at those in $4 (the fetcher asked about them before);
# at parked thin events, all of them.
WANTED_AT_MOST = 500  # resources a pass fetches at most, oldest first
_TIED = ", ".join(f"'{t}'" for t in sorted({FAILED_ATTEMPT, *ATTEMPT_STEPS}))


# the recent pass's filter of the failed attempts ("<since>" in the query)
_RECENT = (f" AND f.resource_id IN (SELECT r.resource_id FROM webhook_events r WHERE r.gateway = '{GATEWAY}'"
           f"\n            AND r.event_type IN ({_TIED}) AND r.projected_at >= $3"
           f"\n            UNION ALL SELECT unnest($4::text[]))")
_WANTED = f"""
WITH wanted AS (
  SELECT resource_id, received_at FROM webhook_events WHERE gateway = '{GATEWAY}' AND outcome = 'parked'
  UNION ALL
  SELECT f.resource_id, f.received_at FROM webhook_events f
   WHERE f.gateway = '{GATEWAY}' AND f.event_type = '{FAILED_ATTEMPT}'<since> AND EXISTS (
         SELECT 1 FROM webhook_events s WHERE s.gateway = '{GATEWAY}' AND s.resource_id = f.resource_id
            AND s.event_type IN ({", ".join(f"'{t}'" for t in sorted(ATTEMPT_STEPS))})
            AND s.payload->>'created' = f.payload->>'created')
     AND NOT EXISTS (
         SELECT 1 FROM webhook_events y WHERE y.gateway = '{GATEWAY}' AND y.resource_id = f.resource_id
            AND y.event_type = 'synced' AND (y.payload->>'created')::bigint >= (f.payload->>'created')::bigint)
     AND NOT EXISTS (  -- a terminal status is certain (tie): nothing left to settle
         SELECT 1 FROM {TABLE} p WHERE p.id = f.resource_id
            AND p.status IN ({", ".join(f"'{t}'" for t in sorted(TERMINAL["payment_intent"]))})))
SELECT resource_id AS id FROM wanted WHERE resource_id LIKE 'pi\\_%' AND resource_id <> ALL($2::text[])
 GROUP BY resource_id HAVING min(received_at) < now() - make_interval(secs => $1)
 ORDER BY min(received_at) LIMIT {WANTED_AT_MOST}"""
FETCH_WANTED = _WANTED.replace("<since>", "")
FETCH_WANTED_RECENT = _WANTED.replace("<since>", _RECENT)

Key = tuple[int, int, int, str]


class StoredEvent(msgspec.Struct, frozen=True, gc=False):
    """One stored event of the resource as the reducer orders it, with the delivery that brought it."""

    id: str
    type: str
    kind: str  # snapshot | thin | synced
    created: int  # seconds (a thin event's ISO time, floored)
    objects: list[Obj]  # a snapshot's data.object; a synced answer's PaymentIntent, charge, refunds; thin: none
    delivery_id: str = ""
    received_at_ms: int = 0
    source: str = "webhook"


def snapshot_key(obj: Obj, event: StoredEvent) -> Key:
    """The order of one object's snapshots (the module docstring states it)."""
    terminal = 1 if obj.status is not None and obj.status in TERMINAL.get(obj.object, ()) else 0
    return terminal, event.created, RANK.get(event.type, 3), event.id


class Latest(msgspec.Struct, gc=False):
    key: Key
    obj: Obj
    event: StoredEvent


def latest(events: list[StoredEvent]) -> dict[tuple[str, str], Latest]:
    """Each object's latest snapshot, by (object kind, id)."""
    found: dict[tuple[str, str], Latest] = {}
    for e in events:
        for obj in e.objects:
            key = snapshot_key(obj, e)
            slot = found.get((obj.object, obj.id))
            if slot is None or key > slot.key:
                found[(obj.object, obj.id)] = Latest(key, obj, e)
    return found


class Row(TypedDict):
    id: str
    status: str | None
    amount_minor: int | None
    amount_received_minor: int
    amount_refunded_minor: int
    currency: str | None
    dispute_status: str | None
    updated_at: str | None
    version: int  # the stored events: they only accumulate, a newer row has more


class View(msgspec.Struct, gc=False):
    """What the latest snapshots say of the resource."""

    status: str | None = None
    amount: int | None = None
    received: int = 0
    refunded: int = 0
    refunds_succeeded: int = 0
    currency: str | None = None
    paid: bool = False
    failed: bool = False
    # (id, latest status, ever closed), oldest first
    disputes: list[tuple[str, str | None, bool]] = msgspec.field(default_factory=list)
    updated: int | None = None
    uncertain: str | None = None  # why the PaymentIntent's latest snapshot is a guess


def view(resource_id: str, events: list[StoredEvent]) -> View:
    slots = latest(events)
    by_kind: dict[str, list[Latest]] = {}
    for (kind, _), slot in sorted(slots.items(), key=lambda item: item[1].key[1:]):
        by_kind.setdefault(kind, []).append(slot)
    out = View(updated=max((s.key[1] for s in slots.values()), default=None))
    intents = by_kind.get("payment_intent", [])
    pi = next((s for s in intents if s.obj.id == resource_id), intents[-1] if intents else None)
    charges = by_kind.get("charge", [])
    own = next((s.obj for s in charges if s.obj.id == resource_id and s.obj.payment_intent is None), None)
    if pi is not None:
        out.status, out.amount, out.received = pi.obj.status, pi.obj.amount, pi.obj.amount_received or 0
        out.paid, out.failed = pi.obj.status == "succeeded", pi.obj.status == "canceled"
        out.uncertain = tie(pi, events)
    elif own is not None:  # a charge without a PaymentIntent (the Charges API) is the resource itself
        out.status, out.amount = own.status, own.amount
        out.received = (own.amount_captured or 0) if own.status == "succeeded" else 0
        out.paid, out.failed = own.status == "succeeded" and own.captured is True, own.status == "failed"
    refunds = by_kind.get("refund", [])
    out.refunded = refunded(charges, refunds)
    out.refunds_succeeded = sum(s.obj.amount or 0 for s in refunds if s.obj.status == "succeeded")
    out.currency = next((s.obj.currency for s in [*intents, *charges, *refunds] if s.obj.currency), None)
    closed = {o.id for e in events for o in e.objects if o.object == "dispute" and o.status in DISPUTE_CLOSED}
    out.disputes = [(s.obj.id, s.obj.status, s.obj.id in closed) for s in by_kind.get("dispute", [])]
    return out


def refunded(charges: list[Latest], refunds: list[Latest]) -> int:
    """The refunded amount from the newer evidence: the charges' ``amount_refunded`` or the refunds'
    own statuses. On a tie of seconds the charges': a charge's total holds every refund of that
    moment, while a refund whose own event is missing would be left out of the refunds' sum."""
    by_charges = sum(s.obj.amount_refunded or 0 for s in charges)
    by_refunds = sum(s.obj.amount or 0 for s in refunds if s.obj.status in REFUND_COUNTED)
    if not refunds:
        return by_charges
    if not charges:
        return by_refunds
    newest_charge = max(s.key[1] for s in charges)
    return by_refunds if max(s.key[1] for s in refunds) > newest_charge else by_charges


def tie(pi: Latest, events: list[StoredEvent]) -> str | None:
    """Why the PaymentIntent's latest snapshot cannot be placed with certainty, or None."""
    if pi.key[0] == 1 or pi.event.kind != "snapshot":
        return None  # a terminal status, or a fetched answer, is certain
    for e in events:
        if e.kind == "snapshot" and e.id != pi.event.id and e.created == pi.event.created:
            pair = {e.type, pi.event.type}
            if FAILED_ATTEMPT in pair and pair & ATTEMPT_STEPS:
                return f"same-second {e.type} and {pi.event.type} at {e.created}: either order is possible"
    return None


def effects_due(v: View) -> list[tuple[str, str | None]]:
    """(effect, dispute id) the resource has earned, in a fixed order."""
    due: list[tuple[str, str | None]] = []
    if v.paid:
        due.append(("mark_order_paid", None))
    if v.failed:
        due.append(("mark_order_failed", None))
    if v.received > 0 and v.refunds_succeeded >= v.received:
        due.append(("mark_order_refunded", None))
    for dispute_id, _, was_closed in v.disputes:
        due.append(("open_dispute", dispute_id))
        if was_closed:
            due.append(("close_dispute", dispute_id))
    return due


# --- decisions for one delivery ---------------------------------------------------------------

class State(msgspec.Struct, gc=False):
    """One PaymentIntent (or PaymentIntent-less charge) as the worker holds it."""

    n: int = 0
    events: list[StoredEvent] = msgspec.field(default_factory=list)
    emitted: list[str] = msgspec.field(default_factory=list)  # effect dedupe keys
    waiting: list[str] = msgspec.field(default_factory=list)  # thin events no fetched answer covers yet
    asked: list[str] = msgspec.field(default_factory=list)  # uncertain ties a fetch was asked for
    row: Row | None = None
    recent: Recent = msgspec.field(default_factory=list, name="_recent")


class Summary(msgspec.Struct, gc=False):
    status: str | None
    events: int
    emitted: list[str]
    parked: int  # thin events waiting for a fetched answer


load, dump = state_codec(State)
_encode = msgspec.json.Encoder().encode


def iso(seconds: int) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat().replace("+00:00", "Z")


def stored(w: Webhook, d: Delivery) -> StoredEvent:
    event = w.event
    where = (d.delivery_id, d.received_at_ms, d.source)
    if isinstance(event, Snapshot):
        return StoredEvent(event.id, event.type, "snapshot", event.created, [event.data.object], *where)
    if isinstance(event, Synced):
        data = event.data
        objects = [data.object, *([data.charge] if data.charge is not None else []), *data.refunds]
        return StoredEvent(event.id, "synced", "synced", event.created, objects, *where)
    moment = datetime.fromisoformat(event.created.replace("Z", "+00:00"))
    created = int((moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp())  # no zone reads as UTC
    return StoredEvent(event.id, event.type, "thin", created, [], *where)


def row_of(resource_id: str, v: View, version: int) -> Row:
    return {"id": resource_id, "status": v.status, "amount_minor": v.amount, "amount_received_minor": v.received,
            "amount_refunded_minor": v.refunded, "currency": v.currency,
            "dispute_status": v.disputes[-1][1] if v.disputes else None,
            "updated_at": iso(v.updated) if v.updated is not None else None, "version": version}


def fetch_fact(resource_id: str, event_id: str, reason: str) -> Fact:
    return Fact("stripe_fetch", f"{GATEWAY}:{resource_id}:fetch:{event_id}",
                {"gateway": GATEWAY, "resource_id": resource_id, "event_id": event_id, "reason": reason})


def apply_event(state: State | None, w: Webhook, d: Delivery) -> tuple[State, list[Decision]]:
    """Store the event with the resource's others, derive the read model again, decide what changed."""
    state = State() if state is None else state
    event = stored(w, d)
    common_type = w.event.type
    for e in state.events:
        if e.id == event.id:
            return numbered(state, [decide(d, DUPLICATE, event_id=event.id, event_type=common_type, payload=w.payload)])
    resource_id = d.resource_key.partition(":")[2]
    if len(state.events) >= MAX_EVENTS:  # the work a delivery costs stays bounded
        return numbered(state, [decide(d, QUARANTINED, event_id=event.id, event_type=common_type, payload=w.payload,
                                       error=f"data.object: {resource_id} holds {MAX_EVENTS} events, the most one "
                                             "PaymentIntent keeps")])
    state.events.append(event)
    facts: list[Fact] = []
    if event.kind == "thin":
        if any(e.kind == "synced" and e.created >= event.created for e in state.events):
            return numbered(state, [decide(d, STALE, event_id=event.id, event_type=common_type, payload=w.payload)])
        state.waiting.append(event.id)
        facts.append(fetch_fact(resource_id, event.id, "a thin event carries no state"))
        return numbered(state, [decide(d, PARKED, event_id=event.id, event_type=common_type, facts=facts,
                                       payload=w.payload)])
    v = view(resource_id, state.events)
    slots = latest(state.events)
    is_latest = any(slots[(o.object, o.id)].event.id == event.id for o in event.objects)
    if v.uncertain is not None and v.uncertain not in state.asked:
        state.asked.append(v.uncertain)
        facts.append(fetch_fact(resource_id, event.id, v.uncertain))
    row = row_of(resource_id, v, len(state.events))
    changed = state.row is None or {**state.row, "version": 0} != {**row, "version": 0}
    state.row = row
    effects = []
    for kind, dispute_id in effects_due(v):
        key = f"{GATEWAY}:{resource_id}:{kind}" + (f":{dispute_id}" if dispute_id else "")
        if key in state.emitted:
            continue
        state.emitted.append(key)
        effects.append(Effect(key, kind, GATEWAY, resource_id, {
            "payment_intent": resource_id, "status": v.status, "amount_received_minor": v.received,
            "amount_refunded_minor": v.refunded, "currency": v.currency, "dispute_id": dispute_id}, d.delivery_id))
    outcome = SYNCED if event.kind == "synced" else APPLIED if is_latest else STALE
    decisions = [decide(d, outcome, event_id=event.id, event_type=common_type, row=row if changed else None,
                        table=TABLE if changed else None, effects=effects, facts=facts, payload=w.payload)]
    if event.kind == "synced":
        decisions += covered(state, event, d)
    return numbered(state, decisions)


def covered(state: State, synced: StoredEvent, d: Delivery) -> list[Decision]:
    """Thin events the fetched answer covers move from parked to unparked."""
    out = []
    for e in state.events:
        if e.id in state.waiting and e.created <= synced.created:
            # the thin event's own delivery (its id and receipt) on this resource; the ordinal is numbered's
            original = msgspec.structs.replace(d, delivery_id=e.delivery_id, received_at_ms=e.received_at_ms)
            out.append(decide(original, UNPARKED, event_id=e.id, event_type=e.type))
            state.waiting.remove(e.id)
    return out


def snapshot(state: State) -> bytes:
    return _encode(Summary(state.row["status"] if state.row else None, len(state.events), state.emitted,
                           len(state.waiting)))


REDUCER: Reducer[State, Webhook] = Reducer(read, apply_event, load, dump, snapshot, snapshot_type=Summary)
