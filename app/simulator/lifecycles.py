"""Realistic resource lifecycles for the three gateways, with the gateway's truth (pure, seeded).

Each generator returns the events in creation order (``Emitted``: gateway, resource key, body,
created_at) and the truth the read models must end at. Nothing here touches the network.
Each gateway's simulator declaration (app/simulator/<name>.py's ``SIMULATOR.lifecycles``) names its
generator here; `orderly simulate`, `dev` and `demo` find it through app/simulator/plugins.py.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import orjson

T0_MS = 1_796_000_000_000  # a fixed epoch for the gateway's own clocks: runs are reproducible


@dataclass(frozen=True)
class Emitted:
    gateway: str
    resource: str
    body: bytes
    created_ms: int


@dataclass
class Truth:
    pg_deposits: dict[str, str] = field(default_factory=dict)  # id -> final status
    pg_withdrawals: dict[str, tuple[str, int, int]] = field(default_factory=dict)  # status, filled, remaining
    balances: dict[str, int] = field(default_factory=dict)  # user -> minor units
    correlations: dict[str, dict[str, str]] = field(default_factory=dict)
    card: dict[str, dict[str, Any]] = field(default_factory=dict)  # ref -> GET /payments answer
    paymos: dict[str, str] = field(default_factory=dict)  # id -> final status


DEPOSIT_PATHS = [
    (0.6, ["pending", "slip_received", "settled"]),
    (0.1, ["pending", "expired", "slip_received", "settled"]),  # the late slip (Case A)
    (0.15, ["pending", "slip_received", "settled", "reversed"]),  # Case B's shape
    (0.1, ["pending", "expired"]),
    (0.05, ["pending", "under_review", "rejected"]),
]


def _pick(rng: random.Random, paths: list[tuple[float, list[str]]]) -> list[str]:
    return rng.choices([p for _, p in paths], weights=[w for w, _ in paths])[0]


def pg(rng: random.Random, deposits: int, withdrawals: int, truth: Truth) -> list[Emitted]:
    out: list[Emitted] = []
    clock = T0_MS
    for i in range(deposits):
        dep, user = f"dep_sim{i}", f"usr_sim{i % max(1, deposits // 3)}"
        amount = rng.randrange(10_000, 2_000_000)
        truth.correlations[dep] = {"merchant_reference": f"mr_{dep}", "our_order_id": f"ord_{dep}",
                                   "our_user_id": user}
        path = _pick(rng, DEPOSIT_PATHS)
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


def _iso(ms: int) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def card(rng: random.Random, payments: int, truth: Truth) -> list[Emitted]:
    out: list[Emitted] = []
    for i in range(payments):
        ref = f"pay_sim{i}"
        clock = T0_MS + rng.randrange(0, 60_000)
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
                    "occurred_at": _iso(clock), "amount_minor": amount, "currency": "EUR"}
            out.append(Emitted("card", ref, orjson.dumps(body), clock))
            if kind == "captured":
                captured += amount
            if kind == "refunded":
                refunded += amount
            state = "refunded" if refunded and refunded == captured else ("captured" if kind == "refunded" else kind)
        truth.card[ref] = {"payment_ref": ref, "state": state, "authorised_minor": auth, "captured_minor": captured,
                           "refunded_minor": refunded, "currency": "EUR"}
    return out


PAYMOS_PATHS = {
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


def paymos(rng: random.Random, per_kind: int, truth: Truth) -> list[Emitted]:
    out: list[Emitted] = []
    for kind, paths in PAYMOS_PATHS.items():
        for i in range(per_kind):
            rid = f"{ {'invoice': 'inv', 'withdrawal': 'wdr', 'payment_channel_deposit': 'pcd'}[kind] }_sim{i}"
            clock = T0_MS + rng.randrange(0, 60_000)
            status = ""
            for n, step in enumerate(_pick(rng, paths)):
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
