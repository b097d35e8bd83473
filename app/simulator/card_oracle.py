"""card's oracle (simulator layer): what one payment's history must end at and each delivery's
outcome, by card-gateway-order-playbook.txt and DESIGN §2.2 (never from app/core); and the cases
card's generator (app/simulator/card.py) claims to produce.
"""

from __future__ import annotations

import itertools
from typing import Any

import orjson

from app.simulator.expected import card_reduce, occurred_ms
from app.simulator.histories import History
from app.simulator.oracle import Outcome

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
