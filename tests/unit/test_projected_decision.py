"""The projector's read of a decision (topics.records.ProjectedDecision) and the payload text it
stores: every field of Decision read alike but the payload, kept as written; stored as sent unless
jsonb could refuse a number as written or the database is not UTF-8, then as read (doubles)."""

from __future__ import annotations

import dataclasses

import msgspec
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.gateways.limits import long_numbers
from app.projector import _payload_json
from topics.records import DECISIONS, PROJECTED, Decision, Effect, Fact, ProjectedDecision

OLD = msgspec.json.Encoder().encode  # how the projector wrote a payload before it kept the text
READ = msgspec.json.Decoder(float_hook=float).decode


def test_the_projected_read_has_every_field_of_a_decision_with_the_same_defaults() -> None:
    fields = {f.name: f for f in dataclasses.fields(Decision)}
    assert list(fields) == list(ProjectedDecision.__struct_fields__)
    blank = PROJECTED.decode(b'{"delivery_id":"d","gateway":"pg","resource_id":"r","outcome":"applied",'
                             b'"received_at_ms":1,"seq":0}')
    full = Decision("d", "pg", "r", "applied", 1, 0)
    for name in fields:
        if name != "payload":
            assert getattr(blank, name) == getattr(full, name), name
    assert bytes(blank.payload) == b"null"
    assert PROJECTED.dec_hook is None and DECISIONS.float_hook is float and PROJECTED.float_hook is float


def test_a_decision_reads_alike_but_its_payload_which_is_the_text_written() -> None:
    decision = Decision("d", "pg", "dep_1", "applied", 1_700_000_000_000, 3, "evt", "deposit.settled", 12,
                        {"pg_deposit_id": "dep_1", "status": "settled"}, "pg_deposits",
                        [Effect("k", "credit_user", "pg", "dep_1", {"user_id": "u", "amount_minor": 5}, "d")],
                        [Fact("note", "n1", {"a": 1})], orjson.Fragment(b"{\"amount\": 1.10}"))
    written = decision.to_bytes()
    old, new = DECISIONS.decode(written), PROJECTED.decode(written)
    for name in ProjectedDecision.__struct_fields__:
        if name != "payload":
            assert getattr(new, name) == getattr(old, name), name
    assert bytes(new.payload) == b'{"amount": 1.10}' and old.payload == {"amount": 1.1}


@pytest.mark.parametrize(("payload", "stored"), [
    (b'{"amount": 1.10, "n": 1E5}', '{"amount": 1.10, "n": 1E5}'),  # as sent
    (b'"caf\\u00e9"', '"caf\\u00e9"'),
    (b'null', 'null'),
    (b'{"tiny": 1e-16384}', '{"tiny":0.0}'),  # jsonb refuses it as written: as read
    (b'{"x": 0.' + b"0" * 16383 + b'1}', '{"x":0.0}'),
    (b'{"id": "1234567890123456789"}', '{"id":"1234567890123456789"}'),  # a long run in a string: read too
])
def test_the_payload_is_stored_as_sent_unless_jsonb_could_refuse_a_number(payload: bytes, stored: str) -> None:
    assert _payload_json(msgspec.Raw(payload)) == stored


def test_on_a_database_not_in_utf8_every_payload_is_stored_as_read() -> None:
    assert _payload_json(msgspec.Raw(b'{"t": "caf\\u00e9", "a": 1.10}'), exact=False) == '{"t":"café","a":1.1}'


@given(st.recursive(st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text()
                    | st.floats(allow_nan=False, allow_infinity=False),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
                    max_leaves=12),
       st.sampled_from(["", "e-400", "e-16384", "0" * 25]))
def test_text_stored_as_sent_reads_as_the_old_write_would(value: object, suffix: str) -> None:
    """Whatever is stored as sent holds no number that long_numbers would flag, and reads back as
    the same JSON value as what the projector wrote before; a number it flags goes the old way."""
    raw = orjson.dumps([value, "__n__"]).replace(b'"__n__"', b"1" + suffix.encode())
    text = _payload_json(msgspec.Raw(raw))
    if long_numbers(raw):
        assert text == OLD(READ(raw)).decode()
    else:
        assert text == raw.decode() and orjson.loads(text) == msgspec.json.decode(OLD(msgspec.json.decode(raw)))
