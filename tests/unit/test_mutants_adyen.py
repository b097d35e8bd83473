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
