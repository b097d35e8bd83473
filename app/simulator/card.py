"""card's simulator (simulator layer): one payment's histories for ``orderly simulate --check``
(card-gateway-order-playbook.txt), the oracle of what they must end at, and the lifecycles
`orderly dev`/`demo` deliver. Found by card's registry line (``simulator="app.simulator.card"``)
through app/simulator/plugins.py.
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import orjson
from aiohttp import web

from app.simulator import lifecycles
from app.simulator.expected import CARD_RANK, Fetched, card_reduce, occurred_ms
from app.simulator.gateway_api import ApiContext
from app.simulator.histories import (
    FETCH_AFTER_MS,
    HOUR,
    MIN,
    Delivery,
    Event,
    History,
    Retrying,
    Schedule,
    in_arrival_order,
    webhooks,
)
from app.simulator.lifecycles import Emitted, Truth
from app.simulator.oracle import Outcome
from app.simulator.plugins import DemoInput, DemoTable, GatewaySimulator
from app.simulator.truths import T0_MS, iso

RETRYING = Retrying((0, 30_000, 2 * MIN, 10 * MIN, HOUR, 6 * HOUR))


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
    from app/gateways/card.py; tests/unit/test_simulate_check.py holds the two equal): a `synced` event
    whose id is derived from the ref, the state and the totals."""
    totals = [answer["authorised_minor"], answer["captured_minor"], answer["refunded_minor"]]
    return orjson.dumps({
        "id": f"sync_{ref}_{answer['state']}_{totals[0]}_{totals[1]}_{totals[2]}", "type": "synced",
        "payment_ref": ref, "sequence": None,
        "occurred_at": datetime.fromtimestamp(at_ms / 1000, UTC).isoformat().replace("+00:00", "Z"),
        "amount_minor": 0, "currency": answer["currency"],
        "synced": {"state": answer["state"], "authorised_minor": totals[0], "captured_minor": totals[1],
                   "refunded_minor": totals[2]}})


def generate(rng: random.Random, seed: int, stem: str) -> History:
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
            # or every capture but the last: taken before that capture (a wrong rank, a clock trusted
            # over the sequence) it would refund the payment in full and leave the capture parked
            but_last = captured - steps[-1][1] if steps[-1][0] == "captured" else 0
            roll = rng.random()
            amount = (captured - refunded if roll < 0.35 else first if roll < 0.55 and refunded + first <= captured
                      else but_last if roll < 0.75 and 0 < but_last and refunded + but_last <= captured
                      else rng.randrange(1, captured - refunded + 1))
            steps.append(("refunded", amount))
            refunded += amount
    sequenced = rng.random() < 0.4
    skewed = sequenced and rng.random() < 0.5  # the gateway's nodes' clocks disagree; its sequence does not
    events: list[Event] = []
    stamps: list[int] = []
    for n, (kind, amount) in enumerate(steps):
        # the same millisecond only where the playbook's rank keeps the true order: authorised before
        # captured or voided, captured before refunded, and two of a kind (their order changes no total)
        tie = n and CARD_RANK[steps[n - 1][0]] <= CARD_RANK[kind] and rng.random() < 0.3
        clock += 0 if tie else rng.choice([1, 350, 2_000, 60_000, 3_600_000])
        # a skewed clock stamps an event before the one created before it (the sequence wins)
        stamp = stamps[-1] - rng.choice([1, 400, 5_000]) if skewed and n and rng.random() < 0.6 else clock
        body = {"id": f"evt_{ref}_{n}", "type": f"payment.{kind}", "payment_ref": ref,
                "sequence": n + 1 if sequenced else None, "occurred_at": iso(stamp), "amount_minor": amount,
                "currency": "EUR"}
        events.append(Event(ref, orjson.dumps(body), clock, {"id": body["id"], "kind": kind, "amount": amount}))
        stamps.append(stamp)
    schedule = Schedule.draw(rng, T0_MS, RETRYING)
    deliveries, lost = webhooks(rng, events, schedule)
    moments = [last + FETCH_AFTER_MS + rng.randrange(0, 30_000) for _, last in lost]
    if rng.random() < 0.1:
        moments.append(rng.randrange(events[0].created_ms, events[-1].created_ms + 120_000))
    for at in moments:
        # never at an event's own millisecond, nor between an event's creation and its (skewed) stamp:
        # the answer is the truth of the events created before ``at``, which are those stamped before it
        inside = [max(e.created_ms, s) for e, s in zip(events, stamps, strict=True)
                  if min(e.created_ms, s) <= at <= max(e.created_ms, s)]
        while inside:
            at = max(inside) + 1
            inside = [max(e.created_ms, s) for e, s in zip(events, stamps, strict=True)
                      if min(e.created_ms, s) <= at <= max(e.created_ms, s)]
        answer = card_truth(events, at)
        deliveries.append(Delivery("fetch", ref, synced_event(ref, answer, at), at, fact={**answer, "at_ms": at}))
    return History("card", seed, events, in_arrival_order(rng, deliveries))


CASES = ("tie authorised-captured", "tie authorised-voided", "tie captured-captured", "tie captured-refunded",
         "tie refunded-refunded", "the rank decides", "clocks disagree", "the sequence decides", "lost then fetched",
         "fetched at random", "parked on the way")


def cases(history: History) -> set[str]:
    """The cases of ``CASES`` that ``history`` holds, read from its events and deliveries."""
    found, events = set(), history.events
    bodies = [orjson.loads(e.body) for e in events]
    for before, after in itertools.pairwise(events):
        if before.created_ms == after.created_ms:
            found.add(f"tie {before.fact['kind']}-{after.fact['kind']}")
            captured = sum(e.fact["amount"] for e in events[:events.index(before)] if e.fact["kind"] == "captured")
            if before.fact["kind"] == "captured" and after.fact["kind"] == "refunded" and \
                    after.fact["amount"] == captured:
                found.add("the rank decides")  # taken first, the refund would refund the earlier captures in full
    stamps = [occurred_ms(b["occurred_at"]) for b in bodies]
    if bodies[0]["sequence"] is not None and stamps != sorted(stamps):
        found.add("clocks disagree")
        by_clock = [{**b, "sequence": None} for b in bodies]
        if card_reduce(by_clock)["state"] != card_reduce(bodies)["state"] or \
                card_reduce(by_clock)["parked"] != card_reduce(bodies)["parked"]:
            found.add("the sequence decides")
    delivered = {d.event for d in history.deliveries if d.source == "webhook"}
    fetches = sum(d.source == "fetch" for d in history.deliveries)
    if len(delivered) < len(events) and fetches:
        found.add("lost then fetched")
    if fetches > len(events) - len(delivered):
        found.add("fetched at random")
    if any("parked" in seen for seen in (oracle(history).outcomes or {}).values()):
        found.add("parked on the way")
    return found


def _card_fold(events: list[Any], state: dict[str, Any]) -> tuple[dict[str, Any], list[str], list[str]]:
    """The playbook's reduce over ``events`` (true order) from ``state``: applied and waiting ids."""
    moves = {"created": {"authorised"}, "authorised": {"captured", "voided"}, "captured": {"captured", "refunded"}}
    pending, applied = list(events), []
    while True:
        for event in pending:
            kind, amount = event.fact["kind"], event.fact["amount"]
            if kind not in moves.get(state["state"], set()):
                continue
            if kind == "refunded" and state["refunded_minor"] + amount > state["captured_minor"]:
                continue  # a refund above what is captured waits for its capture
            if kind == "authorised":
                state["authorised_minor"] = amount
            total = {"captured": "captured_minor", "refunded": "refunded_minor"}.get(kind)
            if total:
                state[total] += amount
            full = state["refunded_minor"] and state["refunded_minor"] == state["captured_minor"]
            state["state"] = "refunded" if full else "captured" if kind == "refunded" else kind
            applied.append(event.fact["id"])
            pending.remove(event)
            break
        else:
            return state, applied, [e.fact["id"] for e in pending]


def _card_known(history: History, upto: int) -> tuple[dict[str, Any], list[str], list[str]]:
    """The payment as the first ``upto`` deliveries let anyone know it: the latest fetched answer,
    then the events delivered after it folded on top. Returns (state, applied or covered, waiting)."""
    import orjson

    fetched: dict[str, tuple[int, dict[str, Any]]] = {}
    for d in history.deliveries[:upto]:
        if d.source == "fetch":
            fetched.setdefault(orjson.loads(d.body)["id"], (d.fact["at_ms"], d.fact))
    seen = {d.event for d in history.deliveries[:upto] if d.source == "webhook"}
    known = [e for i, e in enumerate(history.events) if i in seen]  # true order
    state = {"state": "created", "authorised_minor": 0, "captured_minor": 0, "refunded_minor": 0}
    covered: list[str] = list(fetched)
    if fetched:
        at, answer = max(fetched.values(), key=lambda v: v[0])
        state = {k: answer[k] for k in state}
        covered += [e.fact["id"] for e in known if e.created_ms < at]
        known = [e for e in known if e.created_ms >= at]
    state, applied, waiting = _card_fold(known, state)
    return state, covered + applied, waiting


def card_earned(state: dict[str, Any]) -> set[str]:
    earned = set()
    if state["state"] in ("captured", "refunded") and state["captured_minor"] > 0:
        earned.add("mark_order_paid")
    earned |= {"refunded": {"mark_order_refunded"}, "voided": {"release_authorisation"}}.get(state["state"], set())
    return earned


def oracle(history: History) -> Outcome:
    """The end state from the lifecycle's truth; the effects it earned, and those a state the
    deliveries showed at some moment earned (a one-shot effect is not taken back: a refund equal
    to the captures seen so far reads as fully refunded until a later capture arrives; counted
    apart as ``transient`` so the run shows how often it happens)."""
    want, ref = Outcome(), history.events[0].resource
    state, applied, waiting = _card_known(history, len(history.deliveries))
    if applied:
        want.rows[ref] = dict(state)
    want.facts = {("card_event_applied", i) for i in applied}
    want.parked[ref] = len(waiting)
    final = card_earned(state)
    shown = set(final)
    # each delivery's outcomes: a known event id again is a duplicate; an answer fetched is synced; an
    # event is applied if the payment as then known takes it, else parked, and each event that
    # waited and is taken (or covered by an answer) now is unparked on the delivery that brought it
    want.outcomes, first, before = {}, {}, set()
    for i, d in enumerate(history.deliveries):
        event_id = orjson.loads(d.body)["id"] if d.source == "fetch" else history.events[d.event].fact["id"]
        if event_id in first:
            want.outcomes[i] = ["duplicate"]
            continue
        first[event_id] = i
        known, taken, _ = _card_known(history, i + 1)
        shown |= card_earned(known)
        want.outcomes[i] = ["synced" if d.source == "fetch" else "applied" if event_id in taken else "parked"]
        for other in taken:
            if other not in before and other != event_id:
                want.outcomes[first[other]].append("unparked")
        before = set(taken)
    want.effects = {(f"card:{ref}:{kind}", kind, None) for kind in shown}
    want.transient = {f"card:{ref}:{kind}" for kind in shown - final}
    return want


def card_row_breaks(row: Mapping[str, Any]) -> set[str]:
    """What a card_payments row breaks of the table's CHECKs and the playbook's states (every row the
    projector would write, not only the last: a passing row refused by PostgreSQL stalls nothing
    but is lost)."""
    broken = set()
    if not 0 <= row["refunded_minor"] <= row["captured_minor"]:
        broken.add(f"card_payments {row['payment_ref']}: refunded {row['refunded_minor']} above captured "
                   f"{row['captured_minor']}")
    if (row["state"] == "refunded") != (0 < row["refunded_minor"] == row["captured_minor"]):
        broken.add(f"card_payments {row['payment_ref']}: state {row['state']} with captured {row['captured_minor']}"
                   f" and refunded {row['refunded_minor']}")
    return broken


def stale_card_answer(ref: str, events: list[Emitted]) -> dict[str, Any] | None:
    """The payment as it stood before its last event (None if that leaves nothing to tell)."""
    bodies = [orjson.loads(e.body) for e in events if e.gateway == "card" and e.resource == ref]
    if len(bodies) < 2:
        return None
    before = card_reduce(bodies[:-1])
    return {"payment_ref": ref, "state": before["state"], "authorised_minor": before["authorised_minor"],
            "captured_minor": before["captured_minor"], "refunded_minor": before["refunded_minor"],
            "currency": bodies[-1]["currency"]}


# --- `orderly simulate`/`dev`/`demo`'s lifecycles ------------------------------------------------
def lifecycle(rng: random.Random, payments: int, truth: Truth) -> list[Emitted]:
    out: list[Emitted] = []
    for i in range(payments):
        ref = f"pay_sim{i}"
        clock = lifecycles.T0_MS + rng.randrange(0, 60_000)
        auth = rng.randrange(1_000, 100_000)
        steps: list[tuple[str, int]] = [("authorised", auth)]
        roll = rng.random()
        if roll < 0.1:
            steps.append(("voided", 0))
        else:
            first = auth if rng.random() < 0.6 else auth * 2 // 3
            steps.append(("captured", first))
            if first < auth:
                steps.append(("captured", auth - first))  # partial captures
            if roll > 0.6:
                steps.append(("refunded", auth if roll > 0.85 else auth // 4))
        captured = refunded = 0
        state = "created"
        for n, (kind, amount) in enumerate(steps):
            clock += rng.choice([0, 0, 1, 350, 2000])  # an auto-capture can share the millisecond
            body = {"id": f"evt_{ref}_{n}", "type": f"payment.{kind}", "payment_ref": ref, "sequence": None,
                    "occurred_at": iso(clock), "amount_minor": amount, "currency": "EUR"}
            out.append(Emitted("card", ref, orjson.dumps(body), clock))
            if kind == "captured":
                captured += amount
            if kind == "refunded":
                refunded += amount
            state = "refunded" if refunded and refunded == captured else ("captured" if kind == "refunded" else kind)
        truth.card[ref] = {"payment_ref": ref, "state": state, "authorised_minor": auth, "captured_minor": captured,
                           "refunded_minor": refunded, "currency": "EUR"}
    return out


def api(context: ApiContext) -> list[web.RouteDef]:
    """``GET /payments/{ref}``: the payment's answer (truth, or one event behind), each 200 kept."""
    async def card_payment(request: web.Request) -> web.Response:
        route, ref = "card GET /payments/{ref}", request.match_info["ref"]
        if context.fetch_api == "404":
            return context.not_found(route)
        body = (context.truth.card.get(ref) if context.fetch_api == "truth"
                else stale_card_answer(ref, context.events))
        if not body:
            return context.not_found(route)
        context.served.card_answers.append(Fetched(ref, dict(body), int(time.time() * 1000)))
        return context.answer(route, body)

    return [web.get("/payments/{ref}", card_payment)]


def expected_payments(run: DemoInput) -> dict[str, tuple[str, int, int]]:
    """The playbook's reducer over each payment's delivered events and fetched answers: (state,
    captured, refunded)."""
    bodies: dict[str, list[dict[str, Any]]] = {}
    for e in run.events:
        bodies.setdefault(e.resource, []).append(orjson.loads(e.body))
    by_ref: dict[str, list[Fetched]] = {}
    for f in run.fetched:
        by_ref.setdefault(f.ref, []).append(f)
    out = {}
    for ref, delivered in bodies.items():
        r = card_reduce(delivered, by_ref.get(ref, []))
        out[ref] = (r["state"], r["captured_minor"], r["refunded_minor"])
    return out


DEMO_TABLES = (
    DemoTable("card payments", "SELECT payment_ref, state, captured_minor, refunded_minor FROM card_payments",
              expected_payments,
              lambda truth: {k: (v["state"], v["captured_minor"], v["refunded_minor"]) for k, v in truth.card.items()}),
)


SIMULATOR = GatewaySimulator(
    generate, oracle, rows={"card_payments": ("state", "authorised_minor", "captured_minor", "refunded_minor")},
    facts=frozenset({"card_event_applied"}), row_breaks={"card_payments": card_row_breaks},
    lifecycles=lifecycle, late_first=True,
    demo=lambda rng, n, truth: lifecycle(rng, n[0], truth), demo_sizes=(200,), api=api,
    demo_tables=DEMO_TABLES, case_names=CASES, cases=cases)
