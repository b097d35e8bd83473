"""The received_at header as every reader takes it (topics.records): the ingest writes its clock's
milliseconds; a record appended some other way may carry anything, which the worker sets aside
(test_dispatch) and the quarantine table and the sweeper take as no time, never raising."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from aiokafka.structs import ConsumerRecord
from hypothesis import given
from hypothesis import strategies as st

from projections.quarantine import row, set_aside_record
from topics.catalog import names
from topics.records import H_RECEIVED_AT, RECEIVED_MAX, received_ms, received_ms_or_none


@given(st.binary(max_size=40) | st.integers(-(10**30), 10**30).map(lambda n: str(n).encode()))
def test_any_header_reads_as_a_time_in_range_or_as_none(value: bytes) -> None:
    found = received_ms_or_none(value)
    assert found is None or 0 <= found <= RECEIVED_MAX
    if found is not None:
        assert found == received_ms(value)


@pytest.mark.parametrize(("value", "expected"), [
    (b"1733000000123", 1_733_000_000_123), (b"0", 0), (b"253402300799999", RECEIVED_MAX),
    (b"253402300800000", None), (b"-5", None), (b"abc", None), (b"\xff", None), (b"", None), (None, None),
    ("١٢٣".encode(), 123),
])
def test_the_edges(value: bytes | None, expected: int | None) -> None:
    assert received_ms_or_none(value) == expected


def message(received_at: bytes) -> Any:
    headers = [("stage", b"worker"), ("reason", b"ValueError: received_at"), (H_RECEIVED_AT, received_at)]
    return ConsumerRecord("t.quarantine", 0, 5, 0, 0, b"d1", b"{}", None, 2, 2, headers)


@pytest.mark.parametrize(("value", "expected"), [
    (b"1733000000123", datetime(2024, 11, 30, 20, 53, 20, 123000, tzinfo=UTC)),
    (b"253402300800000", None), (b"abc", None), (b"1" + b"0" * 30, None), (b"0", None),
])
def test_a_quarantined_records_received_at_that_is_no_time_is_stored_as_none(value: bytes,
                                                                             expected: datetime | None) -> None:
    assert row(message(value))[5] == expected


@pytest.mark.parametrize(("received_at_ms", "expected"), [
    (1_733_000_000_123, datetime(2024, 11, 30, 20, 53, 20, 123000, tzinfo=UTC)),
    (0, None), (True, None), ("1733000000123", None), (None, None),
])
def test_a_set_aside_decision_without_a_time_is_quarantined_without_one(received_at_ms: object,
                                                                        expected: datetime | None) -> None:
    # a decision of a record appended without received_at holds 0 (no time): its quarantine row is
    # undated, not dated 1970
    value = orjson.dumps({"delivery_id": "d1", "gateway": "pg", "resource_id": "dep_1",
                          "received_at_ms": received_at_ms})
    decision = ConsumerRecord("t.decisions", 0, 5, 0, 0, b"pg:dep_1", value, None, 2, len(value), [])
    topic, key, body, headers = set_aside_record(names("t"), "projector", decision, "IntegrityError")
    stored = ConsumerRecord(topic, 0, 0, 0, 0, key, body, None, len(key), len(body), headers)
    assert row(stored)[5] == expected
