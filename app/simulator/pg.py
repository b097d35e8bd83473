"""pg's simulator (simulator layer): the histories ``orderly simulate --check`` decides
(deposits, withdrawals, balance transactions; pg-event-order-version-guard.txt), the oracle of what
they must end at, and the lifecycles `orderly dev`/`demo` deliver. Found by pg's registry line
(``simulator="app.simulator.pg"``) through app/simulator/plugins.py.
"""

from __future__ import annotations

import random
from typing import Any

import orjson
from aiohttp import web

from app.simulator import lifecycles
from app.simulator.gateway_api import ApiContext
from app.simulator.histories import (
    BACKFILL_AFTER_MS,
    DAY,
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
from app.simulator.pg_oracle import CASES, cases, oracle
from app.simulator.plugins import DemoInput, DemoTable, GatewaySimulator
from app.simulator.truths import T0_MS, iso

# ~92 hours of attempts (DESIGN.md §2.1)
RETRYING = Retrying((0, 70_000, 370_000, 30 * MIN, 3 * HOUR, 12 * HOUR, 36 * HOUR, 92 * HOUR))


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


def _deposit(rng: random.Random, dep: str, clock: int,
             extra: random.Random | None) -> list[tuple[int, str, dict[str, Any]]]:
    path = list(rng.choice(DEPOSIT_PATHS))
    if rng.random() < 0.3:  # an attribute-only change: a new version, the same status
        at = rng.randrange(1, len(path) + 1)
        path.insert(at, path[at - 1])
    ordered = rng.randrange(10_000, 2_000_000)
    transferred = ordered + (rng.randrange(1, 50_000) if rng.random() < 0.2 else 0)
    received, fee = min(ordered, transferred), rng.randrange(0, ordered // 50 + 1)
    # alone: the flag on one snapshot, not carried on (issue #46's rule; its own stream, see generate)
    flag, flagged, alone = None, False, extra is not None and extra.random() < 0.35
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
        if status == "slip_received" and transferred > ordered and not flagged:
            flag, flagged = {"claim_id": f"clm_{dep}", "cause": "same_transfer_excess",
                             "amount_minor": transferred - ordered, "slip_received_at": iso(clock), "status": "open",
                             "action_required": "contact_support"}, True
        if flag is not None:
            obj["overpayment"] = flag
            # a flag a later snapshot no longer carries: when that one is delivered first, the flag
            # comes in a stale delivery only, and is kept (the guard's one exception)
            flag = None if alone else flag
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


def _withdrawal(rng: random.Random, wdr: str, clock: int,
                extra: random.Random | None) -> list[tuple[int, str, dict[str, Any]]]:
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
    if extra is not None and extra.random() < 0.25:
        # a snapshot sent again under an event id of its own (its version, its fill): the guard's
        # boundary, apply iff version > stored, so whichever of the two comes second is stale
        at, type_, twin = rng.choice(out)
        out.append((at + rng.randrange(1, 60_000), type_, dict(twin)))  # a copy: each pops its own "_fill"
    return out


def generate(rng: random.Random, seed: int, stem: str, first_edition: bool = False) -> History:
    """The history of one to three resources. The rules issue #46 added (a withdrawal snapshot sent again,
    a flag one snapshot carries) draw from a stream of their own, so ``first_edition`` (without them)
    is the history as it was when tests/unit/data/decide_golden.json.gz was made, draw for draw."""
    extra = None if first_edition else random.Random(f"pg:{seed}:issue46")
    raw: list[tuple[int, str, str, dict[str, Any]]] = []  # (created, resource, type, object)
    correlations: dict[str, dict[str, str]] = {}
    for i in range(rng.choice([1, 1, 2, 3])):
        kind = rng.choices(["deposit", "withdrawal", "btxn"], weights=[6, 3, 1])[0]
        rid, start = f"{kind[:3]}_{stem}_{i}", T0_MS + rng.randrange(0, 10 * 60_000)
        if kind == "deposit":
            correlations[rid] = {"pg_deposit_id": rid, "merchant_reference": f"mr_{rid}", "our_order_id": f"ord_{rid}",
                                 "our_user_id": f"usr_{stem}_{rng.randrange(2)}"}
            raw += [(c, rid, t, o) for c, t, o in _deposit(rng, rid, start, extra)]
        elif kind == "withdrawal":
            raw += [(c, rid, t, o) for c, t, o in _withdrawal(rng, rid, start, extra)]
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
    schedule = Schedule.draw(rng, T0_MS, RETRYING)
    deliveries, lost = webhooks(rng, events, schedule)
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


# --- `orderly simulate`/`dev`/`demo`'s lifecycles ------------------------------------------------
LIFECYCLE_PATHS = [
    (0.6, ["pending", "slip_received", "settled"]),
    (0.1, ["pending", "expired", "slip_received", "settled"]),  # the late slip (Case A)
    (0.15, ["pending", "slip_received", "settled", "reversed"]),  # Case B's shape
    (0.1, ["pending", "expired"]),
    (0.05, ["pending", "under_review", "rejected"]),
]


def lifecycle(rng: random.Random, deposits: int, withdrawals: int, truth: Truth) -> list[Emitted]:
    out: list[Emitted] = []
    clock = lifecycles.T0_MS
    for i in range(deposits):
        dep, user = f"dep_sim{i}", f"usr_sim{i % max(1, deposits // 3)}"
        amount = rng.randrange(10_000, 2_000_000)
        truth.correlations[dep] = {"merchant_reference": f"mr_{dep}", "our_order_id": f"ord_{dep}",
                                   "our_user_id": user}
        path = lifecycles.pick(rng, LIFECYCLE_PATHS)
        for version, status in enumerate(path, start=1):
            clock += rng.randrange(1, 2000)
            obj: dict[str, Any] = {"id": dep, "object": "deposit", "version": version * 2, "status": status,
                                   "ordered_amount_minor": amount}
            if status in ("settled", "reversed"):
                fee = amount // 100
                obj.update(transferred_amount_minor=amount, amount_received_minor=amount, fee_total_minor=fee,
                           credited_amount_minor=amount - fee)
            if status == "expired":
                obj.update(is_terminal=len(path) == 2, late_slip_accepted_until="2026-12-01T10:00:00Z")
            if status == "under_review":
                obj["review"] = {"reasons": [{"display_th": "กำลังตรวจสอบ"}]}
            out.append(Emitted("pg", dep, orjson.dumps({"id": f"evt_{dep}_{version}", "object": "event",
                                                        "type": f"deposit.{status}", "sequence": 0,
                                                        "created": str(clock), "data": {"object": obj}}), clock))
        truth.pg_deposits[dep] = path[-1]
        truth.balances[user] = truth.balances.get(user, 0) + (amount if path[-1] == "settled" else 0)
    for i in range(withdrawals):
        wdr = f"wdr_sim{i}"
        total = rng.randrange(100_000, 5_000_000)
        chunks = rng.randint(1, 4)
        filled = 0
        for n in range(1, chunks + 1):
            clock += rng.randrange(1, 2000)
            amount = total - filled if n == chunks else rng.randrange(1, (total - filled) // 2 + 2)
            filled += amount
            status = "settled" if filled == total else "filling"
            body = {"id": f"evt_{wdr}_{n}", "object": "event", "type": f"withdrawal.{status}", "sequence": 0,
                    "created": str(clock),
                    "data": {"object": {"id": wdr, "object": "withdrawal", "version": n * 3, "status": status,
                                        "amount_total_minor": total, "filled_minor": filled,
                                        "remaining_minor": total - filled, "metadata": {"payout_id": f"po_{wdr}"}},
                             "fill": {"leg_ref": f"leg_{wdr}_{n}", "sequence": n, "amount_minor": amount}}}
            out.append(Emitted("pg", wdr, orjson.dumps(body), clock))
        truth.pg_withdrawals[wdr] = ("settled", total, 0)
    # pg's sequence is global and increasing in creation order
    out.sort(key=lambda e: e.created_ms)
    numbered = []
    for seq, e in enumerate(out, start=1):
        body = orjson.loads(e.body)
        body["sequence"] = seq
        numbered.append(Emitted(e.gateway, e.resource, orjson.dumps(body), e.created_ms))
    return numbered


def api(context: ApiContext) -> list[web.RouteDef]:
    """pg's events feed by sequence, its objects and its balance, from the simulated events."""
    def pg_events() -> list[dict[str, Any]]:
        ordered = sorted((orjson.loads(e.body) for e in context.events if e.gateway == "pg"),
                         key=lambda b: b["sequence"])
        return ordered[:len(ordered) - context.lag]

    async def pg_since(request: web.Request) -> web.Response:
        route = "pg GET /v1/pay/events"
        if context.fetch_api == "404":
            return context.not_found(route)
        try:
            since = int(request.query["since_sequence"])
            limit = min(int(request.query.get("limit", "100")), 1000)
        except (KeyError, ValueError):
            return context.answer(route, {"error": "since_sequence must be an integer"}, 400)
        page = [b for b in pg_events() if b["sequence"] > since][:limit]
        return context.answer(route, {"data": page, "has_more": len(page) == limit})

    async def pg_object(request: web.Request) -> web.Response:
        route, wanted = "pg GET /v1/pay/{kind}/{id}", request.match_info["id"]
        if context.fetch_api == "404":
            return context.not_found(route)
        latest = None
        for body in pg_events():
            if body["data"]["object"]["id"] == wanted:
                latest = body["data"]["object"]
        return context.answer(route, latest) if latest else context.not_found(route)

    async def pg_balance(request: web.Request) -> web.Response:
        route = "pg GET /v1/pay/balance"
        if context.fetch_api == "404":
            return context.not_found(route)
        return context.answer(route, {"available_minor": sum(context.truth.balances.values())})

    return [web.get("/v1/pay/events", pg_since), web.get("/v1/pay/deposits/{id}", pg_object),
            web.get("/v1/pay/withdrawals/{id}", pg_object), web.get("/v1/pay/balance", pg_balance)]


def _latest(run: DemoInput) -> dict[str, dict[str, Any]]:
    """Each deposit's and withdrawal's object of its highest ``version`` (DESIGN §2.1)."""
    latest: dict[str, dict[str, Any]] = {}
    for e in run.events:
        obj = orjson.loads(e.body)["data"]["object"]
        if obj["id"] not in latest or obj["version"] > latest[obj["id"]]["version"]:
            latest[obj["id"]] = obj
    return latest


def expected_balances(run: DemoInput) -> dict[str, int]:
    """A user's balance: the ``amount_received_minor`` of each deposit whose highest version is settled."""
    out = {c["our_user_id"]: 0 for c in run.correlations.values()}
    for rid, obj in _latest(run).items():
        if obj["object"] == "deposit" and obj["status"] == "settled":  # a reversed one was credited and debited
            out[run.correlations[rid]["our_user_id"]] += obj["amount_received_minor"]
    return out


DEMO_TABLES = (
    DemoTable("pg deposits", "SELECT pg_deposit_id, status FROM pg_deposits",
              lambda run: {rid: o["status"] for rid, o in _latest(run).items() if o["object"] == "deposit"},
              lambda truth: truth.pg_deposits),
    DemoTable("pg withdrawals", "SELECT pg_withdrawal_id, status, filled_minor, remaining_minor FROM pg_withdrawals",
              lambda run: {rid: (o["status"], o["filled_minor"], o["remaining_minor"])
                           for rid, o in _latest(run).items() if o["object"] != "deposit"},
              lambda truth: truth.pg_withdrawals),
    DemoTable("user balances", "SELECT user_id, balance_minor FROM user_balances", expected_balances,
              lambda truth: truth.balances, missing=0),
)


SIMULATOR = GatewaySimulator(
    generate, oracle, rows={
        "pg_deposits": ("status", "pg_version", "amount_received_minor", "our_user_id"),
        "pg_withdrawals": ("status", "pg_version", "filled_minor", "remaining_minor"),
        "pg_balance_txns": ("amount_minor",)},
    facts=frozenset({"withdrawal_fill", "overpayment_flag"}),
    lifecycles=lambda rng, count, truth: lifecycle(rng, count, max(1, count // 3), truth),
    demo=lambda rng, n, truth: lifecycle(rng, n[0], n[1], truth), demo_sizes=(200, 60), api=api,
    demo_tables=DEMO_TABLES, case_names=CASES, cases=cases,
    first_edition=lambda rng, seed, stem: generate(rng, seed, stem, first_edition=True))
