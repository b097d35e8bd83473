"""Deciding the same delivery twice (its batch was decided but not committed) gives the same
decisions again, without effects; a new delivery of the same event is a duplicate."""

from __future__ import annotations

import orjson
from hypothesis import given
from hypothesis import strategies as st

from app.core.dispatch import decide_record
from app.core.model import RECENT
from app.gateways.registry import GATEWAYS
from tests.pg_events import deposit
from topics.catalog import names

N = names("t")
KEY = b"pg:dep_r"


def headers(delivery_id: str) -> dict[str, str]:
    return {"gateway": "pg", "delivery_id": delivery_id, "received_at": "1700000000000"}


def test_a_delivery_decided_again_keeps_its_outcome_and_emits_no_effect() -> None:
    state, _ = decide_record(N.raw, GATEWAYS, None, KEY, orjson.dumps(
        {"pg_deposit_id": "dep_r", "merchant_reference": "mr", "our_order_id": "o", "our_user_id": "u"}),
        {**headers("c1"), "record": "correlation"}, 0, 0)
    body = deposit("dep_r", 3, "settled", sequence=3)
    state, first = decide_record(N.raw, GATEWAYS, state, KEY, body, headers("d1"), 1, 0)
    assert [d.outcome for d in first] == ["applied"] and first[0].effects
    state, again = decide_record(N.raw, GATEWAYS, state, KEY, body, headers("d1"), 1, 0)
    assert [(d.delivery_id, d.outcome, d.seq) for d in again] == [(d.delivery_id, d.outcome, d.seq) for d in first]
    assert not any(d.effects or d.facts or d.row for d in again)
    state, other = decide_record(N.raw, GATEWAYS, state, KEY, body, headers("d2"), 2, 0)
    assert [d.outcome for d in other] == ["duplicate"]


@given(st.integers(min_value=1, max_value=40))
def test_only_the_last_deliveries_are_remembered(count: int) -> None:
    state = None
    for i in range(count):
        state, _ = decide_record(N.raw, GATEWAYS, state, KEY, deposit("dep_r", i + 1, "pending", sequence=i + 1),
                                 headers(f"d{i}"), i, 0)
    assert state is not None
    assert [entry[0] for entry in state.recent] == [f"d{i}" for i in range(max(0, count - RECENT), count)]
