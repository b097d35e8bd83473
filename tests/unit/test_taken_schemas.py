"""The worker's read of a body the ingest took (issue #43 item 3) uses schemas without the ingest's
id pattern and Python checks; the ingest's schemas are subclasses of those, one field list each.
These tests keep the two from drifting apart: the same fields, order and defaults, and the strict
one still refusing what only its own checks catch."""

from __future__ import annotations

import msgspec
import orjson
import pytest

from app.gateways import card, paymos, pg
from app.gateways.schema import Refusal, typed

PAIRS = [
    (pg.Overpayment, pg.StrictOverpayment), (pg.Deposit, pg.StrictDeposit), (pg.Withdrawal, pg.StrictWithdrawal),
    (pg.PayoutMetadata, pg.StrictPayoutMetadata), (pg.Source, pg.StrictSource),
    (pg.BalanceTransaction, pg.StrictBalanceTransaction), (pg.Fill, pg.StrictFill), (pg.Data, pg.StrictData),
    (pg.Taken, pg.Event), (paymos.Resource, paymos.StrictResource), (card.Fields, card.Event),
    (card.Fetched, card.Unchecked),
]


@pytest.mark.parametrize(("taken", "strict"), PAIRS, ids=lambda t: t.__name__)
def test_the_strict_schema_has_the_taken_one_s_fields_in_its_order(taken: type[msgspec.Struct],
                                                                    strict: type[msgspec.Struct]) -> None:
    assert issubclass(strict, taken)
    assert strict.__struct_fields__ == taken.__struct_fields__
    assert strict.__struct_defaults__ == taken.__struct_defaults__
    assert strict.__struct_config__.tag == taken.__struct_config__.tag
    assert strict.__struct_config__.tag_field == taken.__struct_config__.tag_field


def pg_body(**changed: object) -> bytes:
    """A pg deposit event, its deposit's fields ``changed``."""
    deposit = {"id": "dep_1", "object": "deposit", "version": 1, "status": "pending", **changed}
    return orjson.dumps({"id": "evt_1", "type": "deposit.pending", "sequence": 1, "data": {"object": deposit}})


@pytest.mark.parametrize("dots", [".", "..", "a\nb"])
def test_only_the_ingest_s_schema_refuses_an_id_its_checks_catch(dots: str) -> None:
    body = pg_body(id=dots)
    refused = typed(msgspec.json.Decoder(pg.Event), body)
    assert isinstance(refused, Refusal) and refused.reason.startswith("data.object.id: "), refused
    taken = typed(msgspec.json.Decoder(pg.Taken), body)
    assert not isinstance(taken, Refusal) and taken.data.object.id == dots


def test_both_refuse_what_msgspec_checks_in_c_naming_the_field() -> None:
    body = pg_body(version="1")
    for schema in (pg.Event, pg.Taken):
        refused = typed(msgspec.json.Decoder(schema), body)
        assert isinstance(refused, Refusal) and refused.reason == "data.object.version: expected int, got str"
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"id": "", "object": "invoice", "status": "paid", "is_final": True,
                         "updated_at": 1_796_000_000_000}, paymos.Resource)  # an empty id: its length, in C
