"""What a history must end at, from the lifecycle the simulator generated and the gateway documents
(pure). Written from gateway-docs/* and DESIGN.md §1-§2, not from app/core: nothing here imports
the core, and the order it reasons in is the lifecycle's true order (the position of each event in
it), never a key the core computes.

- pg: a delivered event is applied iff its version is above every version delivered before it
  (the guard; a deposit's events are taken in log order once its correlation is there, and all
  wait while it is not); the read model holds the highest version delivered; the one-shot effects
  are the document's enqueueEffect calls for the applied snapshots (`deposit:{id}:credit_user` once,
  a debit only after a credit, late-slip / fail / review / status effects keyed on the event id,
  `withdrawal:{id}:close_payout` once); every fill's leg_ref and every overpayment claim is kept.
  Open gaps: the numbers above the first sequence seen and below the highest, never delivered,
  each first seen when the first delivery above it arrived.
- card: the payment is the truth of its captures and refunds: a fetched answer is the truth of
  every event created before it, and the events the gateway delivered after it apply on top in
  the playbook's way (in true order; an event that cannot apply yet waits). Effects are what
  that end state earned (`mark_order_paid` once captured, `mark_order_refunded` once fully
  refunded, `release_authorisation` once voided), plus what a state the deliveries showed on the
  way earned: a one-shot effect is not taken back (see ``card``; counted apart as ``transient``).
- paymos: the document's state machine in true order: a snapshot older than the current one is
  stale; out of a terminal state only the named reorgs (or the same status) move, anything else
  waits for its reorg; `paid_late` is one note per invoice; one credit per invoice (paid or
  paid_over, whichever came first), a payout's completion per completion cycle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from app.simulator import adyen as adyen_sim
from app.simulator import stripe_history
from app.simulator.histories import History

REORG_STEPS = {"awaiting_payment", "completion_rewound", "reorged"}
TERMINAL = {"paid", "paid_over", "underpaid", "expired", "cancelled", "completed", "failed", "confirmed"}


@dataclass
class Outcome:
    rows: dict[str, dict[str, Any]] = field(default_factory=dict)  # resource -> its read-model row's fields
    effects: set[tuple[str, str, Any]] = field(default_factory=set)  # (dedupe key, type, amount or None)
    facts: set[tuple[str, str]] = field(default_factory=set)  # (kind, key)
    parked: dict[str, int] = field(default_factory=dict)  # resource -> events still waiting
    gaps: set[tuple[int, int]] = field(default_factory=set)  # (missing sequence, first seen ms)
    transient: set[str] = field(default_factory=set)  # expected effects the end state did not earn
    broken: set[str] = field(default_factory=set)  # rows on the way that break a read model's CHECK

    def differences(self, other: Outcome) -> list[str]:
        out = []
        for name in ("rows", "effects", "facts", "parked", "gaps", "broken"):
            mine, theirs = getattr(self, name), getattr(other, name)
            if mine != theirs:
                if isinstance(mine, set):
                    out.append(f"{name}: expected only {sorted(mine - theirs, key=str)}, "
                               f"core only {sorted(theirs - mine, key=str)}")
                else:
                    keys = sorted(set(mine) | set(theirs))
                    out += [f"{name}[{k}]: expected {mine.get(k)}, core {theirs.get(k)}"
                            for k in keys if mine.get(k) != theirs.get(k)]
        return out


def _unique(history: History, sources: tuple[str, ...] = ("webhook", "fetch")) -> list[Any]:
    seen, out = set(), []
    for d in history.deliveries:
        if d.source in sources and d.event >= 0 and d.event not in seen:
            seen.add(d.event)
            out.append(history.events[d.event])
    return out


def pg(history: History) -> Outcome:
    want = Outcome()
    correlated = {d.resource for d in history.deliveries if d.source == "correlation"}
    top: dict[str, int] = {}
    credited: dict[str, int] = {}
    for event in _unique(history):
        f, rid = event.fact, event.resource
        if f["kind"] == "withdrawal":
            want.facts.add(("withdrawal_fill", f["fill"]["leg_ref"]))
        if f["kind"] == "deposit" and rid not in correlated:
            want.parked[rid] = want.parked.get(rid, 0) + 1  # waits for the merchant's correlation
            continue
        obj = f["object"]
        if f["kind"] == "balance_transaction":
            want.rows[rid] = {"amount_minor": obj["amount_minor"]}
            continue
        if f["kind"] == "deposit" and obj.get("overpayment"):
            want.facts.add(("overpayment_flag", obj["overpayment"]["claim_id"]))
        if f["version"] <= top.get(rid, -1):
            continue  # stale: no row, no effect
        top[rid] = f["version"]
        if f["kind"] == "withdrawal":
            want.rows[rid] = {"status": obj["status"], "pg_version": obj["version"],
                              "filled_minor": obj["filled_minor"], "remaining_minor": obj["remaining_minor"]}
            if obj["status"] == "settled" and obj["remaining_minor"] == 0:
                want.effects.add((f"withdrawal:{rid}:close_payout", "close_payout", None))
            continue
        user = history.correlations[rid]["our_user_id"]
        want.rows[rid] = {"status": obj["status"], "pg_version": obj["version"],
                          "amount_received_minor": obj.get("amount_received_minor"), "our_user_id": user}
        status, scope = obj["status"], f"deposit:{rid}"
        if status == "settled":
            if rid not in credited:
                credited[rid] = obj["amount_received_minor"]
                want.effects |= {(f"{scope}:credit_user", "credit_user", credited[rid]),
                                 (f"{scope}:release_goods", "release_goods", None)}
        elif status == "reversed":
            if rid in credited and (f"{scope}:debit_user", "debit_user", credited[rid]) not in want.effects:
                want.effects |= {(f"{scope}:debit_user", "debit_user", credited[rid]),
                                 (f"{scope}:hold_goods", "hold_goods", None)}
        else:
            kind = {"under_review": "show_pending_review", "rejected": "fail_order"}.get(status, "update_order_status")
            if status in ("expired", "canceled"):
                late = obj.get("is_terminal") is False and obj.get("late_slip_accepted_until")
                kind = "show_late_slip" if late else "fail_order"
            want.effects.add((f"{f['id']}:{kind}", kind, None))
    arrived = [(d.at_ms, history.events[d.event].fact["sequence"]) for d in history.deliveries if d.event >= 0]
    if arrived:
        delivered = {s for _, s in arrived}
        for missing in range(arrived[0][1] + 1, max(delivered)):
            if missing not in delivered:
                want.gaps.add((missing, next(at for at, s in arrived if s > missing)))
    return want


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


def card(history: History) -> Outcome:
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
    for upto in range(1, len(history.deliveries)):
        shown |= card_earned(_card_known(history, upto)[0])
    want.effects = {(f"card:{ref}:{kind}", kind, None) for kind in shown}
    want.transient = {f"card:{ref}:{kind}" for kind in shown - final}
    return want


def paymos(history: History) -> Outcome:
    want, rid = Outcome(), history.events[0].resource
    current: Any = None
    waiting: list[Any] = []
    cycle = 0

    def allowed(event: Any) -> bool:
        f = event.fact
        return (current is None or current.fact["status"] not in TERMINAL or f["step"] in REORG_STEPS
                or f["status"] == current.fact["status"])

    def take(event: Any) -> None:
        nonlocal current, cycle
        current, f = event, event.fact
        status, kind = f["status"], f["kind"]
        want.rows[rid] = {"status": status, "is_final": status in TERMINAL,
                          "updated_at_ms": event.created_ms}
        if kind == "invoice" and status in TERMINAL:
            name = f"invoice_{status}"
            key = f"paymos:{rid}:credit" if status in ("paid", "paid_over") else f"paymos:{rid}:{name}"
            if not any(e[0] == key for e in want.effects):
                want.effects.add((key, name, None))
        elif kind == "withdrawal" and (f["step"] == "completion_rewound" or status in TERMINAL):
            name = "payout_reopened" if f["step"] == "completion_rewound" else f"payout_{status}"
            key = f"paymos:{rid}:{name}:{cycle}"
            if not any(e[0] == key for e in want.effects):
                want.effects.add((key, name, None))
            cycle += f["step"] == "completion_rewound"
        elif kind == "payment_channel_deposit" and status == "confirmed":
            want.effects.add((f"paymos:{rid}:credit_channel_deposit", "credit_channel_deposit", None))

    for event in _unique(history):
        f = event.fact
        if f["note"]:
            want.facts.add(("order_note", f"paymos:{rid}:paid_late"))
            want.effects.add((f"paymos:{rid}:add_order_note", "add_order_note", None))
            continue
        if current is not None and f["position"] <= current.fact["position"]:
            continue  # stale
        if not allowed(event):
            waiting.append(event)
            continue
        take(event)
        progressed = True
        while progressed:
            progressed = False
            for w in sorted(waiting, key=lambda e: e.fact["position"]):
                if w.fact["position"] <= current.fact["position"] or allowed(w):
                    waiting.remove(w)
                    if w.fact["position"] > current.fact["position"]:
                        take(w)
                    progressed = True
                    break
    want.parked[rid] = len(waiting)
    return want


ORACLES = {"pg": pg, "card": card, "paymos": paymos, "stripe": stripe_history.oracle_with(Outcome)}
ORACLES["adyen"] = lambda history: Outcome(**adyen_sim.expected(history))


def expected(history: History) -> Outcome:
    return ORACLES[history.gateway](history)
