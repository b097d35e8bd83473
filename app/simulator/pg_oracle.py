"""pg's oracle (simulator layer): what a history of deposits, withdrawals and balance transactions
must end at, and each delivery's outcome, by pg-event-order-version-guard.txt and DESIGN §2.1 (never
from app/core); and the cases pg's generator (app/simulator/pg.py) claims to produce.
"""

from __future__ import annotations

from app.simulator.histories import Event, History
from app.simulator.oracle import Outcome, one_shot, per_snapshot


def oracle(history: History) -> Outcome:
    """The document's guard over the deliveries in log order (see app/simulator/oracle.py)."""
    outcomes: dict[int, list[str]] = {}
    want = Outcome(outcomes=outcomes)
    top: dict[str, int] = {}
    credited: dict[str, int] = {}
    seen: set[tuple[str, str]] = set()
    correlated: set[str] = set()
    waiting: dict[str, list[tuple[int, Event]]] = {}  # deposit -> (delivery, event) parked for its correlation

    def guard(event: Event, applied: str) -> str:
        f, rid, obj = event.fact, event.resource, event.fact["object"]
        if f["kind"] == "deposit" and obj.get("overpayment"):
            want.facts.add(("overpayment_flag", obj["overpayment"]["claim_id"]))  # kept even when stale
        if f["version"] <= top.get(rid, -1):
            return "stale"  # no row, no effect
        top[rid] = f["version"]
        if f["kind"] == "withdrawal":
            want.rows[rid] = {"status": obj["status"], "pg_version": obj["version"],
                              "filled_minor": obj["filled_minor"], "remaining_minor": obj["remaining_minor"]}
            if obj["status"] == "settled" and obj["remaining_minor"] == 0:
                want.effects.add((one_shot("withdrawal", rid, "close_payout"), "close_payout", None))
            return applied
        user = history.correlations[rid]["our_user_id"]
        want.rows[rid] = {"status": obj["status"], "pg_version": obj["version"],
                          "amount_received_minor": obj.get("amount_received_minor"), "our_user_id": user}
        status = obj["status"]
        if status == "settled":
            if rid not in credited:
                credited[rid] = obj["amount_received_minor"]
                want.effects |= {(one_shot("deposit", rid, "credit_user"), "credit_user", credited[rid]),
                                 (one_shot("deposit", rid, "release_goods"), "release_goods", None)}
        elif status == "reversed":
            debit = (one_shot("deposit", rid, "debit_user"), "debit_user", credited.get(rid))
            if rid in credited and debit not in want.effects:
                want.effects |= {debit, (one_shot("deposit", rid, "hold_goods"), "hold_goods", None)}
        else:
            kind = {"under_review": "show_pending_review", "rejected": "fail_order"}.get(status, "update_order_status")
            if status in ("expired", "canceled"):
                late = obj.get("is_terminal") is False and obj.get("late_slip_accepted_until")
                kind = "show_late_slip" if late else "fail_order"
            want.effects.add((per_snapshot(f["id"], kind), kind, None))
        return applied

    for i, d in enumerate(history.deliveries):
        if d.source == "correlation":
            outcomes[i] = ["duplicate" if d.resource in correlated else "applied"]
            correlated.add(d.resource)
            for j, event in waiting.pop(d.resource, []):  # in log order, as if it had come first
                outcomes[j].append(guard(event, "unparked"))
            continue
        event = history.events[d.event]
        f, rid = event.fact, event.resource
        if (rid, f["id"]) in seen:
            outcomes[i] = ["duplicate"]
            continue
        seen.add((rid, f["id"]))
        if f["kind"] == "withdrawal":
            want.facts.add(("withdrawal_fill", f["fill"]["leg_ref"]))  # appended even when stale
        if f["kind"] == "balance_transaction":
            want.rows[rid] = {"amount_minor": f["object"]["amount_minor"]}
            outcomes[i] = ["applied"]
        elif f["kind"] == "deposit" and rid not in correlated:
            waiting.setdefault(rid, []).append((i, event))  # waits for the merchant's correlation
            outcomes[i] = ["parked"]
        else:
            outcomes[i] = [guard(event, "applied")]
    want.parked = {rid: len(parked) for rid, parked in waiting.items()}
    arrived = [(d.at_ms, history.events[d.event].fact["sequence"]) for d in history.deliveries if d.event >= 0]
    if arrived:
        delivered = {s for _, s in arrived}
        for missing in range(arrived[0][1] + 1, max(delivered)):
            if missing not in delivered:
                want.gaps.add((missing, next(at for at, s in arrived if s > missing)))
    return want


CASES = ("duplicate", "reordered", "lost", "backfilled", "late correlation", "no correlation",
         "attribute-only version", "deposit equal version, fresh event id", "withdrawal equal version, fresh event id",
         "withdrawal equal version stale", "overpayment flag", "overpayment flag only in a stale delivery",
         "gap open", "stale")


def cases(history: History) -> set[str]:
    """The cases of ``CASES`` that ``history`` holds, read from it and the oracle's outcomes."""
    want, found = oracle(history), set()
    outcomes = want.outcomes or {}
    hooks = [d.event for d in history.deliveries if d.source == "webhook"]
    firsts = list(dict.fromkeys(hooks))
    found |= {name for name, seen in (("duplicate", len(hooks) != len(firsts)), ("reordered", firsts != sorted(firsts)),
                                      ("lost", len(set(hooks)) < len(history.events)), ("gap open", bool(want.gaps)),
                                      ("backfilled", any(d.source == "fetch" for d in history.deliveries)),
                                      ("stale", any(o[-1] == "stale" for o in outcomes.values()))) if seen}
    if any(d.source == "correlation" and i > 0 for i, d in enumerate(history.deliveries)):
        found.add("late correlation")
    if history.correlations and not any(d.source == "correlation" for d in history.deliveries):
        found.add("no correlation")
    first: dict[int, int] = {}  # event index -> its first delivery
    for i, d in enumerate(history.deliveries):
        if d.event >= 0:
            first.setdefault(d.event, i)
    by_version: dict[tuple[str, int], list[int]] = {}
    for n, e in enumerate(history.events):
        if e.fact["version"] is not None:
            by_version.setdefault((e.resource, e.fact["version"]), []).append(n)
    for twins in by_version.values():
        if len(twins) > 1:
            kind = history.events[twins[0]].fact["kind"]
            found.add(f"{kind} equal version, fresh event id")
            got = sorted((first[n], outcomes[first[n]][-1]) for n in twins if n in first)
            if kind == "withdrawal" and [o for _, o in got] == ["applied", "stale"]:
                found.add("withdrawal equal version stale")
    statuses: dict[str, list[str]] = {}
    for e in history.events:
        statuses.setdefault(e.resource, []).append(e.fact["status"])
    if any(len(s) != len({*s}) for s in statuses.values()):
        found.add("attribute-only version")
    flagged: dict[str, list[str]] = {}
    for n, e in enumerate(history.events):
        if e.fact["kind"] == "deposit" and e.fact["object"].get("overpayment") and n in first:
            flagged.setdefault(e.fact["object"]["overpayment"]["claim_id"], []).append(outcomes[first[n]][-1])
    if flagged:
        found.add("overpayment flag")
    if any(set(decided) == {"stale"} for decided in flagged.values()):
        found.add("overpayment flag only in a stale delivery")
    return found
