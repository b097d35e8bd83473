"""The simulator's gateway APIs in their three fetch modes, and the documents' expectation the demo
checks the read models against (app/simulator/expected.py, independent of app/core)."""

from __future__ import annotations

import json
import random
import urllib.error
import urllib.request
from typing import Any

import orjson
import pytest

from app.demo import Size, demo_events
from app.gateways.registry import GATEWAYS
from app.simulator import adyen as adyen_simulator
from app.simulator import api, lifecycles, plugins, stripe_history
from app.simulator import card as card_simulator
from app.simulator import paymos as paymos_simulator
from app.simulator import pg as pg_simulator
from app.simulator.expected import Fetched, card_reduce, occurred_ms
from app.simulator.plugins import DemoInput
from tests.support import serve_in_thread


def get(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def card_event(n: int, kind: str, ms: int, amount: int) -> dict[str, Any]:
    seconds, millis = divmod(ms, 1000)
    return {"id": f"evt_{n}", "type": f"payment.{kind}", "payment_ref": "pay_8c21", "sequence": None,
            "occurred_at": f"2026-11-29T10:02:{seconds:02d}.{millis:03d}Z", "amount_minor": amount,
            "currency": "EUR"}


def generated(seed: int) -> tuple[lifecycles.Truth, list[lifecycles.Emitted]]:
    rng = random.Random(seed)
    truth = lifecycles.Truth()
    return truth, (pg_simulator.lifecycle(rng, 60, 20, truth) + card_simulator.lifecycle(rng, 60, truth)
                   + paymos_simulator.lifecycle(rng, 30, truth) + stripe_history.demo(rng, 30, truth)
                   + adyen_simulator.demo(rng, 40, truth))


@pytest.mark.parametrize("seed", range(12))
def test_with_every_event_delivered_the_reducers_alone_reach_the_gateways_truth(seed: int) -> None:
    truth, events = generated(seed)
    # the demo hands each table its events in creation order; those that order by a field of their
    # own (all but stripe, whose Stripe order needs the creation order within a second) take any
    shuffled = random.Random(seed).sample(events, len(events))
    tables = {table.name: (name, table) for name in plugins.simulated()
              for table in plugins.simulator_of(name).demo_tables}
    assert list(tables) == ["pg deposits", "pg withdrawals", "user balances", "card payments", "paymos resources",
                            "stripe payment intents", "adyen payments"]
    for order in (events, shuffled):
        for name, table in tables.values():
            if name == "stripe" and order is shuffled:
                continue
            run = DemoInput([e for e in order if e.gateway == name], truth.correlations)
            want = table.expected(run)
            assert want == table.truth(truth) and want, table.name


def test_stripe_and_adyen_expectations_leave_out_what_never_came() -> None:
    truth, events = generated(4)
    stripe_table = stripe_history.DEMO_TABLES[0]
    # a refunded PaymentIntent whose refund events were given up on: its row is the payment before them
    rid = next(k for k, v in truth.by_gateway["stripe"].items() if v["amount_refunded_minor"] > 0)
    kept = [e for e in events if e.gateway == "stripe" and not (e.resource == rid and b'"refund' in e.body
                                                                and b"charge.refunded" not in e.body)]
    kept = [e for e in kept if not (e.resource == rid and b"charge.refunded" in e.body)]
    row = stripe_table.expected(DemoInput(kept, {}))[rid]
    assert row[0] == "succeeded" and row[2] == 0 != truth.by_gateway["stripe"][rid]["amount_refunded_minor"]
    # an adyen payment whose AUTHORISATION never came has no row (its modifications are parked)
    adyen_table = adyen_simulator.DEMO_TABLES[0]
    psp = next(k for k, v in truth.by_gateway["adyen"].items() if v["captured_minor"] > 0)
    lost = [e for e in events if e.gateway == "adyen" and not (e.resource == psp and b"AUTHORISATION" in e.body)]
    assert psp not in adyen_table.expected(DemoInput(lost, {}))
    # ... and one whose CAPTURE never came stays authorised, its refunds parked
    no_capture = [e for e in events if e.gateway == "adyen" and not (e.resource == psp and b'"CAPTURE"' in e.body)]
    state, authorised, captured, refunded = adyen_table.expected(DemoInput(no_capture, {}))[psp]
    assert (state, captured, refunded) == ("authorised", 0, 0) and authorised > 0


def test_the_playbooks_pay_8c21_parks_the_over_refund_until_the_second_capture() -> None:
    # the playbook: auth 12000, captures 8000 then 3500; a refund of 3500 between the captures applies,
    # one of 10000 in the same gap parks until the 3500 capture lands; totals 11500 captured, 10000 refunded
    events = [card_event(1, "authorised", 0, 12000), card_event(2, "captured", 1000, 8000),
              card_event(3, "refunded", 2000, 10000), card_event(4, "captured", 3000, 3500)]
    for arrival in (events, events[::-1], [events[2], events[0], events[3], events[1]]):
        assert card_reduce(arrival) == {"state": "captured", "authorised_minor": 12000, "captured_minor": 11500,
                                        "refunded_minor": 10000, "parked": []}
    assert card_reduce([events[0], events[1], card_event(3, "refunded", 2000, 3500)])["refunded_minor"] == 3500
    # an auto-capture sharing the authorisation's millisecond: the rank keeps captured after authorised
    same_ms = [card_event(2, "captured", 0, 12000), card_event(1, "authorised", 0, 12000),
               card_event(3, "refunded", 0, 12000)]
    assert card_reduce(same_ms)["state"] == "refunded"


def test_events_that_never_came_leave_the_others_parked_where_the_applied_ones_end() -> None:
    auth, capture, refund = (card_event(1, "authorised", 0, 5000), card_event(2, "captured", 10, 5000),
                             card_event(3, "refunded", 20, 5000))
    assert card_reduce([capture, refund]) == {"state": "created", "authorised_minor": 0, "captured_minor": 0,
                                              "refunded_minor": 0, "parked": ["evt_2", "evt_3"]}
    assert card_reduce([auth, refund]) == {"state": "authorised", "authorised_minor": 5000, "captured_minor": 0,
                                           "refunded_minor": 0, "parked": ["evt_3"]}
    truth, events = generated(3)
    ref = next(k for k, v in truth.card.items() if v["state"] == "refunded")
    lost = frozenset(e.body for e in events if e.resource == ref and b"payment.authorised" in e.body)
    delivered = [e for e in events if e.gateway == "card" and e.body not in lost]
    assert card_simulator.expected_payments(DemoInput(delivered, truth.correlations))[ref] == ("created", 0, 0)


def test_a_synced_answer_is_the_new_base_and_later_events_apply_on_top() -> None:
    capture = card_event(2, "captured", 1000, 4000)
    base = {"payment_ref": "pay_8c21", "state": "authorised", "authorised_minor": 4000, "captured_minor": 0,
            "refunded_minor": 0, "currency": "EUR"}
    at = occurred_ms(capture["occurred_at"])
    # fetched before the capture occurred: the capture applies on top of the answer
    early = [Fetched("pay_8c21", base, at - 1)]
    assert card_reduce([capture], early) == {"state": "captured", "authorised_minor": 4000, "captured_minor": 4000,
                                             "refunded_minor": 0, "parked": []}
    # fetched after it: what the gateway reported covers the events still waiting
    late = [Fetched("pay_8c21", base, at + 1)]
    assert card_reduce([capture], late) == {"state": "authorised", "authorised_minor": 4000, "captured_minor": 0,
                                            "refunded_minor": 0, "parked": []}


def test_the_404_api_answers_nothing_and_counts_every_request() -> None:
    truth, events = generated(5)
    app = api.build(truth, events, "404")
    with serve_in_thread(app) as url:
        paths = ["/payments/pay_sim0", "/payments/pay_sim1", "/v1/pay/events?since_sequence=0",
                 "/v1/pay/deposits/dep_sim0", "/v1/pay/withdrawals/wdr_sim0", "/v1/pay/balance"]
        assert [get(url + p)[0] for p in paths] == [404] * 6
    served = app[api.SERVED]
    assert (served.count("card GET /payments/{ref}"), served.count("card GET /payments/{ref}", 404)) == (2, 2)
    assert sum(served.requests.values()) == 6 and served.card_answers == []


def test_the_truth_api_answers_the_final_state_and_records_what_it_answered() -> None:
    truth, events = generated(5)
    app = api.build(truth, events)
    with serve_in_thread(app) as url:
        assert get(f"{url}/payments/pay_sim4") == (200, truth.card["pay_sim4"])
        assert get(f"{url}/payments/pay_nope")[0] == 404
        status, page = get(f"{url}/v1/pay/events?since_sequence=0&limit=1000")
    pg_count = sum(1 for e in events if e.gateway == "pg")
    assert status == 200 and [b["sequence"] for b in page["data"]] == list(range(1, pg_count + 1))
    served = app[api.SERVED]
    assert [(f.ref, f.answer) for f in served.card_answers] == [("pay_sim4", truth.card["pay_sim4"])]
    assert served.requests == {("card GET /payments/{ref}", 200): 1, ("card GET /payments/{ref}", 404): 1,
                               ("pg GET /v1/pay/events", 200): 1}


def test_the_stale_api_answers_one_event_behind() -> None:
    truth, events = generated(5)
    app = api.build(truth, events, "stale")
    refs = sorted(truth.card)[:10]
    with serve_in_thread(app) as url:
        answers = {ref: get(f"{url}/payments/{ref}") for ref in refs}
        status, page = get(f"{url}/v1/pay/events?since_sequence=0&limit=1000")
    for ref, (code, body) in answers.items():
        bodies = [orjson.loads(e.body) for e in events if e.resource == ref]
        before = card_reduce(bodies[:-1])
        assert code == 200 and body == {"payment_ref": ref, "currency": "EUR",
                                        **{k: before[k] for k in ("state", "authorised_minor", "captured_minor",
                                                                  "refunded_minor")}}
        assert (body["state"], body["captured_minor"], body["refunded_minor"]) != (
            truth.card[ref]["state"], truth.card[ref]["captured_minor"], truth.card[ref]["refunded_minor"])
    pg_count = sum(1 for e in events if e.gateway == "pg")
    assert status == 200 and [b["sequence"] for b in page["data"]] == list(range(1, pg_count))  # the newest held back
    with pytest.raises(ValueError, match="fetch_api"):
        api.build(truth, events, "sometimes")


def test_the_demo_holds_back_every_tenth_card_payments_authorisation() -> None:
    from app.demo import LATE_EVERY, late_authorisations

    _, events = generated(7)
    late = late_authorisations(events)
    held = [orjson.loads(body) for body in late]
    payments = len({e.resource for e in events if e.gateway == "card"})
    assert len(held) == -(-payments // LATE_EVERY)  # the 1st, 11th, 21st, … payment
    assert {h["type"] for h in held} == {"payment.authorised"}
    assert all(any(e.body == body and e.gateway == "card" for e in events) for body in late)


def test_every_registered_gateway_has_lifecycles_found_by_its_registry_line() -> None:
    """`orderly simulate` finds a gateway's lifecycles through its registry line's simulator module
    (the registry itself does not import the simulator); pg's ``count`` deposits come with a third
    as many withdrawals."""
    assert {"pg", "card", "paymos"} <= set(plugins.simulated()) <= set(GATEWAYS)  # (tests may add a toy one)
    for name in plugins.simulated():
        simulate = plugins.simulator_of(name).lifecycles
        assert simulate is not None
        events = simulate(random.Random(7), 9, lifecycles.Truth())
        assert events and {e.gateway for e in events} == {name}
    direct = pg_simulator.lifecycle(random.Random(7), 9, 3, lifecycles.Truth())
    pg_lifecycles = plugins.simulator_of("pg").lifecycles
    assert pg_lifecycles is not None and pg_lifecycles(random.Random(7), 9, lifecycles.Truth()) == direct


def test_the_demo_takes_each_gateways_lifecycles_from_its_simulator_in_the_registrys_order() -> None:
    """`orderly demo --scale 0.1`: the same seeded events as the five gateways' lifecycles drawn one
    after the other (pg's deposits and withdrawals, card's payments, paymos's resources per kind,
    stripe's PaymentIntents, adyen's payments)."""
    rng, truth = random.Random(7), lifecycles.Truth()
    direct = (pg_simulator.lifecycle(rng, 20, 6, truth) + card_simulator.lifecycle(rng, 20, truth)
              + paymos_simulator.lifecycle(rng, 8, truth) + stripe_history.demo(rng, 10, truth)
              + adyen_simulator.demo(rng, 15, truth))
    drawn = lifecycles.Truth()
    assert demo_events(random.Random(7), Size(0.1), drawn) == direct
    assert drawn == truth and set(drawn.by_gateway) == {"stripe", "adyen"}
    assert Size(1.0).of(plugins.simulator_of("stripe")) == (100,)
    assert Size(1.0).of(plugins.simulator_of("adyen")) == (150,)
    assert Size(1.0).of(plugins.simulator_of("pg")) == (200, 60)
