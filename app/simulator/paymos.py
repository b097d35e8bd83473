"""paymos's simulator (simulator layer): invoices, withdrawals and channel deposits for
``orderly simulate --check`` (paymos-events.ru.txt, DESIGN.md §2.3), the oracle of what they must
end at, and the lifecycles `orderly dev`/`demo` deliver. Found by paymos's registry line
(``simulator="app.simulator.paymos"``) through app/simulator/plugins.py.
"""

from __future__ import annotations

import itertools
import random
from typing import Any

import orjson

from app.simulator import lifecycles
from app.simulator.histories import (
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
from app.simulator.oracle import Outcome, one_shot
from app.simulator.plugins import DemoInput, DemoTable, GatewaySimulator
from app.simulator.truths import T0_MS

# paymos gives up on no event, and an outage always ends within its window
RETRYING = Retrying((0, MIN, 5 * MIN, 30 * MIN, 2 * HOUR, 12 * HOUR, 24 * HOUR), longest_outage_ms=20 * HOUR,
                    may_lose=False)


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


def generate(rng: random.Random, seed: int, stem: str) -> History:
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
    deliveries, lost = webhooks(rng, events, Schedule.draw(rng, T0_MS, RETRYING))
    for index, last in lost:  # inside the window by construction; a late attempt still lands
        deliveries.append(Delivery("webhook", rid, events[index].body, last + 1, index))
    return History("paymos", seed, events, in_arrival_order(rng, deliveries))


# The document's reorgs (its processing rules and event tables): "a terminal event ends the resource's
# state machine"; only these leave a terminal state,
# each out of the state it names: a deep reorg that removed every counted transfer brings an invoice
# back to awaiting payment, completion_rewound reopens a *completed* withdrawal (as signed), and a
# reorg cancels a channel deposit's transaction. Anything else after a terminal state waits for its reorg.
REORGS_OUT_OF = {"awaiting_payment": {"paid", "paid_over", "underpaid"}, "completion_rewound": {"completed"},
                 "reorged": {"confirmed"}}
# Nor does a newer snapshot of the same terminal status (the document's processing rules: "a terminal
# event ends the resource's state machine; a redelivery of the same event_id stays a duplicate, not a
# new transition"; completion_rewound: "the completion or the failure comes with a later event"). A
# withdrawal completed, reopened and completed again, the second completion delivered before the
# rewind, waits for it: the merchant hears payout_reopened and the second cycle's payout_completed.


def oracle(history: History) -> Outcome:
    outcomes: dict[int, list[str]] = {}
    want, rid = Outcome(outcomes=outcomes), history.events[0].resource
    current: Any = None
    waiting: list[tuple[int, Any]] = []  # (delivery, event) waiting for a reorg
    cycle, seen, noted = 0, set(), False

    def allowed(event: Any) -> bool:
        if current is None or current.fact["status"] not in TERMINAL:
            return True
        return current.fact["status"] in REORGS_OUT_OF.get(event.fact["step"], set())

    def take(event: Any) -> None:
        nonlocal current, cycle
        current, f = event, event.fact
        status, kind = f["status"], f["kind"]
        want.rows[rid] = {"status": status, "is_final": status in TERMINAL, "updated_at_ms": event.created_ms}
        if kind == "invoice" and status in TERMINAL:
            # paid and paid_over both credit the merchant (the document: paid_over credits all that was
            # received): one credit per invoice, the resource's, whichever status brought it
            name = f"invoice_{status}"
            key = one_shot("paymos", rid, "credit" if status in ("paid", "paid_over") else name)
            if not any(e[0] == key for e in want.effects):
                want.effects.add((key, name, None))
        elif kind == "withdrawal" and (f["step"] == "completion_rewound" or status in TERMINAL):
            name = "payout_reopened" if f["step"] == "completion_rewound" else f"payout_{status}"
            key = one_shot("paymos", rid, name, cycle)
            if not any(e[0] == key for e in want.effects):
                want.effects.add((key, name, None))
            cycle += f["step"] == "completion_rewound"
        elif kind == "payment_channel_deposit" and status == "confirmed":
            want.effects.add((one_shot("paymos", rid, "credit_channel_deposit"), "credit_channel_deposit", None))

    for i, d in enumerate(history.deliveries):
        event = history.events[d.event]
        f = event.fact
        if f["id"] in seen:  # the same event_id again: a redelivery, not a transition
            outcomes[i] = ["duplicate"]
            continue
        seen.add(f["id"])
        if f["note"]:  # a note beside the terminal decision, once per invoice
            want.facts.add(("order_note", f"paymos:{rid}:paid_late"))
            want.effects.add((one_shot("paymos", rid, "add_order_note"), "add_order_note", None))
            outcomes[i] = ["duplicate" if noted else "applied"]
            noted = True
            continue
        if current is not None and f["position"] <= current.fact["position"]:
            outcomes[i] = ["stale"]
            continue
        if not allowed(event):
            waiting.append((i, event))
            outcomes[i] = ["parked"]
            continue
        take(event)
        outcomes[i] = ["applied"]
        progressed = True
        while progressed:  # what waited gets another chance, oldest first; older than the current is stale
            progressed = False
            for j, w in sorted(waiting, key=lambda jw: jw[1].fact["position"]):
                if w.fact["position"] <= current.fact["position"] or allowed(w):
                    waiting.remove((j, w))
                    stale = w.fact["position"] <= current.fact["position"]
                    if not stale:
                        take(w)
                    outcomes[j].append("stale" if stale else "unparked")
                    progressed = True
                    break
    want.parked[rid] = len(waiting)
    return want


CASES = ("duplicate", "reordered", "tie on updated_at", "stale", "reorg out of a terminal state",
         "waits for its reorg", "paid_late note", "a second paid_late", "a second completion cycle")


def cases(history: History) -> set[str]:
    """The cases of ``CASES`` that ``history`` holds, read from it and the oracle's outcomes."""
    want, events = oracle(history), history.events
    outcomes = [o for _, o in sorted((want.outcomes or {}).items())]
    order = [d.event for d in history.deliveries]
    firsts = list(dict.fromkeys(order))
    found = {name for name, seen in (
        ("duplicate", len(order) != len(firsts)), ("reordered", firsts != sorted(firsts)),
        ("tie on updated_at", any(a.created_ms == b.created_ms for a, b in itertools.pairwise(events))),
        ("stale", any(o[-1] == "stale" for o in outcomes)),
        ("waits for its reorg", any("parked" in o for o in outcomes)),
        ("paid_late note", any(e.fact["note"] for e in events)),
        ("a second paid_late", sum(e.fact["note"] for e in events) > 1),
        ("a second completion cycle", any(e.fact["step"] == "completion_rewound" for e in events)),
    ) if seen}
    for before, after in itertools.pairwise(e for e in events if not e.fact["note"]):
        if before.fact["status"] in TERMINAL and after.fact["step"] in REORGS_OUT_OF:
            found.add("reorg out of a terminal state")
    return found


# --- `orderly simulate`/`dev`/`demo`'s lifecycles ------------------------------------------------
LIFECYCLE_PATHS = {
    "invoice": [(0.5, ["confirming", "paid"]), (0.15, ["confirming", "paid", "awaiting_payment", "confirming",
                                                       "paid_over"]),
                (0.15, ["underpaid_waiting", "underpaid"]), (0.1, ["expired", "paid_late"]), (0.1, ["cancelled"])],
    "withdrawal": [(0.6, ["created", "processing", "completed"]),
                   (0.2, ["created", "processing", "completed", "completion_rewound", "completed"]),
                   (0.2, ["created", "failed"])],
    "payment_channel_deposit": [(0.7, ["confirming", "confirmed"]),
                                (0.3, ["confirming", "confirmed", "reorged", "confirming", "confirmed"])],
}
FINAL = {"paid", "paid_over", "underpaid", "expired", "cancelled", "completed", "failed", "confirmed"}
TYPE = {"invoice": "invoice.{}", "withdrawal": "withdrawal.{}", "payment_channel_deposit": "payment_channel.deposit.{}"}


def lifecycle(rng: random.Random, per_kind: int, truth: Truth) -> list[Emitted]:
    out: list[Emitted] = []
    for kind, paths in LIFECYCLE_PATHS.items():
        for i in range(per_kind):
            rid = f"{ {'invoice': 'inv', 'withdrawal': 'wdr', 'payment_channel_deposit': 'pcd'}[kind] }_sim{i}"
            clock = lifecycles.T0_MS + rng.randrange(0, 60_000)
            status = ""
            for n, step in enumerate(lifecycles.pick(rng, paths)):
                clock += rng.randrange(1, 3000)
                if step == "paid_late":
                    data_status, extra = status, {"paid_late_at": clock // 1000}
                else:
                    status = "signed" if step == "completion_rewound" else step
                    data_status, extra = status, {}
                data = {"id": rid, "object": kind, "status": data_status, "is_final": data_status in FINAL,
                        "updated_at": clock, "amount": f"{rng.randrange(1, 10**8) / 10**8:.8f}", **extra}
                body = {"event_id": f"evt_{rid}_{n}", "event_type": TYPE[kind].format(step), "created_at": clock,
                        "data": data}
                out.append(Emitted("paymos", rid, orjson.dumps(body), clock))
            truth.paymos[rid] = status
    return out


def expected_resources(run: DemoInput) -> dict[str, str]:
    """Each resource's ``data.status`` of its newest event by ``data.updated_at`` (ties in the
    lifecycle's order, which is the state machine's; DESIGN §2.3)."""
    latest: dict[str, tuple[int, int, str]] = {}
    for n, e in enumerate(run.events):
        data = orjson.loads(e.body)["data"]
        key = (data["updated_at"], n, data["status"])
        latest[data["id"]] = max(latest.get(data["id"], key), key)
    return {rid: status for rid, (_, _, status) in latest.items()}


DEMO_TABLES = (
    DemoTable("paymos resources", " UNION ALL ".join(
        f"SELECT id, status FROM {table}" for table in ("paymos_invoices", "paymos_withdrawals",
                                                        "paymos_channel_deposits")),
              expected_resources, lambda truth: truth.paymos),
)


SIMULATOR = GatewaySimulator(
    generate, oracle, rows={table: ("status", "is_final", "updated_at_ms")
                            for table in ("paymos_invoices", "paymos_withdrawals", "paymos_channel_deposits")},
    facts=frozenset({"order_note"}), lifecycles=lifecycle,
    demo=lambda rng, n, truth: lifecycle(rng, n[0], truth), demo_sizes=(80,),
    demo_tables=DEMO_TABLES, case_names=CASES, cases=cases)
