"""The fast pass reads a record's headers without a dict of them (dispatch.read_headers): the same
Delivery and flags as decide_record's dict, and a failure wherever that dict failed."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from app.core.incoming import NOT_CHECKED, SOUND, Incoming, checked_as, delivery_of, read_headers
from app.core.model import Delivery
from topics.records import CHECKED_VALUE, CORRELATION, H_CHECKED, H_RECORD

NAMES = st.sampled_from(["gateway", "delivery_id", "received_at", "source", "checked", "record", "x-trace"])
VALUES = st.one_of(
    st.sampled_from([b"", b"1", b"2", b"0", b"pg", b"card", b"webhook", b"fetch", b"correlation", b"\xff", b"\xc3",
                     b"17", b" 42 ", "١٢٣".encode(), b"1_000", b"-5", b"x1", b"1" + b"0" * 30,
                     b"253402300799999", b"253402300800000"]),
    st.binary(max_size=6),
    st.text(max_size=6).map(str.encode),
)


def by_dict(record: Incoming) -> tuple[Delivery, bool, int] | str:
    try:
        headers = {name: value.decode() for name, value in record.headers}
        delivery = delivery_of(record.key.decode(), headers, record.topic, record.offset, record.partition)
        return delivery, headers.get(H_RECORD) == CORRELATION, checked_as(headers.get(H_CHECKED))
    except (UnicodeDecodeError, ValueError) as exc:
        return type(exc).__name__


def read(record: Incoming) -> tuple[Delivery, bool, int] | str:
    try:
        return read_headers(record)
    except (UnicodeDecodeError, ValueError) as exc:
        return type(exc).__name__


@settings(max_examples=2000)
@given(st.lists(st.tuples(NAMES, VALUES), max_size=8), st.sampled_from([b"pg:dep_1", b"card:pay_1", b"\xff:x", b"x"]),
       st.integers(min_value=0, max_value=10**6), st.integers(min_value=0, max_value=11))
def test_read_headers_is_what_the_dict_of_them_gave(headers: list[tuple[str, bytes]], key: bytes, offset: int,
                                                    partition: int) -> None:
    record = Incoming(key, b"{}", headers, offset, partition, "t.raw")
    assert read(record) == by_dict(record)


def test_a_later_header_of_the_same_name_counts() -> None:
    record = Incoming(b"pg:d", b"{}", [("checked", CHECKED_VALUE), ("checked", b"0"), ("received_at", b"5"),
                                       ("received_at", b"7")], 3, 1, "t.raw")
    delivery, correlation, checked = read_headers(record)
    assert (delivery.received_at_ms, correlation, checked) == (7, False, NOT_CHECKED)
    record = Incoming(b"pg:d", b"{}", [("checked", b"1"), ("checked", CHECKED_VALUE)], 3, 1, "t.raw")
    assert read_headers(record)[2] == SOUND
    assert delivery.delivery_id == "t.raw:1:3" and delivery.gateway == "pg" and delivery.source == "webhook"


INGEST_ORDER = ["gateway", "delivery_id", "received_at", "source", "checked"]


@settings(max_examples=1000)
@given(st.lists(VALUES, min_size=5, max_size=5), st.sampled_from([b"pg:dep_1", b"card:pay_1", b"\xff:x", b"x"]),
       st.booleans())
def test_the_ingest_s_own_headers_read_as_the_dict_of_them_gave(values: list[bytes], key: bytes, ingest: bool) -> None:
    # the ingest's order of names (the one-unpacking path), its checked value or any other
    if ingest:
        values[4] = CHECKED_VALUE
    record = Incoming(key, b"{}", list(zip(INGEST_ORDER, values, strict=True)), 7, 2, "t.raw")
    assert read(record) == by_dict(record)
