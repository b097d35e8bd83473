"""A fetched answer the gateway should not have given is refused naming why, at each bound (killing
mutmut's survivors in the card and stripe fetch paths, docs/testing.md): the fetcher logs the
reason and asks again later, it never appends what it cannot trust."""

from __future__ import annotations

import orjson
import pytest

from app.gateways import card, stripe

NOW_MS = 1_796_000_000_000
GOOD = {"state": "captured", "authorised_minor": 100, "captured_minor": 100, "refunded_minor": 0, "currency": "EUR"}


def refusal(answer: object) -> str:
    with pytest.raises(ValueError) as caught:
        card.synced_event("pay_1", answer, NOW_MS)
    return str(caught.value)


def test_card_answers_refused_with_the_reason() -> None:
    assert refusal([1]) == "the answer is not a JSON object: list"
    for bad in ({**GOOD, "state": "odd"}, {**GOOD, "captured_minor": -1}, {**GOOD, "refunded_minor": 2**63},
                {**GOOD, "authorised_minor": 1.5}):
        assert refusal(bad) == f"unusable gateway answer for pay_1: {str(bad)[:300]}"
    long = {**GOOD, "note": "n" * 400}
    assert card.synced_event("pay_1", long, NOW_MS)  # an unread field does not matter
    odd = {**long, "state": "odd"}
    assert refusal(odd) == f"unusable gateway answer for pay_1: {str(odd)[:300]}"
    for currency in ("", "ABCDEFGHI", None, 5):
        assert refusal({**GOOD, "currency": currency}) == "unusable currency in the gateway's answer for pay_1"


def test_card_currencies_of_one_to_eight_characters_are_taken() -> None:
    for currency in ("X", "ABCDEFGH"):
        event = orjson.loads(card.synced_event("pay_1", {**GOOD, "currency": currency}, NOW_MS))
        assert event["currency"] == currency and event["synced"]["state"] == "captured"


def test_stripe_answers_refused_with_the_reason() -> None:
    intent = {"id": "pi_1", "object": "payment_intent"}
    with pytest.raises(ValueError, match=r"^answer: expected the PaymentIntent and its refunds$"):
        stripe.synced("pi_1", [intent, {}], NOW_MS)
    long_id = "x" * 400
    with pytest.raises(ValueError) as wrong:
        stripe.synced("pi_1", ({"id": long_id}, {}), NOW_MS)
    assert str(wrong.value) == f"answer.id: asked for 'pi_1', got {long_id!r}"[:300]
    with pytest.raises(ValueError, match=r"^answer: the PaymentIntent is not a JSON object$"):
        stripe.synced_from([intent], {"object": "list", "data": []}, 1)
    not_lists: list[object] = [[], {"object": "dict", "data": []}, {"object": "list", "data": {}}]
    for refunds in not_lists:
        with pytest.raises(ValueError, match=r"^answer: the refunds are not a list object$"):
            stripe.synced_from(intent, refunds, 1)
    with pytest.raises(ValueError, match=r"^answer.has_more: more than 100 refunds, the list is incomplete$"):
        stripe.synced_from(intent, {"object": "list", "data": [], "has_more": True}, 1)


def test_stripe_fetch_paths_quote_every_reserved_character() -> None:
    assert stripe.fetch_paths("pi_1/X") == ("/v1/payment_intents/pi_1%2FX?expand[]=latest_charge",
                                            "/v1/refunds?payment_intent=pi_1%2FX&limit=100")


def test_stripe_header_values_holding_equals_signs() -> None:
    # a v1 entry is split at its first "=": one whose value holds another "=" is not a signature
    assert stripe.parse_header("t=5=6,v1=ab=" + "0" * 61) == ("5=6", [])
