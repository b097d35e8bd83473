"""model.decide builds a Decision field by field without its __init__: it must set every field of
the dataclass, in the dataclass's order (orjson writes a dataclass's fields in that order)."""

from __future__ import annotations

import dataclasses

import orjson
from hypothesis import given
from hypothesis import strategies as st

from app.core.model import Decision, Delivery, Effect, Fact, decide

TEXT = st.text(max_size=8)
ROW = st.dictionaries(TEXT, st.integers(-(2**63), 2**63 - 1), max_size=3)  # orjson writes 64-bit integers


def test_decide_sets_every_field_of_decision_in_its_order() -> None:
    made = decide(Delivery("d1", "pg", "pg:dep_1", 5, 7), "applied")
    assert list(vars(made)) == [f.name for f in dataclasses.fields(Decision)]


@given(TEXT, TEXT, st.integers(0, 2**40), st.integers(0, 2**31), st.sampled_from(["applied", "stale", "parked"]),
       st.none() | TEXT, st.none() | st.integers(0, 99), st.none() | ROW,
       st.none() | TEXT, st.booleans())
def test_decide_is_the_decision_its_init_makes(delivery_id: str, resource: str, received: int, seq: int,
                                               outcome: str, event_id: str | None, sequence: int | None,
                                               row: dict[str, int] | None, error: str | None, parts: bool) -> None:
    d = Delivery(delivery_id, "card", f"card:{resource}", received, seq)
    effects = [Effect("k", "t", "card", resource, {"a": 1}, delivery_id)] if parts else None
    facts = [Fact("f", "k", {"b": 2})] if parts else None
    made = decide(d, outcome, event_id=event_id, event_type="payment.x", sequence=sequence, row=row,
                  table="t" if row else None, effects=effects, facts=facts, payload={"p": 1}, error=error)
    init = Decision(delivery_id, "card", resource, outcome, received, seq, event_id, "payment.x", sequence, row,
                    "t" if row else None, effects or [], facts or [], {"p": 1}, error)
    assert made == init
    assert orjson.dumps(made) == orjson.dumps(init)
