"""A body the ingest takes is JSON every reader of the log reads (``limits.unreadable``, DESIGN.md
§2.4): bytes that are not UTF-8, or a number beyond a double's range, in a part the gateway's typed
schema skips unread (an unknown field) are refused at the ingest, with the reason. The worker reads
a record the ingest so marked (``checked: 2``) with one typed decode and carries its bytes on as they
are; one an earlier ingest marked (``checked: 1``) or a source other than the ingest appended (the
fetcher, a redrive) is checked for what that mark does not promise, and set aside with the reason."""

from __future__ import annotations

import msgspec
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.core.dispatch import Incoming, plan_batch
from app.gateways import paymos
from app.gateways.limits import unreadable
from app.gateways.registry import GATEWAYS
from tests import paymos_events
from tests.pg_events import deposit
from topics.catalog import names
from topics.records import CHECKED, correlation_headers, raw_headers

N = names("t")
CARD = orjson.dumps({"id": "evt_1", "type": "payment.captured", "payment_ref": "pay_1", "sequence": None,
                     "occurred_at": "2026-11-29T10:02:15.123Z", "amount_minor": 500, "currency": "EUR"})
RESOURCES = {"pg": "dep_1", "card": "pay_1", "paymos": "inv_1"}
BODIES = {
    "pg": deposit("dep_1", 2, "pending"),
    "card": CARD,
    "paymos": paymos_events.event("invoice.confirming", "inv_1", "confirming", 1_796_000_000_000),
}


def with_field(body: bytes, value: bytes) -> bytes:
    """``body`` (a JSON object) with an unknown field holding ``value`` as written."""
    return body[:-1] + b',"x_added":' + value + b"}"


NOT_UTF8 = {"a byte 0xff", "an overlong NUL", "a surrogate as UTF-8", "past U+10FFFF"}
UNREADABLE = {
    "1e309": b"1e309", "1E+400": b"1E+400", "-1e400": b"-1e400", "in an array": b"[1, 2.5e999]",
    "in an object": b'{"rate": 17.0e400}', "a byte 0xff": b'"caf\xff"', "an overlong NUL": b'"\xc0\x80"',
    "a surrogate as UTF-8": b'"\xed\xa0\x80"', "past U+10FFFF": b'"\xf4\x90\x80\x80"',
    "1e300": b"1e300", "-1.5e290 in an array": b"[1, -1.5e290]", "0.1e290": b'{"r": 0.1e290}',
}
HUGE = {"1e300", "-1.5e290 in an array", "0.1e290"}
READABLE = {
    "1e287": b"1e287", "1e-999": b"1e-999", "2.5E+287": b"2.5E+287", "an id like an exponent": b'"12e400"',
    "9.9e287": b"9.9e287", "0e400": b"0e400",
    "UTF-8 text": "\"café ₿ 😀\"".encode(), "an escaped pair": b'"\\ud83d\\ude00"', "digits": b"123456789012345678",
}


@pytest.mark.parametrize("gateway", sorted(BODIES))
@pytest.mark.parametrize("label", sorted(UNREADABLE))
def test_the_ingest_refuses_what_a_reader_of_the_log_would(gateway: str, label: str) -> None:
    raw = with_field(BODIES[gateway], UNREADABLE[label])
    if label not in HUGE:
        with pytest.raises((orjson.JSONDecodeError, msgspec.DecodeError)):
            orjson.loads(raw)  # the premise: a reader refuses it, though the typed schema skips the field
    route = GATEWAYS[gateway].adapter.route(raw)
    assert route.resource_key is None and route.quarantine_code == "not_json"
    reason = ("not UTF-8" if label in NOT_UTF8 else "a number of 1e288 or more" if label in HUGE
              else "a number beyond a double's range")
    assert reason in (route.quarantine_reason or "")
    # what the refusal can still tell: the resource, for its timeline
    assert route.resource_hint == f"{gateway}:{RESOURCES[gateway]}"


@pytest.mark.parametrize("gateway", sorted(BODIES))
@pytest.mark.parametrize("label", sorted(READABLE))
def test_the_ingest_takes_what_every_reader_reads(gateway: str, label: str) -> None:
    raw = with_field(BODIES[gateway], READABLE[label])
    orjson.loads(raw)
    assert GATEWAYS[gateway].adapter.route(raw).resource_key is not None


# JSON text a gateway (or whoever holds its secret) may put in a field no schema reads: numbers in
# every spelling, digit runs, strings of any bytes, nested.
NUMBERS = st.builds(lambda sign, whole, frac, e, exp_sign, exp: f"{sign}{whole}{frac}{e}{exp_sign}{exp}".encode(),
                    st.sampled_from(["", "-"]), st.sampled_from(["0", "1", "9", "17", "1" + "0" * 30, "9" * 320]),
                    st.sampled_from(["", ".5", ".000001", "." + "9" * 40]), st.sampled_from(["e", "E"]),
                    st.sampled_from(["", "+", "-"]), st.integers(min_value=0, max_value=1200).map(str))
STRINGS = st.binary(max_size=12).map(lambda b: b'"' + bytes(c for c in b if c >= 0x20 and c not in b'"\\') + b'"')
LEAVES = st.one_of(NUMBERS, STRINGS, st.integers(min_value=-(10**30), max_value=10**30).map(lambda n: str(n).encode()))


def as_object(values: list[bytes]) -> bytes:
    return b"{" + b",".join(b'"k%d":%s' % (i, x) for i, x in enumerate(values)) + b"}"


VALUES = st.recursive(LEAVES, lambda inner: st.one_of(
    st.lists(inner, max_size=3).map(lambda xs: b"[" + b",".join(xs) + b"]"),
    st.lists(inner, max_size=3).map(as_object)),
    max_leaves=6)


@settings(max_examples=600)
@given(st.sampled_from(sorted(BODIES)), VALUES)
def test_a_body_the_ingest_takes_reads_in_every_reader(gateway: str, value: bytes) -> None:
    raw = with_field(BODIES[gateway], value)
    route = GATEWAYS[gateway].adapter.route(raw)
    readers_take = True
    try:
        orjson.loads(raw)
        msgspec.json.decode(raw)
    except (orjson.JSONDecodeError, msgspec.DecodeError):
        readers_take = False
    if route.resource_key is not None:
        assert readers_take, f"the ingest took what a reader refuses: {raw!r}"
    if not readers_take and route.resource_key is None and route.quarantine_code == "not_json":
        assert unreadable(raw) is not None or b"nests" in (route.quarantine_reason or "").encode()


def record(body: bytes, headers: list[tuple[str, bytes]], offset: int = 1) -> Incoming:
    return Incoming(b"pg:dep_1", body, headers, offset, 0, N.raw)


def correlated() -> Incoming:
    body = orjson.dumps({"pg_deposit_id": "dep_1", "merchant_reference": "mr_1", "our_order_id": "o_1",
                         "our_user_id": "u_1"})
    return Incoming(b"pg:dep_1", body, correlation_headers("pg", "c_1", 1_700_000_000_000), 0, 0, N.raw)


@pytest.mark.parametrize("label, headers", [
    ("an earlier ingest's mark", [*raw_headers("pg", "d1", 1_700_000_000_000), ("checked", b"1")]),
    ("the fetcher's", raw_headers("pg", "d1", 1_700_000_000_000, "fetch")),
    ("no mark", raw_headers("pg", "d1", 1_700_000_000_000)),
])
@pytest.mark.parametrize("value", [b"1e999", b'"\xff"'])
def test_a_record_not_proven_sound_is_checked_and_set_aside_with_the_reason(
        label: str, headers: list[tuple[str, bytes]], value: bytes) -> None:
    plan = plan_batch(N, GATEWAYS, [correlated(), record(with_field(deposit("dep_1", 2, "pending"), value), headers)],
                      lambda _p, _k: None)
    assert len(plan.set_aside) == 1, label
    assert "not UTF-8" in plan.set_aside[0][1] or "double" in plan.set_aside[0][1] or "not JSON" in plan.set_aside[0][1]
    state = orjson.loads(plan.states[b"pg:dep_1"])
    assert state["version"] is None and state["correlation"] is not None  # the correlation alone was applied


def test_a_checked_record_s_parts_are_kept_as_sent() -> None:
    """What the ingest marked is read by the schema alone, and its parts stored as the gateway wrote
    them (spacing, escapes): the same JSON values, not another writing of them."""
    body = deposit("dep_1", 2, "pending").replace(b'"status":"pending"', b'"status" : "pending", "note":"caf\\u00e9"')
    obj = body[body.index(b'"object":{') + len(b'"object":'):body.rindex(b"}}")]
    plan = plan_batch(N, GATEWAYS, [correlated(), record(body, [*raw_headers("pg", "d1", 1_700_000_000_000), CHECKED])],
                      lambda _p, _k: None)
    assert plan.set_aside == []
    stored = plan.states[b"pg:dep_1"]
    assert b'"object":' + obj + b"," in stored
    assert orjson.loads(stored)["object"]["note"] == "café"
    invoice = paymos_events.event("invoice.confirming", "inv_1", "confirming", 1_796_000_000_000)
    spaced = invoice.replace(b'"status":"confirming"', b'"status":  "confirming"')
    data = spaced[spaced.index(b'"data":') + len(b'"data":'):spaced.rindex(b"}")]
    plan = plan_batch(N, GATEWAYS, [Incoming(b"paymos:inv_1", spaced, [*raw_headers("paymos", "d2", 5), CHECKED],
                                             0, 0, N.raw)], lambda _p, _k: None)
    assert plan.set_aside == [] and b'"snapshot":' + data in plan.states[b"paymos:inv_1"]


@pytest.mark.parametrize("twice", [b'"status":5,"status":"confirming"', b'"status":"paid","status":"confirming"'])
@pytest.mark.parametrize("marked", [True, False])
def test_a_key_given_twice_in_paymos_data_reads_as_the_ingest_read_it(twice: bytes, marked: bool) -> None:
    """The ingest reads paymos's ``data`` as an object first (the last of a key given twice wins,
    whatever the others hold): the worker applies what the ingest took, and its snapshot reads back."""
    body = paymos_events.event("invoice.confirming", "inv_1", "confirming", 1_796_000_000_000).replace(
        b'"status":"confirming"', twice)
    assert GATEWAYS["paymos"].adapter.route(body).resource_key == "paymos:inv_1"
    headers = [*raw_headers("paymos", "d1", 5), *([CHECKED] if marked else [])]
    plan = plan_batch(N, GATEWAYS, [Incoming(b"paymos:inv_1", body, headers, 0, 0, N.raw)], lambda _p, _k: None)
    assert plan.set_aside == [] and dict(plan.outcomes) == {("paymos", "applied"): 1}
    later = paymos_events.event("invoice.paid", "inv_1", "paid", 1_796_000_000_001)
    state = plan.states[b"paymos:inv_1"]
    plan = plan_batch(N, GATEWAYS, [Incoming(b"paymos:inv_1", later, [*raw_headers("paymos", "d2", 6), CHECKED], 1, 0,
                                             N.raw)], lambda _p, _k: state)
    assert plan.set_aside == [] and dict(plan.outcomes) == {("paymos", "applied"): 1}


def test_a_parked_paymos_body_that_no_longer_reads_leaves_the_state_saying_why() -> None:
    """A parked body another release stored that this one cannot read does not hold its resource's
    reorg back: it leaves the state with a quarantined decision, and the rest goes on."""
    from app.core import paymos as core
    from app.core.model import Delivery

    paid = paymos.read(paymos_events.event("invoice.paid", "inv_1", "paid", 1_796_000_000_001), True)
    assert isinstance(paid, paymos.Webhook)
    state = orjson.loads(core.dump(core.apply_event(None, paid, Delivery("d1", "paymos", "paymos:inv_1", 5, 0))[0]))
    unreadable_body = paymos_events.event("invoice.confirming", "inv_1", "confirming", 1_796_000_000_003).replace(
        b'"updated_at":1796000000003', b'"updated_at":"soon"')
    state["parked"] = [{"body": orjson.Fragment(unreadable_body),
                        "delivery": {"delivery_id": "d2", "gateway": "paymos", "resource_key": "paymos:inv_1",
                                     "received_at_ms": 6, "seq": 1, "source": "webhook"}}]
    stored = orjson.dumps(state)
    reorg = paymos_events.event("invoice.awaiting_payment", "inv_1", "awaiting_payment", 1_796_000_000_002)
    plan = plan_batch(N, GATEWAYS, [Incoming(b"paymos:inv_1", reorg, [*raw_headers("paymos", "d3", 7), CHECKED], 2, 0,
                                             N.raw)], lambda _p, _k: stored)
    assert plan.set_aside == []
    decided = [orjson.loads(r[2]) for r in plan.records[0] if r[0] == N.decisions]
    assert [(d["delivery_id"], d["outcome"]) for d in decided] == [("d3", "applied"), ("d2", "quarantined")]
    assert "no longer reads" in decided[1]["error"] and orjson.loads(plan.states[b"paymos:inv_1"])["parked"] == []


def test_every_decoder_of_untrusted_any_fields_reads_floats_with_python() -> None:
    """msgspec reads a number of 1e289 or more 300 times slower than another (7 µs): the decoders
    that read untrusted bodies into Any fields before the limits are checked (each adapter's lenient
    Head; Adyen's signed fields, before the signature) hand floats to Python's float() instead, and
    body_error's read of a whole body skips them; everything later meets none (the ingest refuses them)."""
    from app.gateways import adyen, card, limits, pg, stripe

    for decoder in (pg.HEAD, card.HEAD, paymos.HEAD, stripe.HEAD, adyen.HEAD, adyen._SIGNED):
        assert decoder.float_hook is limits.FLOAT_HOOK is float
    assert limits._SHAPE.float_hook is float
    from topics.records import DECISIONS, EFFECTS
    assert DECISIONS.float_hook is float and EFFECTS.float_hook is float  # a log written before may hold them
    # the same answers as before, for what they read
    assert adyen.HEAD.decode(b'{"pspReference": 1e300}').pspReference == 1e300
    assert "nests deeper than 32" in (limits.body_error(b'{"a": ' + b"[" * 40 + b"1e300" + b"]" * 40 + b"}") or "")
    assert limits.body_error(b'{"a": [1e300, ' + b"[]," * 40 + b"123456789012345678901]}") == (
        "a[41]: integer outside the signed 64-bit range")
