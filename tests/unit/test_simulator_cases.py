"""The simulation's generators produce what they claim (issue #46): each gateway's simulator declares a
case table (``case_names``) and reads the cases out of one history (``cases``); over many seeds every
declared case must appear — a coverage of the case table, not of lines. And the oracle reasons
without the core: the issue's examples decided by the oracle and by the core agree, a delivery's
outcome is compared, and the one rule the documents and the core disagree on stays visible."""

from __future__ import annotations

import ast
import random
from collections import Counter
from pathlib import Path

import orjson
import pytest

from app.simulator import card_oracle, check, histories, plugins, truths
from app.simulator.truths import T0_MS, iso
from tests import parsing

SEEDS = 1000
ROOT = Path(__file__).resolve().parents[2]


def _seen(gateway: str, seeds: int) -> Counter[str]:
    sim = plugins.simulator_of(gateway)
    assert sim.cases is not None
    seen: Counter[str] = Counter()
    for seed in range(seeds):
        seen.update(sim.cases(truths.make(gateway, seed)))
    return seen


@pytest.mark.parametrize("gateway", ["card", "pg", "paymos"])
def test_every_case_a_generator_declares_appears_within_a_thousand_seeds(gateway: str) -> None:
    sim = plugins.simulator_of(gateway)
    assert len(sim.case_names) >= 9  # a table, not a token
    seen = _seen(gateway, SEEDS)
    assert [c for c in sim.case_names if not seen[c]] == [], seen
    assert set(seen) <= set(sim.case_names), set(seen) - set(sim.case_names)  # nothing found that is not declared


@pytest.mark.parametrize(("gateway", "case"), [
    ("card", "tie captured-refunded"), ("card", "tie refunded-refunded"), ("card", "tie captured-captured"),
    ("card", "the rank decides"), ("card", "clocks disagree"), ("card", "the sequence decides"),
    ("pg", "withdrawal equal version stale"), ("pg", "overpayment flag only in a stale delivery"),
])
def test_the_rules_issue_46_named_are_in_the_tables(gateway: str, case: str) -> None:
    assert case in plugins.simulator_of(gateway).case_names


def test_a_case_reader_sees_what_a_hand_made_history_holds() -> None:
    """The readers are not vacuous: the issue's card example holds a tie where the rank decides."""
    events = [_card("pay_x", 0, "authorised", 100, T0_MS), _card("pay_x", 1, "captured", 50, T0_MS + 1),
              _card("pay_x", 2, "captured", 50, T0_MS + 2), _card("pay_x", 3, "refunded", 50, T0_MS + 2)]
    history = _in_order("card", events)
    assert {"tie captured-refunded", "the rank decides"} <= plugins.simulator_of("card").cases(history)  # type: ignore[misc]
    assert "clocks disagree" not in plugins.simulator_of("card").cases(history)  # type: ignore[misc]


def _card(ref: str, n: int, kind: str, amount: int, at_ms: int, sequence: int | None = None,
          stamp_ms: int | None = None) -> histories.Event:
    body = orjson.dumps({"id": f"evt_{ref}_{n}", "type": f"payment.{kind}", "payment_ref": ref, "sequence": sequence,
                         "occurred_at": iso(at_ms if stamp_ms is None else stamp_ms), "amount_minor": amount,
                         "currency": "EUR"})
    return histories.Event(ref, body, at_ms, {"id": f"evt_{ref}_{n}", "kind": kind, "amount": amount})


def _in_order(gateway: str, events: list[histories.Event], arrival: list[int] | None = None) -> histories.History:
    order = arrival if arrival is not None else list(range(len(events)))
    return histories.History(gateway, 0, events, [
        histories.Delivery("webhook", events[i].resource, events[i].body, T0_MS + 10_000 * (k + 1), i)
        for k, i in enumerate(order)])


@pytest.mark.parametrize("arrival", [[0, 1, 2, 3], [0, 1, 3, 2], [3, 2, 1, 0]])
def test_the_issues_rank_example_ends_captured_with_one_refund(arrival: list[int]) -> None:
    """Authorise 100 @0, capture 50 @1, a capture 50 and a refund 50 both @2: captured 100, refunded 50
    (the rank puts the capture first), in any arrival order; oracle and core agree delivery by delivery."""
    events = [_card("pay_r", 0, "authorised", 100, T0_MS), _card("pay_r", 1, "captured", 50, T0_MS + 1),
              _card("pay_r", 2, "captured", 50, T0_MS + 2), _card("pay_r", 3, "refunded", 50, T0_MS + 2)]
    history = _in_order("card", events, arrival)
    want = check.expected(history)
    assert want.rows["pay_r"] == {"state": "captured", "authorised_minor": 100, "captured_minor": 100,
                                  "refunded_minor": 50}
    assert want.parked == {}
    assert want.differences(check.observed(history, random.Random(0))) == []


def test_a_sequence_wins_over_clocks_that_disagree() -> None:
    """Sequenced events whose clocks run backwards: the refund stamped before the second capture is
    still taken after it (the sequence), so the payment ends captured, 100 of it, 50 refunded."""
    events = [_card("pay_s", 0, "authorised", 100, T0_MS, 1), _card("pay_s", 1, "captured", 50, T0_MS + 10, 2),
              _card("pay_s", 2, "captured", 50, T0_MS + 20, 3),
              _card("pay_s", 3, "refunded", 50, T0_MS + 30, 4, stamp_ms=T0_MS + 15)]
    history = _in_order("card", events)
    assert {"clocks disagree", "the sequence decides"} <= plugins.simulator_of("card").cases(history)  # type: ignore[misc]
    want = check.expected(history)
    assert want.rows["pay_s"]["state"] == "captured" and want.rows["pay_s"]["refunded_minor"] == 50
    assert want.outcomes == {0: ["applied"], 1: ["applied"], 2: ["applied"], 3: ["applied"]}
    assert want.differences(check.observed(history, random.Random(0))) == []


def test_each_deliverys_outcome_is_compared() -> None:
    """A core that says ``duplicate`` where the oracle says ``stale`` is a mismatch naming the delivery."""
    history = next(h for h in (truths.make("pg", s) for s in range(200))
                   if any(o == ["stale"] for o in (check.expected(h).outcomes or {}).values()))
    got = check.observed(history, random.Random(0))
    assert check.expected(history).differences(got) == []
    assert got.outcomes is not None
    index = next(i for i, o in got.outcomes.items() if o == ["stale"])
    got.outcomes[index] = ["duplicate"]
    assert check.expected(history).differences(got) == [
        f"outcomes[delivery {index}]: expected ['stale'], core ['duplicate']"]


def test_a_second_completion_delivered_before_its_rewind_waits_for_it() -> None:
    """By the document a terminal state is left only by its reorg, never by a newer snapshot of the
    same status: a withdrawal completed, reopened and completed again whose second completion arrives
    before the rewind parks it, and the merchant hears payout_reopened and the second payout_completed.
    The core agrees (it once took the second completion at once, and the rewind then arrived stale)."""
    history = truths.make("paymos", 2)
    steps = [history.events[d.event].fact["step"] for d in history.deliveries]
    assert steps == ["created", "processing", "completed", "completed", "completion_rewound"]
    want = check.expected(history)
    assert {("paymos:wdr_2:payout_reopened:0", "payout_reopened", None),
            ("paymos:wdr_2:payout_completed:1", "payout_completed", None)} <= want.effects
    assert want.outcomes == {0: ["applied"], 1: ["applied"], 2: ["applied"], 3: ["parked", "unparked"],
                             4: ["applied"]}
    assert check.mismatch(history) == []


def test_the_core_keeps_the_sequence_once_a_synced_event_is_stored() -> None:
    """Seed 2917: a sequenced payment whose clocks disagree, fetched once (captured 108), then a
    capture of 6581 and a refund of 108 stamped 5 s before it. The sequence puts the refund last
    (captured 6689, refunded 108); a core that orders by clock once it holds the synced answer
    refunds in full and parks the capture (tests/unit/test_card_synced_order.py holds the shape)."""
    history = truths.make("card", 2917)
    assert {"clocks disagree", "the sequence decides", "fetched at random"} <= card_oracle.cases(history)
    assert card_oracle.oracle(history).rows["pay_2917"] == {
        "state": "captured", "authorised_minor": 6689, "captured_minor": 6689, "refunded_minor": 108}
    assert check.mismatch(history) == []


ORACLE_MODULES = ["oracle.py", "pg_oracle.py", "card_oracle.py", "card.py", "paymos.py", "pg.py", "expected.py",
                  "histories.py", "truths.py"]


@pytest.mark.parametrize("name", ORACLE_MODULES)
def test_the_oracles_import_nothing_of_the_core_or_the_gateways_adapters(name: str) -> None:
    tree = parsing.parse((ROOT / "app" / "simulator" / name).read_text())
    imported = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert [m for m in imported if m.startswith(("app.core", "app.gateways"))] == []
