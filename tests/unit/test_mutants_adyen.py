"""The adyen reducer's one pass equals restarting from the lowest key after every applied item, as
its docstring states (app/core/adyen.py): a naive restart written here, compared on any history
(killing mutmut's survivors in the pass's change counter and the money rules, docs/testing.md)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from app.core.adyen import RANK, AdyenEvent, Reduced, _applied, order_key, reduce, step


def restarted(events: list[AdyenEvent]) -> Reduced:
    """After every applied item, look again from the lowest key: the slow rule the pass stands for."""
    out = Reduced()
    pending = sorted({e.id: e for e in events}.values(), key=order_key)
    while (ready := next((e for e in pending if step(out, e)), None)) is not None:
        pending.remove(ready)
        _applied(out, ready)
    out.parked = [e.id for e in pending]
    return out


def seen(out: Reduced) -> tuple[object, ...]:
    return (out.state, out.authorised_minor, out.captures, out.failed, out.refunds, out.applied, out.parked,
            out.earned, out.updated_ms, out.currency)


MONEY = ["CAPTURE", "REFUND", "CAPTURE_FAILED", "REFUND_FAILED", "CANCELLATION", "CANCEL_OR_REFUND"]
# mostly money movements, mostly carried out, in the authorisation's currency, after it: the histories
# where an item waits for another and must be looked at again after it
fields = st.tuples(st.sampled_from(MONEY * 3 + sorted(RANK)), st.sampled_from([True, True, False]),
                   st.sampled_from(["p1", "p2"]), st.integers(0, 5), st.sampled_from([0, 40, 60, 100]),
                   st.sampled_from(["EUR", "EUR", "USD"]), st.sampled_from([False, False, True]))


def items(drawn: list[tuple[str, bool, str, int, int, str, bool]]) -> list[AdyenEvent]:
    return [AdyenEvent(f"e{i}", code, success, psp, at, amount, currency=currency,
                       recapture=recapture and code == "CAPTURE")
            for i, (code, success, psp, at, amount, currency, recapture) in enumerate(drawn)]


authorisation = st.builds(lambda at, amount: AdyenEvent("auth", "AUTHORISATION", True, "psp", at, amount,
                                                        currency="EUR"),
                          st.sampled_from([0, 0, 0, 2]), st.sampled_from([100, 160]))


@settings(max_examples=600, deadline=None)
@given(authorisation, st.lists(fields, max_size=8).map(items))
def test_the_one_pass_is_the_restart_from_the_lowest_key(auth: AdyenEvent, rest: list[AdyenEvent]) -> None:
    events = [auth, *rest]
    assert seen(reduce(events)) == seen(restarted(events))


def ev(i: str, code: str, psp: str, at: int, amount: int = 0, *, recapture: bool = False,
       success: bool = True) -> AdyenEvent:
    return AdyenEvent(i, code, success, psp, at, amount, currency="EUR", recapture=recapture)


AUTH = ev("auth", "AUTHORISATION", "psp", 0, 100)


def test_a_recapture_waits_for_the_failure_it_re_captures() -> None:
    out = reduce([AUTH, ev("c", "CAPTURE", "c1", 1, 100), ev("again", "CAPTURE", "c1", 2, 100, recapture=True),
                  ev("f", "CAPTURE_FAILED", "c1", 3)])
    assert (out.state, out.captures, out.failed, out.parked) == ("captured", {"c1": 100}, {}, [])
    assert out.applied == ["auth", "c", "f", "again"]


def test_a_capture_repeating_a_pspreference_is_no_change_with_its_amount_and_parked_with_another() -> None:
    same = reduce([AUTH, ev("c", "CAPTURE", "c1", 1, 60), ev("c'", "CAPTURE", "c1", 2, 60)])
    assert (same.captures, same.applied, same.parked) == ({"c1": 60}, ["auth", "c", "c'"], [])
    failed = reduce([AUTH, ev("c", "CAPTURE", "c1", 1, 60), ev("f", "CAPTURE_FAILED", "c1", 2),
                     ev("c'", "CAPTURE", "c1", 3, 40)])
    assert (failed.captures, failed.failed, failed.parked) == ({}, {"c1": 60}, ["c'"])
    assert failed.why == {"c'": "amount.value: capture c1 is held at 60 already"}
    held = reduce([AUTH, ev("c", "CAPTURE", "c1", 1, 60), ev("c'", "CAPTURE", "c1", 2, 40)])
    assert (held.captures, held.parked, held.why) == ({"c1": 60}, ["c'"],
                                                     {"c'": "amount.value: capture c1 is held at 60 already"})


def test_a_cancelled_payment_takes_only_repeated_cancellations() -> None:
    out = reduce([AUTH, ev("x", "CANCELLATION", "x1", 1), ev("x'", "CANCELLATION", "x2", 2),
                  ev("cr", "CANCEL_OR_REFUND", "x3", 3), ev("c", "CAPTURE", "c1", 4, 50),
                  ev("r", "REFUND", "r1", 5, 10)])
    assert (out.state, out.captures, out.applied, out.parked) == ("cancelled", {}, ["auth", "x", "x'", "cr"],
                                                                  ["c", "r"])


def test_a_refund_above_what_is_captured_waits() -> None:
    out = reduce([AUTH, ev("c", "CAPTURE", "c1", 1, 40), ev("r", "REFUND", "r1", 2, 60)])
    assert (out.state, out.refunds, out.parked) == ("captured", {}, ["r"])
    failed = reduce([AUTH, ev("rf", "REFUND_FAILED", "r1", 1), ev("cf", "CAPTURE_FAILED", "c9", 1)])
    assert (failed.state, failed.parked) == ("authorised", ["cf", "rf"])


def test_cancel_or_refund_of_a_fully_refunded_payment_refunds_nothing_more() -> None:
    out = reduce([AUTH, ev("c", "CAPTURE", "c1", 1, 100), ev("r", "REFUND", "r1", 2, 100),
                  ev("cr", "CANCEL_OR_REFUND", "x1", 3)])
    assert (out.state, out.refunds) == ("refunded", {"r1": 100})


def test_effects_one_minor_unit_pays_and_every_chargeback_opens_a_dispute() -> None:
    assert reduce([AUTH, ev("c", "CAPTURE", "c1", 1, 1)]).earned == ["mark_order_paid"]
    for code in ("NOTIFICATION_OF_CHARGEBACK", "CHARGEBACK", "SECOND_CHARGEBACK"):
        out = reduce([AUTH, ev("c", "CAPTURE", "c1", 1, 100), ev("cb", code, "d1", 2)])
        assert out.earned == ["mark_order_paid", "open_dispute"]
    unsuccessful = reduce([AUTH, ev("cb", "CHARGEBACK", "d1", 2, success=False)])
    assert unsuccessful.earned == []


def test_an_item_that_applies_after_waiting_loses_its_reason() -> None:
    out = reduce([AUTH, ev("c", "CAPTURE", "c1", 2, 100),
                  AdyenEvent("r", "REFUND", True, "r1", 1, 50, currency="USD")])
    assert out.why == {"r": "amount.currency: USD is not the payment's EUR"}
    freed = reduce([AUTH, ev("c", "CAPTURE", "c1", 1, 100), ev("c2", "CAPTURE", "c2", 2, 50),
                    ev("f", "CAPTURE_FAILED", "c1", 3)])
    assert (freed.captures, freed.parked, freed.why) == ({"c2": 50}, [], {})
