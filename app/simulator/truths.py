"""Random lifecycles from the gateway documents' state machines, and their delivery histories
(pure, seeded; see app/simulator/histories.py for the delivery rules and the choice of fetches).

Each event's ``fact`` says what the gateway meant by it, so the oracle reasons from the lifecycle
and never has to read a body back: pg the object's version and status, card the kind and amount,
paymos the status and the event's position in the lifecycle (its true order).
"""

from __future__ import annotations

import random
from datetime import UTC, datetime
from typing import Any

import orjson

from app.simulator import adyen as adyen_sim
from app.simulator import stripe_history
from app.simulator.histories import (
    BACKFILL_AFTER_MS,
    DAY,
    FETCH_AFTER_MS,
    Delivery,
    Event,
    History,
    Schedule,
    in_arrival_order,
    webhooks,
)

T0_MS = 1_796_000_000_000


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


# --- pg: deposits, withdrawals, balance transactions (pg-event-order-version-guard.txt) ---------
DEPOSIT_PATHS = (
    ["pending", "slip_received", "settled"],
    ["pending", "expired", "slip_received", "settled"],  # Case A: a late slip within the window
    ["pending", "slip_received", "settled", "reversed"],  # Case B
    ["pending", "expired"],
    ["pending", "canceled"],
    ["pending", "under_review", "rejected"],
    ["pending", "under_review", "settled"],
)


def _deposit(rng: random.Random, dep: str, clock: int) -> list[tuple[int, str, dict[str, Any]]]:
    path = list(rng.choice(DEPOSIT_PATHS))
    if rng.random() < 0.3:  # an attribute-only change: a new version, the same status
        at = rng.randrange(1, len(path) + 1)
        path.insert(at, path[at - 1])
    ordered = rng.randrange(10_000, 2_000_000)
    transferred = ordered + (rng.randrange(1, 50_000) if rng.random() < 0.2 else 0)
    received, fee = min(ordered, transferred), rng.randrange(0, ordered // 50 + 1)
    flag = None
    version, out = rng.randrange(1, 5), []
    for n, status in enumerate(path):
        clock += rng.randrange(1, 20 * 60_000)
        version += rng.randrange(1, 4)
        obj: dict[str, Any] = {"id": dep, "object": "deposit", "version": version, "status": status,
                               "ordered_amount_minor": ordered}
        if status in ("settled", "reversed"):
            obj.update(transferred_amount_minor=transferred, amount_received_minor=received, fee_total_minor=fee,
                       credited_amount_minor=received - fee)
        if status in ("expired", "canceled"):
            late = status == "expired" and (n + 1 < len(path) or rng.random() < 0.5)
            # a terminal one may still carry the window it had (passed): is_terminal decides
            until = iso(clock + DAY) if late else iso(clock - 1) if rng.random() < 0.5 else None
            obj.update(is_terminal=not late, late_slip_accepted_until=until)
            if status == "canceled":
                obj["cancel_reason_code"] = "merchant_request"
        if status == "under_review":
            obj["review"] = {"reasons": [{"display_th": "กำลังตรวจสอบ", "display_en": "Under review"}]}
        if status == "rejected":
            obj["rejection"] = {"display_th": "ปฏิเสธ"}
        if status == "slip_received" and transferred > ordered and flag is None:
            flag = {"claim_id": f"clm_{dep}", "cause": "same_transfer_excess", "amount_minor": transferred - ordered,
                    "slip_received_at": iso(clock), "status": "open", "action_required": "contact_support"}
        if flag is not None:
            obj["overpayment"] = flag
        out.append((clock, f"deposit.{'updated' if n and path[n - 1] == status else status}", obj))
    if rng.random() < 0.15:
        # a snapshot with a version already used, under an event id of its own (a gateway bug the
        # guard must absorb: apply iff version > stored, so whichever of the two the log holds first wins)
        at, _, twin = rng.choice(out)
        same: dict[str, Any] = {"id": dep, "object": "deposit", "version": twin["version"], "status": "under_review",
                                "ordered_amount_minor": ordered,
                                "review": {"reasons": [{"display_th": "ตรวจสอบ", "display_en": "Check"}]}}
        if "overpayment" in twin:
            same["overpayment"] = twin["overpayment"]
        out.append((at + rng.randrange(1, 60_000), "deposit.under_review", same))
    return out


def _withdrawal(rng: random.Random, wdr: str, clock: int) -> list[tuple[int, str, dict[str, Any]]]:
    total, filled, version, out = rng.randrange(100_000, 5_000_000), 0, rng.randrange(1, 5), []
    chunks = rng.randint(1, 4)
    for n in range(1, chunks + 1):
        clock += rng.randrange(1, 30 * 60_000)
        version += rng.randrange(1, 4)
        amount = total - filled if n == chunks else rng.randrange(1, (total - filled) // 2 + 2)
        filled += amount
        status = "settled" if filled == total else "filling"
        obj = {"id": wdr, "object": "withdrawal", "version": version, "status": status, "amount_total_minor": total,
               "filled_minor": filled, "remaining_minor": total - filled, "metadata": {"payout_id": f"po_{wdr}"},
               "_fill": {"leg_ref": f"leg_{wdr}_{n}", "sequence": n, "amount_minor": amount}}
        out.append((clock, f"withdrawal.{'settled' if status == 'settled' else 'filled'}", obj))
    return out


def pg(rng: random.Random, seed: int, stem: str) -> History:
    raw: list[tuple[int, str, str, dict[str, Any]]] = []  # (created, resource, type, object)
    correlations: dict[str, dict[str, str]] = {}
    for i in range(rng.choice([1, 1, 2, 3])):
        kind = rng.choices(["deposit", "withdrawal", "btxn"], weights=[6, 3, 1])[0]
        rid, start = f"{kind[:3]}_{stem}_{i}", T0_MS + rng.randrange(0, 10 * 60_000)
        if kind == "deposit":
            correlations[rid] = {"pg_deposit_id": rid, "merchant_reference": f"mr_{rid}", "our_order_id": f"ord_{rid}",
                                 "our_user_id": f"usr_{stem}_{rng.randrange(2)}"}
            raw += [(c, rid, t, o) for c, t, o in _deposit(rng, rid, start)]
        elif kind == "withdrawal":
            raw += [(c, rid, t, o) for c, t, o in _withdrawal(rng, rid, start)]
        else:
            raw.append((start, rid, "balance_transaction.created", {
                "id": rid, "object": "balance_transaction", "type": "deposit", "direction": "credit",
                "amount_minor": rng.randrange(1, 10**6), "bucket_from": None, "bucket_to": "pending",
                "source": {"id": "dep_x"}, "created_at": iso(start), "balance_after": 1}))
    raw.sort(key=lambda r: r[0])
    base = rng.randrange(1, 10**6)  # sequence: global per merchant, increasing in creation order
    events = []
    for n, (created, rid, type_, obj) in enumerate(raw):
        fill = obj.pop("_fill", None)
        data: dict[str, Any] = {"object": obj} if fill is None else {"object": obj, "fill": fill}
        body = {"id": f"evt_{rid}_{n}", "object": "event", "type": type_, "sequence": base + n,
                "created": iso(created), "data": data}
        events.append(Event(rid, orjson.dumps(body), created, {
            "id": body["id"], "kind": obj["object"], "version": obj.get("version"), "status": obj.get("status"),
            "sequence": base + n, "object": obj, "fill": fill}))
    schedule = Schedule.draw(rng, T0_MS, "pg")
    deliveries, lost = webhooks(rng, "pg", events, schedule)
    for dep, mapping in correlations.items():
        if rng.random() < 0.94:  # the merchant's create-deposit response, sometimes late, rarely never
            first = min(e.created_ms for e in events if e.resource == dep)
            at = first + rng.choice([-5_000, -1, 0, 1, 2_000, 10 * 60_000, rng.randrange(0, 3 * DAY)])
            deliveries.append(Delivery("correlation", dep, orjson.dumps(mapping), at, fact=mapping))
    if lost and rng.random() < 0.75:  # the gap backfill, 4 days after the gap was first seen
        deliveries = in_arrival_order(rng, deliveries)
        index = min(i for i, _ in lost)
        later = [d.at_ms for d in deliveries if d.source == "webhook" and d.event > index]
        if later:
            at = later[0] + BACKFILL_AFTER_MS + rng.randrange(0, 3_600_000)
            deliveries += [Delivery("fetch", e.resource, e.body, at + k, k + index)
                           for k, e in enumerate(events[index:])]
    return History("pg", seed, events, in_arrival_order(rng, deliveries), correlations)


# --- card: one payment (card-gateway-order-playbook.txt) -----------------------------------------
def card_truth(events: list[Event], before_ms: int | None = None) -> dict[str, Any]:
    """The gateway's GET /payments answer after the events created before ``before_ms``."""
    state, auth, captured, refunded = "created", 0, 0, 0
    for e in events:
        if before_ms is not None and e.created_ms >= before_ms:
            break
        kind, amount = e.fact["kind"], e.fact["amount"]
        auth = amount if kind == "authorised" else auth
        captured += amount if kind == "captured" else 0
        refunded += amount if kind == "refunded" else 0
        state = "refunded" if refunded and refunded == captured else "captured" if kind == "refunded" else kind
    return {"payment_ref": events[0].resource, "state": state, "authorised_minor": auth,
            "captured_minor": captured, "refunded_minor": refunded, "currency": "EUR"}


def synced_event(ref: str, answer: dict[str, Any], at_ms: int) -> bytes:
    """The gateway's GET /payments answer as the fetcher appends it, written from DESIGN §2.2 (not
    from app/fetcher.py; tests/unit/test_simulate_check.py holds the two equal): a `synced` event
    whose id is derived from the ref, the state and the totals."""
    totals = [answer["authorised_minor"], answer["captured_minor"], answer["refunded_minor"]]
    return orjson.dumps({
        "id": f"sync_{ref}_{answer['state']}_{totals[0]}_{totals[1]}_{totals[2]}", "type": "synced",
        "payment_ref": ref, "sequence": None,
        "occurred_at": datetime.fromtimestamp(at_ms / 1000, UTC).isoformat().replace("+00:00", "Z"),
        "amount_minor": 0, "currency": answer["currency"],
        "synced": {"state": answer["state"], "authorised_minor": totals[0], "captured_minor": totals[1],
                   "refunded_minor": totals[2]}})


def card(rng: random.Random, seed: int, stem: str) -> History:
    ref, clock, auth = f"pay_{stem}", T0_MS + rng.randrange(0, 60_000), rng.randrange(1_000, 100_000)
    steps = [("authorised", auth)]
    if rng.random() < 0.15:
        steps.append(("voided", 0))
    else:
        left = auth
        for n in range(rng.choice([1, 1, 2, 3])):
            amount = left if n == 2 or rng.random() < 0.4 else rng.randrange(1, left + 1)
            steps.append(("captured", amount))
            left -= amount
            if not left:
                break
        captured, refunded = auth - left, 0
        for _ in range(rng.choice([0, 0, 1, 2])):
            if refunded == captured:
                break
            first = steps[1][1]  # refunding the first capture alone is common (one shipment returned)
            roll = rng.random()
            amount = (captured - refunded if roll < 0.4 else first if roll < 0.6 and refunded + first <= captured
                      else rng.randrange(1, captured - refunded + 1))
            steps.append(("refunded", amount))
            refunded += amount
    sequenced = rng.random() < 0.4
    events = []
    for n, (kind, amount) in enumerate(steps):
        # same millisecond only where the rank keeps the order (an auto-capture after its authorisation)
        tie = n and steps[n - 1][0] == "authorised" and kind in ("captured", "voided") and rng.random() < 0.3
        clock += 0 if tie else rng.choice([1, 350, 2_000, 60_000, 3_600_000])
        body = {"id": f"evt_{ref}_{n}", "type": f"payment.{kind}", "payment_ref": ref,
                "sequence": n + 1 if sequenced else None, "occurred_at": iso(clock), "amount_minor": amount,
                "currency": "EUR"}
        events.append(Event(ref, orjson.dumps(body), clock, {"id": body["id"], "kind": kind, "amount": amount}))
    schedule = Schedule.draw(rng, T0_MS, "card")
    deliveries, lost = webhooks(rng, "card", events, schedule)
    moments = [last + FETCH_AFTER_MS + rng.randrange(0, 30_000) for _, last in lost]
    if rng.random() < 0.1:
        moments.append(rng.randrange(events[0].created_ms, events[-1].created_ms + 120_000))
    for at in moments:
        while any(e.created_ms == at for e in events):
            at += 1  # never at an event's own millisecond: the answer is the truth before ``at``
        answer = card_truth(events, at)
        deliveries.append(Delivery("fetch", ref, synced_event(ref, answer, at), at, fact={**answer, "at_ms": at}))
    return History("card", seed, events, in_arrival_order(rng, deliveries))


# --- paymos: invoices, withdrawals, channel deposits (paymos-events.ru.txt, DESIGN.md §2.3) -----
PAYMOS_PATHS = {
    "invoice": (["confirming", "paid"], ["confirming", "paid_over"], ["underpaid_waiting", "confirming", "paid"],
                ["confirming", "paid", "awaiting_payment", "confirming", "paid_over"],
                ["confirming", "paid", "awaiting_payment", "expired"], ["underpaid_waiting", "underpaid", "paid_late"],
                ["expired", "paid_late", "paid_late"], ["cancelled"]),
    "withdrawal": (["created", "processing", "completed"], ["created", "cancelled"], ["created", "failed"],
                   ["created", "processing", "completed", "completion_rewound", "completed"],
                   ["created", "processing", "completed", "completion_rewound", "failed"]),
    "payment_channel_deposit": (["confirming", "confirmed"], ["confirming", "reorged"],
                                ["confirming", "confirmed", "reorged", "confirming", "confirmed"]),
}
TERMINAL = {"paid", "paid_over", "underpaid", "expired", "cancelled", "completed", "failed", "confirmed"}
# order inside the state machine: a later state at the same updated_at is the newer one
MACHINE = {"awaiting_payment": 0, "confirming": 1, "underpaid_waiting": 2, "created": 0, "signed": 1,
           "processing": 2, "reorged": 0, **{s: 3 for s in TERMINAL}}
MACHINE["confirmed"] = 2
PREFIX = {"invoice": ("inv", "invoice.{}"), "withdrawal": ("wdr", "withdrawal.{}"),
          "payment_channel_deposit": ("pcd", "payment_channel.deposit.{}")}


def paymos(rng: random.Random, seed: int, stem: str) -> History:
    kind = rng.choice(list(PAYMOS_PATHS))
    short, type_format = PREFIX[kind]
    rid, clock, status = f"{short}_{stem}", T0_MS + rng.randrange(0, 60_000), ""
    events = []
    for n, step in enumerate(rng.choice(PAYMOS_PATHS[kind])):
        note = step == "paid_late"
        before = status
        status = status if note else "signed" if step == "completion_rewound" else step
        tie = n and not note and before and MACHINE[status] > MACHINE[before] and rng.random() < 0.2
        clock += 0 if tie else rng.choice([1, 900, 30_000, 600_000])
        data: dict[str, Any] = {"id": rid, "object": kind, "status": status, "is_final": status in TERMINAL,
                                "updated_at": clock, "amount": f"{rng.randrange(1, 10**8) / 10**8:.8f}"}
        if note:
            data["paid_late_at"] = clock // 1000
        body = {"event_id": f"evt_{rid}_{n}", "event_type": type_format.format(step), "created_at": clock,
                "data": data}
        events.append(Event(rid, orjson.dumps(body), clock, {"id": body["event_id"], "kind": kind, "step": step,
                                                              "status": status, "note": note, "position": n}))
    deliveries, lost = webhooks(rng, "paymos", events, Schedule.draw(rng, T0_MS, "paymos"))
    for index, last in lost:  # inside the window by construction; a late attempt still lands
        deliveries.append(Delivery("webhook", rid, events[index].body, last + 1, index))
    return History("paymos", seed, events, in_arrival_order(rng, deliveries))


GENERATORS = {"pg": pg, "card": card, "paymos": paymos, "stripe": stripe_history.history}
GENERATORS["adyen"] = adyen_sim.history


def make(gateway: str, seed: int, tag: str = "") -> History:
    """The history of ``gateway`` for ``seed``: the same seed gives the same history (``tag``
    prefixes its resource ids, so a stack can take the same seeds twice)."""
    return GENERATORS[gateway](random.Random(f"{gateway}:{seed}"), seed, f"{tag}{seed}")
