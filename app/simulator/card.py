"""card's simulator (simulator layer): one payment's histories for ``orderly simulate --check``
(card-gateway-order-playbook.txt), the oracle of what they must end at, and the lifecycles
`orderly dev`/`demo` deliver. Found by card's registry line (``simulator="app.simulator.card"``)
through app/simulator/plugins.py.
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import orjson
from aiohttp import web

from app.simulator import lifecycles
from app.simulator.card_oracle import CASES, cases, oracle
from app.simulator.expected import CARD_RANK, Fetched, card_reduce
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


def _steps(rng: random.Random, extra: random.Random | None, scenario: str,
           auth: int) -> tuple[list[tuple[str, int]], int]:
    """The payment's lifecycle (kind, amount) in true order, and the index of the refund a scenario
    is about (-1: none)."""
    forced = -1
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
            if extra is None:
                amount = (captured - refunded if roll < 0.4 else first if roll < 0.6 and refunded + first <= captured
                          else rng.randrange(1, captured - refunded + 1))
            elif scenario and not refunded and 0 < but_last:
                amount, forced = but_last, len(steps)
            else:
                amount = (captured - refunded if roll < 0.35 else first if roll < 0.55 and refunded + first <= captured
                          else but_last if roll < 0.75 and 0 < but_last and refunded + but_last <= captured
                          else rng.randrange(1, captured - refunded + 1))
            steps.append(("refunded", amount))
            refunded += amount
    return steps, forced


def generate(rng: random.Random, seed: int, stem: str, first_edition: bool = False) -> History:
    """One payment's history. The rules issue #46 added (ties among captures and refunds, a refund of
    all but the last capture, clocks that disagree with the sequence) draw from a stream of their own,
    so ``first_edition`` (without them) is the history as it was when tests/unit/data/decide_golden.json.gz
    was made, draw for draw."""
    extra = None if first_edition else random.Random(f"card:{seed}:issue46")
    # a history about one of the two ordering rules: its first refund is every capture but the last,
    # in that capture's millisecond (the rank decides) or stamped before it (the sequence decides)
    scenario = "" if extra is None else extra.choices(["rank", "sequence", ""], weights=[15, 15, 70])[0]
    ref, clock, auth = f"pay_{stem}", T0_MS + rng.randrange(0, 60_000), rng.randrange(1_000, 100_000)
    steps, forced = _steps(rng, extra, scenario, auth)
    sequenced = rng.random() < 0.4 or scenario == "sequence"
    skewed = sequenced and extra is not None and extra.random() < 0.5  # the nodes' clocks disagree, not the sequence
    events: list[Event] = []
    stamps: list[int] = []
    for n, (kind, amount) in enumerate(steps):
        # the same millisecond only where the playbook's rank keeps the true order: authorised before
        # captured or voided, captured before refunded, and two of a kind (their order changes no total)
        auto = n and steps[n - 1][0] == "authorised" and kind in ("captured", "voided")  # an auto-capture
        kept = n and CARD_RANK[steps[n - 1][0]] <= CARD_RANK[kind]  # the rank keeps the true order
        tie = (auto and rng.random() < 0.3) or (not auto and kept and extra is not None and extra.random() < 0.3) \
            or (n == forced and scenario == "rank")
        clock += 0 if tie else rng.choice([1, 350, 2_000, 60_000, 3_600_000])
        # a skewed clock stamps an event before the one created before it (the sequence wins)
        behind = (skewed and extra is not None and n and extra.random() < 0.6) \
            or (n == forced and scenario == "sequence")
        stamp = stamps[-1] - extra.choice([1, 400, 5_000]) if behind and extra is not None else clock
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
    demo_tables=DEMO_TABLES, case_names=CASES, cases=cases,
    first_edition=lambda rng, seed, stem: generate(rng, seed, stem, first_edition=True))
