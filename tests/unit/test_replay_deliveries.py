"""What `orderly replay` waits for: one timeline row per delivery id in the log, however many times a
record was appended (a pg backfill or a card fetch repeated after the fetcher was killed keeps the
id of the first append, so the live timeline holds it once; replay waited for a row per record and
sat out its whole limit)."""

from __future__ import annotations

from app.replay import Merged, deliveries


def test_a_record_appended_again_is_one_delivery() -> None:
    backfilled = (b"pg:dep_1", b"{}", [("gateway", b"pg"), ("delivery_id", b"fetch-evt_dep_1_1"), ("source", b"fetch")])
    merged: Merged = {
        0: [(b"pg:dep_1", b"{}", [("delivery_id", b"d1")]), backfilled, backfilled],
        1: [(b"card:pay_1", b"{}", [("delivery_id", b"d2")]), (b"card:pay_1", b"{}", [("delivery_id", b"d3")])],
    }
    assert deliveries(merged) == 4
