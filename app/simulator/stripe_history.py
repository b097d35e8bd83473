"""Stripe's delivery histories for `orderly simulate --check`, and their oracle (pure, seeded;
written from Stripe's documents, docs/gateways/stripe.md — nothing here imports app/core).

Delivery, as Stripe documents it: no order guarantee, duplicates, retries with exponential back-off
for up to three days (the intervals are not published: :data:`RETRIES` is a choice), then the
event is given up. What the merchant learns beyond that is a fetch: after a lost event (the
operator's fetch-now, or a reconciliation) and after a thin event, Orderly's fetcher appends
``GET /v1/payment_intents/{id}`` (latest charge expanded) and the PaymentIntent's refunds as a
``synced`` record, in a second in which Stripe changed nothing (an answer holds every event
created in an earlier second and none of a later one). Some histories also carry thin events
(``v1.payment_intent.*``) for PaymentIntent events; in a fifth of those no API is configured and
nothing is fetched for them: they stay parked.

The oracle reasons in the lifecycle's true order (each event's position), never with a key the
core computes: each object's state is its latest known snapshot (a delivered event, or a fetched
answer placed at its second); the read model and effects follow from those as the page says.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar

import orjson

from app.gateways.stripe import synced_body
from app.simulator import lifecycles, stripe_api
from app.simulator.histories import (
    DAY,
    HOUR,
    MIN,
    Delivery,
    Event,
    History,
    Retrying,
    Schedule,
    in_arrival_order,
)
from app.simulator.lifecycles import Emitted
from app.simulator.oracle import Outcome
from app.simulator.plugins import DemoInput, DemoTable, GatewaySimulator
from app.simulator.stripe import CLOSED_DISPUTE, T0_S, Lifecycle, emitted, lifecycle

RETRIES = (0, MIN, 5 * MIN, 30 * MIN, 2 * HOUR, 5 * HOUR, 10 * HOUR, DAY, 2 * DAY, 3 * DAY)
FETCH_AFTER_MS = 60_000
ALIVE = ("pending", "requires_action", "succeeded")
ROW = ("status", "amount_received_minor", "amount_refunded_minor", "currency", "dispute_status", "updated_at")


def arrivals(rng: random.Random, created_ms: int, schedule: Schedule) -> tuple[list[int], int]:
    """When one event reaches the log (more than once if a 200 was lost) and its last attempt."""
    first = created_ms + rng.choice([0, 5, 40, 300, 1500])
    if rng.random() < schedule.lose:
        return [], first + RETRIES[-1]
    for offset in RETRIES:
        at = first + offset + (rng.randrange(0, 5_000) if offset else 0)
        if schedule.down(at) or rng.random() < schedule.fail:
            continue
        out = [at]
        while rng.random() < schedule.duplicate:
            out.append(out[-1] + rng.choice([1, 200, 30_000, 10 * MIN]))
        return out, at
    return [], first + RETRIES[-1]


def quiet_second(life: Lifecycle, at_ms: int) -> int:
    """The first second from ``at_ms`` on in which Stripe created no event of this lifecycle."""
    second = at_ms // 1000
    while second in life.created:
        second += 1
    return second


def fetch(life: Lifecycle, at_ms: int) -> Delivery:
    second = quiet_second(life, at_ms)
    known = [i for i, c in enumerate(life.created) if c < second]
    intent, charge, refunds = life.answers[known[-1]]
    body = synced_body(intent, charge, refunds, second)
    return Delivery("fetch", life.resource, body, second * 1000 + 500, fact={"second": second, "upto": known[-1]})


def thin(life: Lifecycle, index: int, event_type: str) -> bytes:
    created = life.created[index]
    iso = datetime.fromtimestamp(created, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return orjson.dumps({"id": f"evt_thin_{life.resource}_{index}", "object": "v2.core.event",
                         "type": f"v1.{event_type}", "livemode": False, "created": iso,
                         "related_object": {"id": life.resource, "type": "payment_intent",
                                            "url": f"/v1/payment_intents/{life.resource}"}})


def history(rng: random.Random, seed: int, stem: str) -> History:
    life = lifecycle(rng, f"pi_{stem}", T0_S + rng.randrange(0, 60))
    events = []
    for i, raw in enumerate(life.events):
        body = orjson.loads(raw)
        events.append(Event(life.resource, raw, life.created[i] * 1000,
                            {"id": body["id"], "type": body["type"], "position": i, "object": body["data"]["object"]}))
    schedule = Schedule.draw(rng, T0_S * 1000, Retrying(RETRIES))
    deliveries: list[Delivery] = []
    for i, e in enumerate(events):
        arrived, last = arrivals(rng, e.created_ms, schedule)
        deliveries += [Delivery("webhook", e.resource, e.body, at, i) for at in arrived]
        if not arrived and rng.random() < 0.8:  # the operator's fetch-now after a lost event (most histories)
            deliveries.append(fetch(life, last + FETCH_AFTER_MS + rng.randrange(0, 30_000)))
    for i in life.ties:  # the fetcher answers the stripe_fetch fact an uncertain tie raised
        deliveries.append(fetch(life, events[i].created_ms + rng.randrange(2_000, 120_000)))
    if rng.random() < 0.25:  # an event destination with thin events too
        api = rng.random() < 0.8
        for i, e in enumerate(events):
            if e.fact["type"].startswith("payment_intent.") and rng.random() < 0.5:
                at = e.created_ms + rng.choice([0, 300, 2_000, 40_000])
                deliveries.append(Delivery("webhook", e.resource, thin(life, i, e.fact["type"]), at, -1,
                                           {"thin": True, "second": life.created[i]}))
                if api:  # the fetcher answers a thin event
                    deliveries.append(fetch(life, at + rng.randrange(1_000, FETCH_AFTER_MS)))
    return History("stripe", seed, events, in_arrival_order(rng, deliveries))


# --- the oracle ---------------------------------------------------------------------------------

def fetched(history: History) -> list[Delivery]:
    """The fetched answers that count: an answer's id is derived from what it says, so an unchanged
    repeat is a duplicate of the first to arrive (DESIGN.md §2.5)."""
    first: dict[str, Delivery] = {}
    for d in history.deliveries:
        if d.source == "fetch":
            first.setdefault(orjson.loads(d.body)["id"], d)
    return list(first.values())


def _known(history: History) -> list[tuple[float, dict[str, Any], int]]:
    """(true position, object, created second) of every snapshot delivered or fetched: a fetched
    answer sits just after the last event it holds."""
    out: list[tuple[float, dict[str, Any], int]] = []
    for d in history.deliveries:
        if d.source == "webhook" and d.event >= 0:
            e = history.events[d.event]
            out.append((e.fact["position"], e.fact["object"], e.created_ms // 1000))
    for d in fetched(history):
        data = orjson.loads(d.body)["data"]
        place = d.fact["upto"] + 0.5
        objects = [data["object"], *([data["charge"]] if data["charge"] else []), *data["refunds"]]
        out += [(place, obj, d.fact["second"]) for obj in objects]
    return out


class Expected(Protocol):
    """What the oracle fills of app/simulator/oracle.py's Outcome (passed in: that module lists this one)."""

    rows: dict[str, dict[str, Any]]
    effects: set[tuple[str, str, Any]]
    parked: dict[str, int]


E = TypeVar("E", bound=Expected)


def oracle_with(new: Callable[[], E]) -> Callable[[History], E]:
    """The oracle, filling the Outcome ``new`` makes (its SIMULATOR, at the end of this module)."""
    return lambda history: oracle(history, new())


def oracle(history: History, want: E) -> E:
    """The PaymentIntent as what was delivered lets anyone know it (see the module docstring)."""
    rid = history.events[0].resource
    latest: dict[tuple[str, str], tuple[float, dict[str, Any], int]] = {}
    ever_closed, ever = set(), set()
    for place, obj, second in sorted(_known(history), key=lambda k: k[0]):
        latest[(obj["object"], obj["id"])] = (place, obj, second)
        if obj["object"] == "dispute" and obj["status"] in CLOSED_DISPUTE:
            ever_closed.add(obj["id"])
        if obj["object"] == "payment_intent":
            ever.add(obj["status"])
    if latest:
        want.rows[rid] = row(rid, latest)
    pi = latest.get(("payment_intent", rid), (0, {}, 0))[1]
    refunds = [o for kind, o in ((k[0], v[1]) for k, v in latest.items()) if kind == "refund"]
    keys: set[tuple[str, str | None]] = set()
    if "succeeded" in ever:
        keys.add(("mark_order_paid", None))
    if "canceled" in ever:
        keys.add(("mark_order_failed", None))
    received = pi.get("amount_received") or 0
    if received and sum(r["amount"] for r in refunds if r["status"] == "succeeded") >= received:
        keys.add(("mark_order_refunded", None))
    for (kind, oid) in latest:
        if kind == "dispute":
            keys.add(("open_dispute", oid))
            if oid in ever_closed:
                keys.add(("close_dispute", oid))
    want.effects = {(f"stripe:{rid}:{k}" + (f":{dispute}" if dispute else ""), k, None) for k, dispute in keys}
    seconds = [d.fact["second"] for d in fetched(history)]
    thin_seconds = {orjson.loads(d.body)["id"]: d.fact["second"] for d in history.deliveries if d.fact.get("thin")}
    # a thin event a fetched answer of its second or later covers is no longer parked (DESIGN §2.5)
    want.parked[rid] = sum(1 for s in thin_seconds.values() if not any(f >= s for f in seconds))
    return want


def row(rid: str, latest: dict[tuple[str, str], tuple[float, dict[str, Any], int]]) -> dict[str, Any]:
    by_kind: dict[str, list[tuple[float, dict[str, Any], int]]] = {}
    for (kind, _), slot in latest.items():
        by_kind.setdefault(kind, []).append(slot)
    pi = latest.get(("payment_intent", rid))
    charges, refunds = by_kind.get("charge", []), by_kind.get("refund", [])
    # the refunded amount from the newest refund evidence in true order: a charge's amount_refunded,
    # or the refunds' own statuses (Stripe changes both together, so either tells the same then)
    newest_charge = max((c[0] for c in charges), default=-1.0)
    if (refunds and max(r[0] for r in refunds) >= newest_charge) or not charges:
        refunded = sum(r[1]["amount"] for r in refunds if r[1]["status"] in ALIVE)
    else:
        refunded = sum(c[1].get("amount_refunded") or 0 for c in charges)
    disputes = sorted(by_kind.get("dispute", []), key=lambda s: s[0])
    currency = next((s[1]["currency"] for s in [*([pi] if pi else []), *charges, *refunds]), None)
    updated = max(s[2] for s in latest.values())
    return {"status": pi[1]["status"] if pi else None,
            "amount_received_minor": (pi[1].get("amount_received") or 0) if pi else 0,
            "amount_refunded_minor": refunded, "currency": currency,
            "dispute_status": disputes[-1][1]["status"] if disputes else None,
            "updated_at": datetime.fromtimestamp(updated, UTC).isoformat().replace("+00:00", "Z")}


# --- `orderly demo` -------------------------------------------------------------------------------
DEMO_COLUMNS = ("status", "amount_received_minor", "amount_refunded_minor", "currency", "dispute_status")


def demo(rng: random.Random, count: int, truth: lifecycles.Truth) -> list[Emitted]:
    """`orderly demo`'s Stripe: ``count`` PaymentIntents' snapshot events in creation order, and what
    Stripe's API says of each at the end (``truth.by_gateway["stripe"]``). Only lifecycles without an
    uncertain same-second tie: the demo's Stripe API does not answer yet, and a tie is settled by
    the fetch it asks for (docs/gateways/stripe.md), so with the payloads alone the reducer's
    guess could rightly differ from Stripe's own order."""
    truths = truth.by_gateway.setdefault("stripe", {})
    out = []
    for i in range(count):
        life = lifecycle(rng, f"pi_demo{i}", T0_S + rng.randrange(0, 60))
        while life.ties:
            life = lifecycle(rng, f"pi_demo{i}", T0_S + rng.randrange(0, 60))
        truths[life.resource] = life.truth.row
        out += [Emitted("stripe", life.resource, raw, second * 1000)
                for raw, second in zip(life.events, life.created, strict=True)]
    return sorted(out, key=lambda e: e.created_ms)


def _epoch(iso: str) -> int:
    return int(datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp())


def expected_intents(run: DemoInput) -> dict[str, tuple[Any, ...]]:
    """What docs/gateways/stripe.md says ``stripe_payment_intents`` holds after the delivered snapshot
    events: each object at its latest snapshot in Stripe's order (the events come in creation
    order; a lost one is simply not there), the row derived from those as the oracle derives it.
    (status, received, refunded, currency, dispute status, updated_at in epoch seconds)."""
    latest: dict[str, dict[tuple[str, str], tuple[float, dict[str, Any], int]]] = {}
    for n, e in enumerate(run.events):
        obj = orjson.loads(e.body)["data"]["object"]
        latest.setdefault(e.resource, {})[(obj["object"], obj["id"])] = (n, obj, e.created_ms // 1000)
    out = {}
    for rid, known in latest.items():
        r = row(rid, known)
        out[rid] = (*(r[c] for c in DEMO_COLUMNS), _epoch(r["updated_at"]))
    return out


DEMO_TABLES = (
    DemoTable("stripe payment intents",
              f"SELECT id, {', '.join(DEMO_COLUMNS)}, extract(epoch FROM updated_at)::bigint "
              "FROM stripe_payment_intents",
              expected_intents,
              lambda truth: {rid: (*(r[c] for c in DEMO_COLUMNS), _epoch(r["updated_at"]))
                             for rid, r in truth.by_gateway.get("stripe", {}).items()}),
)


# What the simulator knows of stripe (app/simulator/plugins.py): the registry line names this module.
SIMULATOR = GatewaySimulator(
    history, oracle_with(Outcome), rows={"stripe_payment_intents": ROW},
    lifecycles=lambda rng, count, truth: [Emitted("stripe", *e)
                                          for e in emitted(rng, count, stripe_api.answers(truth))],
    demo=lambda rng, n, truth: demo(rng, n[0], truth), demo_sizes=(100,), demo_tables=DEMO_TABLES,
    api=stripe_api.api)
