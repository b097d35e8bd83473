"""The adyen reducer (app/core/adyen.py): Adyen's order over all of a payment's items, whatever
order and how many times they arrive (docs/gateways/adyen.md)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from app.core import adyen as core
from app.core.model import APPLIED, DUPLICATE, PARKED, UNPARKED, Delivery
from app.gateways import adyen
from app.gateways.adyen import Notification

PSP = "PAY0000000000001"
T0 = 1_796_000_000_000


def item(code: str, at_s: float, value: int, psp: str | None = None, success: bool = True,
         reason: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "pspReference": psp or PSP, "eventCode": code, "success": "true" if success else "false",
        "eventDate": datetime.fromtimestamp((T0 / 1000) + at_s, UTC).isoformat(timespec="seconds"),
        "amount": {"value": value, "currency": "EUR"}, "merchantAccountCode": "Shop", "merchantReference": "order-1"}
    if code != "AUTHORISATION":
        body["originalReference"] = PSP
    if reason is not None:
        body["reason"] = reason
    return body


def notification(body: dict[str, Any]) -> Notification:
    found = adyen.read(orjson.dumps(body), True)
    assert isinstance(found, Notification), found
    return found


def run(items: list[dict[str, Any]]) -> tuple[core.State, list[Any]]:
    state: core.State | None = None
    decisions = []
    for i, body in enumerate(items):
        d = Delivery(f"d{i}", "adyen", f"adyen:{PSP}", T0 + i, i)
        state, made = core.apply_event(state, notification(body), d)
        decisions += made
    assert state is not None
    return state, decisions


def final(decisions: list[Any]) -> tuple[Any, frozenset[str]]:
    rows = [d.row for d in decisions if d.row is not None]
    last = max(rows, key=lambda r: r["version"]) if rows else None
    comparable = None if last is None else {k: v for k, v in last.items() if k != "version"}
    return comparable, frozenset(e.dedupe_key for d in decisions for e in d.effects)


def test_a_capture_before_its_authorisation_parks_and_applies_when_it_arrives() -> None:
    _, decisions = run([item("CAPTURE", 5, 1000, "CAP1"), item("AUTHORISATION", 1, 1000)])
    assert [d.outcome for d in decisions] == [PARKED, APPLIED, UNPARKED]
    row = decisions[1].row
    assert row is not None and (row["state"], row["captured_minor"]) == ("captured", 1000)
    assert {e.type for e in decisions[1].effects} == {"mark_order_paid"}


def test_a_refused_authorisation_fails_the_order() -> None:
    _, decisions = run([item("AUTHORISATION", 1, 1000, success=False)])
    assert decisions[0].row is not None and decisions[0].row["state"] == "refused"
    assert [e.dedupe_key for e in decisions[0].effects] == [f"adyen:{PSP}:mark_order_failed"]


def test_capture_failed_undoes_its_capture_and_refund_failed_its_refund() -> None:
    _, decisions = run([item("AUTHORISATION", 1, 1000), item("CAPTURE", 2, 1000, "CAP1"),
                        item("REFUND", 3, 400, "REF1"), item("REFUND_FAILED", 4, 400, "REF1")])
    row = decisions[-1].row
    assert row is not None and (row["state"], row["refunded_minor"]) == ("captured", 0)
    _, decisions = run([item("AUTHORISATION", 1, 1000), item("CAPTURE", 2, 1000, "CAP1"),
                        item("CAPTURE_FAILED", 3, 1000, "CAP1")])
    row = decisions[-1].row
    assert row is not None and (row["state"], row["captured_minor"]) == ("authorised", 0)


def test_a_partial_refund_stays_captured_and_a_full_one_is_refunded() -> None:
    _, decisions = run([item("AUTHORISATION", 1, 1000), item("CAPTURE", 2, 1000, "CAP1"),
                        item("REFUND", 3, 300, "REF1")])
    assert decisions[-1].row is not None and decisions[-1].row["state"] == "captured"
    _, decisions = run([item("AUTHORISATION", 1, 1000), item("CAPTURE", 2, 1000, "CAP1"),
                        item("REFUND", 3, 300, "REF1"), item("REFUND", 4, 700, "REF2")])
    assert decisions[-1].row is not None and decisions[-1].row["state"] == "refunded"
    assert {e.type for d in decisions for e in d.effects} == {"mark_order_paid", "mark_order_refunded"}


def test_a_resent_item_is_a_duplicate() -> None:
    auth = item("AUTHORISATION", 1, 1000)
    _, decisions = run([auth, auth])
    assert decisions[-1].outcome == DUPLICATE and decisions[-1].effects == []


def test_chargeback_and_its_reversal() -> None:
    _, decisions = run([item("AUTHORISATION", 1, 1000), item("CAPTURE", 2, 1000, "CAP1"),
                        item("CHARGEBACK", 3, 1000, "DIS1"), item("CHARGEBACK_REVERSED", 4, 1000, "DIS1")])
    states = [d.row["state"] for d in decisions if d.row is not None]
    assert states == ["authorised", "captured", "chargeback", "captured"]
    assert sum(e.type == "open_dispute" for d in decisions for e in d.effects) == 1


# --- any arrival order ----------------------------------------------------------------------

@st.composite
def lifecycles(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A payment's items in the order Adyen made them, as its docs describe the lifecycle: one to
    three partial captures (one may fail and be captured again), partial refunds of what is captured
    so far (which may fail), a cancellation, a chargeback (which may be reversed), failed
    modifications. Times increase; a tie only where the lifecycle rank agrees with the order of
    creation."""
    amount = draw(st.integers(1, 10_000))
    made: list[dict[str, Any]] = []
    clock = [0.0]

    def add(code: str, value: int, psp: str, success: bool = True, reason: str | None = None) -> None:
        may_tie = bool(made) and core.RANK[code] > core.RANK[made[-1]["eventCode"]]
        tie: bool = may_tie and draw(st.booleans())
        clock[0] += 0 if tie else draw(st.integers(1, 5))
        made.append(item(code, clock[0], value, psp, success, reason))

    add("AUTHORISATION", amount, PSP, draw(st.booleans()) or draw(st.booleans()))
    if made[0]["success"] == "false":
        return made
    path = draw(st.sampled_from(["cancel", "cancel_or_refund", "capture"]))
    if draw(st.booleans()):
        add("CAPTURE", amount, "CAPX", success=False)
    if path == "cancel":
        add("CANCELLATION", amount, "CAN1")
        return made
    if path == "cancel_or_refund" and draw(st.booleans()):
        add("CANCEL_OR_REFUND", amount, "COR1")
        return made
    captured, refunded, refunds, failed = 0, 0, 0, False
    for c in range(draw(st.integers(1, 3))):
        if captured == amount:
            break
        value = draw(st.integers(1, amount - captured))
        add("CAPTURE", value, f"CAP{c}")
        captured += value
        if draw(st.booleans()) and captured - value >= refunded:
            add("CAPTURE_FAILED", value, f"CAP{c}")
            captured -= value
            if draw(st.booleans()):
                return made  # not re-captured (a later refund of it: docs/gateways/adyen.md, Limits)
            add("CAPTURE", value, f"CAP{c}", reason="Transaction Recaptured")  # Adyen captured it again
            captured += value
        for _ in range(0 if failed else draw(st.integers(0, 2))):  # refunds of what is captured so far
            part = draw(st.integers(1, max(1, captured)))
            if refunded + part > captured:
                break
            add("REFUND", part, f"REF{refunds}")
            refunded += part
            refunds += 1
            if draw(st.booleans()):
                add("REFUND_FAILED", part, f"REF{refunds - 1}")
                refunded -= part
                failed = True
                break  # a later refund may not complete the total: docs/gateways/adyen.md, Limits
    if path == "cancel_or_refund":
        add("CANCEL_OR_REFUND", amount, "COR1")
    elif captured and draw(st.booleans()):
        if draw(st.booleans()):
            add("NOTIFICATION_OF_CHARGEBACK", captured, "DIS1")
        add("CHARGEBACK", captured, "DIS1")
        if draw(st.booleans()):
            add("CHARGEBACK_REVERSED", captured, "DIS1")
            if draw(st.booleans()):
                add("SECOND_CHARGEBACK", captured, "DIS1")
    return made


@settings(max_examples=300, deadline=None)
@given(data=st.data(), made=lifecycles())
def test_any_arrival_order_with_duplicates_ends_as_the_creation_order(data: st.DataObject,
                                                                       made: list[dict[str, Any]]) -> None:
    _, in_order = run(made)
    expected = final(in_order)
    resent = made + data.draw(st.lists(st.sampled_from(made), max_size=4))
    arrived = data.draw(st.permutations(resent))
    state, decisions = run(arrived)
    assert final(decisions) == expected
    keys = [e.dedupe_key for d in decisions for e in d.effects]
    assert len(keys) == len(set(keys))  # no effect twice
    assert len(state.applied) == len(made)  # every item applied in the end, none parked for ever
    assert expected[0] is not None and expected[0]["state"] in core.STATES
